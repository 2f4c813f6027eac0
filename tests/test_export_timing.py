"""The timing harness across backends (rvqspec_lib.eval.export_timing) and the CUDA-graph backend's CPU-side logic
(rvqspec_lib.models.cuda_graphs with use_graphs=False: static caches, in-place compaction, static input buffers; the
fused speculative chain's graphs built and replayed through EagerGraph stand-ins over its static buffers).

Absent backends are reported with their reason, never timed; speedups are computed from the rows exactly; the
static-buffer backend decodes the official module's codes draw for draw.
"""

from __future__ import annotations

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.eval import export_timing as T
from rvqspec_lib.eval import speed
from rvqspec_lib.models.cuda_graphs import EagerGraph, GraphedBackend, GraphedChainFrame, GraphedFrame
from rvqspec_lib.models.fused import FusedARFrame
from rvqspec_lib.models.fused_spec import FusedChainFrame
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree


def test_backend_status_names_what_is_absent_here():
    table = {r["backend"]: r for r in T.backend_table()}
    assert list(table) == list(T.BACKENDS)
    assert table["eager"]["available"] and table["onnx"]["available"]
    for name in ("coreml", "cuda"):  # this machine: Linux, no GPU
        assert not table[name]["available"] and table[name]["reason"] and "\n" not in table[name]["reason"]
    with pytest.raises(ValueError, match="unknown backend"):
        T.backend_status("tpu")
    with pytest.raises(ValueError, match="not available here: no CUDA"):
        T.make_backend("cuda", None)


def test_node_budget():
    assert T.node_budget(AR()) == 1 and T.node_budget(Chain(6)) == 6
    assert T.node_budget(Tree(((0,), (1,), (0, 0)))) == 4
    assert list(T.decoders_by_budget(None, [2, 4, 16], chains=[4])) == ["AR", "chain4", "chain2"]


ROWS = [  # synthetic frame-time rows: two backends, AR, two budgets, the fused frame
    {"decoder": "AR", "backend": "eager", "nodes": 1, "tokens_per_call": 1.0, "ms_per_frame": 30.0,
     "speedup_vs_ar": 1.0},
    {"decoder": "chain2", "backend": "eager", "nodes": 2, "tokens_per_call": 1.5, "ms_per_frame": 25.0,
     "speedup_vs_ar": 1.2},
    {"decoder": "tree2", "backend": "eager", "nodes": 2, "tokens_per_call": 1.7, "ms_per_frame": 20.0,
     "speedup_vs_ar": 1.5},
    {"decoder": "tree4", "backend": "eager", "nodes": 4, "tokens_per_call": 2.0, "ms_per_frame": 24.0,
     "speedup_vs_ar": 1.25},
    {"decoder": speed.FUSED, "backend": "eager", "nodes": None, "tokens_per_call": None, "ms_per_frame": 15.0,
     "speedup_vs_ar": 2.0},
    {"decoder": "AR", "backend": "onnx", "nodes": 1, "tokens_per_call": 1.0, "ms_per_frame": 20.0,
     "speedup_vs_ar": 1.0},
    {"decoder": "tree2", "backend": "onnx", "nodes": 2, "tokens_per_call": 1.7, "ms_per_frame": 16.0,
     "speedup_vs_ar": 1.25},
]


def test_speedup_vs_n_and_summary_are_read_off_the_rows():
    best = T.speedup_vs_n(ROWS)
    assert [(r["backend"], r["nodes"], r["decoder"]) for r in best] == [("eager", 2, "tree2"), ("eager", 4, "tree4"),
                                                                        ("onnx", 2, "tree2")]
    assert best[0]["speedup_vs_fused"] == 15.0 / 20.0 and best[2]["speedup_vs_fused"] is None
    s = {r["backend"]: r for r in T.summary_by_backend(ROWS)}
    assert s["eager"]["best_decoder"] == "tree2" and s["eager"]["best_speedup_vs_ar"] == 30.0 / 20.0
    assert s["eager"]["fused_speedup_vs_ar"] == 2.0 and s["eager"]["best_speedup_vs_fused"] == 0.75
    assert s["onnx"]["fused_ms"] is None and s["onnx"]["best_speedup_vs_ar"] == 20.0 / 16.0


def test_projected_speedup_is_e_times_cost_ratio():
    cost = [{"backend": "onnx", "query_positions": q, "ratio_to_q1": r} for q, r in ((1, 1.0), (2, 1.25), (4, 2.0))]
    rows = T.projected_speedup({2: 1.5, 4: 2.4}, cost)
    assert [(r["nodes"], r["projected_speedup"]) for r in rows] == [(2, 1.5 / 1.25), (4, 2.4 / 2.0)]
    cal = {"best_kind": {"2": "sampled"}, "sampled": {"call_expected_tokens": {"2": 1.7}}}
    assert T.expected_tokens_per_call(cal) == {2: 1.7}


@pytest.mark.slow
def test_frame_times_across_backends_reports_the_absent_ones(small):
    ctx = speed.random_contexts(small, 3)
    decs = {"AR": AR(), "chain2": Chain(2), "tree": Tree(((0,), (1,), (0, 0)))}
    res = T.frame_times(small, ctx, decs, ["eager", "onnx", "coreml", "cuda"], repeats=2, warmup=1, progress=False)
    assert set(res["absent"]) == {"coreml", "cuda"} and all(res["absent"].values())
    assert {(r["decoder"], r["backend"]) for r in res["rows"]} == {(d, b) for d in [*decs, speed.FUSED]
                                                                   for b in ("eager", "onnx")}
    for r in res["rows"]:
        assert r["ms_per_frame"] > 0 and r["nodes"] == (None if r["decoder"] == speed.FUSED else
                                                        T.node_budget(decs[r["decoder"]]))
        ar = next(x for x in res["rows"] if x["backend"] == r["backend"] and x["decoder"] == "AR")
        assert r["speedup_vs_ar"] == pytest.approx(ar["ms_per_frame"] / r["ms_per_frame"])
    cost = T.verify_costs(small, ["eager", "onnx", "cuda"], query_sizes=(1, 2), repeats=2, warmup=1,
                          progress=False, built=res["built"])
    assert {r["backend"] for r in cost["rows"]} == {"eager", "onnx"} and set(cost["absent"]) == {"cuda"}
    with pytest.raises(ValueError, match="not available here"):
        T.bench_backend("cuda", small, ctx)
    with pytest.raises(ValueError, match="macOS|call by call"):
        T.bench_backend("coreml", small, ctx)


@pytest.mark.parametrize("decoder", [AR(), Chain(4), Tree(((0,), (1,), (0, 0), (0, 0, 0))),
                                     Tree(((0,), (1,), (1, 0)), sampled=True)],
                         ids=["ar", "chain4", "tree", "sampled-tree"])
@pytest.mark.parametrize("batch", [1, 2])
def test_static_buffer_backend_equals_the_official_draw_for_draw(cp, decoder, batch):
    """The CUDA-graph backend's logic without the capture: one static cache per shape reused frame after frame,
    compacted in place, inputs copied into static buffers."""
    be = GraphedBackend(cp, use_graphs=False)
    ctx = torch.randn(batch, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(batch))
    for seed in range(3):  # several frames through the same static caches
        ref = decode_frame(cp, ctx, decoder=decoder, generator=torch.Generator().manual_seed(seed))
        got = decode_frame(cp, ctx, decoder=decoder, generator=torch.Generator().manual_seed(seed), backend=be)
        assert torch.equal(got.codes, ref.codes) and torch.equal(got.calls, ref.calls)
    assert len(be._caches) == 1 and be.capture_s


def test_static_buffer_backend_needs_its_own_cache(cp):
    be = GraphedBackend(cp, use_graphs=False)
    other = be.lean.new_cache(1, 20)
    x = torch.zeros(1, 2, int(cp.config.hidden_size))
    with pytest.raises(ValueError, match="its own new_cache"):
        be.forward(x, torch.arange(2)[None], torch.ones(1, 2, 20, dtype=torch.bool), other, torch.arange(2)[None])


def test_graphed_frame_logic_equals_the_fused_frame(cp):
    f, ref = GraphedFrame(cp, use_graphs=False), FusedARFrame(cp, compile=False)
    ctx = torch.randn(2, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(0))
    for s in range(2):
        noise = ref.noise(2, torch.Generator().manual_seed(s))
        assert torch.equal(f(ctx, noise), ref(ctx, noise))
    assert torch.equal(f.decode(ctx, torch.Generator().manual_seed(5)),
                       ref.decode(ctx, torch.Generator().manual_seed(5)))


@pytest.mark.parametrize("window", [2, 4])
def test_graphed_chain_frame_logic_equals_the_fused_chain_frame(cp, window):
    """The CUDA-graph fused chain without the capture: its static buffers, the graphs of every start depth built as a
    capture builds them (warm-up calls that write into the buffers) and replayed by the frame loop, give the eager
    FusedChainFrame's codes and calls for the same uniforms, frame after frame, alone and in a batch whose rows part
    (rows at different depths: gathered into the buffers of their own batch size, which are built mid-frame)."""
    g, ref = GraphedChainFrame(cp, window, use_graphs=False), FusedChainFrame(cp, window, compile=False)
    parted = False
    for batch in (1, 3):
        ctx = torch.randn(batch, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(batch))
        for seed in range(3):  # several frames through the same static buffers
            u = ref.uniforms(batch, torch.Generator().manual_seed(seed))
            assert torch.equal(g(ctx, u), ref(ctx, u)) and g.last_calls == ref.last_calls
            parted |= len(set(ref.last_calls)) > 1
        assert torch.equal(g.decode(ctx, torch.Generator().manual_seed(7)),
                           ref.decode(ctx, torch.Generator().manual_seed(7)))
    assert parted  # the batch really had rows at different depths
    assert g.name == f"fused-chain{window}-static-eager" and g.nodes == window


def test_graphed_chain_frame_replays_one_graph_per_round_over_one_set_of_buffers(cp):
    g = GraphedChainFrame(cp, 4, use_graphs=False)
    assert g.compile_all(1) >= 0 and g.compile_all(1) == 0.0  # captured once per batch size
    assert set(g._graphs) == {("prefill", 1), *((s, 1) for s in range(1, g.n_codes))}
    assert all(isinstance(graph, EagerGraph) for graph in g._graphs.values())
    replays = []
    for key, graph in g._graphs.items():
        graph.fn = (lambda fn, key: lambda: (replays.append(key), fn())[1])(graph.fn, key)
    buf = g.buffers(1)
    addresses = {name: t.data_ptr() for name, t in buf.items()}
    ctx = torch.randn(1, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(0))
    for seed in range(2):
        replays.clear()
        codes = g.decode(ctx, torch.Generator().manual_seed(seed))
        # the prefill, then one graph per round, each chosen by the depth the previous one left
        assert replays[0] == ("prefill", 1) and len(replays) == g.last_calls[0]
        depths = [key[0] for key in replays[1:]]
        assert depths == sorted(set(depths)) and depths[0] == 1 and all(d < g.n_codes for d in depths)
        assert int(buf["depth"][0]) == g.n_codes and torch.equal(codes, buf["codes"])
        assert codes.data_ptr() != buf["codes"].data_ptr()  # a copy: the next frame overwrites the buffers
    assert {name: t.data_ptr() for name, t in g.buffers(1).items()} == addresses  # the same buffers every frame
    with pytest.raises(ValueError, match=r"uniforms must have shape \(1, 15, 7\)"):
        g(ctx, torch.zeros(1, 15, 3, dtype=torch.float64))


def test_cuda_graphs_off_cuda_are_refused_in_one_line(cp):
    for make in (lambda: GraphedBackend(cp, use_graphs=True), lambda: GraphedFrame(cp, use_graphs=True),
                 lambda: GraphedChainFrame(cp, 4, use_graphs=True)):
        with pytest.raises(ValueError, match="CUDA device") as e:
            make()
        assert "\n" not in str(e.value)
    assert GraphedBackend(cp).use_graphs is False  # default: graphs only where the module is on CUDA
    assert GraphedChainFrame(cp).use_graphs is False


def test_device_timers_time_the_fused_rounds_beside_the_fused_ar_frame(cp):
    """gpu_bench's fused-spec leg on the CPU: the graphed fused chains timed in the same interleaved run as AR and the
    fused AR frame, their tokens per call counted from their calls, their ratio to the fused AR frame read off the
    rows."""
    ctx = speed.random_contexts(cp, 2)
    spec = [GraphedChainFrame(cp, w, use_graphs=False) for w in (2, 4)]
    res = T.device_frame_times(cp, ctx, {"AR": AR()}, GraphedBackend(cp, use_graphs=False),
                               GraphedFrame(cp, use_graphs=False), fused_spec=spec, label="static", repeats=2,
                               warmup=1, progress=False)
    rows = {r["decoder"]: r for r in res["rows"]}
    assert set(rows) == {"AR", speed.FUSED, "fused-chain2", "fused-chain4"}
    for w in (2, 4):
        r = rows[f"fused-chain{w}"]
        assert 1.0 <= r["tokens_per_call"] <= w and r["calls_per_frame"] == pytest.approx(
            P.n_codes(cp) / r["tokens_per_call"])
        assert r["speedup_vs_fused"] == pytest.approx(rows[speed.FUSED]["ms_per_frame"] / r["ms_per_frame"])
    beside = T.fused_spec_vs_fused_ar(res["rows"])
    assert [r["decoder"] for r in beside] == ["fused-chain2", "fused-chain4"]
    for r in beside:
        assert r["fused_ar_ms"] == rows[speed.FUSED]["ms_per_frame"] and r["backend"] == "static"
        assert r["x_fused_ar"] == pytest.approx(r["ms_per_frame"] / r["fused_ar_ms"])
        assert r["tokens_per_call"] == rows[r["decoder"]]["tokens_per_call"]


def test_fused_spec_vs_fused_ar_is_read_off_the_rows():
    rows = ROWS + [{"decoder": "fused-chain4", "backend": "eager", "ms_per_frame": 12.0, "p10_ms": 11.0,
                    "p90_ms": 13.0, "tokens_per_call": 2.5, "calls_per_frame": 6.0},
                   {"decoder": "fused-tree8", "backend": "onnx", "ms_per_frame": 9.0, "p10_ms": 8.0, "p90_ms": 10.0,
                    "tokens_per_call": 3.0, "calls_per_frame": 5.0}]
    out = T.fused_spec_vs_fused_ar(rows)
    assert [(r["decoder"], r["backend"], r["fused_ar_ms"], r["x_fused_ar"]) for r in out] == [
        ("fused-chain4", "eager", 15.0, 12.0 / 15.0), ("fused-tree8", "onnx", None, None)]  # onnx: no fused AR row
    assert T.fused_spec_vs_fused_ar(ROWS) == []


def test_device_timers_on_the_cpu(cp):
    ctx = speed.random_contexts(cp, 2)
    res = T.device_frame_times(cp, ctx, {"AR": AR(), "chain2": Chain(2)}, GraphedBackend(cp, use_graphs=False),
                               GraphedFrame(cp, use_graphs=False), label="static", repeats=2, warmup=1,
                               progress=False)
    rows = {r["decoder"]: r for r in res["rows"]}
    assert set(rows) == {"AR", "chain2", speed.FUSED} and rows["AR"]["speedup_vs_ar"] == 1.0
    assert rows["AR"]["tokens_per_call"] == 1.0 and rows["AR"]["calls_per_frame"] == P.n_codes(cp)
    cost = T.device_verify_costs(cp, GraphedBackend(cp, use_graphs=False), query_sizes=(1, 4), repeats=2, warmup=1,
                                 progress=False)
    assert [r["query_positions"] for r in cost["rows"]] == [1, 4] and cost["rows"][0]["ratio_to_q1"] == 1.0
    with pytest.raises(ValueError, match="include 1"):
        T.device_verify_costs(cp, GraphedBackend(cp, use_graphs=False), query_sizes=(2, 4))
    with pytest.raises(ValueError, match="condition"):
        T.time_conditions({}, ctx)
