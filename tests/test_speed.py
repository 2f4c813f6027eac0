"""The interleaved benchmark functions (rvqspec_lib.eval.speed) on tiny-random, over the registry's runners: what the
rows mean, not how fast; the speedups, the summary and the projection read off rows exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.predictor import OfficialBackend
from rvqspec_lib.eval import speed as S
from bench import frames as BF
from rvqspec_lib.models.backends import available, verify_backend
from rvqspec_lib.device.precision import apply_precision

TREE = Tree(((0,), (1,), (0, 0)))


def test_build_runners_shares_one_backend_and_adds_the_fused_frames(cp):
    runners, absent = S.build_runners(["official", "eager"], cp, [AR(), Chain(4), TREE])
    assert absent == {}
    got = [(r.backend, r.name.label, r.fused) for r in runners]
    assert got == [("official", "ar", False), ("official", "chain:4", False), ("official", "tree:0;1;0,0", False),
                   ("eager", "ar", False), ("eager", "chain:4", False), ("eager", "tree:0;1;0,0", False),
                   ("eager", "ar", True), ("eager", "chain:4", True)]  # official has no fused frame, trees none
    assert len({id(r.verify) for r in runners if r.backend == "eager" and not r.fused}) == 1
    replay, _ = S.build_runners(["eager"], cp, {"ar": AR()}, acceptance=object())
    assert [r.fused for r in replay] == [False]  # a replay's frames are stepped only
    bf16 = apply_precision(copy.deepcopy(cp), "bfloat16", require_native=False)
    runners, absent = S.build_runners(["onnx", "eager"], bf16, [AR()], fused=False)
    assert set(absent) == {"onnx"} and "float32" in absent["onnx"] and [r.backend for r in runners] == ["eager"]
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        S.build_runners(["tpu"], cp, [AR()])


def test_time_frames_rows(cp):
    runners, _ = S.build_runners(["official", "eager"], cp, [AR(), Chain(4), TREE])
    out = S.time_frames(runners, S.random_contexts(cp, 3), repeats=3, warmup=1, progress=False)
    rows = {(r["decoder"], r["backend"], r["fused"]): r for r in out["rows"]}
    assert len(rows) == len(runners)
    for (d, b, f), r in rows.items():
        assert r["p10_ms"] <= r["ms_per_frame"] <= r["p90_ms"] and r["precision"] == "float32"
        assert 0 <= r["model_ms"] <= r["ms_per_frame"] and r["speedup_vs_ar"] > 0
        if not f:
            assert r["heads_ms"] > 0 and 0 <= r["outside_share"] < 1
    for b in ("official", "eager"):
        ar = rows[("ar", b, False)]
        assert ar["tokens_per_call"] == 1.0 and ar["calls_per_frame"] == 15 and ar["speedup_vs_ar"] == 1.0
        assert rows[("chain:4", b, False)]["tokens_per_call"] >= 1.0 and rows[("chain:4", b, False)]["nodes"] == 4
    fused = rows[("ar", "eager", True)]
    assert fused["speedup_vs_fused"] == 1.0 and fused["calls_per_frame"] == 15 and fused["heads_ms"] == 0
    assert rows[("ar", "official", False)]["speedup_vs_fused"] is None  # official has no fused frame
    # the same frames through both backends (bit-identical forward): the same tokens per call
    assert rows[("tree:0;1;0,0", "official", False)]["tokens_per_call"] == \
        rows[("tree:0;1;0,0", "eager", False)]["tokens_per_call"]
    meta = out["meta"]
    assert meta["threads"] == torch.get_num_threads() and meta["dtype"] == "float32" and meta["repeats"] == 3
    assert "other_cpu_frac" in meta and "cpu" in meta and len(meta["noise_keys"]) == len(runners)
    with pytest.raises(ValueError, match="same decoder, backend"):
        S.time_frames(runners + runners[:1], S.random_contexts(cp, 2), progress=False)


def test_time_frames_fused_chain_rows(cp):
    """The fused speculative chain: its own row per window, tokens per call from its calls."""
    runners, _ = S.build_runners(["eager"], cp, [AR(), Chain(2), Chain(4)])
    out = S.time_frames(runners, S.random_contexts(cp, 2), repeats=2, warmup=1, progress=False)
    rows = {(r["decoder"], r["fused"]): r for r in out["rows"]}
    for w in (2, 4):
        r = rows[(f"chain:{w}", True)]
        assert r["nodes"] == w and 1.0 <= r["tokens_per_call"] <= w
        assert 15 / w <= r["calls_per_frame"] <= 15  # a round commits 1..window codes
        assert r["speedup_vs_ar"] > 0 and r["speedup_vs_fused"] > 0 and r["heads_ms"] == 0


def test_timed_backend_changes_nothing_but_the_clock(cp):
    ctx = S.random_contexts(cp, 2)
    clock = S.Clock()
    ref = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(0))
    got = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(0),
                       backend=S.TimedBackend(OfficialBackend(cp), clock),
                       drafter=S.TimedDrafter(ReusedHeads(), clock))
    assert torch.equal(ref.codes, got.codes) and torch.equal(ref.calls, got.calls)
    assert clock.model_s > 0 and clock.heads_s > 0


def test_verify_cost_curve_rows(cp):
    out = S.verify_cost_curve(cp, {b: verify_backend(b, cp) for b in ("official", "eager")}, query_sizes=(1, 2, 8),
                              repeats=2, warmup=1, progress=False)
    rows = out["rows"]
    assert [(r["backend"], r["query_positions"]) for r in rows] == [(b, q) for b in ("official", "eager")
                                                                    for q in (1, 2, 8)]
    assert all(r["ratio_to_q1"] == 1.0 for r in rows if r["query_positions"] == 1)
    assert all(r["median_ms"] > 0 for r in rows) and out["meta"]["prefix_len"] == S.PREFIX_LEN
    assert set(out["meta"]["rel_se"]) == {f"{b}/{q}" for b in ("official", "eager") for q in (1, 2, 8)}


def test_verify_call_whole_adds_the_projection_and_a_head(cp):
    be = verify_backend("eager", cp)
    assert S.verify_call(cp, be, 3)().shape == (1, 3, int(cp.config.hidden_size))
    assert S.verify_call(cp, be, 3, whole=True)().shape == (3, int(cp.config.vocab_size))
    a, b = S.verify_call(cp, be, 2, whole=True), S.verify_call(cp, OfficialBackend(cp), 2, whole=True)
    torch.testing.assert_close(a(), b(), rtol=0, atol=0)  # the lean forward is bit-identical in float32


def test_batch_throughput_rows(cp):
    runners, _ = S.build_runners(["eager"], cp, [AR(), Chain(4)])
    out = BF.batch_throughput(runners, S.random_contexts(cp, 5), batch_sizes=(1, 4), repeats=2, warmup=0,
                             progress=False)
    rows = {(r["decoder"], r["fused"], r["batch"]): r for r in out["rows"]}
    assert set(rows) == {(d, f, b) for d in ("ar", "chain:4") for f in (False, True) for b in (1, 4)}
    for (d, f, b), r in rows.items():
        assert r["frames_per_s"] == pytest.approx(b / (r["ms_per_batch"] / 1e3))
        assert r["ms_per_frame"] == pytest.approx(r["ms_per_batch"] / b)
    assert rows[("ar", False, 4)]["tokens_per_call"] == 1.0 and rows[("ar", False, 1)]["speedup_vs_ar"] == 1.0


def test_bad_input_is_one_line(cp):
    runners, _ = S.build_runners(["official"], cp, [AR()])
    with pytest.raises(ValueError, match=r"contexts must be a \(N >= 1, 2, \d+\) tensor"):
        S.time_frames(runners, torch.zeros(3, 2), progress=False)
    with pytest.raises(ValueError, match="at least one frame runner"):
        S.time_frames([], S.random_contexts(cp, 2), progress=False)
    with pytest.raises(ValueError, match="include 1"):
        S.verify_cost_curve(cp, {"o": OfficialBackend(cp)}, query_sizes=(2, 4), progress=False)
    with pytest.raises(ValueError, match="batch sizes"):
        BF.batch_throughput(runners, S.random_contexts(cp, 2), batch_sizes=(0,), progress=False)
    with pytest.raises(ValueError, match="needs a noise_target"):
        S.time_frames(runners, S.random_contexts(cp, 2), repeats=4, progress=False, max_repeats=8)


def test_the_noise_target_reaches_the_harness(cp):
    runners, _ = S.build_runners(["eager"], cp, [AR(), Chain(4)], fused=False)
    out = S.time_frames(runners, S.random_contexts(cp, 3), repeats=3, warmup=0, progress=False, noise_target=1e9,
                        max_repeats=9)
    m = out["meta"]
    assert (m["repeats"], m["noise_target"], m["max_repeats"]) == (3, 1e9, 9) and set(m["rel_se"]) == {"0", "1"}
    assert m["noise_keys"] == {"0": "ar/eager", "1": "chain:4/eager"}


def test_format_rows():
    md = BF.format_rows([{"a": 1.23456, "b": None, "c": "x"}])
    assert md.splitlines() == ["| a | b | c |", "| ---: | --- | --- |", "| 1.235 |  | x |"] and BF.format_rows([]) == ""


def _row(decoder, kind, nodes, ms, *, backend="eager", fused=False, tpc=1.0, lossy=False):
    return {"decoder": decoder, "kind": kind, "nodes": nodes, "lossy": lossy, "backend": backend, "fused": fused,
            "precision": "float32", "ms_per_frame": ms, "tokens_per_call": tpc}


ROWS = [  # synthetic frame-time rows: two backends, AR, two budgets, the fused frames
    _row("ar", "ar", 1, 30.0), _row("chain:2", "chain", 2, 25.0, tpc=1.5),
    _row("tree:calibrated-point-mass:2", "calibrated", 2, 20.0, tpc=1.7),
    _row("tree:calibrated-sampled:4", "calibrated", 4, 24.0, tpc=2.0),
    _row("ssd-lossy:0.4", "ssd-lossy", 4, 10.0, tpc=3.0, lossy=True),  # never the best: LOSSY
    _row("ar", "ar", 1, 15.0, fused=True), _row("chain:4", "chain", 4, 12.0, fused=True, tpc=2.5),
    _row("ar", "ar", 1, 20.0, backend="onnx"), _row("tree:0;1", "tree", 3, 16.0, backend="onnx", tpc=1.7),
]


def test_speedups_summary_and_speedup_vs_n_are_read_off_the_rows():
    rows = [dict(r) for r in ROWS]
    S._speedups(rows)
    by = {(r["decoder"], r["backend"], r["fused"]): r for r in rows}
    assert by[("chain:2", "eager", False)]["speedup_vs_ar"] == 30.0 / 25.0
    assert by[("chain:4", "eager", True)]["speedup_vs_fused"] == 15.0 / 12.0
    assert by[("tree:0;1", "onnx", False)]["speedup_vs_fused"] is None  # onnx: no fused AR row
    best = BF.speedup_vs_n(rows)
    assert [(r["backend"], r["nodes"], r["decoder"]) for r in best] == [
        ("eager", 1, "ar"), ("eager", 2, "tree:calibrated-point-mass:2"), ("eager", 4, "tree:calibrated-sampled:4"),
        ("onnx", 1, "ar"), ("onnx", 3, "tree:0;1")]
    s = {r["backend"]: r for r in BF.summary_by_backend(rows)}
    e = s["eager"]
    assert (e["ar_ms"], e["fused_ar_ms"], e["best_decoder"], e["best_nodes"]) == (30.0, 15.0,
                                                                                  "tree:calibrated-point-mass:2", 2)
    assert e["best_speedup_vs_ar"] == 30.0 / 20.0 and e["best_speedup_vs_fused"] == 15.0 / 20.0
    assert e["fused_spec_decoder"] == "chain:4" and e["fused_spec_speedup_vs_fused"] == 15.0 / 12.0
    assert e["fused_speedup_vs_ar"] == 2.0
    o = s["onnx"]
    assert o["fused_ar_ms"] is None and o["best_speedup_vs_ar"] == 20.0 / 16.0 and o["fused_spec_decoder"] is None


def test_projected_speedup_is_e_times_cost_ratio():
    cost = [{"backend": "onnx", "query_positions": q, "ratio_to_q1": r} for q, r in ((1, 1.0), (2, 1.25), (4, 2.0))]
    rows = BF.projected_speedup({2: 1.5, 4: 2.4}, cost)
    assert [(r["nodes"], r["projected_speedup"]) for r in rows] == [(2, 1.5 / 1.25), (4, 2.4 / 2.0)]
    cal = {"best_kind": {"2": "sampled"}, "sampled": {"predicted_tokens_per_call": {"2": 1.7}}}
    assert BF.expected_tokens_per_call(cal) == {2: 1.7}


@pytest.mark.slow
def test_frames_through_onnx_runtime_beside_eager(small):
    """A 4-code model: the ONNX frame graph unrolls every code, so its export stays short."""
    if not available("onnx")[0]:
        pytest.skip(available("onnx")[1])
    runners, absent = S.build_runners(["eager", "onnx"], small, [AR(), Chain(2), TREE])
    assert absent == {} and [(r.backend, r.fused) for r in runners if r.name.label == "ar"] == [
        ("eager", False), ("eager", True), ("onnx", False), ("onnx", True)]  # onnx: the AR frame graph fused
    out = S.time_frames(runners, S.random_contexts(small, 3), repeats=2, warmup=1, progress=False)
    rows = {(r["decoder"], r["backend"], r["fused"]): r for r in out["rows"]}
    for r in rows.values():
        ar = rows[("ar", r["backend"], False)]
        assert r["speedup_vs_ar"] == pytest.approx(ar["ms_per_frame"] / r["ms_per_frame"])
    assert rows[("tree:0;1;0,0", "onnx", False)]["tokens_per_call"] == \
        rows[("tree:0;1;0,0", "eager", False)]["tokens_per_call"]  # the same frames, the same codes


def test_speedups_over_ar_names_the_fastest_ar_and_the_gain_over_each():
    rows = [dict(r) for r in ROWS] + [_row("paper:4", "paper", 4, 18.0, tpc=1.4),
                                      _row("ar", "ar", 1, 8.0, backend="native", fused=True),
                                      _row("chain:4", "chain", 4, 9.0, backend="native", fused=True, tpc=2.5)]
    out = BF.speedups_over_ar(rows)
    assert [(r["ar"], r["ar_ms"]) for r in out] == [("ar (native, fused)", 8.0), ("ar (eager, fused)", 15.0),
                                                    ("ar (onnx)", 20.0), ("ar (eager)", 30.0)]
    assert [r["fastest_ar"] for r in out] == [True, False, False, False]
    assert [r["ar_vs_fastest_ar"] for r in out] == [1.0, 15.0 / 8.0, 20.0 / 8.0, 30.0 / 8.0]
    # the fastest LOSSLESS speculative runner of the run (the lossy control at 10 ms never counts)
    assert {r["fastest_speculative"] for r in out} == {"chain:4 (native, fused)"}
    assert [r["speedup"] for r in out] == [8.0 / 9.0, 15.0 / 9.0, 20.0 / 9.0, 30.0 / 9.0]
    same = {r["ar"]: (r["same_backend_speculative"], r["same_backend_speedup"]) for r in out}
    assert same["ar (eager)"] == ("chain:4 (eager, fused)", 30.0 / 12.0)
    assert same["ar (onnx)"] == ("tree:0;1 (onnx)", 20.0 / 16.0)
    assert {r["paper_decoder"] for r in out} == {"paper:4 (eager)"} and out[-1]["paper_speedup"] == 30.0 / 18.0
    assert BF.speedups_over_ar([r for r in rows if r["kind"] != "ar"]) == []


def test_cost_growth_words_follow_the_measurements():
    from paper.notebook_measures import cost_growth_words

    assert cost_growth_words({1: 1.0, 2: 1.05, 4: 1.08, 8: 1.18, 16: 1.58, 32: 2.39}) == \
        "within 1.2x of one position up to N = 8, first 2x or more at N = 32 (2.39x)"
    assert cost_growth_words({"1": 1.0, "2": 1.3, "4": 1.5}) == \
        "1.30x one position already at N = 2, below 2x up to N = 4"
    assert cost_growth_words({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.1}) == \
        "within 1.2x of one position up to N = 2, below 2x up to N = 8"  # a dip after a rise is not "near one"
    assert cost_growth_words({1: 1.0, 2: 0.9, 8: 1.1}) == "within 1.2x of one position up to N = 8, the largest N timed"
    with pytest.raises(ValueError, match="N > 1"):
        cost_growth_words({1: 1.0})


def test_expected_tokens_per_call_of_one_kind():
    """E(N) per frame (what a decoder measures), never one round's expected codes (``call_expected_tokens``)."""
    cal = {"best_kind": {"2": "sampled", "4": "point-mass"},
           "sampled": {"predicted_tokens_per_call": {"2": 1.7, "4": 2.4},
                       "call_expected_tokens": {"2": 1.9, "4": 3.0}},
           "point-mass": {"predicted_tokens_per_call": {"2": 1.1, "4": 2.6},
                          "call_expected_tokens": {"2": 1.2, "4": 2.9}}}
    assert BF.expected_tokens_per_call(cal) == {2: 1.7, 4: 2.6}
    assert BF.expected_tokens_per_call(cal, "point-mass") == {2: 1.1, 4: 2.6}
    assert BF.expected_tokens_per_call(cal, "sampled") == {2: 1.7, 4: 2.4}
    rows = BF.projected_speedup(BF.expected_tokens_per_call(cal, "sampled"),
                               [{"backend": "native", "query_positions": q, "ratio_to_q1": r}
                                for q, r in ((1, 1.0), (2, 1.1), (4, 1.6))])
    assert [r["projected_speedup"] for r in rows] == [1.7 / 1.1, 2.4 / 1.6]


def test_read_gain_the_tie_rule_both_directions_and_its_edge():
    from paper import notebook_measures as M

    # rel_se 0.1 -> factor 1.2, edge band 0.1 x 0.2 = 0.02 either side of it
    assert M.noise_factor(0.1) == pytest.approx(1.2) and M.noise_factor(None) is None and M.noise_factor(0.0) is None
    assert M.read_gain(1.1, 0.1) == "tie" and M.read_gain(1 / 1.1, 0.1) == "tie"
    assert M.read_gain(1.3, 0.1) == "faster" and M.read_gain(1 / 1.3, 0.1) == "slower"
    assert M.read_gain(1.19, 0.1) == "edge" and M.read_gain(1.21, 0.1) == "edge" and M.read_gain(1 / 1.21, 0.1) == "edge"
    assert M.read_gain(1.17, 0.1) == "tie" and M.read_gain(1.23, 0.1) == "faster"  # just outside the band
    assert M.read_gain(None, 0.1) is None and M.read_gain(2.0, None) is None  # nothing to read
    with pytest.raises(ValueError, match="> 0"):
        M.read_gain(0.0, 0.1)
