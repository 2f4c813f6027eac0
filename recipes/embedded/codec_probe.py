"""Stage 1's gates of issue 35, measured on any codec with ``encode(audio) -> codes (frames, n_codebooks)`` (and
``decode`` for the third): whether its codes can carry speech that a talker and a code predictor can learn.

    nice python -m recipes.embedded.codec_probe --sentences 200 --json build/codec_probe.json

1. :func:`robustness`: the share of codes, per depth, unchanged under changes no one hears (:data:`PERTURBATIONS`:
   a +0.1 dB gain change, a one-sample delay, white noise 70 dB under the signal). Gate: at least 90% at every
   depth for the gain change and the delay, on speech frames (all frames reported beside them).
2. :func:`predictability`: a counting predictor of code k (k >= 1) from (code 0, the phone being spoken, the frame's
   position inside the phone), of code 0 from (phone, position, previous code 0), and a no-context baseline (the
   negative control), fitted on 80% of the sentences and scored on the other 20%, speech frames only. The phones
   and their end times come from the synthesiser itself (flite ``-psdur``, :func:`render_with_phones`). Gate: a
   mean top-1 probability of at least 0.25 at every depth 1..15 (read it beside the accuracy: on few sentences the
   largest of a context's counts flatters it).
3. :func:`intelligibility`: the recogniser's WER on the codec's reconstructions against the original audio's. Gate:
   within 0.10.

The held-out sentences are the shipped calibration and evaluation ones (data/eval_texts): no codec fitted by
``recipes.embedded.build`` saw them.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from rvqspec_lib.common.files import json_text
from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.data import voices
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.eval.asr import wer
from rvqspec_lib.eval.asr_models import recogniser
from rvqspec_lib.eval.inner_loop import transcribe_all
from rvqspec_lib.eval.parity import paired_ratio_difference
from rvqspec_lib.models.audio import SAMPLE_RATE
from rvqspec_lib.models.rvq_codec import RVQCodec
from recipes.embedded.learned_codec import LearnedCodec, is_learned_codec, voice_set
from recipes.embedded.phones import MAX_POSITION, SILENCE, frame_phones, parse_psdur, render_with_phones  # noqa: F401

#: The gates of issue 35's stage 1.
MIN_UNCHANGED = 0.90  # share of codes at every depth that survive the gain change and the delay
MIN_TOP1 = 0.25  # mean top-1 probability of the counting predictor at every depth 1..15
MAX_WER_GAP = 0.10  # WER of the reconstructions less WER of the original audio
#: The perturbations whose codes the gate requires to survive (the noise is reported, not gated).
GATED = ("gain +0.1 dB", "delay 1 sample")


def _gain(wav, rng):
    return (wav * 10.0 ** (0.1 / 20)).astype(np.float32)


def _delay(wav, rng):
    return np.concatenate([np.zeros(1, np.float32), wav[:-1]]).astype(np.float32)


def _noise(wav, rng):
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))) if wav.size else 0.0
    return (wav + rng.standard_normal(wav.shape[0]) * rms * 10.0 ** (-70 / 20)).astype(np.float32)


#: name -> ``f(wav (samples,) float32, rng) -> wav`` of the same length: inaudible changes of the input.
PERTURBATIONS: dict[str, Callable] = {"gain +0.1 dB": _gain, "delay 1 sample": _delay, "noise -70 dB": _noise}


def robustness(codec, wavs: Sequence[np.ndarray], *, masks: Sequence[np.ndarray] | None = None,
               codes: Sequence[np.ndarray] | None = None, perturbations: dict[str, Callable] | None = None,
               seed: int = 0) -> dict:
    """The share of codes unchanged under each perturbation, per depth, pooled over the frames of ``wavs``.

    Args:
        codec: anything with ``encode(wav) -> (frames, n_codebooks)`` integer codes (frames a function of the length).
        wavs: `(samples,)` float32 audio at the codec's rate. masks: one `(frames,)` bool array per utterance, the
            frames to count (e.g. speech frames); ``None``: all frames. codes: ``codec.encode`` of each of ``wavs``
            when already known (``None``: encoded here). perturbations: default :data:`PERTURBATIONS`. seed: of the
            noise.

    Returns:
        ``{name: {"unchanged": [share per depth], "all_unchanged": share of frames with every code unchanged,
        "frames": n, "every_frame": the same three over all frames (with masks only)}}``.

    Raises:
        ValueError: no utterances, masks or codes of another count or length, no frame counted.
    """
    if not len(wavs):
        raise ValueError("robustness needs at least one utterance")
    for name, xs in (("masks", masks), ("codes", codes)):
        if xs is not None and len(xs) != len(wavs):
            raise ValueError(f"{len(xs)} {name} for {len(wavs)} utterances: give one per utterance")
    rng = np.random.default_rng(seed)
    base = [np.asarray(codec.encode(w)) for w in wavs] if codes is None else [np.asarray(c) for c in codes]
    sel = [np.ones(b.shape[0], bool) if masks is None else np.asarray(m, bool) for b, m in zip(base, masks or base)]
    if any(s.shape != b.shape[:1] for s, b in zip(sel, base)):
        raise ValueError("a mask's length differs from its utterance's frames: give one bool per code frame")
    if not sum(int(s.sum()) for s in sel):
        raise ValueError("no frame to count: the masks select nothing")

    def shares(same):
        return {"unchanged": same.mean(0).tolist(), "all_unchanged": float(same.all(1).mean()),
                "frames": int(same.shape[0])}

    out = {}
    for name, f in (perturbations or PERTURBATIONS).items():
        same = [np.asarray(codec.encode(f(w, rng))) == b for w, b in zip(wavs, base)]
        out[name] = shares(np.concatenate([x[s] for x, s in zip(same, sel)]))
        if masks is not None:
            out[name]["every_frame"] = shares(np.concatenate(same))
    return out


# ---------------------------------------------------------------- counting predictor
#: The discounts :meth:`CountingPredictor.tuned` chooses among.
DISCOUNTS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995)


class CountingPredictor:
    """P(code | context) from counts by interpolated absolute discounting (Ney, Essen & Kneser 1994):
    ``P(c | h) = max(n(h, c) - D, 0) / n(h) + D T(h) / n(h) P(c | h')``, ``T(h)`` the distinct codes seen after
    ``h``, ``h'`` the context less its last key; an unseen ``h`` gives ``P(c | h')``; the chain ends in the uniform
    distribution over ``vocab`` codes. Order a context's keys from most to least informative: ``(a, b, c)`` backs
    off to ``(a, b)``, ``(a,)``, ``()``.

    Args:
        vocab: codes per codebook. discount: ``D`` in (0, 1), the same at every context length; ``None``: per
            length from the fitted counts, ``n1 / (n1 + 2 n2)`` (pairs seen once, twice; 0.5 when both are 0).
            :meth:`tuned` chooses it on held-out counts, which keeps the top-1 probability near the accuracy where
            contexts are seen once or twice and the codes are noise.
    """

    def __init__(self, vocab: int, discount: float | None = None):
        if vocab < 1 or (discount is not None and not 0 < discount < 1):
            raise ValueError(f"need vocab >= 1 and a discount in (0, 1) or None, got {vocab} and {discount}")
        self.vocab, self.fixed_discount = vocab, discount
        self.counts: dict[tuple, Counter] = defaultdict(Counter)
        self.discount: dict[int, float] = {}
        self._cache: dict[tuple, np.ndarray] = {}

    @classmethod
    def tuned(cls, contexts: Sequence[tuple], codes: Sequence[int], vocab: int,
              grid: Sequence[float] = DISCOUNTS) -> "CountingPredictor":
        """Fitted on all ``contexts`` and ``codes``, with the discount of ``grid`` that gives the last fifth of
        them the highest likelihood when counted on the first four fifths (deleted estimation)."""
        cut = max(1, (4 * len(codes)) // 5)
        if cut >= len(codes):
            return cls(vocab).fit(contexts, codes)

        def loglik(d):
            p = cls(vocab, d).fit(contexts[:cut], codes[:cut])
            return sum(np.log(p.distribution(h)[int(c)]) for h, c in zip(contexts[cut:], codes[cut:]))

        return cls(vocab, max(grid, key=loglik)).fit(contexts, codes)

    def fit(self, contexts: Sequence[tuple], codes: Sequence[int]) -> "CountingPredictor":
        """Count every prefix of each context with its code (contexts: tuples of one length); set the discounts."""
        for h, c in zip(contexts, codes):
            for n in range(len(h) + 1):
                self.counts[tuple(h[:n])][int(c)] += 1
        n12 = defaultdict(lambda: [0, 0])
        for h, seen in self.counts.items():
            for v in seen.values():
                if v <= 2:
                    n12[len(h)][v - 1] += 1
        self.discount = {o: n1 / (n1 + 2 * n2) if n1 + n2 else 0.5 for o, (n1, n2) in n12.items()}
        self._cache.clear()
        return self

    def distribution(self, context: tuple) -> np.ndarray:
        """`(vocab,)` float64 probabilities of the next code after ``context``; sums to 1."""
        h = tuple(context)
        if h not in self._cache:
            p = np.full(self.vocab, 1.0 / self.vocab) if not h else self.distribution(h[:-1])
            seen = self.counts.get(h)
            if seen:
                n, d = sum(seen.values()), self.fixed_discount or self.discount.get(len(h), 0.5)
                idx = np.fromiter(seen.keys(), np.int64, len(seen))
                p = p * (d * len(seen) / n)
                p[idx] += np.maximum(np.fromiter(seen.values(), np.float64, len(seen)) - d, 0) / n
            self._cache[h] = p
        return self._cache[h]

    def score(self, contexts: Sequence[tuple], codes: Sequence[int]) -> dict:
        """``{"accuracy": share of codes equal to the most probable, "top1": mean top-1 probability, "p_true": mean
        probability of the true code, "n"}`` (NaN without codes). ``top1`` keeps the bias of a maximum over noisy
        counts (above chance on noise codes); ``p_true`` has none (about chance on noise)."""
        hit, top, true = 0, 0.0, 0.0
        for h, c in zip(contexts, codes):
            p = self.distribution(h)
            k = int(np.argmax(p))
            hit, top, true = hit + (k == int(c)), top + float(p[k]), true + float(p[int(c)])
        n = len(codes)
        return {k: v / n if n else float("nan") for k, v in (("accuracy", hit), ("top1", top), ("p_true", true))} | {
            "n": n}


def entropy_bits(codes: Sequence[int]) -> float:
    """The plug-in entropy (bits) of the codes' frequencies: how much a depth carries at most. A depth that always
    takes one entry has 0 and is perfectly predictable (read the top-1 probability beside it). NaN without codes."""
    counts = np.array(list(Counter(int(c) for c in codes).values()), dtype=np.float64)
    if not counts.size:
        return float("nan")
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def predictability(codes: Sequence[np.ndarray], phones: Sequence[Sequence[str]], positions: Sequence[np.ndarray],
                   *, vocab: int, fit_fraction: float = 0.8, seed: int = 0, fit_extra: tuple | None = None) -> dict:
    """How well counts predict each code of speech frames (phone not :data:`SILENCE`) of held-out utterances.

    Args:
        codes: `(frames, G)` integer codes per utterance. phones: per utterance, one phone name per frame.
        positions: `(frames,)` int per utterance (:func:`frame_phones`). vocab: codes per codebook.
        fit_fraction: share of utterances (a seeded shuffle) counted; the rest are scored.
        fit_extra: ``(codes, phones, positions)`` of more utterances counted besides (e.g. the codec's training
            sentences, as a talker trained on them would see), never scored.

    Returns:
        ``{"deep": [{"depth", "accuracy", "top1", "n"}] for depth 1..G-1 from (code 0, phone, position); "deep_none":
        the same with no context (negative control); "code0": code 0 from (phone, position, previous code 0);
        "code0_none"; "fit_utterances", "scored_utterances", "smoothing"}``.

    Raises:
        ValueError: lists of different lengths, fewer than 2 utterances, a bad ``fit_fraction``.
    """
    if not (len(codes) == len(phones) == len(positions)):
        raise ValueError(f"{len(codes)} code arrays, {len(phones)} phone lists, {len(positions)} position arrays: "
                         "give one of each per utterance")
    if len(codes) < 2 or not 0 < fit_fraction < 1:
        raise ValueError(f"need >= 2 utterances and 0 < fit_fraction < 1, got {len(codes)} and {fit_fraction}")
    order = list(range(len(codes)))
    random.Random(seed).shuffle(order)
    n_fit = min(len(order) - 1, max(1, round(fit_fraction * len(order))))
    parts = {"fit": order[:n_fit], "scored": order[n_fit:]}
    n_extra = 0
    if fit_extra is not None:
        xc, xp, xq = fit_extra
        if not (len(xc) == len(xp) == len(xq)):
            raise ValueError("fit_extra: give one code array, phone list and position array per utterance")
        codes, phones, positions = list(codes) + list(xc), list(phones) + list(xp), list(positions) + list(xq)
        n_extra = len(xc)
        parts["fit"] = parts["fit"] + list(range(len(order), len(codes)))
    rows = {}  # part -> list of (code row, phone, position, previous code 0)
    for part, idx in parts.items():
        rows[part] = []
        for u in idx:
            c = np.asarray(codes[u])
            if c.shape[0] != len(phones[u]) or c.shape[0] != len(positions[u]):
                raise ValueError(f"utterance {u}: {c.shape[0]} frames of codes but {len(phones[u])} phones and "
                                 f"{len(positions[u])} positions")
            for i in range(c.shape[0]):
                if phones[u][i] != SILENCE:
                    rows[part].append((c[i], phones[u][i], int(positions[u][i]), int(c[i - 1, 0]) if i else -1))
    g = int(np.asarray(codes[0]).shape[1])

    def measure(context, target):
        fit, scored = rows["fit"], rows["scored"]
        pred = CountingPredictor.tuned([context(r) for r in fit], [target(r) for r in fit], vocab)
        return {**pred.score([context(r) for r in scored], [target(r) for r in scored]),
                "discount": pred.fixed_discount, "entropy_bits": entropy_bits([target(r) for r in scored])}

    out = {"deep": [], "deep_none": []}
    for k in range(1, g):
        out["deep"].append({"depth": k, **measure(lambda r: (int(r[0][0]), r[1], r[2]), lambda r: r[0][k])})
        out["deep_none"].append({"depth": k, **measure(lambda r: (), lambda r: r[0][k])})
    out["code0"] = measure(lambda r: (r[1], r[2], r[3]), lambda r: r[0][0])
    out["code0_none"] = measure(lambda r: (), lambda r: r[0][0])
    return {**out, "fit_utterances": len(parts["fit"]), "scored_utterances": len(parts["scored"]),
            "fit_extra_utterances": n_extra,
            "smoothing": "interpolated absolute discounting down to uniform, D tuned on the last fifth of the fit "
                         "frames"}


# ---------------------------------------------------------------- intelligibility
def intelligibility(codec, wavs: Sequence[np.ndarray], refs: Sequence[str], asr, *, sample_rate: int = SAMPLE_RATE,
                    progress: bool = False, groups: Sequence[str] | None = None) -> dict:
    """WER by ``asr`` of the original audio and of the codec's reconstruction ``decode(encode(wav))`` (cut to the
    input's length): ``{"asr", "wer_original", "wer_codec", "gap", "gap_ci_low", "gap_ci_high" (a paired 95%
    bootstrap interval over utterances), "ref_words", "n"}``; with ``groups`` (a label per utterance, e.g. its voice)
    also ``"by_group": {label: {"wer_original", "wer_codec", "gap", "ref_words", "n"}}`` from the same transcripts.

    Raises:
        ValueError: ``wavs`` and ``refs`` of different lengths.
    """
    if len(wavs) != len(refs):
        raise ValueError(f"{len(wavs)} utterances and {len(refs)} texts: give one reference text per utterance")
    if groups is not None and len(groups) != len(refs):
        raise ValueError(f"{len(groups)} group labels for {len(refs)} utterances: give one label per utterance")
    recon = [np.asarray(codec.decode(codec.encode(w)), np.float32)[: len(w)] for w in wavs]
    orig = wer(list(refs), transcribe_all(asr, wavs, sample_rate, desc="asr original", progress=progress))
    rec = wer(list(refs), transcribe_all(asr, recon, sample_rate, desc="asr codec", progress=progress))
    def errors(r):
        return [u["substitutions"] + u["deletions"] + u["insertions"] for u in r.utterances]

    words = [u["ref_units"] for u in orig.utterances]
    ci = paired_ratio_difference(errors(rec), words, errors(orig), words)
    out = {"asr": getattr(asr, "name", type(asr).__name__), "wer_original": orig.rate, "wer_codec": rec.rate,
           "gap": rec.rate - orig.rate, "gap_ci_low": ci["ci_low"], "gap_ci_high": ci["ci_high"],
           "ref_words": orig.ref_units, "n": len(refs)}
    if groups is not None:
        out["by_group"], e_o, e_c = {}, errors(orig), errors(rec)
        for g in sorted(set(groups)):
            idx = [i for i, x in enumerate(groups) if x == g]
            n_words = sum(words[i] for i in idx)
            w_o = sum(e_o[i] for i in idx) / n_words if n_words else float("nan")
            w_c = sum(e_c[i] for i in idx) / n_words if n_words else float("nan")
            out["by_group"][g] = {"wer_original": w_o, "wer_codec": w_c, "gap": w_c - w_o, "ref_words": n_words,
                                  "n": len(idx)}
    return out


# ---------------------------------------------------------------- the gates
def gates(result: dict) -> dict:
    """``{gate: bool}`` of a result holding ``robustness``, ``predictability`` and ``intelligibility`` (each
    optional: a missing one is not judged)."""
    out = {}
    if "robustness" in result:
        out["robustness"] = all(min(result["robustness"][p]["unchanged"]) >= MIN_UNCHANGED for p in GATED)
    if "predictability" in result:
        out["predictability"] = all(r["top1"] >= MIN_TOP1 for r in result["predictability"]["deep"])
    if "intelligibility" in result:
        out["intelligibility"] = result["intelligibility"]["gap"] <= MAX_WER_GAP
    return out


def report(result: dict) -> str:
    """The figures of :func:`main`'s result as a plain-text table, each gate with PASS or FAIL."""
    g, lines = gates(result), [f"machine: {result['machine']}", f"codec: {result['codec']}; {result['n']}"]
    verdict = {True: "PASS", False: "FAIL"}
    if "robustness" in result:
        rb = result["robustness"]
        for scope in ("speech frames", "all frames"):
            pick = (lambda r: r) if scope == "speech frames" else (lambda r: r.get("every_frame", r))
            lines.append(f"\n1. robustness, share of codes unchanged per depth 0..15 ({scope}, "
                         f"{pick(next(iter(rb.values())))['frames']} frames)")
            for p, r in rb.items():
                lines.append(f"  {p:15s} " + " ".join(f"{x:.2f}" for x in pick(r)["unchanged"]) +
                             f"  | all 16: {pick(r)['all_unchanged']:.2f}")
        lines.append(f"  gate: >= {MIN_UNCHANGED:.2f} at every depth for {' and '.join(GATED)} (speech frames): "
                     f"{verdict[g['robustness']]}")
    if "predictability" in result:
        pr = result["predictability"]
        extra = pr.get("fit_extra_utterances", 0)
        lines.append(f"\n2. predictability on speech frames, fit on {pr['fit_utterances']} utterances"
                     f"{f' ({extra} of them the codec training sentences)' if extra else ''}, scored on "
                     f"{pr['scored_utterances']} ({pr['deep'][0]['n']} frames); smoothing: {pr['smoothing']}")
        lines.append("  depth | (code 0, phone, position): accuracy  top1  p_true  D | no context: accuracy  top1  p_true"
                     " | entropy (bits)")
        for r, b in zip(pr["deep"], pr["deep_none"]):
            lines.append(f"  {r['depth']:5d} | {r['accuracy']:35.3f}  {r['top1']:.3f}  {r['p_true']:.3f}  "
                         f"{r['discount']:.3f} | {b['accuracy']:19.3f}  {b['top1']:.3f}  {b['p_true']:.3f} | "
                         f"{r.get('entropy_bits', float('nan')):.2f}")
        c0, c0n = pr["code0"], pr["code0_none"]
        lines.append(f"  code 0 from (phone, position, previous code 0): accuracy {c0['accuracy']:.3f}, top1 "
                     f"{c0['top1']:.3f}, p_true {c0['p_true']:.3f}; no context: accuracy {c0n['accuracy']:.3f}, "
                     f"top1 {c0n['top1']:.3f}, p_true {c0n['p_true']:.3f}")
        lines.append(f"  gate: mean top-1 probability >= {MIN_TOP1:.2f} at every depth 1..15: "
                     f"{verdict[g['predictability']]}")
    if "intelligibility" in result:
        it = result["intelligibility"]
        lines.append(f"\n3. intelligibility ({it['asr']}, {it['n']} utterances, {it['ref_words']} words): WER "
                     f"original {it['wer_original']:.3f}, codec {it['wer_codec']:.3f}, gap {it['gap']:+.3f} (paired 95% "
                     f"interval {it['gap_ci_low']:+.3f} to {it['gap_ci_high']:+.3f})")
        for name, b in it.get("by_group", {}).items():
            lines.append(f"  {name}: {b['n']} utterances, WER original {b['wer_original']:.3f}, codec "
                         f"{b['wer_codec']:.3f}, gap {b['gap']:+.3f}")
        lines.append(f"  gate: gap <= {MAX_WER_GAP:.2f}: {verdict[g['intelligibility']]}")
    return "\n".join(lines)


def held_out_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` English sentences of the shipped calibration and evaluation splits (no build's codec fitted on them), a
    seeded choice. Raises ValueError: more than are shipped."""
    texts = [s.text for split in ("calibration", "evaluation") for s in voices.shipped_sentences(split, "en")]
    if n > len(texts):
        raise ValueError(f"--sentences {n} is more than the {len(texts)} held-out sentences shipped")
    random.Random(seed).shuffle(texts)
    return texts[:n]


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=200, help="held-out sentences (fit 80%%, score 20%%)")
    ap.add_argument("--asr-sentences", type=int, default=60, help="of them, how many the recogniser hears (at most all)")
    ap.add_argument("--codec", default=None, help="an RVQCodec file or folder, or a learned codec's file "
                    "(recipes.embedded.learned_codec; default: the embedded model's RVQCodec)")
    ap.add_argument("--voice", default="slt", help="a flite voice, or several comma-separated (each sentence spoken "
                    "by one, as the embedded corpus chooses)")
    ap.add_argument("--flat-pitch", action="store_true", help="speak with no intonation (the same phones and timing)")
    ap.add_argument("--asr", default="whisper-tiny.en", help="recogniser (rvqspec_lib.eval.asr_models), or none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--fit-training", default=None, help="a learned codec's data file (its training sentences, "
                    "recipes.embedded.learned_codec data): count them too, as a talker trained on them would")
    ap.add_argument("--beam", type=int, default=None, help="a learned codec's encoding beam (partial code sequences "
                    "kept per frame; default: the codec's own encode_beam)")
    a = ap.parse_args(argv)
    if a.sentences < 2 or a.asr_sentences < 0:
        ap.error("need --sentences >= 2 and --asr-sentences >= 0")
    if a.beam is not None and a.beam < 1:
        ap.error("need --beam >= 1 (1: greedy)")
    t0 = time.perf_counter()
    codec_path = Path(a.codec) if a.codec else embedded_root("embedded") / "codec.safetensors"
    codec = LearnedCodec.load(codec_path) if is_learned_codec(codec_path) else RVQCodec.load(codec_path)
    if a.beam is not None:
        if not isinstance(codec, LearnedCodec):
            ap.error("--beam needs a learned codec (the embedded model's codec encodes by nearest entries)")
        codec.with_encode_beam(a.beam)
    asr = None if a.asr == "none" else recogniser(a.asr, "en")
    texts = held_out_texts(a.sentences, a.seed)
    speakers = [v for v in a.voice.split(",") if v]
    if not speakers:
        ap.error("--voice needs a flite voice, or several comma-separated")
    spoken = [voices.voice_of(t, speakers) for t in texts]
    wavs, phones, positions = [], [], []
    for t, v in zip(texts, spoken):
        w, ph = render_with_phones(t, v, codec.sample_rate, a.flat_pitch)
        names, pos = frame_phones(ph, -(-w.shape[0] // codec.frame_samples), codec.frame_samples / codec.sample_rate)
        wavs.append(w), phones.append(names), positions.append(pos)
    speech = [np.array([p != SILENCE for p in names]) for names in phones]
    codes = [np.asarray(codec.encode(w)) for w in wavs]
    result = {"machine": f"{cpu_model()} ({platform.machine()}), torch threads {torch.get_num_threads()}",
              "codec": f"{codec_path} ({codec.decoder_kind} decoder"
                       + (f", encoding beam {codec.config.encode_beam})" if isinstance(codec, LearnedCodec) else ")"),
              "n": f"{len(texts)} held-out sentences, voice {a.voice}{' (flat pitch)' if a.flat_pitch else ''}, "
                   f"seed {a.seed}",
              "robustness": robustness(codec, wavs, masks=speech, codes=codes, seed=a.seed)}
    extra = None
    if a.fit_training:
        if not isinstance(codec, LearnedCodec):
            ap.error("--fit-training needs a learned codec (the data file holds its features, not audio)")
        d = torch.load(a.fit_training)
        if d.get("flat_pitch", False) != a.flat_pitch:
            ap.error(f"{a.fit_training} was spoken with{'out' if a.flat_pitch else ''} --flat-pitch: probe it the "
                     "same way")
        if voice_set(d) != speakers:
            ap.error(f"{a.fit_training} was spoken by {','.join(voice_set(d))}: probe with --voice "
                     f"{','.join(voice_set(d))}")
        with torch.no_grad():
            extra = ([codec.codes_of_features(f).numpy() for f in d["feats"]],
                     d["phones"], [np.asarray(p) for p in d["positions"]])
    result["predictability"] = predictability(codes, phones, positions, vocab=codec.codebook_size, seed=a.seed,
                                              fit_extra=extra)
    if asr is not None and a.asr_sentences:
        k = a.asr_sentences
        result["intelligibility"] = intelligibility(codec, wavs[:k], texts[:k], asr,
                                                    groups=spoken[:k] if len(speakers) > 1 else None)
    result["gates"] = gates(result)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(report(result) + f"\n\n{result['seconds']:.0f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json_text(result) + "\n")
    return result


if __name__ == "__main__":
    main()
