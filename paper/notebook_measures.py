"""Small computations only the notebooks (and the paper modules beside them) use: the shipped splits' sizes, the
chain window where acceptance saturates, the timing notebooks' tie rule, the sample sizes a parity verdict would need,
every exported graph against eager PyTorch, the embedded codec's spectrograms and log-spectral distance, and the two
loops' geometry of a model folder. The library keeps what commands run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device.export_check import RELATIVE_TOLERANCE, check_file
from rvqspec_lib.eval.parity import ALPHA, power_two_sample
from rvqspec_lib.eval.timing import machine_meta
from rvqspec_lib.models.audio import SAMPLE_RATE
from rvqspec_lib.models.configs import frame_rate_from_dir


def shipped_split_sizes(model: str | os.PathLike = "embedded") -> dict[str, dict]:
    """``{split: {"utterances", "frames", "file"}}`` of a small model's ``utterances.jsonl`` (no codes loaded), what
    notebooks quote. Raises FileNotFoundError: the model ships no utterances
    (:func:`rvqspec_lib.data.utterances.embedded_root`)."""
    j = embedded_root(model) / "utterances.jsonl"
    out: dict[str, dict] = {}
    for line in j.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            d = out.setdefault(r["split"], {"utterances": 0, "frames": 0, "file": str(j)})
            d["utterances"] += 1
            d["frames"] += int(r["frames"])
    return out


def saturation_window(result: dict, *, rel_tol: float = 0.02) -> int:
    """The smallest chain window whose tokens per call is within ``rel_tol`` of the best window's (seed 003: "acceptance
    saturates once the window passes four depths").

    Args:
        result: :func:`rvqspec_lib.eval.acceptance.evaluate_acceptance`'s output (its chains found by their fields:
            ``kind`` chain, ``nodes`` the window), or ``{window (int): tokens per call}``.
        rel_tol: relative shortfall from the maximum still counted as saturated (0.02 = 2%).

    Raises:
        ValueError: no chain window, or ``rel_tol`` negative.
    """
    if rel_tol < 0:
        raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
    if "decoders" in result:
        result = {d["nodes"]: d["tokens_per_call"] for d in result["decoders"].values() if d["kind"] == "chain"}
    by_w = {int(w): float(v) for w, v in result.items() if v is not None}
    if not by_w:
        raise ValueError("no chain window to compare: evaluate chain decoders (evaluate_acceptance's default)")
    best = max(by_w.values())
    return min(w for w, v in by_w.items() if v >= best * (1 - rel_tol))


def sentences_needed(difference: float, se: float, n: int, *, alpha: float = ALPHA, power: float = 0.8) -> float:
    """Utterances needed to detect ``difference`` with ``power`` at level ``alpha`` (two-sided), scaling ``se``
    measured on ``n`` utterances as ``1/sqrt(n)`` (``inf`` for a zero difference).

    Raises:
        ValueError: ``n < 1`` or ``se < 0``.
    """
    from scipy import stats

    if n < 1 or se < 0:
        raise ValueError(f"need n >= 1 and se >= 0, got n={n}, se={se}")
    if difference == 0:
        return math.inf
    z = float(stats.norm.isf(alpha / 2)) + float(stats.norm.isf(1 - power))
    return float(n * (z * se / abs(difference)) ** 2)


def samples_needed(tv: float, df: int, *, power: float = 0.9, level: float = ALPHA) -> int:
    """Samples per group (equal groups) for :func:`power_two_sample`'s bound to reach ``power`` against a shift of
    total variation ``tv`` (doubling, then bisection). ``inf`` for ``tv <= 0`` or ``df < 1``."""
    if tv <= 0 or df < 1:
        return math.inf
    hi = 2
    while power_two_sample(hi, hi, df, tv=tv, level=level) < power:
        hi *= 2
        if hi > 2 ** 40:
            return math.inf
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_two_sample(mid, mid, df, tv=tv, level=level) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def numerical_agreement(code_predictor, *, graphs: Sequence[str], dtypes: Sequence[str], formats: Sequence[str],
                        nodes: int, work_dir: str | os.PathLike) -> dict:
    """Export every (graph, format, dtype) of the float32 official module into ``work_dir``, run it where it can run
    (seeds 0 and 1) and compare it with eager PyTorch (:func:`check_file`); ``nodes``: the verify graph's.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (graph, format, dtype, runner): ``graph``, ``format``,
        ``dtype``, ``nodes``, ``interface_ok`` (declared == written), ``bytes``, ``export_s``, ``path`` (None), and
        :func:`check_file`'s fields.

    Raises:
        ValueError: what the exporter refuses (an unknown graph, format or dtype; one line).
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for graph in graphs:
        n = nodes if graph == "verify" else None
        for fmt in formats:
            for dt in dtypes:
                path = work / f"{graph}-{dt}{F.FORMATS[fmt]}"
                res = F.export_graph(code_predictor, graph, fmt, path, dtype=dt, nodes=n)
                base = {"graph": graph, "format": fmt, "dtype": dt, "nodes": res["nodes"],
                        "interface_ok": res["declared"] == res["written"], "bytes": res["bytes"],
                        "export_s": round(res["export_s"], 1), "path": None}
                rows += [{**base, **r} for r in check_file(code_predictor, graph, path, dtype=dt, nodes=n)]
    return {"rows": rows, "meta": {**machine_meta(code_predictor), "seeds": [0, 1],
                                   "tolerance": RELATIVE_TOLERANCE, "reference": "official module, float32, eager"}}


def unstack(codec, vectors: np.ndarray) -> np.ndarray:
    """An :class:`~rvqspec_lib.models.rvq_codec.RVQCodec`'s frame vectors `(frames, dim)` -> log-mel spectrogram
    `(n_mels, frames * stack)` float32 (natural log of mel power, one column per mel hop).

    Raises:
        ValueError: ``vectors`` is not `(frames, dim)`.
    """
    v = np.asarray(vectors, dtype=np.float32)
    c = codec.config
    if v.ndim != 2 or v.shape[1] != c.dim:
        raise ValueError(f"expected frame vectors of shape (frames, {c.dim}), got {v.shape}")
    return np.ascontiguousarray(v.reshape(v.shape[0] * c.stack, c.n_mels).T)


def log_mel_db(codec, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The log-mel spectrogram of audio as the codec sees it, in dB: `(n_mels, frames * stack)` float32,
    10 log10 of mel power, one column per 20 ms mel hop (``codec.features`` then :func:`unstack`)."""
    return (unstack(codec, codec.features(wav, sample_rate)) * (10.0 / np.log(10.0))).astype(np.float32)


def log_spectral_distance(codec, a: np.ndarray, b: np.ndarray) -> float:
    """Mean log-spectral distance in dB between frame vectors ``a``, ``b`` `(frames, dim)` of one shape: per mel
    frame the RMS over the bands of ``10 log10(P_a / P_b)``, then the mean (0.0 with no frames).

    Raises:
        ValueError: the shapes differ or are not `(frames, dim)`.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"frame vectors of different shapes {a.shape} and {b.shape}: trim both to the same "
                         "number of frames")
    la, lb = unstack(codec, a), unstack(codec, b)  # (n_mels, t)
    if la.shape[1] == 0:
        return 0.0
    db = (10.0 / np.log(10.0)) * (la.astype(np.float64) - lb)
    return float(np.sqrt((db ** 2).mean(0)).mean())


def loop_facts(folder: str | os.PathLike) -> dict:
    """The two loops' geometry from a model folder's ``config.json`` (the frame rate from ``rvqspec_model.json`` or
    ``speech_tokenizer/``), without building the model: ``{"folder", "talker_layers", "talker_hidden",
    "code_predictor_layers", "code_predictor_hidden", "n_code_groups", "frame_rate_hz"}``.

    Raises:
        FileNotFoundError: no ``config.json`` in ``folder``.
    """
    p = Path(folder).expanduser()
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in {p}: pass a model folder (e.g. data/configs/<name>)")
    talker = json.loads(cfg_path.read_text())["talker_config"]
    cp = talker.get("code_predictor_config", {})
    marker = p / "rvqspec_model.json"
    fr = float(json.loads(marker.read_text())["frame_rate_hz"]) if marker.is_file() else frame_rate_from_dir(p)[0]
    return {"folder": str(p), "talker_layers": int(talker["num_hidden_layers"]),
            "talker_hidden": int(talker["hidden_size"]), "code_predictor_layers": int(cp.get("num_hidden_layers", 0)),
            "code_predictor_hidden": int(cp.get("hidden_size", 0)), "n_code_groups": int(talker["num_code_groups"]),
            "frame_rate_hz": fr}


def cost_growth_words(ratios: Mapping, *, near: float = 1.2, double: float = 2.0) -> str:
    """How one verify call's cost grows with its query positions, in words generated from ``ratios`` ``{N: t(N)/t(1)}``
    (one model and backend; int or str keys): up to which N it stays within ``near`` times a call of one position,
    and the first N at which it costs ``double`` or more. Raises ValueError: no N above 1 in ``ratios``."""
    r = {int(n): float(v) for n, v in ratios.items()}
    ns = sorted(n for n in r if n > 1)
    if not ns:
        raise ValueError("ratios needs t(N)/t(1) of some N > 1: pass a verify cost curve's rows")
    flat = [n for i, n in enumerate(ns) if all(r[m] <= near for m in ns[: i + 1])]
    first = (f"within {near:g}x of one position up to N = {flat[-1]}" if flat else
             f"{r[ns[0]]:.2f}x one position already at N = {ns[0]}")
    if flat and flat[-1] == ns[-1]:
        return f"{first}, the largest N timed"
    dbl = next((n for n in ns if r[n] >= double), None)
    if dbl is None:
        return f"{first}, below {double:g}x up to N = {ns[-1]}"
    return first if dbl == ns[0] else f"{first}, first {double:g}x or more at N = {dbl} ({r[dbl]:.2f}x)"


# the tie rule of the timing notebooks (04, 06, 07), on a run's noise (rvqspec_lib.eval.noise.noise_meta)
#: The tie rule: two medians within a factor of 1 + TIE_WIDTH x the relative standard error are not told apart.
TIE_WIDTH = 2
#: A ratio within this share of the margin (factor - 1) of the factor, either side, is at the edge of the noise (the
#: factor itself rests on an estimated error).
EDGE_SHARE = 0.1


def noise_factor(rel_se: float | None) -> float | None:
    """The tie rule's factor, ``1 + TIE_WIDTH * rel_se`` (``rel_se``: a run's worst relative standard error of a
    median, ``rel_se_max`` of :func:`rvqspec_lib.eval.noise.noise_meta`); ``None`` without an estimate (``None`` or
    0)."""
    return 1 + TIE_WIDTH * rel_se if rel_se else None


def read_gain(gain: float | None, rel_se: float | None) -> str | None:
    """One speed ratio read with the tie rule: ``gain`` is the other runner's time over this one's (above 1: this one
    is faster), a ratio below 1 read as its inverse so both directions use the same factor.

    Returns:
        ``"faster"`` or ``"slower"`` beyond :func:`noise_factor`, ``"tie"`` within it, ``"edge"`` within
        :data:`EDGE_SHARE` of its margin either side; ``None`` without a gain or a noise estimate.
    Raises:
        ValueError: a gain <= 0.
    """
    factor = noise_factor(rel_se)
    if gain is None or factor is None:
        return None
    if not gain > 0:
        raise ValueError(f"a speed ratio must be > 0, got {gain}: pass one time over another")
    m = max(gain, 1 / gain)
    if abs(m - factor) <= EDGE_SHARE * (factor - 1):
        return "edge"
    return "tie" if m < factor else ("faster" if gain > 1 else "slower")
