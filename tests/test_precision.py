"""Precision as the user's choice (rvqspec_lib.device.precision): capability checks, the int8 layer, and
speculation lossless with respect to AR in bfloat16 and int8.

G-tests: the design, the exact pmf and the power argument of tests/test_lossless.py, reused as they are (its
``variant`` models, ``exact_pmf``, ``frames_needed``, ``g_test``, ``power``), with the code predictor converted to the
precision first; the exact pmf is the CONVERTED module's (teacher-forced through its own ``forward_finetune``), so
each test asks "does speculation sample what AR samples in this precision". Each G-test fails at p < 1e-3; seeds are
fixed (deterministic). Over the 9 G-tests of a correct sampler here (Chain(4), a sampled tree and a point-mass tree,
in bfloat16, int8 and int8-dynamic) a union bound puts the chance that a correct implementation meets an unlucky seed
at 9 x 1e-3 = 0.9 %. The negative controls (LossySSD in each of the three) must REJECT at the same level.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_lossless import (run_on, ALPHA, DEFAULT, HOT_TOPK3, MIN_POWER, NUCLEUS, SAMPLED_WIDE, TREE_WIDE,
                           exact_pmf, power, variant)

from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree
from rvqspec_lib.decoding.sampling import Sampling

ZEN2 = frozenset("fpu sse2 avx avx2 fma".split())
ZEN4 = frozenset("avx2 avx512f avx512_bf16 avx512_vnni avx_vnni".split())
SPR = frozenset("avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8 amx_tile".split())


# ----------------------------------------------------------------------------------------------------------------
# capability and errors
# ----------------------------------------------------------------------------------------------------------------
def test_native_precisions_from_flags(tmp_path):
    assert PR.native_precisions(ZEN2) == ("float32",)
    assert PR.native_precisions(ZEN4) == PR.PRECISIONS == PR.native_precisions(SPR)
    assert PR.native_precisions(frozenset({"amx_bf16"})) == ("float32", "bfloat16", "int8")
    assert PR.native_precisions(frozenset({"avx512_vnni"})) == ("float32", "int8-dynamic")  # e.g. Ice Lake
    assert PR.native_precisions(frozenset({"avx_vnni"})) == ("float32", "int8-dynamic")  # e.g. Alder Lake
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu AVX2 avx512_bf16\nbugs\t: x\n")
    assert PR.cpu_flags(f) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert PR.cpu_flags(tmp_path / "absent") == frozenset()
    assert PR.cpu_features(SPR) == {"bf16": ["avx512_bf16", "amx_bf16"], "int8_dot": ["avx512_vnni", "amx_int8"],
                                    "avx512f": True, "avx2": True}
    assert "float32" in PR.native_precisions()  # this machine's flags


def test_check_precision_errors_are_one_line_and_name_the_fix():
    with pytest.raises(ValueError, match=r"^unknown precision 'fp8': use one of float32, bfloat16, int8, int8-dyn"):
        PR.check_precision("fp8", flags=ZEN4)
    for prec in PR.PRECISIONS[1:]:
        with pytest.raises(ValueError) as e:
            PR.check_precision(prec, flags=ZEN2)
        msg = str(e.value)
        needs = "AVX512-VNNI, AVX-VNNI or AMX-INT8" if prec == "int8-dynamic" else "AVX512-BF16 or AMX-BF16"
        assert "\n" not in msg and msg.startswith(f"--dtype {prec} needs {needs}")
        assert msg.endswith("this CPU has avx2: use float32")
        assert PR.check_precision(prec, flags=ZEN4) == prec
        assert PR.check_precision(prec, device="cuda", flags=ZEN2) == prec  # not a CPU question
    assert PR.check_precision("float32", flags=frozenset()) == "float32"
    with pytest.raises(ValueError, match="this CPU has avx512_vnni: use float32 or int8-dynamic$"):
        PR.check_precision("bfloat16", flags=frozenset({"avx512_vnni"}))
    cp = build_from_config(tiny_config_dict(), seed=0).talker.code_predictor
    with pytest.raises(ValueError, match="^--dtype int8 needs"):
        PR.apply_precision(cp, "int8", flags=ZEN2)
    with pytest.raises(ValueError, match="^unknown precision"):
        PR.apply_precision(cp, "float16", require_native=False)
    assert PR.precision_of(cp) == "float32"  # a refused conversion leaves the module as it was


# ----------------------------------------------------------------------------------------------------------------
# the int8 layer and the converted module
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("k", [48, 40])  # 48: torch._weight_int8pack_mm; 40: the dequantised F.linear path
def test_int8_linear_is_the_rounded_weight_row_by_row(k, dynamic):
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(k, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, k, generator=gen))
        lin.weight[3] = 0.0  # an all-zero row: scale 1, weights 0
    q = PR.Int8Linear(lin, dynamic=dynamic)
    act = torch.float32 if dynamic else torch.bfloat16
    assert q.packed == (k % 16 == 0) and q.weight_int8.dtype == torch.int8 and q.scale.dtype == act
    assert int(q.weight_int8.abs().max()) == 127 and bool((q.weight_int8[3] == 0).all())
    # the int8 weights are the rounded weights, one symmetric scale per output row
    w = lin.weight.detach()
    s32 = (w.abs().amax(1) / 127).where(w.abs().amax(1) > 0, torch.ones(()))
    assert torch.equal(q.weight_int8, torch.round(w / s32[:, None]).clamp(-127, 127).to(torch.int8))
    assert torch.equal(q.scale, s32.to(act))
    deq = q.weight_int8.float() * q.scale.float()[:, None]  # (24, k)
    assert float((deq - w).abs().max()) <= float(s32.max()) * (0.5 + 127 * 2 ** -8)  # half a step + bf16 scale
    x = torch.randn(2, 7, k, generator=gen)
    x[0, 3] *= 100  # one row far larger than the others: a per-tensor activation scale would crush the rest
    with torch.no_grad():
        y = q(x)
        ref = torch.nn.functional.linear(x.to(act).float(), deq, q.bias.float())
        rows = torch.cat([q(x.reshape(-1, k)[i:i + 1]) for i in range(14)]).reshape(2, 7, 24)
    assert y.shape == (2, 7, 24) and y.dtype == act
    scale = ref.abs().amax(-1, keepdim=True)  # per row: each row must be right at its own scale
    assert bool(((y.float() - ref).abs() <= 2e-2 * scale).all())
    assert torch.equal(y, rows)  # each row from its own input alone: no per-tensor activation scale
    # negative control: a per-TENSOR activation scale (torch.ao's dynamic quantisation) breaks both properties
    s_t = x.abs().max() / 127
    y_t = (torch.round(x / s_t).clamp(-127, 127) * s_t) @ deq.T + q.bias.float()
    assert not bool(((y_t - ref).abs() <= 2e-2 * scale).all())


def test_apply_precision_converts_every_linear():
    for prec, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("int8", torch.bfloat16),
                        ("int8-dynamic", torch.float32)):
        cp = PR.apply_precision(build_from_config(tiny_config_dict(), seed=0).talker.code_predictor, prec,
                                require_native=False)
        assert PR.precision_of(cp) == prec and P.param_dtype(cp) == dtype
        assert all(p.dtype == dtype for p in cp.parameters())
        linears = [m for m in cp.modules() if isinstance(m, torch.nn.Linear)]
        int8 = [m for m in cp.modules() if isinstance(m, PR.Int8Linear)]
        quantised = prec.startswith("int8")
        assert (len(linears), len(int8) > 0) == ((0, True) if quantised else (len(linears), False))


# ----------------------------------------------------------------------------------------------------------------
# exact: verify rows equal AR's single-row calls; greedy frames through verify equal AR's
# ----------------------------------------------------------------------------------------------------------------
def _converted(prec: str, seed: int = 0):
    return PR.apply_precision(build_from_config(tiny_config_dict(), seed=seed).talker.code_predictor, prec,
                              require_native=False)


@torch.inference_mode()
def _ar_and_verify_hidden(cp, context, codes):
    """Hidden states of positions 2..k+1 (codes 1..k fed), once one position per call (AR) and once all k in ONE
    verify call with a causal mask. ``context`` (B, 2, Ht), ``codes`` (B, k). Returns two (B, k, H) tensors."""
    b, k = codes.shape
    slots = 2 + k
    depth = torch.arange(1, k + 1).expand(b, k)
    x = cp.small_to_mtp_projection(context.to(P.param_dtype(cp)))
    causal = torch.ones(slots, slots, dtype=torch.bool).tril()

    def prefill():
        cache = P.StaticSlotCache(cp, b, slots)
        P.verify_forward(cp, x, torch.arange(2).expand(b, 2), causal[None, :2].expand(b, 2, slots), cache,
                         torch.arange(2).expand(b, 2))
        return cache

    emb = P.embed_codes(cp, codes, depth)  # (B, k, H)
    cache = prefill()
    ar = [P.verify_forward(cp, emb[:, j:j + 1], torch.full((b, 1), j + 2),
                           causal[None, j + 2:j + 3].expand(b, 1, slots), cache, torch.full((b, 1), j + 2))
          for j in range(k)]
    cache = prefill()
    ver = P.verify_forward(cp, emb, torch.arange(2, k + 2).expand(b, k), causal[None, 2:].expand(b, k, slots), cache,
                           torch.arange(2, k + 2).expand(b, k))
    return torch.cat(ar, 1), ver


#: Tolerance of verify rows against AR's single-row calls (relative to the largest |hidden|): float32 GEMMs block
#: differently for 1 and k rows (measured below 1e-6 relative, in float32 arithmetic, int8-dynamic's attention and
#: norms too); the bfloat16 and int8 paths were equal bit for bit here, but oneDNN's bfloat16 GEMMs may block by row
#: count on other CPUs, so they get bfloat16's resolution.
VERIFY_RTOL = {"float32": 1e-5, "bfloat16": 1e-2, "int8": 1e-2, "int8-dynamic": 1e-5}


@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_verify_rows_equal_ar_calls_and_greedy_frames_equal(prec):
    cp = _converted(prec)
    h = int(cp.model.codec_embedding[0].embedding_dim)
    gen = torch.Generator().manual_seed(5)
    context = torch.randn(16, 2, h, generator=gen)
    codes = torch.randint(0, int(cp.config.vocab_size), (16, 6), generator=gen)
    ar, ver = _ar_and_verify_hidden(cp, context, codes)
    scale = float(ar.float().abs().max())
    err = float((ar.float() - ver.float()).abs().max())
    assert err <= VERIFY_RTOL[prec] * scale, (prec, err, scale)
    # greedy codes through verify equal AR's where the top-2 margin of AR's logits is clear (here: every row)
    heads = torch.arange(1, 7).expand(16, 6).reshape(-1)
    la = P.head_logits(cp, ar.reshape(-1, ar.shape[-1]), heads).float()
    lv = P.head_logits(cp, ver.reshape(-1, ver.shape[-1]), heads).float()
    top2 = la.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 4 * float((la - lv).abs().max().detach())
    assert bool(clear.float().mean() > 0.9)
    assert torch.equal(la.argmax(-1)[clear], lv.argmax(-1)[clear])
    # and whole greedy frames: every decoder commits AR's codes
    ctx = torch.randn(32, 2, h, generator=gen)
    greedy = Sampling(greedy=True)
    ref = decode_frame(cp, ctx, decoder=AR(), sampling=greedy, generator=torch.Generator().manual_seed(0)).codes
    for dec in (Chain(4), Tree([(0,), (1,), (0, 0), (0, 0, 0)]), Tree([(0,), (1,), (0, 0)], sampled=True)):
        res = decode_frame(cp, ctx, decoder=dec, sampling=greedy, generator=torch.Generator().manual_seed(0))
        assert torch.equal(res.codes, ref), (prec, dec)


@pytest.mark.parametrize("prec", ["int8", "int8-dynamic"])
def test_int8_model_is_the_float_model_up_to_rounding(prec):
    """Negative control of the conversion (it must change something, and only a little): int8 logits differ from
    float32's, by less than a tenth of their spread."""
    f32, i8 = _converted("float32"), _converted(prec)
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        a = f32.forward_finetune(inputs_embeds=x).logits
        b = i8.forward_finetune(inputs_embeds=x.to(P.param_dtype(i8))).logits.float()
    diff = float((a - b).abs().max())
    assert 0 < diff < 0.1 * float(a.std())


# ----------------------------------------------------------------------------------------------------------------
# lossless in that precision: G-tests against the converted module's exact pmf
# ----------------------------------------------------------------------------------------------------------------
def _variant_in(model: str, prec: str):
    cp, context = variant(model)
    cp = PR.apply_precision(copy.deepcopy(cp), prec, require_native=False)
    return cp, context.to(P.param_dtype(cp))  # exact_pmf concatenates it with the module's embeddings


def _run(model, prec, decoder, sampling, seed=1234):
    return run_on(*_variant_in(model, prec), decoder, sampling, seed)


G_CASES = [(prec, model, dec, s) for prec in PR.PRECISIONS[1:] for model, dec, s in (
    ("sharp", Chain(4), DEFAULT), ("sharp", SAMPLED_WIDE, HOT_TOPK3), ("peaked", TREE_WIDE, NUCLEUS))]


@pytest.mark.slow
@pytest.mark.parametrize("prec,model,decoder,sampling", G_CASES,
                         ids=[f"{p}-{m}-{d!r}".replace(" ", "") for p, m, d, _ in G_CASES])
def test_speculation_samples_ar_distribution_in_precision(prec, model, decoder, sampling):
    pval, df, g, n, res = _run(model, prec, decoder, sampling)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"{prec}: G={g:.1f} df={df} p={pval:.2e} N={n}: speculation does not sample AR's target"
    assert float(res.tokens_per_call.mean()) > 1.0  # it really speculated


@pytest.mark.slow
@pytest.mark.parametrize("prec", PR.PRECISIONS[1:])
def test_negative_control_lossy_ssd_is_caught_in_precision(prec):
    pval, df, g, n, _ = _run("sharp", prec, LossySSD(), DEFAULT)
    assert pval < ALPHA, f"{prec}: LossySSD passed the G-test (G={g:.1f} df={df} p={pval:.2e}, N={n})"


@pytest.mark.parametrize("prec", PR.PRECISIONS[1:])
def test_the_precision_pmf_is_not_the_float32_pmf(prec):
    """The G-tests above compare against the converted module's own pmf, and it really differs from float32's
    (so the tests are of the precision, not of float32 again)."""
    cp32, context = variant("sharp")
    cp_p, ctx_p = _variant_in("sharp", prec)
    a, b = exact_pmf(cp32, context, DEFAULT), exact_pmf(cp_p, ctx_p, DEFAULT)
    assert float((a - b).abs().sum()) > 1e-4


# ----------------------------------------------------------------------------------------------------------------
# the commands: a precision the CPU cannot run is refused in one line, before any model loads
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["bench", "latency", "--model", "tiny-random", "--dtype", "bfloat16"],
    ["bench", "precisions", "--model", "tiny-random", "--dtype", "float32,int8"],
    ["synth", "--model", "tiny-random", "--text", "Hi.", "--out", "{tmp}/x.wav", "--dtype", "int8"],
    ["synth", "--model", "tiny-random", "--text", "Hi.", "--out", "{tmp}/x.wav", "--dtype", "bfloat16"],
    ["synth", "--model", "tiny-random", "--text", "Hi.", "--out", "{tmp}/x.wav", "--dtype", "int8-dynamic"],
])
def test_commands_refuse_a_precision_the_cpu_cannot_run(tmp_path, capsys, monkeypatch, argv, no_load):
    from rvqspec_lib.cli.main import main

    monkeypatch.setattr(PR, "cpu_flags", lambda *a: ZEN2)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: --dtype ") and err.count("\n") == 1, err
    assert ("needs AVX512-VNNI" if "int8-dynamic" in argv else "needs AVX512-BF16 or AMX-BF16") in err
    assert err.rstrip().endswith("use float32")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype,needle", [("fp8", "--dtype fp8: give some of"),  # unknown
                                          ("float32,float64", "--dtype float32,float64: give some of"),  # not compared
                                          ("int8,int8", "each once")])
def test_bench_refuses_bad_dtype_lists(capsys, dtype, needle, no_load):
    """bench precisions compares the four precisions (float64 is none of them), each once; onnx times float32."""
    from rvqspec_lib.cli.main import main

    assert main(["bench", "precisions", "--model", "tiny-random", "--dtype", dtype]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert "give some of float32, bfloat16, int8, int8-dynamic, each once" in err and "float64," not in err, err
    assert main(["bench", "frames", "--model", "tiny-random", "--dtype", "int8", "--backends", "onnx"]) == 2
    assert "--backends onnx is not available here: the onnx backend runs float32 modules, not int8" in \
        capsys.readouterr().err


def test_auto_choice_is_cached_per_precision():
    """bfloat16 and int8 modules share a parameter dtype; the auto choice's cache key still tells them apart."""
    from rvqspec_lib.eval.budget import cache_key

    keys = {prec: cache_key("tiny-random", _converted(prec), {}, "heads")["dtype"] for prec in PR.PRECISIONS}
    assert keys == {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "int8": "int8",
                    "int8-dynamic": "int8-dynamic"}
