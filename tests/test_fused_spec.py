"""The fused speculative chain (rvqspec_lib.device.fused_spec): one compiled graph a round, uniforms drawn up front.

Exact properties: greedy codes equal AR's code for code; a row's codes depend only on its own uniforms (the same
uniforms give the same codes alone or in any batch, other uniforms other codes); the compiled graphs give the eager
functions' codes. Distribution: the G-test of tests/test_lossless.py (its model variants, exact pmf, pooling and frame
counts for power >= 0.9 at TV 0.03), each case failing with probability 1e-3 for a correct sampler (4 positive cases
in float32 and 3 in bfloat16 / int8 / int8-dynamic here: a union bound of 0.7 % that a correct implementation meets an
unlucky fixed seed). Negative controls (accept every draft; drafts drawn at temperature 1.5 while acceptance is handed
the temperature-0.9 q; accept every draft in each precision) must be rejected at the same level.

In a precision (rvqspec_lib.device.precision) the fused round runs on the converted module (int8 layers through their
own int8 forward): greedy codes equal decode_frame's Chain and AR of that precision code for code; the compiled graphs
give the eager functions' codes for the same uniforms (int8: bfloat16 activations and int8 weights, so one compiled
case covers both non-float32 kernels' paths through inductor); the G-test is against the CONVERTED module's exact pmf
(tests/test_precision.py: it differs from float32's).
"""

from __future__ import annotations

import copy

import pytest
import torch

import rvqspec_lib.device.fused_spec as FS
import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.device.fused_spec import FusedChainFrame, inverse_cdf
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain
from rvqspec_lib.decoding.sampling import Sampling
from tests.test_lossless import (ALPHA, DEFAULT, HOT_TOPK3, MIN_POWER, N_GROUPS, exact_pmf, frames_needed, g_test,
                                 power, variant)


def _ctx(cp, b, seed=0):
    return torch.randn(b, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("window", [2, 4, 8])
def test_greedy_fused_chain_equals_ar(cp, window):
    g = Sampling(greedy=True)
    ctx = _ctx(cp, 5)
    ref = decode_frame(cp, ctx, sampling=g).codes
    f = FusedChainFrame(cp, window, g, compile=False)
    got = f.decode(ctx, torch.Generator().manual_seed(0))
    assert got.shape == ref.shape == (5, P.n_codes(cp)) and torch.equal(got, ref)
    alone = torch.cat([f.decode(ctx[i:i + 1], torch.Generator().manual_seed(i)) for i in range(5)])
    assert torch.equal(alone, ref)


def test_a_row_depends_on_its_own_uniforms_only(cp):
    f = FusedChainFrame(cp, 4, compile=False)
    ctx = _ctx(cp, 6)
    u = f.uniforms(6, torch.Generator().manual_seed(1))
    assert u.shape == (6, P.n_codes(cp), 7) and u.dtype == torch.float64
    batch = f(ctx, u)  # rows land on different depths: one call per depth present
    assert torch.equal(batch, torch.cat([f(ctx[i:i + 1], u[i:i + 1]) for i in range(6)]))
    assert torch.equal(batch, f.decode(ctx, torch.Generator().manual_seed(1)))
    assert not torch.equal(batch, f.decode(ctx, torch.Generator().manual_seed(2)))  # negative control


def test_inverse_cdf_never_draws_a_code_of_mass_zero():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    for u in (0.0, 0.25, 0.5, 0.75, 1.0 - 2 ** -53, 1.0):  # 1.0: a rounding overshoot is clamped
        got = inverse_cdf(p, torch.full((2,), u, dtype=torch.float64)).tolist()
        assert got[0] in (1, 3) and got[1] == 2
    assert inverse_cdf(p, torch.tensor([0.49, 0.0], dtype=torch.float64)).tolist() == [1, 2]
    assert inverse_cdf(p, torch.tensor([0.5, 0.0], dtype=torch.float64)).tolist() == [3, 2]


def test_bad_input_is_one_line(cp):
    with pytest.raises(ValueError, match="Chain window must be an integer in 2..8"):
        FusedChainFrame(cp, 1, compile=False)
    with pytest.raises(ValueError, match="temperature and top-k only"):
        FusedChainFrame(cp, 4, Sampling(top_p=0.8), compile=False)
    f = FusedChainFrame(cp, 4, compile=False)
    with pytest.raises(ValueError, match=r"uniforms must have shape \(2, 15, 7\)"):
        f(_ctx(cp, 2), torch.rand(2, 15, 5, dtype=torch.float64))


@pytest.mark.slow
def test_compiled_fused_chain_equals_eager():
    """Every round graph compiled (a 4-codebook tiny model: two start depths) gives the eager codes, for chains with
    and without a bonus column, for one frame and a batch whose rows part."""
    small = build_from_config(tiny_config_dict(n_code_groups=4, codebook_size=8), seed=0).talker.code_predictor
    ctx = _ctx(small, 8)
    for window in (2, 4):
        eager, comp = FusedChainFrame(small, window, compile=False), FusedChainFrame(small, window, compile=True)
        comp.compile_all(1)
        assert set(comp.compile_s) == {("prefill", 1), (1, 1), (2, 1)}
        for seed in range(4):
            u = eager.uniforms(1, torch.Generator().manual_seed(seed))
            assert torch.equal(comp(ctx[:1], u), eager(ctx[:1], u))
        u = eager.uniforms(8, torch.Generator().manual_seed(9))
        assert torch.equal(comp(ctx, u), eager(ctx, u))


# ----------------------------------------------------------------------------------------------------------------
# the distribution: G-tests against the exact AR pmf, and negative controls
# ----------------------------------------------------------------------------------------------------------------
CASES = [("sharp", 4, DEFAULT), ("peaked", 2, HOT_TOPK3), ("flat", 4, DEFAULT), ("sharp", 2, DEFAULT)]


def _run(model, window, sampling, seed):
    cp, context = variant(model)
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    codes = FusedChainFrame(cp, window, sampling, compile=False).decode(context.expand(n, 2, context.shape[-1]),
                                                                        torch.Generator().manual_seed(seed))
    assert codes.shape == (n, N_GROUPS - 1)
    return (*g_test(pmf, codes), n)


@pytest.mark.slow
@pytest.mark.parametrize("model,window,sampling", CASES,
                         ids=[f"{m}-chain{w}-T{s.temperature}-k{s.top_k}" for m, w, s in CASES])
def test_fused_chain_samples_the_exact_pmf(model, window, sampling):
    pval, df, g, n = _run(model, window, sampling, seed=777)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"G={g:.1f} df={df} p={pval:.2e} with N={n}: the fused chain does not sample the target"


def _always_accept(p, x, q_x):
    return torch.ones_like(q_x)


def _drafts_at_temperature_1_5(q, u):
    q2 = q.clamp_min(0) ** (0.9 / 1.5)  # the temperature-0.9 q re-warped to temperature 1.5
    return inverse_cdf(q2, u)


@pytest.mark.slow
@pytest.mark.parametrize("attr,broken", [("acceptance", _always_accept), ("draft_codes", _drafts_at_temperature_1_5)],
                         ids=["always-accept", "drafts-at-T1.5"])
def test_negative_control_is_rejected(monkeypatch, attr, broken):
    monkeypatch.setattr(FS, attr, broken)
    pval, df, g, n = _run("sharp", 4, DEFAULT, seed=777)
    assert pval < ALPHA, f"{attr} broken, yet the G-test passed (G={g:.1f} df={df} p={pval:.2e}, N={n})"


@pytest.mark.slow
def test_compile_all_builds_every_graph_a_frame_meets():
    """After compile_all, frames compile nothing more (the round graphs see the strides a frame hands them)."""
    small = build_from_config(tiny_config_dict(n_code_groups=6, codebook_size=8), seed=0).talker.code_predictor
    f = FusedChainFrame(small, 2, compile=True)
    f.compile_all(1)
    before = dict(f.compile_s)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in range(6):
            f.decode(_ctx(small, 1, seed), torch.Generator().manual_seed(seed))
    assert f.compile_s == before and set(before) == {("prefill", 1)} | {(s, 1) for s in range(1, 5)}


# ----------------------------------------------------------------------------------------------------------------
# in a precision: bfloat16, int8 weight-only, int8 with per-row dynamic activations
# ----------------------------------------------------------------------------------------------------------------
LOW = PR.PRECISIONS[1:]


def _in(cp, prec):
    return PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)


@pytest.mark.parametrize("prec", LOW)
def test_greedy_fused_chain_equals_chain_and_ar_in_precision(cp, prec):
    cp = _in(cp, prec)
    g = Sampling(greedy=True)
    ctx = _ctx(cp, 6).to(P.param_dtype(cp))
    ar = decode_frame(cp, ctx, decoder=AR(), sampling=g).codes
    chain = decode_frame(cp, ctx, decoder=Chain(4), sampling=g).codes
    got = FusedChainFrame(cp, 4, g, compile=False).decode(ctx, torch.Generator().manual_seed(0))
    assert torch.equal(got, chain) and torch.equal(got, ar)
    assert PR.precision_of(cp) == prec


def test_int8_heads_run_their_own_int8_forward(cp):
    """The fused round applies an int8 layer through Int8Linear.forward, not through its dequantised weight (the two
    differ: a negative control that the test can fail)."""
    cp = _in(cp, "int8-dynamic")
    f = FusedChainFrame(cp, 4, compile=False)
    h = torch.randn(3, int(cp.config.hidden_size), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(f._head(h, 2), cp.lm_head[2](h))
        assert not torch.equal(f._head(h, 2), torch.nn.functional.linear(h, cp.lm_head[2].weight))


@pytest.mark.slow
def test_compiled_fused_chain_equals_eager_in_int8():
    small = _in(build_from_config(tiny_config_dict(n_code_groups=4, codebook_size=8), seed=0).talker.code_predictor,
                "int8")
    ctx = _ctx(small, 4).to(torch.bfloat16)
    eager, comp = FusedChainFrame(small, 4, compile=False), FusedChainFrame(small, 4, compile=True)
    comp.compile_all(1)
    for seed in range(4):
        u = eager.uniforms(1, torch.Generator().manual_seed(seed))
        assert torch.equal(comp(ctx[seed:seed + 1], u), eager(ctx[seed:seed + 1], u))


def _run_in(prec, model, window, sampling, seed):
    cp, context = variant(model)
    cp, context = _in(cp, prec), context.to(PR.ACTIVATION_DTYPE[prec])
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    codes = FusedChainFrame(cp, window, sampling, compile=False).decode(context.expand(n, 2, context.shape[-1]),
                                                                        torch.Generator().manual_seed(seed))
    return (*g_test(pmf, codes), n)


@pytest.mark.slow
@pytest.mark.parametrize("prec", LOW)
def test_fused_chain_samples_the_exact_pmf_in_precision(prec):
    pval, df, g, n = _run_in(prec, "sharp", 4, DEFAULT, seed=777)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"{prec}: G={g:.1f} df={df} p={pval:.2e} N={n}: the fused chain does not sample the target"


@pytest.mark.slow
@pytest.mark.parametrize("prec", LOW)
def test_negative_control_is_rejected_in_precision(monkeypatch, prec):
    monkeypatch.setattr(FS, "acceptance", _always_accept)
    pval, df, g, n = _run_in(prec, "sharp", 4, DEFAULT, seed=777)
    assert pval < ALPHA, f"{prec}: always-accept passed the G-test (G={g:.1f} df={df} p={pval:.2e}, N={n})"
