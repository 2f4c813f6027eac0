"""Statistics of WER parity, pure functions of numbers (notebook 05, ``rvqspec eval-wer``;
docs/methods.md#reporting-wer, #testing-losslessness): paired WER differences, two-sample tests and their power, Holm,
bootstrap means, Table 1 (the notebook's tables and verdicts in words: paper/wer_report.py). Every draw comes from a
``numpy.random.Generator`` seeded by an argument."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

#: Family-wise level of the code-distribution tests (over the depths of one decoder) and of the WER difference.
ALPHA = 1e-3
#: Bootstrap resamples of the intervals.
N_BOOT = 10_000
#: Sign-flip permutations of the paired WER test.
N_PERM = 10_000
#: The smallest expected count of a pooled bin in each sample (the chi-square approximation's rule of thumb).
MIN_EXPECTED = 5.0
#: Power reported at this shift of total variation (per depth, binned distribution).
POWER_TV = 0.05
#: An utterance whose WER exceeds Q3 + OUTLIER_IQR x IQR of its decoder's utterances is an outlier.
OUTLIER_IQR = 3.0
#: A free-running utterance longer than this many times its true length (or one that hit the frame cap) is one.
OUTLIER_LENGTH_RATIO = 2.0


# ---- outliers --------------------------------------------------------------------------------------------------------
def _asr_flags(utterances: Sequence[Mapping]) -> list[str]:
    """Why :class:`rvqspec_lib.eval.asr.ErrorRates` flagged each utterance (``""``: not flagged)."""
    return [str(u.get("why", "")) if u.get("outlier") else "" for u in utterances]


def flag_outliers(utterances: Sequence[Mapping], *, lengths: Sequence[float] | None = None,
                  ref_lengths: Sequence[float] | None = None, capped: Sequence[bool] | None = None) -> list[str]:
    """Why each utterance is an outlier (``""`` if it is not; docs/methods.md#reporting-wer): flagged already by
    :class:`rvqspec_lib.eval.asr.ErrorRates` (``outlier``, ``why``), a rate above ``Q3 +`` :data:`OUTLIER_IQR` ``IQR``,
    more than :data:`OUTLIER_LENGTH_RATIO` times its true length (``lengths`` / ``ref_lengths``, free running), or
    ``capped``.

    Raises:
        ValueError: lengths of a different count than the utterances.
    """
    n = len(utterances)
    for name, x in (("lengths", lengths), ("ref_lengths", ref_lengths), ("capped", capped)):
        if x is not None and len(x) != n:
            raise ValueError(f"{name} has {len(x)} entries for {n} utterances")
    why = _asr_flags(utterances)
    rates = np.array([float(u["rate"]) for u in utterances], dtype=np.float64)
    if n >= 4:
        q1, q3 = np.percentile(rates, [25, 75])
        iqr = q3 - q1
        if iqr > 0:
            top = q3 + OUTLIER_IQR * iqr
            for i in np.flatnonzero(rates > top):
                why[i] = why[i] or f"WER {rates[i]:.2f} above Q3 + {OUTLIER_IQR:g} IQR = {top:.2f}"
    if lengths is not None and ref_lengths is not None:
        for i, (a, b) in enumerate(zip(lengths, ref_lengths)):
            if a > OUTLIER_LENGTH_RATIO * max(b, 1):
                why[i] = why[i] or f"{a} frames for {b} true ({a / max(b, 1):.1f}x)"
    if capped is not None:
        for i, c in enumerate(capped):
            if c:
                why[i] = why[i] or "hit the frame cap without ending"
    return why


# ---- paired WER difference -------------------------------------------------------------------------------------------
def _errors_and_words(utterances: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray]:
    err = np.array([u["substitutions"] + u["deletions"] + u["insertions"] for u in utterances], dtype=np.float64)
    words = np.array([u["ref_units"] for u in utterances], dtype=np.float64)
    return err, words


def paired_wer_difference(utts_a: Sequence[Mapping], utts_ref: Sequence[Mapping], *,
                          outliers_a: Sequence[str] | None = None, outliers_ref: Sequence[str] | None = None,
                          alpha: float = ALPHA, n_boot: int = N_BOOT, n_perm: int = N_PERM, seed: int = 0) -> dict:
    """Corpus WER of decoder A minus the reference's (AR) on the same utterances, ``sum(e_a - e_ref) / sum(words)``
    over utterances outliers in NEITHER run (with them: beside it), with a 95% percentile bootstrap interval and a
    two-sided sign-flip p-value (losslessness makes an utterance's two error counts exchangeable); ``detected``:
    ``p_value < alpha``; ``mde80``: the difference found with power 0.8 (normal approximation).

    Returns:
        ``{"wer_a", "wer_ref", "difference", "ci_low", "ci_high", "confidence", "p_value", "alpha", "detected", "se",
        "mde80", "n_utterances", "n_words", "n_outliers_a", "n_outliers_ref", "n_outliers_either",
        "difference_with_outliers", "wer_a_with_outliers", "wer_ref_with_outliers", "note"}``; with fewer than 2
        utterances left no interval (NaN) and ``detected`` False.
    Raises:
        ValueError: different numbers of utterances, different references.
    """
    from scipy import stats

    if len(utts_a) != len(utts_ref):
        raise ValueError(f"paired comparison needs the same utterances: {len(utts_a)} vs {len(utts_ref)}")
    if any(a["ref"] != b["ref"] for a, b in zip(utts_a, utts_ref)):
        raise ValueError("paired comparison needs the same references in the same order")
    out_a = list(outliers_a) if outliers_a is not None else _asr_flags(utts_a)
    out_r = list(outliers_ref) if outliers_ref is not None else _asr_flags(utts_ref)
    ea, words = _errors_and_words(utts_a)
    er, _ = _errors_and_words(utts_ref)
    keep = np.array([not (x or y) for x, y in zip(out_a, out_r)], dtype=bool)
    base = {"n_outliers_a": sum(bool(x) for x in out_a), "n_outliers_ref": sum(bool(x) for x in out_r),
            "n_outliers_either": int((~keep).sum()), "confidence": 0.95, "alpha": alpha,
            "difference_with_outliers": float((ea - er).sum() / max(words.sum(), 1)),
            "wer_a_with_outliers": float(ea.sum() / max(words.sum(), 1)),
            "wer_ref_with_outliers": float(er.sum() / max(words.sum(), 1))}
    if keep.sum() < 2 or words[keep].sum() == 0:
        nan = float("nan")
        total = float(words[keep].sum())
        return {**base, "wer_a": float(ea[keep].sum() / total) if total else nan,
                "wer_ref": float(er[keep].sum() / total) if total else nan,
                "difference": float((ea - er)[keep].sum() / total) if total else nan, "ci_low": nan, "ci_high": nan,
                "p_value": nan, "detected": False, "se": nan, "mde80": nan, "n_utterances": int(keep.sum()),
                "n_words": int(total), "note": f"{int(keep.sum())} utterance(s) without outliers: no interval"}
    d, w = (ea - er)[keep], words[keep]
    m, total = len(d), float(w.sum())
    diff = float(d.sum() / total)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, m, size=(n_boot, m))
    boot = d[idx].sum(1) / w[idx].sum(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    flips = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, m))
    perm = np.abs((flips * d).sum(1))
    p_value = float((1 + np.sum(perm >= abs(d.sum()) - 1e-9)) / (n_perm + 1))
    se = float(boot.std(ddof=1))
    z = float(stats.norm.isf(alpha / 2)) + float(stats.norm.isf(0.2))
    return {**base, "wer_a": float(ea[keep].sum() / total), "wer_ref": float(er[keep].sum() / total),
            "difference": diff, "ci_low": float(lo), "ci_high": float(hi), "p_value": p_value,
            "detected": bool(p_value < alpha), "se": se, "mde80": z * se, "n_utterances": m, "n_words": int(total),
            "note": ""}


# ---- two-sample test of a categorical distribution -------------------------------------------------------------------
def pooled_bins(counts_a: np.ndarray, counts_b: np.ndarray, *, max_bins: int | None = None) -> np.ndarray:
    """Bin index ``(C,)`` int64 of every category of two count vectors ``(C,)``: categories sorted by pooled count,
    cut into at most ``max_bins`` bins of about equal pooled mass, tail bins merged until each expects >=
    :data:`MIN_EXPECTED` in both samples; -1 for categories seen in neither.
    """
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    tot = a + b
    na, nb = a.sum(), b.sum()
    order = np.lexsort((np.arange(len(tot)), -tot))
    order = order[tot[order] > 0]
    bins = np.full(len(tot), -1, dtype=np.int64)
    if len(order) == 0:
        return bins
    cum = np.cumsum(tot[order])
    n_max = len(order) if max_bins is None else max(1, min(int(max_bins), len(order)))
    raw = np.minimum(((cum - tot[order]) * n_max // cum[-1]).astype(np.int64), n_max - 1)
    # merge consecutive bins (in order of decreasing frequency) until each expects >= MIN_EXPECTED in both samples
    share = min(na, nb) / (na + nb) if na + nb > 0 else 0.0
    new, acc, k = np.empty_like(raw), 0.0, 0
    for i, r in enumerate(raw):
        if i > 0 and r != raw[i - 1] and acc * share >= MIN_EXPECTED:
            k += 1
            acc = 0.0
        new[i] = k
        acc += tot[order[i]]
    if acc * share < MIN_EXPECTED and k > 0:  # the last bin is too small: fold it into the one before
        new[new == k] = k - 1
    bins[order] = new
    return bins


def two_sample_test(sample_a: np.ndarray, sample_b: np.ndarray, *, n_categories: int | None = None,
                    max_bins: int | None = None) -> dict:
    """Chi-square test of homogeneity of two samples of category indices (1-D non-negative integers), categories
    pooled by :func:`pooled_bins` (B bins, B - 1 degrees of freedom; conservative when both samples come from the same
    contexts).

    Returns:
        ``{"statistic", "df", "p_value", "n_a", "n_b", "bins", "tv"}`` (``tv``: the total variation between the binned
        distributions); one bin: ``p_value`` 1, ``df`` 0.
    Raises:
        ValueError: an empty sample, negative or non-integer values.
    """
    from scipy import stats

    a = np.asarray(sample_a).ravel()
    b = np.asarray(sample_b).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("two_sample_test needs two non-empty samples")
    for x in (a, b):
        if not np.issubdtype(x.dtype, np.integer) or x.min() < 0:
            raise ValueError("samples must be non-negative integers (category indices)")
    c = int(max(a.max(), b.max()) + 1) if n_categories is None else int(n_categories)
    ca, cb = np.bincount(a, minlength=c).astype(np.float64), np.bincount(b, minlength=c).astype(np.float64)
    bins = pooled_bins(ca, cb, max_bins=max_bins)
    nb_ = int(bins.max()) + 1
    ta = np.bincount(bins[bins >= 0], weights=ca[bins >= 0], minlength=nb_)
    tb = np.bincount(bins[bins >= 0], weights=cb[bins >= 0], minlength=nb_)
    tv = 0.5 * float(np.abs(ta / a.size - tb / b.size).sum())
    if nb_ < 2:
        return {"statistic": 0.0, "df": 0, "p_value": 1.0, "n_a": int(a.size), "n_b": int(b.size), "bins": nb_,
                "tv": tv}
    table = np.stack([ta, tb])
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = nb_ - 1
    return {"statistic": stat, "df": df, "p_value": float(stats.chi2.sf(stat, df)), "n_a": int(a.size),
            "n_b": int(b.size), "bins": nb_, "tv": tv}


def power_two_sample(n_a: int, n_b: int, df: int, *, tv: float = POWER_TV, level: float = ALPHA) -> float:
    """Lower bound on the power of :func:`two_sample_test` (at ``level``, ``df`` degrees of freedom) against ANY
    shift of total variation ``tv``: by Cauchy-Schwarz the noncentrality is at least ``n_h (2 tv)^2``,
    ``n_h = n_a n_b / (n_a + n_b)``. ``nan`` for ``df < 1``.
    """
    from scipy import stats

    if df < 1:
        return float("nan")
    n_h = n_a * n_b / (n_a + n_b)
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, n_h * (2 * tv) ** 2))


def detectable_tv(n_a: int, n_b: int, df: int, *, power: float = 0.9, level: float = ALPHA) -> float:
    """The smallest total-variation shift detected with at least ``power`` by :func:`power_two_sample`'s bound
    (bisection; ``nan`` for ``df < 1``)."""
    if df < 1:
        return float("nan")
    lo, hi = 0.0, 1.0
    if power_two_sample(n_a, n_b, df, tv=hi, level=level) < power:
        return float("inf")
    for _ in range(60):
        mid = (lo + hi) / 2
        if power_two_sample(n_a, n_b, df, tv=mid, level=level) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control; compare each with the family's level)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


# ---- per-utterance means (tokens per call) ---------------------------------------------------------------------------
def bootstrap_mean(numerators: Sequence[float], denominators: Sequence[float], *, seed: int = 0) -> dict:
    """``sum(num) / sum(den)`` over utterances (a ratio of totals, e.g. codes / calls = tokens per call) with a 95%
    percentile bootstrap interval over utterances.

    Returns:
        ``{"value", "ci_low", "ci_high", "n"}``. Raises ``ValueError`` for no utterance.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.size == 0 or num.shape != den.shape:
        raise ValueError("bootstrap_mean needs one numerator and denominator per utterance (at least one)")
    # the paired difference to a ratio of zero: the same resamples, the same numbers
    d = paired_ratio_difference(num, den, np.zeros_like(num), np.ones_like(num), seed=seed)
    return {"value": d["difference"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"]}


def bootstrap_difference(num_a, den_a, num_b, den_b, *, confidence: float = 0.95, seed: int = 0) -> dict:
    """Ratio of totals of group A minus that of an INDEPENDENT group B (e.g. tokens per call of German minus
    English sentences), with a percentile bootstrap interval resampling each group's utterances.

    Returns:
        ``{"difference", "ci_low", "ci_high", "n_a", "n_b"}``. Raises ``ValueError`` for an empty group.
    """
    na_, da = np.asarray(num_a, dtype=np.float64), np.asarray(den_a, dtype=np.float64)
    nb_, db = np.asarray(num_b, dtype=np.float64), np.asarray(den_b, dtype=np.float64)
    if na_.size == 0 or nb_.size == 0:
        raise ValueError("bootstrap_difference needs utterances in both groups")
    diff = float(na_.sum() / da.sum() - nb_.sum() / db.sum())
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, na_.size, size=(N_BOOT, na_.size))
    ib = rng.integers(0, nb_.size, size=(N_BOOT, nb_.size))
    boot = na_[ia].sum(1) / da[ia].sum(1) - nb_[ib].sum(1) / db[ib].sum(1)
    lo, hi = np.percentile(boot, [50 * (1 - confidence), 50 * (1 + confidence)])
    return {"difference": diff, "ci_low": float(lo), "ci_high": float(hi), "n_a": int(na_.size),
            "n_b": int(nb_.size)}


# ---- Table 1 analogue ------------------------------------------------------------------------------------------------
TABLE1_COLUMNS = ("split", "role", "language", "samples", "hours", "frames")
#: The decoder fields a WER row starts with (:data:`rvqspec_lib.eval.wer_parity.ROW_FIELDS`).
WER_ROW_FIELDS = ("decoder", "kind", "drafter", "nodes", "lossy", "sampled")


def entries_used(entries: Sequence[Mapping], max_frames: int) -> list[dict]:
    """The Table 1 entries of the utterances a frame budget used, in order: the first utterances until
    ``max_frames`` frames (the last one cut, its ``seconds`` scaled to the frames kept), as
    :func:`rvqspec_lib.data.frame_sources.frames_from_utterances` takes them."""
    out, have = [], 0
    for e in entries:
        if have >= max_frames:
            break
        t = min(int(e["frames"]), max_frames - have)
        out.append({**e, "frames": t, "seconds": float(e["seconds"]) * t / max(int(e["frames"]), 1)})
        have += t
    return out


def table1_rows(entries: Sequence[Mapping]) -> list[dict]:
    """The paper's Table 1 from the data a run used: one row per (split, role, language).

    Args:
        entries: one dict per utterance used, with ``split``, ``role``, ``language``, ``seconds`` (audio length)
            and ``frames`` (12.5 Hz codec frames).
    Returns:
        Rows with :data:`TABLE1_COLUMNS` (``hours`` rounded to 4 decimals), in first-seen order of (split, role),
        English first within them.
    Raises:
        ValueError: an entry without one of the fields.
    """
    groups: dict[tuple, dict] = {}
    for e in entries:
        missing = [k for k in ("split", "role", "language", "seconds", "frames") if k not in e]
        if missing:
            raise ValueError(f"Table 1 entry lacks {', '.join(missing)}: {dict(e)}")
        g = groups.setdefault((e["split"], e["role"], e["language"]), {"samples": 0, "seconds": 0.0, "frames": 0})
        g["samples"] += 1
        g["seconds"] += float(e["seconds"])
        g["frames"] += int(e["frames"])
    first: dict[tuple, int] = {}
    for k in groups:
        first.setdefault(k[:2], len(first))
    keys = sorted(groups, key=lambda k: (first[k[:2]], k[2] != "en", k[2]))
    return [{"split": s, "role": r, "language": lang, "samples": groups[(s, r, lang)]["samples"],
             "hours": round(groups[(s, r, lang)]["seconds"] / 3600, 4), "frames": groups[(s, r, lang)]["frames"]}
            for s, r, lang in keys]


def paired_ratio_difference(num_a, den_a, num_b, den_b, *, confidence: float = 0.95, seed: int = 0) -> dict:
    """Ratio of totals of decoder A minus that of decoder B on the SAME utterances (e.g. tokens per call of the
    paper's decoder minus the reused heads' tree, per utterance ``codes`` and ``calls``), with a percentile
    bootstrap interval resampling the utterances jointly (paired: one index draws both decoders' counts).

    Returns:
        ``{"difference", "ci_low", "ci_high", "n"}``. Raises ``ValueError`` for no utterance or unequal lengths.
    """
    a, da = np.asarray(num_a, dtype=np.float64), np.asarray(den_a, dtype=np.float64)
    b, db = np.asarray(num_b, dtype=np.float64), np.asarray(den_b, dtype=np.float64)
    if a.size == 0 or not (a.shape == da.shape == b.shape == db.shape):
        raise ValueError("paired_ratio_difference needs one count per utterance for both decoders (same utterances)")
    diff = float(a.sum() / da.sum() - b.sum() / db.sum())
    if a.size < 2:
        return {"difference": diff, "ci_low": diff, "ci_high": diff, "n": int(a.size)}
    idx = np.random.default_rng(seed).integers(0, a.size, size=(N_BOOT, a.size))
    boot = a[idx].sum(1) / da[idx].sum(1) - b[idx].sum(1) / db[idx].sum(1)
    lo, hi = np.percentile(boot, [50 * (1 - confidence), 50 * (1 + confidence)])
    return {"difference": diff, "ci_low": float(lo), "ci_high": float(hi), "n": int(a.size)}
