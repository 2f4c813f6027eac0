"""The fused AR frame (rvqspec_lib.device.fused): one call per frame, Gumbel-max sampling inside, noise as an input.

Its distribution is tested with the exact-pmf G-test in tests/test_lossless.py (with a negative control); here the
exact properties: greedy codes equal decode_frame's AR (and so the official generate's, tests/test_frame.py), the
same noise gives the same codes (other noise other codes), the warpers equal transformers', and the compiled graph
gives the eager function's codes.
"""

from __future__ import annotations

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.sampling import Sampling


@pytest.fixture(scope="module")
def cp():
    return load_model("tiny-random").code_predictor


def _ctx(cp, b, seed=0):
    return torch.randn(b, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(seed))


def test_greedy_fused_frame_equals_ar(cp):
    g = Sampling(greedy=True)
    ctx = _ctx(cp, 6)
    ref = decode_frame(cp, ctx, sampling=g).codes
    got = FusedARFrame(cp, g, compile=False).decode(ctx, torch.Generator().manual_seed(0))
    assert got.shape == ref.shape == (6, P.n_codes(cp)) and torch.equal(got, ref)


def test_same_noise_same_codes_other_noise_other_codes(cp):
    f = FusedARFrame(cp, compile=False)
    ctx = _ctx(cp, 4)
    a = f.decode(ctx, torch.Generator().manual_seed(1))
    assert torch.equal(a, f.decode(ctx, torch.Generator().manual_seed(1)))
    assert torch.equal(a, f(ctx, f.noise(4, torch.Generator().manual_seed(1))))
    assert not torch.equal(a, f.decode(ctx, torch.Generator().manual_seed(2)))  # negative control


def test_warpers_equal_transformers(cp):
    """Softmax of the fused frame's warped scores is exactly Sampling.probs (transformers' warper classes)."""
    logits = torch.randn(5, 2048, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, :60] = 1.0  # ties at the k-th value: every tied code is kept, as TopKLogitsWarper does
    for s in (Sampling(), Sampling(temperature=1.0, top_k=3), Sampling(temperature=0.7, top_k=0)):
        got = torch.softmax(FusedARFrame(cp, s, compile=False).warp(logits), -1)
        assert torch.equal(got, s.probs(logits))


def test_noise_is_standard_gumbel(cp):
    f = FusedARFrame(cp, compile=False)
    g = f.noise(64, torch.Generator().manual_seed(0))  # 64 x 15 x 2048 draws
    assert g.dtype == torch.float32 and bool(torch.isfinite(g).all())
    # mean = Euler's gamma 0.5772, sd = pi / sqrt(6) = 1.2825; 5 standard errors of the mean
    assert abs(float(g.double().mean()) - 0.5772157) < 5 * 1.2825 / g.numel() ** 0.5
    assert abs(float(g.double().std()) - 1.2825498) < 0.01


def test_fused_frame_refuses_top_p(cp):
    with pytest.raises(ValueError, match="top-k only"):
        FusedARFrame(cp, Sampling(top_p=0.8), compile=False)


@pytest.mark.slow
def test_compiled_fused_frame_equals_eager():
    """The whole frame compiled (a 4-codebook tiny model keeps the compile short) gives the eager codes."""
    cfg = tiny_config_dict(n_code_groups=4, codebook_size=8)
    small = build_from_config(cfg, seed=0).talker.code_predictor
    ctx = _ctx(small, 8)
    eager, comp = FusedARFrame(small, compile=False), FusedARFrame(small, compile=True)
    noise = eager.noise(8, torch.Generator().manual_seed(3))
    assert torch.equal(comp(ctx, noise), eager(ctx, noise))
    assert list(comp.compile_s) == [8] and comp.compile_s[8] > 0
    assert torch.equal(comp(ctx, noise), eager(ctx, noise)) and list(comp.compile_s) == [8]  # no recompile
