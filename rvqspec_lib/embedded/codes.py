"""Encoding the rendered corpus into codes (one ``(frames, 16)`` array per utterance) with the fitted codec.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.models.audio import load_wav


def encode_manifest(rows: Iterable[Mapping], codec, *, progress: bool = True) -> dict[str, np.ndarray]:
    """Encode every utterance of a manifest with a codec.

    Args:
        rows: manifest rows (:func:`rvqspec_lib.embedded.corpus.read_manifest`: ``id`` and absolute ``path``).
        codec: an :class:`~rvqspec_lib.models.rvq_codec.RVQCodec` (anything with ``encode(wav)`` and ``sample_rate``).
    Returns:
        ``{id: (frames, n_codebooks) int64}``.
    """
    rows = list(rows)
    return {r["id"]: np.asarray(codec.encode(load_wav(r["path"], codec.config.sample_rate)), dtype=np.int64)
            for r in progress_bar(rows, desc="encode", unit="utt", enabled=progress)}
