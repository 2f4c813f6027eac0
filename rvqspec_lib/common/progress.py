"""Progress bars for long work: one helper so every loop shows (or hides) progress the same way."""

from __future__ import annotations

from typing import Iterable, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress_bar(iterable: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = True,
             leave: bool = False, unit: str = "it") -> Iterable[T]:
    """``iterable`` in a plain tqdm bar when ``enabled`` (else unchanged): ``desc`` its label, ``total`` its length
    when ``len()`` does not give it, ``leave`` keep it on screen, ``unit`` what one step is."""
    if not enabled:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=leave, unit=unit)
