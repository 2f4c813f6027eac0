"""Encoding the rendered corpus into codes (one ``(frames, 16)`` array per utterance) with the fitted codec.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.models.audio import load_wav


def encode_manifest(rows: Iterable[Mapping], codec, *, progress: bool = True) -> dict[str, np.ndarray]:
    """Encode every utterance of a manifest (rows with ``id`` and absolute ``path``) with an ``RVQCodec``:
    ``{id: (frames, n_codebooks) int64}``."""
    rows = list(rows)
    return {r["id"]: np.asarray(codec.encode(load_wav(r["path"], codec.config.sample_rate)), dtype=np.int64)
            for r in progress_bar(rows, desc="encode", unit="utt", enabled=progress)}
