"""The three exportable graphs (rvqspec_lib.device.export_graphs) in eager PyTorch, against the official module.

Exact where the arithmetic is the official module's (hidden states, caches, stepped logits: bit-identical), to
summation order where the verify graph applies its heads as one batched product (1e-6 relative). Beyond single
calls: a whole greedy frame driven through the stepped graph equals decode_frame's AR, and a whole greedy frame
driven through the fused verify graph (drafts from its own draft logits, new positions written into free slots,
never compacted) equals it too. Negative controls: swapped heads and a wrong write slot are caught.
"""

from __future__ import annotations

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.device import export_graphs as G
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree

TREE = DraftTree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)])


def _call(graph, inputs: dict) -> dict:
    """A graph in eager PyTorch on named inputs: ``{output name: tensor}``."""
    with torch.no_grad():
        out = graph(*[inputs[s.name] for s in graph.input_specs()])
    return dict(zip([s.name for s in graph.output_specs()], out if isinstance(out, tuple) else (out,)))


def _ctx(cp, b, seed=0):
    return torch.randn(b, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(seed))


def _graphs(cp):
    return {"stepped": G.SteppedGraph(cp), "stepped-b3": G.SteppedGraph(cp, batch=3),
            "verify-tree": G.VerifyGraph(cp, 5, tree=TREE), "verify-chain-b2": G.VerifyGraph(
                cp, 4, tree=DraftTree.chain(3), batch=2),
            "verify-hidden": G.VerifyGraph(cp, 7, outputs="hidden"), "frame": G.FrameGraph(cp, batch=2)}


@pytest.mark.parametrize("name", ["stepped", "stepped-b3", "verify-tree", "verify-chain-b2", "verify-hidden",
                                  "frame"])
@pytest.mark.parametrize("depth", [1, 6])
def test_graph_equals_the_official_module(cp, name, depth):
    g = _graphs(cp)[name].eval()
    inp = G.example_inputs(g, seed=depth, frame_depth=depth)
    got, ref = _call(g, inp), G.reference_outputs(g, inp)
    assert set(got) == set(ref) == {s.name for s in g.output_specs()}
    for k, r in ref.items():
        spec = next(s for s in g.output_specs() if s.name == k)
        assert tuple(got[k].shape) == spec.shape and got[k].dtype == spec.dtype, k
        if k in ("verify_logits", "draft_logits"):  # one batched product instead of one matmul per head
            assert float((got[k] - r).abs().max()) <= 1e-6 * float(r.abs().max()), k
        else:
            assert torch.equal(got[k], r), k


def test_swapped_heads_are_caught(cp):
    """Negative control: a verify graph whose stacked heads 3 and 4 are swapped fails the same comparison."""
    g = G.VerifyGraph(cp, 5, tree=TREE).eval()
    g.head_weight[[3, 4]] = g.head_weight[[4, 3]].clone()
    inp = G.example_inputs(g, frame_depth=3)  # the root at depth 3: head 3 verifies it, head 4 drafts
    got, ref = _call(g, inp), G.reference_outputs(g, inp)
    assert float((got["verify_logits"] - ref["verify_logits"]).abs().max()) > 1e-3


def test_buffers_hold_the_cache_as_float16_state(cp):
    """state='buffers' (Core ML): the call updates its buffers in place with what state='inputs' returns, rounded
    to float16 (Core ML states are float16); the logits are those of a float16-rounded cache."""
    gi, gb = G.SteppedGraph(cp).eval(), G.SteppedGraph(cp, state="buffers").eval()
    inp = G.example_inputs(gi, frame_depth=4)
    k16, v16 = inp["k_cache"].half(), inp["v_cache"].half()
    gb.k_cache.copy_(k16)
    gb.v_cache.copy_(v16)
    out_b = _call(gb, inp)
    out_i = _call(gi, {**inp, "k_cache": k16.float(), "v_cache": v16.float()})
    assert torch.equal(out_b["logits"], out_i["logits"])
    assert gb.k_cache.dtype == torch.float16 and torch.equal(gb.k_cache, out_i["k_cache_out"].half())
    assert [s.name for s in gb.input_specs()] == ["inputs_embeds", "position"]
    assert [s.dtype for s in gb.state_specs()] == [torch.float16, torch.float16]
    gb.reset_state()
    assert not bool(gb.k_cache.any())


def test_stepped_graph_decodes_a_greedy_frame_as_ar(cp):
    """One stepped call per position (the context's two, then each code), head j's argmax at position j + 1: the
    codes of decode_frame's AR, greedy, for a batch of 3."""
    g = G.SteppedGraph(cp, batch=3).eval()
    ctx = _ctx(cp, 3)
    ref = decode_frame(cp, ctx, sampling=Sampling(greedy=True)).codes
    n = P.n_codes(cp)
    k = torch.zeros(g.cache_shape)
    v = torch.zeros(g.cache_shape)
    x = cp.small_to_mtp_projection(ctx)
    codes = []
    with torch.no_grad():
        for pos in range(n + 1):
            if pos < 2:
                e = x[:, pos: pos + 1]
            else:
                e = P.embed_codes(cp, codes[-1][:, None], torch.full((3, 1), pos - 1))
            logits, k, v = g(e, torch.full((3,), pos, dtype=torch.int32), k, v)
            if pos >= 1:
                codes.append(logits[:, pos - 1].argmax(-1))
    assert torch.equal(torch.stack(codes, 1), ref)


def greedy_frame_through_verify_graph(cp, run, n_query: int, ctx: torch.Tensor, *, dtype=torch.float32):
    """A greedy speculative frame (batch 1) driven through a fused verify graph of a CHAIN of ``n_query - 1``
    drafts, as a device would run it: the prefill is a verify call with two live positions (the rest masked), drafts
    come from the graph's own ``draft_logits`` of the last accepted node, accepted while they equal the verifier's
    argmax, and the next call writes its positions into the slots not holding a committed position (no compaction).
    ``run(inputs) -> outputs`` runs the graph on named inputs (eager, ONNX Runtime). Returns ``((1, n_codes) codes,
    calls)``."""
    n, k = P.n_codes(cp), n_query - 1
    slots = n + 1 + n_query
    cache = {"k_cache": torch.zeros(0), "v_cache": torch.zeros(0)}
    tree = DraftTree.chain(k)
    committed: list[int] = []  # slots holding committed positions
    codes: list[int] = []
    calls = 0

    def call(embeds, positions, live, parents):
        nonlocal calls
        free = [s for s in range(slots) if s not in committed][:n_query]
        allow = torch.zeros(1, n_query, slots, dtype=dtype)
        allow[0, :, committed] = 1
        for i in range(n_query):
            for j in range(n_query):
                if parents[i, j] and live[j]:
                    allow[0, i, free[j]] = 1
            allow[0, i, free[i]] = 1
        out = run({"inputs_embeds": embeds.to(dtype), "positions": positions.to(torch.int32)[None],
                   "attention_mask": allow, "write_slots": torch.tensor([free], dtype=torch.int32), **cache})
        cache["k_cache"], cache["v_cache"] = out["k_cache_out"], out["v_cache_out"]
        calls += 1
        return out, free

    shape = (len(cp.model.layers), 1, int(cp.config.num_key_value_heads), slots,
             int(cp.config.head_dim))
    cache["k_cache"], cache["v_cache"] = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    # prefill: positions 0 and 1 (the context), the other query positions masked to themselves
    hid = int(cp.config.hidden_size)
    embeds = torch.zeros(1, n_query, hid)
    embeds[0, :2] = cp.small_to_mtp_projection(ctx)[0]
    live = [True, True] + [False] * (n_query - 2)
    causal = torch.tensor([[j <= i and i < 2 for j in range(n_query)] for i in range(n_query)])
    out, free = call(embeds, torch.tensor([0, 1] + [0] * (n_query - 2)), live, causal)
    committed += free[:2]
    codes.append(int(out["verify_logits"][0, 1].argmax()))
    # the draft logits of node 1 (depth 1) predict depths 2..K+1 (heads 1..K)
    drafts = [int(x) for x in out["draft_logits"][0, 1].argmax(-1)]
    while len(codes) < n:
        s = len(codes)  # depth of the last committed code (the root)
        node_codes = [codes[-1]] + drafts
        depths = [s + t for t in range(n_query)]
        live = [d <= n for d in depths]  # drafts never run past the last depth
        embeds = P.embed_codes(cp, torch.tensor([node_codes]), torch.tensor([depths]).clamp(max=n))
        out, free = call(embeds, torch.tensor(depths) + 1, live, tree.ancestors)
        a = 0  # drafts accepted: each equal to the verifier's argmax after its parent
        while a < k and live[a + 1] and depths[a + 1] <= n and node_codes[a + 1] == int(
                out["verify_logits"][0, a].argmax()):
            a += 1
        codes += node_codes[1: a + 1]
        committed += free[: a + 1]  # the root and the accepted nodes' positions
        if len(codes) < n:
            codes.append(int(out["verify_logits"][0, a].argmax()))  # the correction / bonus code
            drafts = [int(x) for x in out["draft_logits"][0, a].argmax(-1)]
    return torch.tensor([codes[:n]]), calls


@pytest.mark.parametrize("n_query", [2, 4, 8])
def test_verify_graph_decodes_a_greedy_frame_as_ar_without_compaction(cp, n_query):
    g = G.VerifyGraph(cp, n_query, tree=DraftTree.chain(n_query - 1)).eval()
    for seed in range(3):
        ctx = _ctx(cp, 1, seed)
        ref = decode_frame(cp, ctx, sampling=Sampling(greedy=True)).codes
        got, calls = greedy_frame_through_verify_graph(cp, lambda inp: _call(g, inp), n_query, ctx)
        assert torch.equal(got, ref)
        assert calls <= P.n_codes(cp)


def test_a_wrong_write_slot_is_caught(cp):
    """Negative control: writing every call's positions one slot later than the mask says breaks the frame."""
    g = G.VerifyGraph(cp, 4, tree=DraftTree.chain(3)).eval()

    def shifted(inp):
        return _call(g, {**inp, "write_slots": (inp["write_slots"] + 1).clamp(max=g.slots - 1)})
    ctx = _ctx(cp, 1)
    ref = decode_frame(cp, ctx, sampling=Sampling(greedy=True)).codes
    got, _ = greedy_frame_through_verify_graph(cp, shifted, 4, ctx)
    assert not torch.equal(got, ref)


def test_frame_graph_is_the_fused_frame(cp):
    g = G.FrameGraph(cp, batch=2).eval()
    inp = G.example_inputs(g, seed=3)
    got = _call(g, inp)["codes"]
    assert got.dtype == torch.int32 and torch.equal(got.long(), g.fused.frame(inp["context"], inp["noise"]))


def test_bad_input_is_refused_in_one_line(cp):
    cases = [
        (lambda: G.build_graph(cp, "tree"), "unknown graph"),
        (lambda: G.build_graph(cp, "verify", nodes=1), "2..64"),
        (lambda: G.build_graph(cp, "verify", nodes=65), "2..64"),
        (lambda: G.build_graph(cp, "stepped", nodes=4), "verify graph"),
        (lambda: G.VerifyGraph(cp, 5, tree=DraftTree.chain(3)), "needs a tree of 4"),
        (lambda: G.VerifyGraph(cp, 4), "needs a tree"),
        (lambda: G.VerifyGraph(cp, 0, outputs="hidden"), "1..64"),
        (lambda: G.SteppedGraph(cp, state="disk"), "state must be"),
        (lambda: G.check_exportable(torch.nn.Linear(2, 2)), "export needs the official code predictor"),
    ]
    for make, words in cases:
        with pytest.raises(ValueError, match=words) as e:
            make()
        assert "\n" not in str(e.value)


def test_heads_with_a_bias_cannot_be_exported():
    lm = load_model("tiny-random")
    cp = lm.code_predictor
    head = cp.lm_head[0]
    cp.lm_head[0] = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with pytest.raises(ValueError, match="bias"):
        G.SteppedGraph(cp)
