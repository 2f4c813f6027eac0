"""The decode round as named steps (draft -> verify -> accept -> commit) and the fixed shapes of the verify call.

``decode_frame`` is the four steps in a loop; here the loop is written out by hand from the public steps and must
give exactly the same codes, calls and logs under the same seed, and every verify call of a frame (after the
prefill) must have the same input shapes, so one compiled or exported graph serves every round.
"""

from __future__ import annotations

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import RoundPlan, accept, commit, decode_frame, draft, prefill, verify
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling

DECODERS = [AR(), Chain(4), Chain(8), Tree([(0,), (1,), (0, 0), (0, 0, 0)]), Tree([(0,) * t for t in range(1, 8)])]
IDS = ["AR", "Chain4", "Chain8", "Tree-default", "Tree-deep"]


@pytest.fixture(scope="module")
def cp():
    return load_model("tiny-random").code_predictor


def _context(cp, b, seed=0):
    h = cp.model.codec_embedding[0].embedding_dim
    return torch.randn(b, 2, h, generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def _by_hand(cp, ctx, decoder, sampling, seed):
    gen = torch.Generator().manual_seed(seed)
    n = P.n_codes(cp)
    plan = RoundPlan.build(decoder.tree(n), n, sampled=decoder.sampled_drafts, device=ctx.device)
    state = prefill(cp, ctx, plan, sampling, gen)
    while bool(state.active.any()):
        d = draft(cp, ReusedHeads(), plan, state, sampling, gen)
        v = verify(cp, plan, state, d, sampling)
        w = accept(plan, d, v, gen)
        commit(plan, state, d, v, w)
    return state.result()


@pytest.mark.parametrize("decoder", DECODERS, ids=IDS)
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_steps_by_hand_equal_decode_frame(cp, decoder, greedy):
    sampling = Sampling(greedy=greedy)
    ctx = _context(cp, 3)
    ref = decode_frame(cp, ctx, decoder=decoder, sampling=sampling, generator=torch.Generator().manual_seed(7))
    got = _by_hand(cp, ctx, decoder, sampling, 7)
    assert torch.equal(got.codes, ref.codes)
    assert torch.equal(got.calls, ref.calls)
    assert torch.equal(got.committed, ref.committed) and torch.equal(got.start_depth, ref.start_depth)


@pytest.mark.parametrize("decoder", DECODERS, ids=IDS)
def test_every_verify_call_of_a_frame_has_the_same_shapes(cp, decoder, monkeypatch):
    shapes = []
    real = P.verify_forward

    def spy(code_predictor, embeds, positions, allow, cache, write_slots):
        shapes.append((tuple(embeds.shape), tuple(positions.shape), tuple(allow.shape), tuple(write_slots.shape),
                       tuple(cache._k[0].shape)))
        return real(code_predictor, embeds, positions, allow, cache, write_slots)

    monkeypatch.setattr(P, "verify_forward", spy)
    res = decode_frame(cp, _context(cp, 2), decoder=decoder, generator=torch.Generator().manual_seed(1))
    assert len(shapes) == int(res.calls.max())  # one forward per call, the prefill included
    rounds = shapes[1:]
    assert len(rounds) >= 1 and all(s == rounds[0] for s in rounds), rounds
    n_query = decoder.tree(15).n_nodes + 1
    assert rounds[0][0][:2] == (2, n_query)
    # the cache never grows: the prefill and every round see the same slots
    assert all(s[4] == shapes[0][4] for s in shapes)


def test_shape_spy_can_fail(cp, monkeypatch):
    """Negative control: a cache that grows with the frame (as a plain dynamic cache would) is caught."""
    shapes = []
    real = P.verify_forward

    def growing(code_predictor, embeds, positions, allow, cache, write_slots):
        shapes.append(tuple(allow.shape[:2]) + (int(cache.n_slots) + len(shapes),))
        return real(code_predictor, embeds, positions, allow, cache, write_slots)

    monkeypatch.setattr(P, "verify_forward", growing)
    decode_frame(cp, _context(cp, 1), decoder=Chain(4), generator=torch.Generator().manual_seed(1))
    rounds = shapes[1:]
    assert len(rounds) > 1 and not all(s == rounds[0] for s in rounds)


def test_static_slot_cache_compaction_keeps_slots_in_order():
    cp = load_model("tiny-random").code_predictor
    cache = P.StaticSlotCache(cp, batch=2, slots=5)
    for k in cache._k:
        k.copy_(torch.arange(5, dtype=k.dtype)[None, None, :, None].expand_as(k))
    order = torch.tensor([[0, 2, 4, 1, 3], [4, 3, 2, 1, 0]])
    cache.compact(order)
    assert torch.equal(cache._k[0][0, 0, :, 0], torch.tensor([0.0, 2, 4, 1, 3]))
    assert torch.equal(cache._k[0][1, 0, :, 0], torch.tensor([4.0, 3, 2, 1, 0]))
