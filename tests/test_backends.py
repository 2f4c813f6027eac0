"""The one registry of verify backends and frame runners (rvqspec_lib/models/backends.py).

* every backend builds by name, carries that name, and refuses what it cannot run in one line;
* a stepped runner is decode_frame through the backend, draw for draw;
* greedy frames are the same codes through every runner, stepped or fused (the lossless tests of each fused frame
  are in test_fused.py, test_fused_spec.py and test_native_frame.py);
* fused_support names why a decoder has no fused frame.
"""

import pytest
import torch

from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree
from rvqspec_lib.decoding.drafters import PositionOffsets
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models import backends as B

GREEDY = Sampling(greedy=True)


def _ctx(cp, n=2, seed=0):
    h = cp.model.codec_embedding[0].embedding_dim
    return torch.randn(n, 2, h, generator=torch.Generator().manual_seed(seed))


def test_every_available_backend_builds_under_its_name(cp):
    for row in B.backend_table():
        if not row["available"]:
            continue
        be = B.verify_backend(row["backend"], cp)
        assert be.name == row["backend"]


def test_unknown_and_absent_backends_are_one_line_errors(cp):
    with pytest.raises(ValueError, match="unknown backend 'mlx': use one of official, eager") as e:
        B.verify_backend("mlx", cp)
    assert "\n" not in str(e.value)
    ok, why = B.available("onnx", "bfloat16")
    assert not ok and "float32" in why
    with pytest.raises(ValueError, match="not available here: the onnx backend runs float32"):
        B.check_available("onnx", "bfloat16")


def test_a_stepped_runner_is_decode_frame_draw_for_draw(cp):
    ctx = _ctx(cp)
    for dec in (AR(), Chain(3), Tree([(0,), (1,), (0, 0)])):
        runner = B.frame_runner("eager", cp, dec)
        got = runner(ctx, torch.Generator().manual_seed(5))
        want = decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(5))
        assert torch.equal(got.codes, want.codes) and torch.equal(got.calls, want.calls)
        assert runner.backend == "eager" and not runner.fused


@pytest.mark.parametrize("name", ["eager", "native"])
@pytest.mark.parametrize("decoder", [AR(), Chain(4)], ids=["ar", "chain4"])
def test_greedy_codes_are_the_same_through_every_runner(cp, name, decoder):
    ok, why = B.available(name)
    if not ok:
        pytest.skip(why)
    ctx = _ctx(cp, n=3, seed=1)
    want = decode_frame(cp, ctx, decoder=AR(), sampling=GREEDY).codes
    for fused in (False, True):
        res = B.frame_runner(name, cp, decoder, fused=fused, sampling=GREEDY)(ctx, torch.Generator().manual_seed(0))
        assert torch.equal(res.codes, want), (name, decoder, fused)
        assert res.calls.shape == (3,) and int(res.calls.min()) >= 1


def test_a_fused_chain_reports_its_calls(cp):
    runner = B.frame_runner("eager", cp, Chain(4), fused=True, sampling=GREEDY)
    res = runner(_ctx(cp, n=1), torch.Generator().manual_seed(0))
    assert runner.fused and 1 <= int(res.calls[0]) <= runner.n_codes
    assert float(res.tokens_per_call[0]) == runner.n_codes / int(res.calls[0])


def test_fused_support_names_why_not(cp):
    assert B.fused_support("eager", AR()) is None and B.fused_support("native", Chain(5)) is None
    assert "official module has no fused frame" in B.fused_support("official", AR())
    assert "not Tree" in B.fused_support("eager", Tree([(0,)]))
    assert "not LossySSD" in B.fused_support("eager", LossySSD())
    assert "reused heads only" in B.fused_support("native", Chain(4, drafter=PositionOffsets.for_code_predictor(cp)))
    assert "top-k only" in B.fused_support("native", Chain(4), Sampling(top_p=0.8))
    assert "AR frame only" in B.fused_support("onnx", Chain(4))
    with pytest.raises(ValueError, match="no fused eager frame for this decoder: a fused frame runs AR or a chain"):
        B.frame_runner("eager", cp, Tree([(0,)]), fused=True)
    with pytest.raises(ValueError, match="a fused frame computes its own acceptance"):
        B.frame_runner("eager", cp, AR(), fused=True, acceptance=object())
