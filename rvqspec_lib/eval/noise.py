"""When a timing has repeated enough: a stopping rule on the measured noise of the median instead of a fixed count
(docs/reproducibility.md#timing-noise). :func:`rvqspec_lib.eval.timing.interleaved` runs ``repeats`` rounds, then one
at a time until every condition's median is known to a relative standard error of ``noise_target``, or
``max_repeats``. The estimator: SE(median) = sqrt(pi / 2) sigma / sqrt(n) for a normal density (asymptotic
normality of sample quantiles: van der Vaart 1998, ch. 21), sigma estimated robustly as 1.4826 MAD (Rousseeuw &
Croux 1993: a preempted round must not decide the count)."""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

#: sqrt(pi / 2): SE(median) over sigma / sqrt(n) for a normal density (the asymptotic variance of the median).
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
#: 1 / Phi^-1(3/4): makes the MAD a consistent estimator of the normal sigma (Rousseeuw & Croux 1993).
MAD_TO_SIGMA = 1.4826
#: ``max_repeats`` when a noise target is given without one: this many times the minimum ``repeats``.
DEFAULT_MAX_FACTOR = 4


def relative_standard_error(samples: Sequence[float]) -> float:
    """The median's standard error over the median of n timings: a unitless fraction; ``inf`` under 2 samples or for
    a median <= 0; 0.0 when MAD = 0."""
    xs = [float(x) for x in samples]
    if len(xs) < 2:
        return math.inf
    med = statistics.median(xs)
    if not med > 0:
        return math.inf
    mad = statistics.median(abs(x - med) for x in xs)
    return MEDIAN_SE_FACTOR * MAD_TO_SIGMA * mad / math.sqrt(len(xs)) / med


def repeat_cap(noise_target: float | None, repeats: int, max_repeats: int | None) -> int:
    """The rounds a loop may run: ``repeats`` without a target, else ``max_repeats`` (default
    :data:`DEFAULT_MAX_FACTOR` x ``repeats``); call it before any timing.

    Raises:
        ValueError (one line, naming the fix): ``noise_target <= 0``, ``repeats < 2`` with a target, ``max_repeats <
            repeats``, ``max_repeats`` without a target.
    """
    if noise_target is None:
        if max_repeats is not None:
            raise ValueError(f"max_repeats={max_repeats} needs a noise_target (give noise_target=0.02, say, or drop "
                             f"max_repeats: without a target exactly `repeats` rounds run)")
        return int(repeats)
    if isinstance(noise_target, bool) or not isinstance(noise_target, (int, float)) or not noise_target > 0 \
            or not math.isfinite(noise_target):
        raise ValueError(f"noise_target must be a relative standard error > 0 (e.g. 0.02 for 2 %), or None for a "
                         f"fixed count, got {noise_target!r}")
    if int(repeats) < 2:
        raise ValueError(f"with a noise_target, repeats (the minimum) must be >= 2 to estimate any noise, "
                         f"got {repeats}")
    cap = DEFAULT_MAX_FACTOR * int(repeats) if max_repeats is None else int(max_repeats)
    if cap < int(repeats):
        raise ValueError(f"max_repeats must be >= repeats (the minimum), got max_repeats={max_repeats} < "
                         f"repeats={repeats}")
    return cap


def should_stop(samples: Mapping[str, Sequence[float]], noise_target: float | None, min_repeats: int,
                max_repeats: int) -> bool:
    """Whether a timing loop has done enough rounds (the shortest list of ``samples``): True at ``max_repeats``,
    False below ``min_repeats``, else True without a target or when every :func:`relative_standard_error` <=
    ``noise_target``.

    Raises:
        ValueError: bad settings (:func:`repeat_cap`), ``max_repeats < min_repeats``, no condition.
    """
    if not samples:
        raise ValueError("should_stop needs at least one condition's samples ({name: [seconds, ...]})")
    if noise_target is not None:
        repeat_cap(noise_target, min_repeats, max_repeats)
    if max_repeats < min_repeats:
        raise ValueError(f"max_repeats must be >= min_repeats, got {max_repeats} < {min_repeats}")
    n = min(len(v) for v in samples.values())
    if n >= max_repeats:
        return True
    if n < min_repeats:
        return False
    if noise_target is None:
        return True
    return all(relative_standard_error(v) <= noise_target for v in samples.values())


def noise_meta(samples: Mapping[str, Sequence[float]], noise_target: float | None, max_repeats: int) -> dict:
    """A timing meta's stopping: ``repeats``, ``noise_target``, ``max_repeats``, ``rel_se`` (per condition, 4 digits;
    None under 2 samples), ``rel_se_max``."""
    rel = {str(k): relative_standard_error(v) for k, v in samples.items()}
    rel = {k: round(v, 4) if math.isfinite(v) else None for k, v in rel.items()}  # None: under 2 samples (JSON-able)
    worst = None if not rel or None in rel.values() else max(rel.values())
    return {"repeats": min((len(v) for v in samples.values()), default=0), "noise_target": noise_target,
            "max_repeats": int(max_repeats), "rel_se": rel, "rel_se_max": worst}


def noise_words(meta: Mapping) -> str:
    """A caption's words for a timing's stopping, from its ``meta`` (:func:`noise_meta`): e.g. ``"23 repeats
    (noise target 2.0 %, at most 80), median's relative standard error <= 1.7 %"``."""
    n = meta.get("repeats")
    target, worst = meta.get("noise_target"), meta.get("rel_se_max")
    words = f"{n} repeats" if target is None else \
        f"{n} repeats (noise target {100 * target:.1f} %, at most {meta.get('max_repeats')})"
    if worst is not None:
        words += f", median's relative standard error <= {100 * worst:.1f} %"
    return words
