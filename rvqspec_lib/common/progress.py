"""Progress bars for long work: one helper so every loop shows (or hides) progress the same way."""

from __future__ import annotations

from typing import Iterable, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress_bar(iterable: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = True,
             leave: bool = False, unit: str = "it") -> Iterable[T]:
    """Wrap ``iterable`` in a tqdm bar when ``enabled`` (a plain text bar: no widgets needed in notebooks).

    Args:
        iterable: what to iterate. total: its length when ``len()`` does not give it. desc: the bar's label.
        enabled: ``False`` returns ``iterable`` unchanged (library calls default to no bar in tests).
        leave: keep the finished bar on screen. unit: what one step is (``"frame"``, ``"utt"``, ...).
    """
    if not enabled:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=leave, unit=unit)
