"""The lean forward (rvqspec_lib.device.lean, the ``eager`` and ``compile`` backends) against the official module.

* eager: the hidden states of every call (prefill, a tree-masked verify call, a call after the cache
  was compacted) are BIT-IDENTICAL to the official call, on tiny-random and on the real-size 0.6B code predictor
  (its released config, 2 of its 5 layers to keep the test fast); so decode_frame gives the same codes, calls and
  logs under the same seed, sampled as well as greedy.
* ``compile=True``: one graph per input shape, within float32 rounding of the eager lean forward.
Negative controls show that each comparison can fail.
"""

from __future__ import annotations

import json

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.device import lean
from rvqspec_lib.models.configs import build_from_config
from rvqspec_lib.device.lean import LeanCodePredictor
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling

#: compiled vs eager lean forward (inductor fuses the norms and RoPE: float32 rounding only).
COMPILE_REL_TOL = 1e-5


def real_size_code_predictor(n_layers: int = 2):
    """The 0.6B code predictor from its released config (hidden 1024, 16/8 heads, SwiGLU 3072, 15 heads of 2048)
    with ``n_layers`` of its 5 layers, random weights; the talker is shrunk to 1 layer and a small text vocabulary,
    since only the code predictor is used."""
    cfg = json.loads((DATA_DIR / "configs" / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "config.json").read_text())
    cfg["talker_config"].update(num_hidden_layers=1, text_vocab_size=1024)
    cfg["talker_config"]["code_predictor_config"]["num_hidden_layers"] = n_layers
    return build_from_config(cfg, seed=0).talker.code_predictor


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random").code_predictor


@pytest.fixture(scope="module")
def real():
    return real_size_code_predictor()


def _calls(backend, cp, seed=0, n_calls=3):
    """Three verify calls through ``backend``: the 2-position prefill, a 4-node tree call (each node sees the
    committed slots and its ancestors), then, after compacting the cache (slots 0, 1, 2, 4 kept), a 3-node chain.
    Returns the hidden states and the final cache's first layer (``n_calls=2``: the first two calls only)."""
    g = torch.Generator().manual_seed(seed)
    h, hid = P.talker_hidden_size(cp), int(cp.config.hidden_size)
    slots = 12
    cache = backend.new_cache(2, slots)
    slot = torch.arange(slots)
    outs = []
    with torch.inference_mode():
        ctx = cp.small_to_mtp_projection(torch.randn(2, 2, h, generator=g))
        allow = (slot[None, :] <= torch.arange(2)[:, None]).expand(2, 2, slots)
        outs.append(backend.forward(ctx, torch.arange(2).expand(2, 2), allow, cache, torch.arange(2).expand(2, 2)))
        # root + 3 nodes: 1 and 2 children of the root, 3 child of 1
        anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
        allow = (slot[None, None, :] < 2).expand(2, 4, slots).clone()
        allow[:, :, 2:6] = anc
        x = torch.randn(2, 4, hid, generator=g)
        pos = torch.tensor([[2, 3, 3, 4], [2, 3, 3, 4]])
        outs.append(backend.forward(x, pos, allow, cache, torch.arange(2, 6).expand(2, 4)))
        if n_calls == 2:
            return outs, (cache._k[0] if hasattr(cache, "_k") else cache.k[0])
        order = torch.tensor([0, 1, 2, 4, 3] + list(range(5, slots))).expand(2, slots)
        backend.compact(cache, order)
        allow = (slot[None, None, :] < 4).expand(2, 3, slots).clone()
        allow[:, :, 4:7] = torch.ones(3, 3, dtype=torch.bool).tril()
        x = torch.randn(2, 3, hid, generator=g)
        outs.append(backend.forward(x, torch.tensor([[4, 5, 6]]).expand(2, 3), allow, cache,
                                    torch.arange(4, 7).expand(2, 3)))
    k = cache._k[0] if hasattr(cache, "_k") else cache.k[0]
    return outs, k


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_lean_forward_is_bit_identical_to_the_official_call(request, model):
    cp = request.getfixturevalue(model)
    ref, k_ref = _calls(P.OfficialBackend(cp), cp)
    got, k_got = _calls(LeanCodePredictor(cp), cp)
    for a, b in zip(ref, got):
        assert a.shape == b.shape and torch.equal(a, b), float((a - b).abs().max())
    assert torch.equal(k_ref, k_got)  # same keys, in the same slots, after the compaction


def test_bit_identity_check_can_fail(tiny, monkeypatch):
    """Negative control: a lean forward whose RMSNorm epsilon is off by 1e-6 is caught by the same comparison."""
    ref, _ = _calls(P.OfficialBackend(tiny), tiny)
    be = LeanCodePredictor(tiny)
    monkeypatch.setattr(be.stack, "eps", be.stack.eps + 1e-6)
    got, _ = _calls(be, tiny)
    assert not all(torch.equal(a, b) for a, b in zip(ref, got))


DECODERS = [AR(), Chain(4), Chain(8), Tree(), Tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)], sampled=True)]


@pytest.mark.parametrize("decoder", DECODERS, ids=repr)
@pytest.mark.parametrize("greedy,batch", [(False, 4), (True, 4), (False, 1)], ids=["sampled", "greedy", "one-row"])
def test_decode_frame_through_the_lean_forward_equals_the_official_draw_for_draw(tiny, decoder, greedy, batch):
    """Bit-identical hidden states + random numbers drawn in the same order = the same frames, even sampled (one
    row: the one-row walk and the one-row cache compaction)."""
    ctx = torch.randn(batch, 2, P.talker_hidden_size(tiny), generator=torch.Generator().manual_seed(3))
    s = Sampling(greedy=greedy)
    ref = decode_frame(tiny, ctx, decoder=decoder, sampling=s, generator=torch.Generator().manual_seed(5))
    got = decode_frame(tiny, ctx, decoder=decoder, sampling=s, generator=torch.Generator().manual_seed(5),
                       backend=LeanCodePredictor(tiny))
    assert torch.equal(ref.codes, got.codes) and torch.equal(ref.calls, got.calls)
    assert torch.equal(ref.committed, got.committed) and torch.equal(ref.accepted, got.accepted)


@pytest.mark.slow
def test_compiled_lean_forward_one_graph_per_shape(tiny):
    eager = LeanCodePredictor(tiny)
    comp = LeanCodePredictor(tiny, compile=True)
    ref, _ = _calls(eager, tiny, n_calls=2)
    got, _ = _calls(comp, tiny, n_calls=2)
    for a, b in zip(ref, got):
        assert float((a - b).abs().max()) <= COMPILE_REL_TOL * float(a.abs().max())
    assert sorted(comp.compile_s) == [(2, 2, 12), (2, 4, 12)]  # one compile per shape
    before = dict(comp.compile_s)
    _calls(comp, tiny, seed=1, n_calls=2)  # the same shapes again: no new graph
    assert comp.compile_s == before


def test_lean_refuses_what_it_cannot_run(tiny):
    with pytest.raises(ValueError, match="official code predictor"):
        LeanCodePredictor(torch.nn.Linear(2, 2))


def test_rope_positions_cover_every_tree_of_the_node_budget():
    # positions = depth + 1 <= n_codes + deepest offset of a 63-node tree + 1
    assert lean.ROPE_POSITIONS >= 15 + 63 + 1
