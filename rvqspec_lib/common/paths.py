"""Where the repository's own files are: the root (relative output folders resolve against it) and ``data/``."""

from __future__ import annotations

from pathlib import Path

#: Root of the repository (this file lives in ``<root>/rvqspec_lib/common/``).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Shipped data: ``configs/`` (the released configs), ``embedded/`` (the small trained model), ``eval_texts/``.
DATA_DIR = REPO_ROOT / "data"
