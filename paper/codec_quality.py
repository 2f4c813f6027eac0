"""What each codebook of an RVQ codec adds (notebook 00): the variance left after k stages against the bound for an
unstructured residual (:func:`unstructured_stage_factor`), and the distance and WER / CER of audio decoded from the
first k codebooks (:func:`codec_quality`). Labels derive from fields (:func:`condition_label`), never parsed back."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.eval.asr import cer
from rvqspec_lib.eval.inner_loop import score_conditions
from rvqspec_lib.models.audio import SAMPLE_RATE, _check_wav
from paper.notebook_measures import log_spectral_distance

#: The conditions of a sweep besides the codec's: the input audio, and the inversion of its unquantised features.
ORIGINAL, INVERSION, CODEC = "original", "inversion", "codec"


def condition_label(fields: Mapping) -> str:
    """THE label of a condition, from its fields: ``original``, ``unquantised`` (the inversion of unquantised
    features), ``k=<k>`` (the codec's own decoder) or ``table k=<k>`` (the table decoder beside a neural one:
    ``fields["table"]`` true)."""
    if fields["condition"] == ORIGINAL:
        return "original"
    if fields["condition"] == INVERSION:
        return "unquantised"
    return f"{'table ' if fields.get('table') else ''}k={int(fields['k'])}"


def conditions(codec, n_codebooks: Sequence[int], *, table_codec=None) -> list[dict]:
    """The conditions of a sweep, in order, as fields: ``condition``, ``decoder`` (``None``, ``"neural"`` or
    ``"table"``), ``table`` (the table decoder measured beside the codec's own), ``k`` (codebooks decoded) and
    ``label`` (:func:`condition_label`)."""
    rows = [{"condition": ORIGINAL, "decoder": None, "table": False, "k": None},
            {"condition": INVERSION, "decoder": None, "table": False, "k": None}]
    rows += [{"condition": CODEC, "decoder": codec.decoder_kind, "table": False, "k": int(k)} for k in n_codebooks]
    if table_codec is not None:
        rows += [{"condition": CODEC, "decoder": "table", "table": True, "k": int(k)} for k in n_codebooks]
    return [{**r, "label": condition_label(r)} for r in rows]


def _resynthesise(codec, wav: np.ndarray, n_codebooks: Sequence[int], *, table: bool) -> dict[str, dict]:
    """One utterance's rows of :func:`sweep_codebooks` (``{label: {"audio", "feature_lsd_db", "audio_lsd_db"}}``):
    the codec's first k codebooks for each k and, unless ``table`` (the table decoder beside a neural one), the input
    itself and the inversion of its unquantised features (the ceiling of any k)."""
    x = _check_wav(wav, SAMPLE_RATE, codec.sample_rate)
    feats = codec.features(x, codec.sample_rate)
    codes = codec.quantize(feats)

    def row(vectors):
        y = codec.vectors_to_audio(vectors)[: x.shape[0]]
        return {"audio": y, "feature_lsd_db": log_spectral_distance(codec, vectors, feats),
                "audio_lsd_db": log_spectral_distance(codec, codec.features(y, codec.sample_rate), feats)}

    swept = {condition_label({"condition": CODEC, "table": table, "k": k}): row(codec.decode_vectors(codes, int(k)))
             for k in n_codebooks}
    if table:
        return swept
    return {"original": {"audio": x, "feature_lsd_db": 0.0, "audio_lsd_db": 0.0}, "unquantised": row(feats), **swept}


def sweep_codebooks(codec, wavs: Sequence[np.ndarray], n_codebooks: Sequence[int], *, table_codec=None,
                    progress: bool = False) -> dict:
    """Every utterance (``(samples,)`` float at 24 kHz) resynthesised under every condition of :func:`conditions`:
    through ``codec``'s own decoder and, with ``table_codec`` (``codec.with_decoder(None)``), the table decoder beside
    it, from the first k of ``n_codebooks``.

    Returns:
        ``{"conditions": [fields], "audio": {label: [wav]}, "feature_lsd_db": {label: [dB]}, "audio_lsd_db": {label:
        [dB]}}``: the output audio and the log-spectral distances of the decoder's input to the unquantised features
        and of the output audio's features to the input's.
    Raises:
        ValueError: a k outside ``[1, n_codebooks]``, bad audio (the codec's messages).
    """
    conds = conditions(codec, n_codebooks, table_codec=table_codec)
    out = {"conditions": conds, **{key: {c["label"]: [] for c in conds}
                                   for key in ("audio", "feature_lsd_db", "audio_lsd_db")}}
    for wav in progress_bar(wavs, desc="codec sweep", unit="utt", enabled=progress):
        rows = _resynthesise(codec, wav, n_codebooks, table=False)
        if table_codec is not None:
            rows.update(_resynthesise(table_codec, wav, n_codebooks, table=True))
        for label, r in rows.items():
            for key in ("audio", "feature_lsd_db", "audio_lsd_db"):
                out[key][label].append(r[key])
    return out


def codec_quality(codec, wavs: Sequence[np.ndarray], refs: Sequence[str], n_codebooks: Sequence[int], asr, *,
                  table_codec=None, progress: bool = False) -> dict:
    """:func:`sweep_codebooks` scored by ``asr`` against ``refs``, one row per condition: its fields, ``bits_per_s``
    (``None`` without codes), ``wer``, ``wer_without_outliers``, ``outliers``, ``errors``, ``ref_words``, ``cer``, the
    mean ``feature_lsd_db`` and ``audio_lsd_db``, and ``n``.

    Returns:
        ``{"asr": asr.name, "rows", "sweep", "hypotheses": {label: [text]}}``.
    Raises:
        ValueError: ``refs`` and ``wavs`` of different lengths; :func:`sweep_codebooks`'s errors.
    """
    if len(refs) != len(wavs):
        raise ValueError(f"{len(wavs)} utterances and {len(refs)} reference texts: give one text per utterance")
    sweep = sweep_codebooks(codec, wavs, n_codebooks, table_codec=table_codec, progress=progress)
    scores = score_conditions(sweep["audio"], refs, asr, sample_rate=SAMPLE_RATE, progress=progress)
    bits = math.log2(codec.codebook_size)
    rows = []
    for c in sweep["conditions"]:
        lab, s = c["label"], scores[c["label"]]
        rows.append({**c, "bits_per_s": codec.frame_rate_hz * c["k"] * bits if c["k"] else None,
                     "wer": s["wer"], "wer_without_outliers": s["wer_without_outliers"], "outliers": s["outliers"],
                     "errors": s["errors"], "ref_words": s["ref_words"], "cer": cer(list(refs), s["hypotheses"]).rate,
                     "feature_lsd_db": float(np.mean(sweep["feature_lsd_db"][lab])),
                     "audio_lsd_db": float(np.mean(sweep["audio_lsd_db"][lab])), "n": len(refs)})
    return {"asr": asr.name, "rows": rows, "sweep": sweep,
            "hypotheses": {lab: s["hypotheses"] for lab, s in scores.items()}}


def unstructured_stage_factor(codebook_size: int, dim: int) -> float:
    """The smallest factor by which one stage of ``codebook_size`` entries can shrink the variance of an
    unstructured ``dim``-dimensional residual (an isotropic Gaussian): ``2 ** (-2 * log2(codebook_size) / dim)``,
    Shannon's distortion-rate function at ``log2(codebook_size)`` bits per vector. Any real residual with structure
    (unequal variances, clusters) can be shrunk by more.

    Raises:
        ValueError: ``codebook_size < 2`` or ``dim < 1``.
    """
    if codebook_size < 2 or dim < 1:
        raise ValueError(f"need codebook_size >= 2 and dim >= 1, got {codebook_size} and {dim}")
    return 2.0 ** (-2.0 * math.log2(codebook_size) / dim)


def residual_variance(codec, wavs: Sequence[np.ndarray]) -> list[dict]:
    """How much of the frame vectors' variance (pooled over ``wavs``) the first k stages leave, k = 1..n_codebooks,
    through the table decoder (:meth:`~rvqspec_lib.models.rvq_codec.RVQCodec.dequantize`).

    Returns:
        one row per k: ``k``, ``variance_left`` (mean squared residual over the total variance about the mean frame),
        ``stage_factor`` (this stage's residual over the previous one's), ``removed_by_stage``, ``unstructured_factor``
        (:func:`unstructured_stage_factor`) and ``frames``.
    Raises:
        ValueError: no audio, or frames whose variance is zero.
    """
    if not wavs:
        raise ValueError("residual_variance needs at least one utterance")
    feats = np.concatenate([codec.features(w, SAMPLE_RATE) for w in wavs]).astype(np.float64)  # (F, dim)
    total = float(((feats - feats.mean(0)) ** 2).sum(1).mean())
    if total <= 0:
        raise ValueError("the frame vectors do not vary: residual variance is undefined")
    codes = codec.quantize(feats.astype(np.float32))
    ref = unstructured_stage_factor(codec.codebook_size, codec.config.dim)
    rows, prev = [], total
    for k in range(1, codec.n_codebooks + 1):
        left = float(((feats - codec.dequantize(codes, k)) ** 2).sum(1).mean())
        rows.append({"k": k, "variance_left": left / total, "stage_factor": left / prev,
                     "removed_by_stage": (prev - left) / total, "unstructured_factor": ref,
                     "frames": int(feats.shape[0])})
        prev = left
    return rows
