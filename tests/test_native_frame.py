"""The native fused frame (rvqspec_lib.device.native_frame): a whole frame of Chain(window), or AR with window 1, in ONE
C call (rvq_frame_run, the last section of rvqspec_lib/device/kernels/cpforward.c); the registry's ``native`` fused
runner (rvqspec_lib.models.backends.frame_runner(..., fused=True)).

Exact properties (the tiny-random model, every precision, converted with ``require_native=False`` so that a CPU
without the AVX-512 paths runs the plain C ones): greedy codes equal ``decode_frame(AR, backend=NativeCodePredictor)``
code for code for windows 1, 2, 4, and every row takes the calls of decode_frame's Chain of that window; a row's codes
depend only on its own context and uniforms (alone = inside a batch; other uniforms, other codes); for the same
uniforms the codes are FusedChainFrame's (the uniform layout is the same; the two forwards round differently in
float32, so a uniform within rounding of a CDF boundary could part them: probability about 1e-6 per draw, and the
seeds are fixed).

Distribution: the G-test of tests/test_lossless.py (4 code groups, 8 codes, the joint pmf of the 3 codes, bins of
expected count < 5 pooled, frames for power >= 0.9 at TV 0.03, level 1e-3) against the exact AR pmf computed by
teacher forcing through the NATIVE forward (its logits, the frame's projected embedding tables), in float32 (AR,
Chain(2), Chain(4)) and in bfloat16 and int8-dynamic (Chain(4)). False failures: 5 positive G-tests at level 1e-3, a
union bound of 0.5 % that a correct implementation meets an unlucky fixed seed (the tests are deterministic: they
pass or fail always). Negative controls (the C frame's deliberately lossy flags: accept every draft; drafts drawn at
temperature 1.5 while acceptance is handed the temperature-0.9 q; the code after a rejection drawn from p instead of
the residual) must be rejected by the same test on the ``sharp`` model (drafts far from p).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree
from rvqspec_lib.decoding.drafters import PositionOffsets, ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models import backends as B
from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.models.frame import synthesize
from rvqspec_lib.device.fused_spec import FusedChainFrame, inverse_cdf
from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.device.native import NativeCodePredictor
from rvqspec_lib.device.native_frame import FLAGS, NativeChainFrame
from tests.test_fused_spec import _ctx
from tests.test_lossless import ALPHA, DEFAULT, HOT_TOPK3, MIN_POWER, N_GROUPS, V, frames_needed, g_test, power, variant

pytestmark = pytest.mark.skipif(not C.available(), reason=f"native forward unavailable: {C.unavailable_reason()}")


@pytest.fixture(scope="module")
def converted(cp):
    """``{precision: (code_predictor, NativeCodePredictor)}``: tiny-random in each precision, built on first use."""
    cache = {}

    def get(prec):
        if prec not in cache:
            m = PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)
            cache[prec] = (m, NativeCodePredictor(m))
        return cache[prec]

    return get


@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_greedy_codes_equal_native_ar(converted, prec):
    cp, nb = converted(prec)
    g = Sampling(greedy=True)
    ctx = _ctx(cp, 6).to(P.param_dtype(cp))
    ar = torch.cat([decode_frame(cp, ctx[i:i + 1], decoder=AR(), sampling=g, backend=nb).codes for i in range(6)])
    for window in (1, 2, 4):
        f = NativeChainFrame(nb, window, g)
        got = f.decode(ctx, torch.Generator().manual_seed(window))
        assert got.shape == (6, P.n_codes(cp)) and got.dtype == torch.int64
        assert torch.equal(got, ar), f"{prec} window {window}"
        want_calls = [P.n_codes(cp)] * 6 if window == 1 else \
            decode_frame(cp, ctx, decoder=Chain(window), sampling=g, backend=nb).calls.tolist()
        assert f.last_calls == want_calls, f"{prec} window {window}"
    assert f.name == "native-chain4" and NativeChainFrame(nb, 1, g).name == "native-ar"


@pytest.mark.parametrize("prec", ["float32", "int8"])
@pytest.mark.parametrize("window", [1, 4])
def test_a_row_depends_on_its_own_uniforms_only(converted, prec, window):
    cp, nb = converted(prec)
    f = NativeChainFrame(nb, window)
    ctx = _ctx(cp, 6)
    u = f.uniforms(6, torch.Generator().manual_seed(1))
    assert u.shape == (6, P.n_codes(cp), 2 * window - 1) and u.dtype == torch.float64
    batch = f(ctx, u)
    calls = f.last_calls
    alone = [f(ctx[i:i + 1], u[i:i + 1]) for i in range(6)]
    assert torch.equal(batch, torch.cat(alone))
    assert torch.equal(batch, f.decode(ctx, torch.Generator().manual_seed(1)))
    assert not torch.equal(batch, f.decode(ctx, torch.Generator().manual_seed(2)))  # negative control
    if window == 1:
        assert calls == [P.n_codes(cp)] * 6
    else:
        assert len(set(calls)) > 1 and max(calls) < P.n_codes(cp)  # rows part, and speculation commits > 1 a call


@pytest.mark.parametrize("window", [2, 4, 8])
def test_same_uniforms_give_fused_chain_frames_codes(cp, window):
    f = NativeChainFrame(NativeCodePredictor(cp), window)
    ctx = _ctx(cp, 8, seed=5)
    u = f.uniforms(8, torch.Generator().manual_seed(11))
    fused = FusedChainFrame(cp, window, compile=False)
    assert torch.equal(f(ctx, u), fused(ctx, u))
    assert f.last_calls == fused.last_calls


def _python_ar(frame: NativeChainFrame, context: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """AR through the native backend one call at a time in Python, code s+1 drawn by inverse_cdf from
    Sampling.probs (transformers' warpers) with ``u[:, s, 0]``: what the native AR frame's layout says it computes."""
    be, n, b = frame.backend, frame.n_codes, context.shape[0]
    slot = torch.arange(n + 1)
    allow = slot[None, :] <= slot[:, None]
    two = slot[:2].expand(b, 2)
    cache, codes = be.new_cache(b, n + 1), []
    h = be.forward(frame.project(context), two, allow[None, :2].expand(b, 2, n + 1), cache, two)[:, 1]
    for j in range(n):
        codes.append(inverse_cdf(frame.sampling.probs(be.head(j, h)), u[:, j, 0]))
        if j < n - 1:
            pos = slot[j + 2:j + 3].expand(b, 1)
            h = be.forward(frame.tables[j][codes[-1]][:, None], pos, allow[None, j + 2:j + 3].expand(b, 1, n + 1),
                           cache, pos)[:, 0]
    return torch.stack(codes, 1)


@pytest.mark.parametrize("prec", ["float32", "bfloat16"])
def test_native_ar_frame_is_the_python_ar_loop(converted, prec):
    """The warpers (temperature, top-k with ties: bfloat16 logits tie often), the softmax and the inverse CDF in C
    give the codes transformers' warpers and inverse_cdf give for the same uniforms (float32 rounding of the softmax
    differs: a uniform within about 1e-7 of a CDF boundary could part them; the seeds are fixed)."""
    cp, nb = converted(prec)
    f = NativeChainFrame(nb, 1)
    ctx = _ctx(cp, 8, seed=3).to(P.param_dtype(cp))
    u = f.uniforms(8, torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert torch.equal(f(ctx, u), _python_ar(f, ctx, u))


@pytest.mark.parametrize("prec", ["float32", "bfloat16"])
def test_a_model_whose_projection_is_the_identity(prec):
    """code_predictor hidden = talker hidden (as the 0.6B and the embedded model): small_to_mtp_projection is the
    identity, the tables are the module's own; greedy codes equal native AR's, and a float32 context is rounded to the
    module's dtype as decode_frame rounds it (the same codes as the context given in that dtype)."""
    small = build_from_config(tiny_config_dict(code_predictor_hidden=64), seed=0).talker.code_predictor.eval()
    small = PR.apply_precision(small, prec, require_native=False)
    assert isinstance(small.small_to_mtp_projection, torch.nn.Identity)
    nb, g = NativeCodePredictor(small), Sampling(greedy=True)
    ctx = _ctx(small, 4, seed=8)
    ar = torch.cat([decode_frame(small, ctx[i:i + 1], decoder=AR(), sampling=g, backend=nb).codes for i in range(4)])
    assert torch.equal(NativeChainFrame(nb, 4, g).decode(ctx), ar)
    f = NativeChainFrame(nb, 4)
    u = f.uniforms(4, torch.Generator().manual_seed(9))
    assert torch.equal(f(ctx, u), f(ctx.to(P.param_dtype(small)).float(), u))


def test_bad_input_is_one_line(cp):
    for window in (0, 9, 2.0, True):
        with pytest.raises(ValueError, match=r"native frame window must be an integer in 1\.\.8") as e:
            NativeChainFrame(NativeCodePredictor(cp), window)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"temperature and top-k only; top_p=0.8 needs decode_frame") as e:
        NativeChainFrame(NativeCodePredictor(cp), 4, Sampling(top_p=0.8))
    assert "\n" not in str(e.value)
    f = NativeChainFrame(NativeCodePredictor(cp), 4)
    for u in (torch.rand(2, 15, 5, dtype=torch.float64), torch.rand(3, 15, 7, dtype=torch.float64),
              torch.rand(2, 14, 7, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"uniforms must have shape \(2, 15, 7\)") as e:
            f(_ctx(cp, 2), u)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"context must have shape \(B, 2, 64\)") as e:
        f(torch.zeros(2, 3, 64), torch.rand(2, 15, 7, dtype=torch.float64))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# the distribution: G-tests against the exact AR pmf of the NATIVE forward, and negative controls
# ----------------------------------------------------------------------------------------------------------------
@torch.inference_mode()
def native_pmf(frame: NativeChainFrame, context: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Exact joint pmf ``(V, V, V)`` of codes 1..3 under AR through the native forward: all V*V prefixes (c1, c2)
    teacher-forced in one call of 4 positions (context, context, code 1, code 2; the frame's projected tables), the
    native heads at positions 1, 2, 3, :meth:`Sampling.probs`, the product of the conditionals (a verify row equals the
    AR call of its prefix bit for bit: the native forward is row invariant)."""
    be, n = frame.backend, V * V
    c1, c2 = torch.arange(V).repeat_interleave(V), torch.arange(V).repeat(V)
    ctx = frame.project(context)
    x = torch.cat([ctx.expand(n, 2, ctx.shape[-1]), frame.tables[0][c1][:, None], frame.tables[1][c2][:, None]], 1)
    pos = torch.arange(4).expand(n, 4)
    allow = (torch.arange(4)[None, :] <= torch.arange(4)[:, None]).expand(n, 4, 4)
    hid = be.forward(x, pos, allow, be.new_cache(n, 4), pos)
    p = [sampling.probs(be.head(i, hid[:, i + 1])).to(torch.float64) for i in range(3)]
    joint = p[0][0][:, None, None] * p[1][::V][:, :, None] * p[2].reshape(V, V, V)
    assert abs(float(joint.sum()) - 1.0) < 1e-5
    return joint / joint.sum()


def _run(model, prec, window, sampling, seed=777, flags=0):
    cp, context = variant(model)
    cp = PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)
    frame = NativeChainFrame(NativeCodePredictor(cp), window, sampling)
    pmf = native_pmf(frame, context, sampling)
    n = frames_needed(pmf)
    codes = frame.decode(context.expand(n, 2, context.shape[-1]), torch.Generator().manual_seed(seed), flags=flags)
    assert codes.shape == (n, N_GROUPS - 1)
    tpc = 3 * n / sum(frame.last_calls)
    return (*g_test(pmf, codes), n, tpc)


CASES = [("sharp", "float32", 4, DEFAULT), ("sharp", "float32", 1, DEFAULT), ("peaked", "float32", 2, HOT_TOPK3),
         ("sharp", "bfloat16", 4, DEFAULT), ("sharp", "int8-dynamic", 4, DEFAULT)]


@pytest.mark.parametrize("model,prec,window,sampling", CASES,
                         ids=[f"{m}-{p}-w{w}-T{s.temperature}-k{s.top_k}" for m, p, w, s in CASES])
def test_native_frame_samples_the_exact_pmf(model, prec, window, sampling):
    pval, df, g, n, tpc = _run(model, prec, window, sampling)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"{prec} window {window}: G={g:.1f} df={df} p={pval:.2e} N={n}: not the target"
    assert tpc == 1.0 if window == 1 else tpc > 1.0  # and it really speculated


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_negative_control_is_rejected(flag):
    pval, df, g, n, _ = _run("sharp", "float32", 4, DEFAULT, flags=FLAGS[flag])
    assert pval < ALPHA, f"{flag}: the lossy rule passed the G-test (G={g:.1f} df={df} p={pval:.2e}, N={n})"


def test_negative_control_is_rejected_in_bfloat16():
    pval, df, g, n, _ = _run("sharp", "bfloat16", 4, DEFAULT, flags=FLAGS["always_accept"])
    assert pval < ALPHA, f"always_accept passed the G-test in bfloat16 (G={g:.1f} df={df} p={pval:.2e}, N={n})"


# ----------------------------------------------------------------------------------------------------------------
# the frame loop through the native whole frame (synth --backend native)
# ----------------------------------------------------------------------------------------------------------------
def test_the_native_fused_runner_takes_only_what_the_c_frame_computes():
    """frame_runner("native", ..., fused=True): the C frame of window 1 (AR) or N (Chain(N) with the reused heads);
    every other decoder, drafter or sampling is refused in one line (backends.fused_support names why), and so is a
    native forward built over another module."""
    cp = build_from_config(tiny_config_dict(), seed=0).talker.code_predictor
    nat = NativeCodePredictor(cp)
    assert B.frame_runner("native", cp, AR(), fused=True, verify=nat).frame.window == 1
    runner = B.frame_runner("native", cp, Chain(4), fused=True, drafter=ReusedHeads(), verify=nat)
    assert runner.frame.window == 4 and runner.frame.backend is nat  # the given forward's packed weights, reused
    for decoder, kw in ((LossySSD(), {}), (Tree([(0,), (1,)]), {}),  # a lossy control keeps its rule; no tree in C
                        (Chain(4), {"drafter": PositionOffsets.for_code_predictor(cp)}),
                        (Chain(4), {"sampling": Sampling(top_p=0.8)})):  # top-p: not in the C frame
        assert B.fused_support("native", decoder, kw.get("sampling"), kw.get("drafter")) is not None
        with pytest.raises(ValueError, match="no fused native frame for this decoder") as e:
            B.frame_runner("native", cp, decoder, fused=True, verify=nat, **kw)
        assert "\n" not in str(e.value)
    other = build_from_config(tiny_config_dict(), seed=1).talker.code_predictor
    with pytest.raises(ValueError, match="built over this code_predictor"):
        B.frame_runner("native", other, AR(), fused=True, verify=nat)


@pytest.mark.parametrize("decoder", [AR(), Chain(4)])
def test_synthesize_through_the_native_frame_equals_decode_frame_greedy(decoder):
    """Greedy, the whole-frame C decoder gives the frame loop exactly the codes decode_frame gives through the same
    native forward (and the same calls per frame)."""
    lm = load_model("tiny-random")
    nat = NativeCodePredictor(lm.code_predictor)
    g = Sampling(greedy=True)
    res = {}
    for fused in (False, True):  # stepped: decode_frame through the native forward; fused: the C frame over it
        runner = B.frame_runner("native", lm.code_predictor, decoder, fused=fused, sampling=g, verify=nat)
        res[fused] = synthesize(lm, ["Hello there."], runner=runner, talker_sampling=g, max_frames=4,
                                generator=torch.Generator().manual_seed(0))
        assert res[fused].runner["fused"] is fused and res[fused].runner["backend"] == "native"
    a, b = res[False], res[True]
    assert len(a.codes[0]) > 0 and torch.equal(a.codes[0], b.codes[0])
    assert a.per_frame_calls == b.per_frame_calls


def test_frames_over_one_backend_share_its_embedding_tables(cp):
    """The projected embedding tables are made once per backend (the auto stage builds a fused frame per candidate:
    a copy each cost V x H x 4 bytes per table), and sharing them changes no code: a frame over a second backend has
    its own (the negative control) and decodes the same."""
    nb = NativeCodePredictor(cp)
    a, b = NativeChainFrame(nb, 1), NativeChainFrame(nb, 4)
    other = NativeChainFrame(NativeCodePredictor(cp), 4)
    assert a.tables and all(x.data_ptr() == y.data_ptr() for x, y in zip(a.tables, b.tables))
    assert all(x.data_ptr() != y.data_ptr() and torch.equal(x, y) for x, y in zip(b.tables, other.tables))
    ctx = _ctx(cp, 4, seed=3)
    u = b.uniforms(4, torch.Generator().manual_seed(2))
    assert torch.equal(b(ctx, u), other(ctx, u))
