"""Whole-utterance conditions of the inner loop, decoded to audio and scored by an ASR: ``inner_loop`` (true code 0,
codes 1..15 generated from the teacher-forced talker state: the code predictor alone, what this project speculates
on) and ``free_running`` (:func:`rvqspec_lib.models.frame.synthesize` from the text alone)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.data.teacher import as_utterance
from rvqspec_lib.eval.asr import wer
from rvqspec_lib.models.backends import frame_runner
from rvqspec_lib.models.frame import inner_sampling, synthesize
from rvqspec_lib.models.loader import LoadedModel
from rvqspec_lib.models.speech_tokenizers import decode_audio


def speaker_batches(utterances: Sequence, batch_size: int) -> list[list[int]]:
    """Indices of ``utterances`` grouped into batches of at most ``batch_size`` sharing one speaker, shortest first."""
    order = sorted(range(len(utterances)), key=lambda i: (str(utterances[i].speaker), utterances[i].codes.shape[0]))
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < batch_size and utterances[batches[-1][0]].speaker == utterances[i].speaker:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def batch_seed(*parts: int) -> int:
    """One generator seed from several integers (a run's seed, a replicate, a batch): ``numpy.random.SeedSequence``."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def free_running_codes(lm: LoadedModel, utts: Sequence, *, max_frames: int = 300, seed: int = 0, decoder=None,
                       paired: bool = False, progress: bool = True, desc: str = "free-running") -> list[dict]:
    """Speak each utterance's text with :func:`rvqspec_lib.models.frame.synthesize` (``decoder`` stepped, default
    AR), batched by speaker (at most 8), frame cap ``min(max_frames, 2 * longest true length + 10)``; one generator
    seeded ``seed`` through the batches, or with ``paired`` batch i seeded :func:`batch_seed` ``(seed, i)``.

    Returns:
        Per utterance, in input order: ``{"codes": (frames, G) int64, "ended": bool, "frames": int, "cap": int}``.
    """
    us = [as_utterance(u) for u in utts]
    batches = speaker_batches(us, 8)
    out: list[dict | None] = [None] * len(us)
    gen = torch.Generator(device=lm.device).manual_seed(seed)  # on the model's device (CUDA refuses a CPU one)
    for bi, b in enumerate(progress_bar(batches, desc=desc, unit="batch", enabled=progress)):
        cap = int(min(max_frames, 2 * max(us[i].codes.shape[0] for i in b) + 10))
        runner = None if decoder is None else frame_runner("official", lm.code_predictor, decoder,
                                                           sampling=inner_sampling(lm))
        r = synthesize(lm, [us[i].text for i in b], runner=runner, speaker=us[b[0]].speaker,
                       language=us[b[0]].language, max_frames=cap,
                       generator=torch.Generator(device=lm.device).manual_seed(batch_seed(seed, bi)) if paired
                       else gen)
        for j, i in enumerate(b):
            out[i] = {"codes": r.codes[j], "ended": bool(r.ended[j]), "frames": int(r.frames[j]), "cap": cap}
    return out  # type: ignore[return-value]


def codes_to_audio(codec, codes) -> np.ndarray:
    """``(frames, G)`` codes -> float32 audio at ``codec.sample_rate``, through a codec or a speech tokenizer; empty
    codes give empty audio."""
    c = codes.cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
    if c.size == 0:
        return np.zeros(0, dtype=np.float32)
    if hasattr(codec, "encode"):  # the codec interface
        return np.asarray(codec.decode(c), dtype=np.float32).reshape(-1)
    return decode_audio(codec, c)[0]


def transcribe_all(asr, wavs: Sequence[np.ndarray], sample_rate: int, *, desc: str = "asr",
                   progress: bool = False) -> list[str]:
    """The ASR's transcript of every waveform (empty audio: empty text)."""
    return [asr.transcribe(w, sample_rate) if len(w) else ""
            for w in progress_bar(list(wavs), desc=desc, enabled=progress, unit="utt")]


def score_conditions(audio: Mapping[str, Sequence[np.ndarray]], refs: Sequence[str], asr, *,
                     sample_rate: int = 24000, progress: bool = True) -> dict:
    """WER of each condition's audio ``{condition: [wav per reference]}`` against ``refs`` by ``asr``:
    ``{condition: {wer summary..., "hypotheses"}}``."""
    out = {}
    for name, wavs in audio.items():
        hyps = transcribe_all(asr, wavs, sample_rate, desc=f"asr {name}", progress=progress)
        out[name] = {**wer(list(refs), hyps).summary(), "hypotheses": hyps}
    return out
