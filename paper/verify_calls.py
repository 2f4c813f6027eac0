"""The inputs of the verify calls of one decoded frame, recorded as the decode loop passes them to the model (Figure
2's mask, never rebuilt by hand; docs/methods.md#the-tree-as-data): ``decode_frame`` runs through an official backend
that keeps a copy of every call's positions, ``allow`` mask and written slots."""

from __future__ import annotations

import torch

from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.predictor import OfficialBackend


class _RecordingBackend(OfficialBackend):
    """:class:`OfficialBackend` that keeps ``(positions, allow, write_slots)`` of every ``forward`` call."""

    name = "official-recording"

    def __init__(self, code_predictor):
        super().__init__(code_predictor)
        self.calls: list[dict] = []

    def forward(self, embeds, positions, allow, cache, write_slots):
        self.calls.append({"positions": positions.detach().cpu().clone(), "allow": allow.detach().cpu().clone(),
                           "write_slots": write_slots.detach().cpu().clone()})
        return super().forward(embeds, positions, allow, cache, write_slots)


def record_verify_calls(code_predictor, context: torch.Tensor, decoder, *, sampling=None, seed: int = 0) -> list[dict]:
    """Decode one frame (``context`` ``(1, 2, talker_hidden)``; the rest as
    :func:`rvqspec_lib.decoding.decode.decode_frame`) and return each code-predictor call's inputs, prefill first:
    ``positions`` ``(Q,)`` int64, ``allow`` ``(Q, S)`` bool, ``write_slots`` ``(Q,)`` int64, ``n_query``, ``kind``
    (``"prefill"`` or ``"verify"``).

    Raises:
        ValueError: ``context`` is not a batch of one frame.
    """
    if not isinstance(context, torch.Tensor) or context.dim() != 3 or context.shape[0] != 1:
        raise ValueError(f"context must be (1, 2, hidden), one frame; got {tuple(getattr(context, 'shape', ()))}: "
                         "pass frames.context[:1]")
    backend = _RecordingBackend(code_predictor)
    gen = torch.Generator(device=context.device).manual_seed(int(seed))
    with torch.no_grad():
        decode_frame(code_predictor, context, decoder=decoder, sampling=sampling, generator=gen, backend=backend)
    return [{"positions": c["positions"][0], "allow": c["allow"][0], "write_slots": c["write_slots"][0],
             "n_query": int(c["positions"].shape[1]), "kind": "prefill" if i == 0 else "verify"}
            for i, c in enumerate(backend.calls)]
