"""The native forward (rvqspec_lib.device.native, kernels/cpforward.c): equal to the official module in every precision
to a stated tolerance, row invariant bit for bit (a verify row is the same row computed alone), greedy frames equal,
and speculation through it lossless (G-tests against the exact pmf of the NATIVE forward, a negative control caught).

The C file has plain-C paths for CPUs without AVX-512, so every test runs on any x86-64 CPU (the AVX-512 paths where
the CPU has them: ``cpforward.fast_precisions()``).

G-tests: the design of tests/test_lossless.py (its variant models, ``frames_needed``, ``g_test``, ``power``: level
1e-3, power >= 0.9 against a total-variation shift of 0.03), with the exact pmf computed by teacher forcing all
prefixes through the native forward itself. Four G-tests of a correct sampler: a false failure for an unlucky seed has
probability at most 4 x 1e-3 = 0.4 % (the seeds are fixed, so the tests are deterministic). The negative control
(SSD's lossy tolerance rule through the same backend) must be REJECTED at the same level.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_lossless import (ALPHA, DEFAULT, HOT_TOPK3, MIN_POWER, SAMPLED_WIDE, TREE_WIDE, V, frames_needed, g_test,
                           power, variant)

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.device.native import NativeCodePredictor

pytestmark = pytest.mark.skipif(not C.available(), reason=f"native forward unavailable: {C.unavailable_reason()}")

#: Tolerance of the native forward against the official module, relative to the largest |hidden|: float32 differs by
#: summation order (measured ~1e-7 here); bfloat16 and int8 round at the official module's rounding points but sum in
#: another order, so a few bfloat16 steps (2^-8 relative each) over 2 layers.
OFFICIAL_RTOL = {"float32": 1e-5, "bfloat16": 4e-2, "int8": 4e-2, "int8-dynamic": 1e-5}


def _converted(prec: str, seed: int = 0):
    return PR.apply_precision(build_from_config(tiny_config_dict(), seed=seed).talker.code_predictor, prec,
                              require_native=False)


def _causal(slots: int) -> torch.Tensor:
    return torch.ones(slots, slots, dtype=torch.bool).tril()


@torch.inference_mode()
def _prefill_and_verify(backend, cp, context, codes, *, extra_visible: bool = False):
    """Prefill (positions 0, 1) then ONE verify call over codes 1..k (causal). Returns (prefill hidden, verify
    hidden, cache). ``extra_visible``: every verify row also sees the LAST verify slot (a broken mask: the negative
    control of the row-invariance test)."""
    b, k = codes.shape
    slots = 2 + k
    x = cp.small_to_mtp_projection(context.to(P.param_dtype(cp)))
    causal = _causal(slots)
    cache = backend.new_cache(b, slots)
    h0 = backend.forward(x, torch.arange(2).expand(b, 2), causal[None, :2].expand(b, 2, slots), cache,
                         torch.arange(2).expand(b, 2))
    emb = backend.embed(codes, torch.arange(1, k + 1).expand(b, k))
    allow = causal[None, 2:].expand(b, k, slots).clone()
    if extra_visible:
        allow[:, :, -1] = True
    h1 = backend.forward(emb, torch.arange(2, k + 2).expand(b, k), allow, cache, torch.arange(2, k + 2).expand(b, k))
    return h0, h1, cache


@torch.inference_mode()
def _ar_rows(backend, cp, context, codes):
    """The same positions one call each (AR): (B, k, H)."""
    b, k = codes.shape
    slots = 2 + k
    x = cp.small_to_mtp_projection(context.to(P.param_dtype(cp)))
    causal = _causal(slots)
    cache = backend.new_cache(b, slots)
    backend.forward(x, torch.arange(2).expand(b, 2), causal[None, :2].expand(b, 2, slots), cache,
                    torch.arange(2).expand(b, 2))
    emb = backend.embed(codes, torch.arange(1, k + 1).expand(b, k))
    return torch.cat([backend.forward(emb[:, j:j + 1], torch.full((b, 1), j + 2),
                                      causal[None, j + 2:j + 3].expand(b, 1, slots), cache, torch.full((b, 1), j + 2))
                      for j in range(k)], 1)


def _inputs(cp, b=3, k=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(b, 2, P.talker_hidden_size(cp), generator=g)
    codes = torch.randint(0, int(cp.config.vocab_size), (b, k), generator=g)
    return context, codes


# ----------------------------------------------------------------------------------------------------------------
# equal to the official module in the same precision
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_native_call_equals_the_official_call_within_tolerance(prec):
    cp = _converted(prec)
    nat, off = NativeCodePredictor(cp), P.OfficialBackend(cp)
    context, codes = _inputs(cp, b=4, k=8)
    a0, a1, _ = _prefill_and_verify(nat, cp, context, codes)
    b0, b1, _ = _prefill_and_verify(off, cp, context, codes)
    assert a1.dtype == b1.dtype == nat.dtype and a1.shape == b1.shape
    for a, b in ((a0, b0), (a1, b1)):
        scale = float(b.float().abs().max())
        assert float((a.float() - b.float()).abs().max()) <= OFFICIAL_RTOL[prec] * scale, prec
    # logits of every head: close, and the same greedy code wherever the official top-2 margin is clear
    rows = a1.reshape(-1, a1.shape[-1])
    head = torch.arange(rows.shape[0]) % len(cp.lm_head)
    with torch.inference_mode():
        la, lb = nat.logits(rows, head).float(), P.head_logits(cp, b1.reshape(-1, b1.shape[-1]), head).float()
    diff = float((la - lb).abs().max())
    assert diff <= OFFICIAL_RTOL[prec] * 4 * float(lb.abs().max()) + 1e-6
    top2 = lb.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff  # both sides may move by diff
    assert int(clear.sum()) >= 0.5 * rows.shape[0]  # enough rows for the comparison to mean something
    assert torch.equal(la.argmax(-1)[clear], lb.argmax(-1)[clear])


def test_the_tolerance_test_can_fail():
    """Negative control: the same comparison against a module with one weight changed fails."""
    cp = _converted("float32")
    other = copy.deepcopy(cp)
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(1.01)
    context, codes = _inputs(cp)
    _, a1, _ = _prefill_and_verify(NativeCodePredictor(other), other, context, codes)
    _, b1, _ = _prefill_and_verify(P.OfficialBackend(cp), cp, context, codes)
    assert float((a1 - b1).abs().max()) > OFFICIAL_RTOL["float32"] * float(b1.abs().max())


def test_packed_weights_are_a_copy():
    """The backend packs the weights at construction: a later change of the module is not seen (documented)."""
    cp = _converted("float32")
    nat = NativeCodePredictor(cp)
    context, codes = _inputs(cp)
    before = _prefill_and_verify(nat, cp, context, codes)[1]
    with torch.no_grad():
        cp.model.layers[0].mlp.down_proj.weight.mul_(2.0)
    assert torch.equal(_prefill_and_verify(nat, cp, context, codes)[1], before)
    assert not torch.equal(_prefill_and_verify(NativeCodePredictor(cp), cp, context, codes)[1], before)


# ----------------------------------------------------------------------------------------------------------------
# row invariance: a verify call computes each row exactly as the row alone
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_verify_rows_equal_ar_calls_bit_for_bit(prec):
    cp = _converted(prec)
    nat = NativeCodePredictor(cp)
    context, codes = _inputs(cp, b=2, k=6)
    _, ver, cache_v = _prefill_and_verify(nat, cp, context, codes)
    ar = _ar_rows(nat, cp, context, codes)
    assert torch.equal(ver, ar), f"{prec}: max diff {float((ver.float() - ar.float()).abs().max())}"
    # the logits of each row too (one head for all rows, and rows grouped by head)
    rows_v, rows_a = ver.reshape(-1, ver.shape[-1]), ar.reshape(-1, ar.shape[-1])
    head = torch.arange(rows_v.shape[0]) % 3
    assert torch.equal(nat.logits(rows_v, head), torch.cat([nat.logits(r[None], h[None]) for r, h in
                                                             zip(rows_a, head)]))


def test_row_invariance_test_can_fail():
    """Negative control: rows that see one more slot than their AR twin (a broken mask) are not equal."""
    cp = _converted("float32")
    nat = NativeCodePredictor(cp)
    context, codes = _inputs(cp, b=2, k=6)
    _, ver, _ = _prefill_and_verify(nat, cp, context, codes, extra_visible=True)
    assert not torch.equal(ver, _ar_rows(nat, cp, context, codes))


@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_greedy_frames_through_native_equal_native_ar(prec):
    """Greedy speculation through the native forward commits exactly AR's codes through it (row invariance makes
    every verify row's argmax AR's), for a chain, a point-mass tree and a sampled tree."""
    cp = _converted(prec)
    nat = NativeCodePredictor(cp)
    ctx = torch.randn(3, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(5))
    greedy = Sampling(greedy=True)
    ref = decode_frame(cp, ctx, decoder=AR(), sampling=greedy, backend=nat,
                       generator=torch.Generator().manual_seed(0)).codes
    for dec in (Chain(4), Tree([(0,), (1,), (0, 0), (0, 0, 0)]), Tree([(0,), (1,), (0, 0)], sampled=True)):
        res = decode_frame(cp, ctx, decoder=dec, sampling=greedy, backend=nat, generator=torch.Generator().manual_seed(0))
        assert torch.equal(res.codes, ref), (prec, dec)


# ----------------------------------------------------------------------------------------------------------------
# lossless through the native forward: G-tests against its own exact pmf
# ----------------------------------------------------------------------------------------------------------------
@torch.inference_mode()
def native_exact_pmf(nat: NativeCodePredictor, cp, context: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Exact joint pmf ``(V, V, V)`` of codes 1..3 through the native forward: every prefix (c1, c2) teacher-forced
    in one verify call of 4 positions (context, context, code 1, code 2), heads 0, 1, 2 at positions 1, 2, 3."""
    c1 = torch.arange(V).repeat_interleave(V)
    c2 = torch.arange(V).repeat(V)
    b = V * V
    x = cp.small_to_mtp_projection(context.to(P.param_dtype(cp))).expand(b, 2, -1)
    emb = nat.embed(torch.stack([c1, c2], 1), torch.tensor([1, 2]).expand(b, 2))
    cache = nat.new_cache(b, 4)
    hid = nat.forward(torch.cat([x, emb], 1), torch.arange(4).expand(b, 4), _causal(4)[None].expand(b, 4, 4), cache,
                      torch.arange(4).expand(b, 4))  # (b, 4, H)
    logits = torch.stack([nat.logits(hid[:, i + 1], torch.full((b,), i)) for i in range(3)], 1)  # (b, 3, V)
    p = sampling.probs(logits).to(torch.float64)
    joint = p[0, 0][:, None, None] * p[::V, 1][:, :, None] * p[:, 2].reshape(V, V, V)
    return joint / joint.sum()


def _native_run(model: str, prec: str, decoder, sampling: Sampling, seed: int = 1234, chunk: int = 4096):
    cp, context = variant(model)
    cp = PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)
    context = context.to(P.param_dtype(cp))
    nat = NativeCodePredictor(cp)
    pmf = native_exact_pmf(nat, cp, context, sampling)
    n = frames_needed(pmf)
    gen = torch.Generator().manual_seed(seed)
    codes, calls = [], []
    for i in range(0, n, chunk):
        res = decode_frame(cp, context.expand(min(chunk, n - i), 2, context.shape[-1]), decoder=decoder,
                           sampling=sampling, generator=gen, backend=nat)
        codes.append(res.codes)
        calls.append(res.tokens_per_call)
    pval, df, g = g_test(pmf, torch.cat(codes))
    return pval, df, g, n, float(torch.cat(calls).mean())


G_CASES = [("float32", "sharp", Chain(4), DEFAULT), ("float32", "sharp", SAMPLED_WIDE, HOT_TOPK3),
           ("float32", "peaked", TREE_WIDE, DEFAULT), ("bfloat16", "sharp", Chain(4), DEFAULT)]


@pytest.mark.slow
@pytest.mark.parametrize("prec,model,decoder,sampling", G_CASES,
                         ids=[f"{p}-{m}-{d!r}".replace(" ", "") for p, m, d, _ in G_CASES])
def test_speculation_through_native_samples_its_ar_distribution(prec, model, decoder, sampling):
    pval, df, g, n, tpc = _native_run(model, prec, decoder, sampling)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"{prec}: G={g:.1f} df={df} p={pval:.2e} N={n}: speculation does not sample AR's target"
    assert tpc > 1.0  # it really speculated


@pytest.mark.slow
def test_negative_control_lossy_ssd_through_native_is_caught():
    pval, df, g, n, _ = _native_run("sharp", "float32", LossySSD(), DEFAULT)
    assert pval < ALPHA, f"LossySSD passed the G-test through the native forward (G={g:.1f} df={df} p={pval:.2e})"


def test_native_pmf_is_close_to_the_official_pmf():
    """The exact pmf above is the native forward's own, and it is the official module's up to rounding (so the
    G-tests ask the question of the native forward, not of another model)."""
    from test_lossless import exact_pmf

    cp, context = variant("sharp")
    a = native_exact_pmf(NativeCodePredictor(cp), cp, context, DEFAULT)
    b = exact_pmf(cp, context, DEFAULT)
    assert float((a - b).abs().sum()) < 1e-4


# ----------------------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------------------
def test_errors_are_one_line_and_name_the_fix():
    cp = build_from_config(tiny_config_dict(), seed=0).talker.code_predictor
    with pytest.raises(ValueError, match=r"^NativeCodePredictor needs the official code predictor"):
        NativeCodePredictor(cp.model)
    half = copy.deepcopy(cp).to(torch.float16)
    with pytest.raises(ValueError, match=r"not float16: convert with apply_precision") as e:
        NativeCodePredictor(half)
    assert "\n" not in str(e.value)
    biased = copy.deepcopy(cp)
    biased.model.layers[0].self_attn.q_proj.bias = torch.nn.Parameter(torch.zeros(
        biased.model.layers[0].self_attn.q_proj.out_features))
    with pytest.raises(ValueError, match="without bias"):
        NativeCodePredictor(biased)


def test_fast_precisions_follow_the_cpu_flags():
    flags = PR.cpu_flags()
    fast = C.fast_precisions()
    assert ("float32" in fast) == ("avx512f" in flags)
    assert ("bfloat16" in fast) == ("avx512f" in flags and "avx512_bf16" in flags)
    assert ("int8-dynamic" in fast) == ("avx512f" in flags and "avx512_vnni" in flags)
    assert NativeCodePredictor(_converted("float32")).fast == ("float32" in fast)
