"""Encoding the rendered corpus into codes (one ``(frames, 16)`` array per utterance) with the fitted codec, and the
inner loop's own codes of whole utterances (true code 0, codes 1..15 by AR): what the code decoder trains on and
what the model card's inner-loop condition speaks.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.data.frame_sources import frames_from_utterances
from rvqspec_lib.data.teacher import as_utterance, eval_mode
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models.audio import load_wav
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.models.loader import LoadedModel


def encode_manifest(rows: Iterable[Mapping], codec, *, progress: bool = True) -> dict[str, np.ndarray]:
    """Encode every utterance of a manifest (rows with ``id`` and absolute ``path``) with an ``RVQCodec``:
    ``{id: (frames, n_codebooks) int64}``."""
    rows = list(rows)
    return {r["id"]: np.asarray(codec.encode(load_wav(r["path"], codec.config.sample_rate)), dtype=np.int64)
            for r in progress_bar(rows, desc="encode", unit="utt", enabled=progress)}




def inner_loop_codes(lm: LoadedModel, utt, *, sampling: Sampling | None = None,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """:func:`inner_loop_codes_batch` of one utterance, every frame in one decode call: ``(frames, G)`` int64, column
    0 the true code 0. ``sampling`` default the checkpoint's; ``generator`` default seeded 0."""
    u = as_utterance(utt)
    return inner_loop_codes_batch(lm, [u], sampling=sampling, generator=generator,
                                  chunk_frames=max(1, u.codes.shape[0]))[0]


@torch.no_grad()
def inner_loop_codes_batch(lm: LoadedModel, utts: Sequence, *, batch_size: int = 16,
                           sampling: Sampling | None = None, generator: torch.Generator | None = None,
                           progress: bool = False, chunk_frames: int = 2048) -> list[torch.Tensor]:
    """True code 0 plus codes 1..G-1 sampled by AR for every frame of many utterances, from teacher-forced talker
    passes over the TRUE frames, ``chunk_frames`` frames a decode call.

    Returns:
        One ``(frames, G)`` int64 tensor per utterance, in input order.

    Raises:
        ValueError: no utterances, codes that do not fit the model.
    """
    us = [as_utterance(u) for u in utts]
    if not us:
        raise ValueError("no utterances to run the inner loop on")
    frames = frames_from_utterances(lm, us, batch_size=batch_size, progress=progress)  # input order
    dev = next(lm.model.parameters()).device
    generator = generator if generator is not None else torch.Generator(device=dev).manual_seed(0)
    sampling = sampling or inner_sampling(lm)
    parts = []
    with eval_mode(lm.model):
        for s in progress_bar(range(0, len(frames), chunk_frames), desc="inner loop", unit="chunk", enabled=progress):
            res = decode_frame(lm.code_predictor, frames.context[s:s + chunk_frames].to(dev), decoder=AR(),
                               sampling=sampling, generator=generator)
            parts.append(res.codes.cpu())
    generated = torch.split(torch.cat(parts), [u.codes.shape[0] for u in us])
    return [torch.cat([u.codes[:, :1].long(), g], 1) for u, g in zip(us, generated)]
