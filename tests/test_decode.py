"""decode_frame: greedy equality with AR and the official ``generate``, seeded sampling, batching, boundaries, errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import FrameResult, decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree, parse_paths
from rvqspec_lib.decoding.verify import walk_tree

GREEDY = Sampling(greedy=True)
TREES = {
    "small": [(0,), (1,), (0, 0)],
    "default": [(0,), (1,), (0, 0), (0, 0, 0)],
    "wide": [(0,), (1,), (2,), (3,), (4,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
    "deep": [(0,) * t for t in range(1, 8)],  # a chain of 7 point-mass drafts
    "deep-and-wide": [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0), (0, 0, 0, 0, 0)],
}
DECODERS = [AR()] + [Chain(n) for n in (2, 3, 4, 8)] + [Tree(p) for p in TREES.values()]
DEC_IDS = ["AR"] + [f"Chain{n}" for n in (2, 3, 4, 8)] + [f"Tree-{k}" for k in TREES]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def _cp(tiny, dtype):
    cp = tiny.code_predictor
    return cp if dtype == torch.float32 else _converted(tiny, dtype)


_CACHE: dict = {}


def _converted(tiny, dtype):
    if dtype not in _CACHE:
        _CACHE[dtype] = load_model("tiny-random", dtype=torch.float32).code_predictor.to(dtype)
    return _CACHE[dtype]


def _context(cp, b, seed=0, dtype=None):
    h = cp.model.codec_embedding[0].embedding_dim
    dtype = dtype or next(cp.parameters()).dtype
    return torch.randn(b, 2, h, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _official_greedy(cp, ctx):
    return cp.generate(inputs_embeds=ctx, max_new_tokens=int(cp.config.num_code_groups) - 1, do_sample=False)


def _check_invariants(res: FrameResult, n: int, vocab: int, window: int):
    b = res.codes.shape[0]
    assert res.codes.shape == (b, n) and res.codes.dtype == torch.long
    assert bool((res.codes >= 0).all()) and bool((res.codes < vocab).all())
    assert res.calls.shape == (b,)
    assert bool((res.calls >= math.ceil(n / window)).all()) and bool((res.calls <= n).all())
    # tighter: the prefill commits 1 code, every later call at most `window`
    assert bool((res.calls >= 1 + math.ceil((n - 1) / window)).all())
    assert torch.equal(res.committed.sum(1), torch.full((b,), n, dtype=torch.long))
    assert torch.equal((res.committed > 0).sum(1), res.calls)  # every call commits >= 1 code, then zeros
    assert bool((res.committed <= window).all()) and bool((res.committed[:, 0] == 1).all())
    assert bool((res.accepted <= res.committed).all()) and bool((res.accepted <= window - 1).all())
    assert bool((res.accepted >= 0).all())
    # start depth of call k = codes committed before it (0 for the prefill)
    before = torch.cumsum(res.committed, 1) - res.committed
    live = res.committed > 0
    assert torch.equal(res.start_depth[live], before[live])
    torch.testing.assert_close(res.tokens_per_call, n / res.calls.double())


def _window(dec) -> int:
    if isinstance(dec, AR):
        return 1
    if isinstance(dec, Chain):
        return dec.window
    return DraftTree.from_paths(dec.paths).max_depth + 1


# ----------------------------------------------------------------------------------------------------------------
# greedy equality: AR == Chain(N) == Tree(...) == official generate
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("b", [1, 4])
def test_greedy_every_decoder_equals_official_generate(tiny, dtype, b):
    cp = _cp(tiny, dtype)
    ctx = _context(cp, b, seed=b)
    with torch.inference_mode():
        official = _official_greedy(cp, ctx)
    n = int(cp.config.num_code_groups) - 1
    assert official.shape == (b, n)
    for dec in DECODERS:
        res = decode_frame(cp, ctx, decoder=dec, sampling=GREEDY, generator=torch.Generator().manual_seed(0))
        assert torch.equal(res.codes, official), f"{dec!r} ({dtype}, B={b}) differs from the official greedy codes"
        _check_invariants(res, n, cp.config.vocab_size, _window(dec))


def test_bfloat16_runs_for_every_decoder_and_reports_agreement(tiny):
    """bf16: every decoder runs and keeps the invariants; AR vs official greedy agreement is reported (bf16 sums in a
    different order give different roundings, so exact equality is not required)."""
    cp = _cp(tiny, torch.bfloat16)
    ctx = _context(cp, 4, seed=3)
    n = int(cp.config.num_code_groups) - 1
    with torch.inference_mode():
        official = _official_greedy(cp, ctx)
    report = {}
    for dec, name in zip(DECODERS, DEC_IDS):
        for sampling in (GREEDY, Sampling()):
            res = decode_frame(cp, ctx, decoder=dec, sampling=sampling, generator=torch.Generator().manual_seed(0))
            _check_invariants(res, n, cp.config.vocab_size, _window(dec))
            if sampling is GREEDY:
                report[name] = float((res.codes == official).float().mean())
    msg = "bf16 greedy agreement with the official generate: " + ", ".join(f"{k} {v:.2f}" for k, v in report.items())
    print(msg)
    if report["AR"] < 1.0:
        warnings.warn(msg)
    assert report["AR"] >= 0.5, msg  # a gross mismatch (wrong positions / heads) would agree on ~0 codes


# ----------------------------------------------------------------------------------------------------------------
# sampled AR == official generate with the same seed; seeded determinism
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("seed", [0, 17])
def test_sampled_ar_equals_official_generate_with_same_seed(tiny, b, seed):
    cp = tiny.code_predictor
    ctx = _context(cp, b, seed=100 + b)
    torch.manual_seed(seed)
    with torch.inference_mode():
        official = cp.generate(inputs_embeds=ctx, max_new_tokens=15, do_sample=True, top_k=50, top_p=1.0,
                               temperature=0.9)
    res = decode_frame(cp, ctx, decoder=AR(), sampling=Sampling(temperature=0.9, top_k=50, top_p=1.0),
                       generator=torch.Generator().manual_seed(seed))
    assert torch.equal(res.codes, official)


def test_decode_never_touches_the_global_rng(tiny):
    cp = tiny.code_predictor
    ctx = _context(cp, 2)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    for dec in (AR(), Chain(4), Tree()):
        decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("dec", DECODERS, ids=DEC_IDS)
def test_seeded_determinism(tiny, dec):
    cp = tiny.code_predictor
    ctx = _context(cp, 3, seed=9)
    run = lambda s: decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(s))  # noqa: E731
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.calls, b.calls) and torch.equal(a.committed, b.committed)
    assert not torch.equal(a.codes, c.codes)


def test_unseeded_generator_is_allowed(tiny):
    cp = tiny.code_predictor
    res = decode_frame(cp, _context(cp, 2), decoder=Chain(3))
    _check_invariants(res, 15, cp.config.vocab_size, 3)


# ----------------------------------------------------------------------------------------------------------------
# batch == per row
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dec", DECODERS, ids=DEC_IDS)
def test_batch_equals_per_row_greedy(tiny, dec):
    cp = tiny.code_predictor
    ctx = _context(cp, 5, seed=21)
    batch = decode_frame(cp, ctx, decoder=dec, sampling=GREEDY)
    for i in range(5):
        row = decode_frame(cp, ctx[i:i + 1], decoder=dec, sampling=GREEDY)
        assert torch.equal(batch.codes[i], row.codes[0]), f"row {i}"
        assert int(batch.calls[i]) == int(row.calls[0])
        k = int(row.calls[0])
        assert torch.equal(batch.committed[i, :k], row.committed[0, :k])


def test_rows_of_a_batch_may_accept_different_lengths(tiny):
    cp = tiny.code_predictor
    res = decode_frame(cp, _context(cp, 16, seed=2), decoder=Chain(4), generator=torch.Generator().manual_seed(0))
    _check_invariants(res, 15, cp.config.vocab_size, 4)
    # done rows log zeros while others continue
    assert bool((res.committed == 0).any()) or bool((res.calls == res.calls[0]).all())


# ----------------------------------------------------------------------------------------------------------------
# boundaries
# ----------------------------------------------------------------------------------------------------------------
def _small_cp(n_groups, seed=0, vocab=16):
    cfg = tiny_config_dict(n_code_groups=n_groups, codebook_size=vocab)
    return build_from_config(cfg, seed=seed).talker.code_predictor


def test_window_longer_than_the_frame():
    """Chain(8) on a 4-group model (3 codes): the window shrinks, greedy still equals AR and generate."""
    cp = _small_cp(4)
    ctx = _context(cp, 4)
    with torch.inference_mode():
        official = _official_greedy(cp, ctx)
    for dec in (AR(), Chain(8), Chain(3), Tree([(0,), (1,), (0, 0)]), Tree([(0,), (0, 0)])):
        res = decode_frame(cp, ctx, decoder=dec, sampling=GREEDY)
        assert torch.equal(res.codes, official), dec
        _check_invariants(res, 3, 16, min(_window(dec), 3))
        assert bool((res.calls <= 3).all()) and bool((res.calls >= 2).all())
    sampled = decode_frame(cp, ctx[:1].expand(64, -1, -1), decoder=Chain(8), generator=torch.Generator().manual_seed(0))
    _check_invariants(sampled, 3, 16, 3)


def test_tree_running_past_the_last_depth():
    """A depth-4 tree on the 15-code model: near the end of the frame its deep nodes are masked; greedy equals AR."""
    cp = _small_cp(16, seed=3)
    ctx = _context(cp, 3, seed=1)
    ar = decode_frame(cp, ctx, decoder=AR(), sampling=GREEDY)
    for paths in (TREES["default"] + [(0, 0, 0, 0)], TREES["deep"], TREES["deep-and-wide"]):
        res = decode_frame(cp, ctx, decoder=Tree(paths), sampling=GREEDY)
        assert torch.equal(res.codes, ar.codes)
        _check_invariants(res, 15, 16, _window(Tree(paths)))
        # the last call never starts past depth 14
        assert int(res.start_depth.max()) <= 14


def test_tree_deeper_than_the_whole_frame_shrinks():
    """A tree deeper than the depths that can ever be drafted shrinks like a long chain window: greedy equals AR."""
    cp = _small_cp(4)
    ctx = _context(cp, 2)
    ar = decode_frame(cp, ctx, decoder=AR(), sampling=GREEDY)
    res = decode_frame(cp, ctx, decoder=Tree([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]), sampling=GREEDY)
    assert torch.equal(res.codes, ar.codes)
    two = _small_cp(2)
    res2 = decode_frame(two, _context(two, 2), decoder=Tree([(0,), (0, 0)]), sampling=GREEDY)
    assert bool((res2.calls == 1).all())


def test_tree_rank_out_of_codebook_is_a_clear_error():
    cp = _small_cp(4, vocab=16)
    with pytest.raises(ValueError, match="rank 16 is out of range"):
        decode_frame(cp, _context(cp, 1), decoder=Tree([(0,), (16,)]))


def test_two_code_groups_one_code_per_frame():
    """n_code_groups = 2: the prefill gives the frame's only code; speculation has nothing to draft."""
    cp = _small_cp(2)
    ctx = _context(cp, 3)
    with torch.inference_mode():
        official = _official_greedy(cp, ctx)
    assert official.shape == (3, 1)
    for dec in (AR(), Chain(2), Chain(8), Tree([(0,)])):
        res = decode_frame(cp, ctx, decoder=dec, sampling=GREEDY)
        assert torch.equal(res.codes, official)
        assert bool((res.calls == 1).all()) and torch.equal(res.committed, torch.ones(3, 1, dtype=torch.long))
        torch.testing.assert_close(res.tokens_per_call, torch.ones(3, dtype=torch.float64))
        sampled = decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(1))
        _check_invariants(sampled, 1, 16, 1)


def _p_equals_q_cp():
    """A code predictor whose hidden state is the same at every position: every layer's output projections are zero
    (the residual stream is the input), code embeddings are zero and the context is zero, so every input is the
    projection's bias. Then the drafter's q (lm_head[s+j-1] on H_s) equals the verifier's p (the same head on
    H_{s+j-1}) exactly."""
    cp = _small_cp(16, seed=4, vocab=32)
    with torch.no_grad():
        for layer in cp.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for e in cp.model.codec_embedding:
            e.weight.zero_()
        cp.small_to_mtp_projection.bias.copy_(torch.randn(cp.small_to_mtp_projection.bias.shape,
                                                          generator=torch.Generator().manual_seed(0)))
        for head in cp.lm_head:
            head.weight.mul_(10.0)
    return cp


def test_p_equals_q_every_draft_accepted():
    """End to end p == q: Chain(N) accepts every sampled draft (14 codes after the prefill: ceil(14/N) calls)."""
    cp = _p_equals_q_cp()
    ctx = torch.zeros(8, 2, cp.model.codec_embedding[0].embedding_dim)
    for n in (2, 4, 8):
        res = decode_frame(cp, ctx, decoder=Chain(n), generator=torch.Generator().manual_seed(n))
        assert bool((res.calls == 1 + math.ceil(14 / n)).all()), (n, res.calls)
        live = res.committed[:, 1:] > 0
        start = res.start_depth[:, 1:][live]
        full = torch.clamp(15 - start, max=n - 1)  # every draft the window holds, fewer at the end of the frame
        assert torch.equal(res.accepted[:, 1:][live], full)
        # a bonus code follows unless the last accepted draft was the frame's last code
        assert torch.equal(res.committed[:, 1:][live], full + (start + full < 15).long())
        _check_invariants(res, 15, 32, n)


def test_p_equals_q_in_walk_tree():
    """p == q at the level of the accept rule (dyadic probabilities: p(x)/q(x) is exactly 1)."""
    n, v = 1000, 4
    pr = torch.tensor([0.5, 0.25, 0.125, 0.125])
    g = torch.Generator().manual_seed(0)
    codes = torch.cat([torch.zeros(n, 1, dtype=torch.long), torch.multinomial(pr.expand(n, v), 3, True, generator=g)],
                      1)
    tree = DraftTree.chain(3)
    p = pr.expand(n, 4, v).clone()
    walk = walk_tree(p, codes, tree.children, torch.ones(n, 4, dtype=torch.bool), torch.ones(n, 4, dtype=torch.bool),
                     g, p.clone())
    assert bool((walk.n_accepted == 3).all()) and bool((walk.last_node == 3).all())
    assert torch.equal(walk.path, torch.tensor([1, 2, 3]).expand(n, 3))


@pytest.mark.parametrize("dec", DECODERS, ids=DEC_IDS)
def test_frame_result_invariants_sampled(tiny, dec):
    cp = tiny.code_predictor
    res = decode_frame(cp, _context(cp, 6, seed=4), decoder=dec, generator=torch.Generator().manual_seed(3))
    _check_invariants(res, 15, cp.config.vocab_size, _window(dec))


# ----------------------------------------------------------------------------------------------------------------
# bad arguments
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [1, 9, 0, -2, 2.5, "4", True, None])
def test_chain_bad_window(window):
    with pytest.raises(ValueError, match=r"window.*2\.\.8"):
        Chain(window)


@pytest.mark.parametrize("paths,word", [
    ([], "at least one"),
    ((), "at least one"),
    ([(0, 0)], "gap"),
    ([(0,), (0, 1, 0)], "gap"),
    ([(-1,)], "negative"),
    ([(0,), (0, -3)], "negative"),
    ([(0,), (1,), (0,)], "repeated"),
    ([()], "empty"),
    ([(0.5,)], "integer"),
    ([("a",)], "integer"),
])
def test_tree_bad_paths(paths, word):
    with pytest.raises(ValueError, match=word):
        Tree(paths)


def test_bad_context_shapes(tiny):
    cp = tiny.code_predictor
    h = cp.model.codec_embedding[0].embedding_dim
    for bad in (torch.zeros(2, 3, h), torch.zeros(2, 2, h + 1), torch.zeros(2, h), torch.zeros(0, 2, h),
                torch.zeros(2, 2, h, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"context"):
            decode_frame(cp, bad)
    with pytest.raises(ValueError, match=rf"\(B, 2, {h}\)"):
        decode_frame(cp, torch.zeros(1, 3, h))


def test_bad_decoder(tiny):
    cp = tiny.code_predictor
    with pytest.raises(ValueError, match="decoder"):
        decode_frame(cp, _context(cp, 1), decoder="chain")


def test_parse_paths():
    assert parse_paths("0;1;0,0;0,0,0") == [(0,), (1,), (0, 0), (0, 0, 0)]
    assert parse_paths(" 0 ; 1 ;") == [(0,), (1,)]
    for bad in ("a", "0;x", "", "  ", "0,,1"):
        with pytest.raises(ValueError):
            parse_paths(bad)
    # parsed paths compile into the same tree as written ones
    assert Tree(parse_paths("0;1;0,0")) == Tree([(0,), (1,), (0, 0)])


def test_draft_tree_structure():
    t = DraftTree.from_paths([(1,), (0,), (0, 0), (0, 1), (1, 0)])
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert t.n_nodes == 5 and t.max_depth == 2 and t.max_rank == 1
    assert t.parent.tolist() == [-1, 0, 0, 1, 1, 2]
    assert t.children[0].tolist()[:2] == [1, 2] and t.children[1].tolist()[:2] == [3, 4]
    assert bool(t.ancestors[5, 2]) and bool(t.ancestors[5, 0]) and not bool(t.ancestors[5, 1])
