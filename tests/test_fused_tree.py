"""The fused speculative tree round (rvqspec_lib.models.fused_tree): a point-mass tree, one graph a round, uniforms
drawn up front.

Exact: greedy codes equal AR's code for code, and each row takes as many calls as decode_frame's Tree of the same
paths (the same walk); a row's codes depend on its own uniforms only (alone == in a batch whose rows part; other
uniforms, other codes); the compiled graphs give the eager functions' codes (a 4-codebook model: start depths where
the tree is cut by the frame's end). Distribution: the G-test of tests/test_lossless.py against the exact AR pmf
(its variants, pooling and frame counts), each case failing with probability 1e-3 for a correct sampler; 4 positive
cases here (3 in float32, 1 in int8 against the int8 module's own pmf): a union bound of 0.4 %. Negative controls,
rejected at the same level: a rejected child keeps its mass (no point-mass residual); every child accepted.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
import rvqspec_lib.models.fused_tree as FT
from rvqspec_lib.models import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.models.fused_tree import FusedTreeFrame
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import DEFAULT_TREE, Tree
from rvqspec_lib.decoding.sampling import Sampling
from tests.test_lossless import (ALPHA, DEFAULT, HOT_TOPK3, MIN_POWER, N_GROUPS, TREE_SMALL, TREE_WIDE, exact_pmf,
                                 frames_needed, g_test, power, variant)

TREES = [Tree(DEFAULT_TREE), TREE_WIDE, Tree(((1,), (0,), (1, 0))), Tree(tuple((0,) * t for t in range(1, 6)))]


def _ctx(cp, b, seed=0):
    return torch.randn(b, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tree", TREES, ids=lambda t: str(len(t.paths)) + "-" + str(t.tree(0).max_depth))
def test_greedy_fused_tree_equals_ar_and_walks_as_decode_frame(cp, tree):
    g = Sampling(greedy=True)
    ctx = _ctx(cp, 5)
    ar = decode_frame(cp, ctx, sampling=g).codes
    ref = decode_frame(cp, ctx, decoder=tree, sampling=g)
    f = FusedTreeFrame(cp, tree, g, compile=False)
    got = f.decode(ctx, torch.Generator().manual_seed(0))
    assert torch.equal(got, ar) and torch.equal(ref.codes, ar)
    assert f.last_calls == ref.calls.tolist()


def test_a_row_depends_on_its_own_uniforms_only(cp):
    f = FusedTreeFrame(cp, TREE_WIDE, compile=False)
    ctx = _ctx(cp, 6)
    u = f.uniforms(6, torch.Generator().manual_seed(1))
    assert u.shape == (6, P.n_codes(cp), 2 * 3 + 1) and u.dtype == torch.float64  # depth 2, 3 children, + 1
    batch = f(ctx, u)
    assert len(set(f.last_calls)) > 1  # rows parted: one call per depth present
    assert torch.equal(batch, torch.cat([f(ctx[i:i + 1], u[i:i + 1]) for i in range(6)]))
    assert not torch.equal(batch, f.decode(ctx, torch.Generator().manual_seed(2)))  # negative control


def test_bad_input_is_one_line(cp):
    with pytest.raises(ValueError, match="point-mass trees"):
        FusedTreeFrame(cp, Tree(((0,), (1,)), sampled=True), compile=False)
    vocab = int(cp.config.vocab_size)
    with pytest.raises(ValueError, match=f"rank {vocab} is out of range for a codebook of {vocab} codes"):
        FusedTreeFrame(cp, [(0,), (vocab,)], compile=False)
    f = FusedTreeFrame(cp, TREE_SMALL, compile=False)
    with pytest.raises(ValueError, match=r"uniforms must have shape \(2, 15, 5\) \(FusedTreeFrame.uniforms\)"):
        f(_ctx(cp, 2), torch.rand(2, 15, 7, dtype=torch.float64))


@pytest.mark.slow
def test_compiled_fused_tree_equals_eager():
    small = build_from_config(tiny_config_dict(n_code_groups=4, codebook_size=8), seed=0).talker.code_predictor
    ctx = _ctx(small, 6)
    eager, comp = FusedTreeFrame(small, TREE_WIDE, compile=False), FusedTreeFrame(small, TREE_WIDE, compile=True)
    comp.compile_all(1)
    assert set(comp.compile_s) == {("prefill", 1), (1, 1), (2, 1)}
    for seed in range(6):
        u = eager.uniforms(1, torch.Generator().manual_seed(seed))
        assert torch.equal(comp(ctx[seed:seed + 1], u), eager(ctx[seed:seed + 1], u))


# ----------------------------------------------------------------------------------------------------------------
# the distribution: G-tests against the exact AR pmf, and negative controls
# ----------------------------------------------------------------------------------------------------------------
CASES = [("float32", "sharp", TREE_WIDE, DEFAULT), ("float32", "peaked", Tree(DEFAULT_TREE), HOT_TOPK3),
         ("float32", "flat", TREE_SMALL, DEFAULT), ("int8", "sharp", TREE_WIDE, DEFAULT)]


def _run(prec, model, tree, sampling, seed=4321):
    cp, context = variant(model)
    if prec != "float32":
        cp = PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)
        context = context.to(PR.ACTIVATION_DTYPE[prec])
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    f = FusedTreeFrame(cp, tree, sampling, compile=False)
    codes = f.decode(context.expand(n, 2, context.shape[-1]), torch.Generator().manual_seed(seed))
    assert codes.shape == (n, N_GROUPS - 1)
    return (*g_test(pmf, codes), n, f)


@pytest.mark.slow
@pytest.mark.parametrize("prec,model,tree,sampling", CASES,
                         ids=[f"{p}-{m}-{len(t.paths)}nodes-T{s.temperature}-k{s.top_k}" for p, m, t, s in CASES])
def test_fused_tree_samples_the_exact_pmf(prec, model, tree, sampling):
    pval, df, g, n, f = _run(prec, model, tree, sampling)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"{prec}: G={g:.1f} df={df} p={pval:.2e} N={n}: the fused tree does not sample the target"
    assert sum(f.last_calls) / len(f.last_calls) < N_GROUPS - 1  # it really speculated


def _keeps_mass(resid, x):
    return resid


def _always_accept(resid, x):
    return torch.ones(resid.shape[0], dtype=resid.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("attr,broken", [("point_mass_residual", _keeps_mass), ("point_mass_acceptance",
                                                                                _always_accept)],
                         ids=["rejected-child-keeps-mass", "always-accept"])
def test_negative_control_is_rejected(monkeypatch, attr, broken):
    monkeypatch.setattr(FT, attr, broken)
    pval, df, g, n, _ = _run("float32", "sharp", TREE_WIDE, DEFAULT)
    assert pval < ALPHA, f"{attr} broken, yet the G-test passed (G={g:.1f} df={df} p={pval:.2e}, N={n})"
