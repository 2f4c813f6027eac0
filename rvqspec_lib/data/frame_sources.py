"""Where frames (:class:`~rvqspec_lib.data.frames.Frames`) come from: the model's own speech, a local dataset
encoded by a codec, given or shipped utterances (contexts from ONE teacher-forced talker pass each), or codes the
inner loop samples from given contexts (no talker).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.data.teacher import (Utterance, as_utterance, check_codes, contexts_of, eval_mode,
                                      teacher_forced_contexts)
from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models.audio import _decode_audio, resample
from rvqspec_lib.models.frame import synthesize

#: Texts spoken by :func:`frames_from_model` when none are given (short, varied English sentences).
DEFAULT_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "It was the best of times, it was the worst of times.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "A journey of a thousand miles begins with a single step.",
    "She sells seashells by the seashore, and the shells she sells are surely seashells.",
    "The meeting has been moved to Thursday afternoon at three o'clock.",
    "Numbers like 1,234 and dates like March 5th are hard to read aloud.",
)


def frames_from_model(lm, texts: Iterable[str] | None = None, *, seed: int = 0, max_frames: int = 200) -> Frames:
    """Frames of the model's own speech: the official frame loop (the checkpoint's sampling, one generator seeded
    ``seed``) speaks each text (default :data:`DEFAULT_TEXTS`) up to ``max_frames``, then
    :func:`teacher_forced_contexts`; one utterance per text, texts without a frame skipped.

    Raises:
        ValueError: no texts, no frame for any text.
    """
    texts = list(DEFAULT_TEXTS if texts is None else texts)
    if not texts:
        raise ValueError("no texts given")
    gen = torch.Generator().manual_seed(seed)
    parts, n_frames = [], []
    for u, text in enumerate(texts):
        codes = synthesize(lm, [text], generator=gen, max_frames=max_frames).codes[0]
        n_frames.append(int(codes.shape[0]))
        if codes.shape[0]:
            ctx = teacher_forced_contexts(lm, text, codes)
            parts.append(Frames(ctx, codes[:, 1:].cpu(), torch.full((codes.shape[0],), u, dtype=torch.long)))
    if not parts:
        raise ValueError("the model produced no frame for any text (end of speech at once): check the model")
    out = Frames.cat(parts, keep_ids=True)  # the text index as utterance id
    out.source = {"kind": "model", "model": lm.name, "random_weights": lm.is_random, "n_texts": len(texts),
                  "frames_per_text": n_frames, "seed": seed, "max_frames": max_frames, "decoder": repr(None),
                  "language": "auto", "speaker": None}
    return out


TEXT_COLUMNS = ("raw_text", "text", "normalized_text", "transcription", "sentence")


def load_split(dataset, split: str | None = None):
    """A ``datasets.Dataset``: ``dataset`` itself, a ``save_to_disk`` folder, or a ``DatasetDict``'s ``split``
    (default ``train``, else the first). Raises FileNotFoundError: a path that does not exist (nothing downloads)."""
    import datasets as hf

    if isinstance(dataset, (str, os.PathLike)):
        p = Path(dataset).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"no dataset folder {p}: write one with datasets' save_to_disk (nothing is "
                                    "downloaded here)")
        dataset = hf.load_from_disk(str(p))
    if isinstance(dataset, hf.DatasetDict):
        dataset = dataset[split or ("train" if "train" in dataset else list(dataset)[0])]
    return dataset


def frames_from_dataset(dataset, lm, codec, *, split: str | None = None, text_column: str | None = None,
                        language: str = "auto", max_frames: int | None = None, progress: bool = False) -> Frames:
    """Frames of real speech: each row of ``dataset`` (:func:`load_split`) encoded by ``codec`` (``encode(wav) ->
    (frames, n_code_groups)`` at ``codec.sample_rate``, default 24 kHz; other rates resampled), contexts by
    :func:`teacher_forced_contexts` with the prompt ``language``; audio in the ``audio`` column, ``text_column``
    default the first of :data:`TEXT_COLUMNS` present; ``max_frames`` stops once collected. Rows with empty text
    or no frames are skipped (counted in ``source``).

    Raises:
        FileNotFoundError: a path that is not a saved dataset. ValueError: missing columns, codes of the wrong shape.
    """
    dataset = load_split(dataset, split)
    cols, audio_column = dataset.column_names, "audio"
    if audio_column not in cols:
        raise ValueError(f"dataset has no {audio_column!r} column (columns: {', '.join(cols)})")
    if text_column is None:
        text_column = next((c for c in TEXT_COLUMNS if c in cols), None)
        if text_column is None:
            raise ValueError(f"no text column among {TEXT_COLUMNS} (columns: {', '.join(cols)}): pass text_column=")
    elif text_column not in cols:
        raise ValueError(f"dataset has no {text_column!r} column (columns: {', '.join(cols)})")
    feat = dataset.features.get(audio_column)
    if type(feat).__name__ == "Audio" and feat.decode:  # decode with soundfile ourselves (no torchcodec needed)
        dataset = dataset.cast_column(audio_column, type(feat)(decode=False))
    rows = len(dataset)
    sr_codec = int(getattr(codec, "sample_rate", 24000))
    parts, skipped, have = [], 0, 0
    for i in progress_bar(range(rows), total=rows, desc="encoding", enabled=progress):
        if max_frames is not None and have >= max_frames:
            break
        row = dataset[i]
        text = row[text_column] or ""
        if not text.strip() and text_column == "raw_text" and "normalized_text" in cols:
            text = row["normalized_text"] or ""
        if not text.strip():
            skipped += 1
            continue
        wav, sr = _decode_audio(row[audio_column])
        codes = torch.as_tensor(np.asarray(codec.encode(resample(wav, sr, sr_codec))), dtype=torch.long)
        if codes.dim() != 2 or codes.shape[1] != lm.n_code_groups:
            raise ValueError(f"codec returned codes of shape {tuple(codes.shape)}, expected (frames, "
                             f"{lm.n_code_groups})")
        if codes.shape[0] == 0:
            skipped += 1
            continue
        ctx = teacher_forced_contexts(lm, text, codes, language=language)
        parts.append(Frames(ctx, codes[:, 1:], torch.full((codes.shape[0],), i, dtype=torch.long)))
        have += codes.shape[0]
    if not parts:
        raise ValueError("no usable row (every row had empty text or no audio frames)")
    out = Frames.cat(parts, keep_ids=True)  # row index as utterance id
    out.source = {"kind": "dataset", "model": lm.name, "rows": rows, "skipped": skipped, "text_column": text_column,
                  "codec": type(codec).__name__, "codec_sample_rate": sr_codec, "language": language}
    return out


@torch.no_grad()
def frames_from_utterances(lm, utterances: Sequence, *, max_frames: int | None = None, batch_size: int = 8,
                           progress: bool = False, source: dict | None = None) -> Frames:
    """Teacher-forced frames of given utterances (text + true codes): contexts by
    :func:`~rvqspec_lib.data.teacher.contexts_of`, ``batch_size`` a pass, batched by (speaker, language) and length;
    ``max_frames`` stops once collected (the last utterance cut); ``utterance`` is the index in ``utterances``.

    Raises:
        ValueError: no utterances, ``max_frames < 1`` or ``batch_size < 1``, bad codes (naming the utterance).
    """
    utts = [as_utterance(u) for u in utterances]
    if not utts:
        raise ValueError("no utterances given")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be >= 1 (or None), got {max_frames}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, u in enumerate(utts):
        check_codes(lm, u.codes, f"utterance {i} ({u.text!r}): codes")
    chosen: list[tuple[int, Utterance]] = []  # (input index, utterance, the last one possibly cut)
    have = 0
    for i, u in enumerate(utts):
        if max_frames is not None and have >= max_frames:
            break
        t = u.codes.shape[0] if max_frames is None else min(u.codes.shape[0], max_frames - have)
        chosen.append((i, u if t == u.codes.shape[0] else Utterance(u.text, u.codes[:t], u.speaker, u.language)))
        have += t
    order = sorted(range(len(chosen)), key=lambda a: (str(chosen[a][1].speaker), chosen[a][1].language,
                                                      chosen[a][1].codes.shape[0]))
    batches = [order[s: s + batch_size] for s in range(0, len(order), batch_size)]
    got: dict[int, torch.Tensor] = {}
    with eval_mode(lm.model):
        for b in progress_bar(batches, desc="teacher-forced contexts", enabled=progress, unit="batch"):
            got.update(zip(b, contexts_of(lm, [chosen[a][1] for a in b])))
    parts = [Frames(got[a], chosen[a][1].codes[:, 1:].clone(),
                    torch.full((chosen[a][1].codes.shape[0],), chosen[a][0], dtype=torch.long))
             for a in range(len(chosen))]
    out = Frames.cat(parts, keep_ids=True)  # the input index as utterance id
    cut = chosen[-1][1].codes.shape[0] < utts[chosen[-1][0]].codes.shape[0]
    out.source = {"kind": "utterances", "model": getattr(lm, "name", None), "n_utterances": len(chosen),
                  "n_given": len(utts), "max_frames": max_frames, "cut_last": cut, **(source or {})}
    return out


def frames_from_shipped(lm, split: str, *, max_frames: int | None = None,
                        seed: int | None = 0, progress: bool = False) -> Frames:
    """:func:`frames_from_utterances` of one split (``"training"``, ``"validation"``, ``"calibration"``,
    ``"evaluation"``) of the utterances shipped beside the model, in a seeded random order (a frame limit samples the
    whole split; ``seed=None``: file order); ``utterance`` is the index in the split. Raises FileNotFoundError: the
    model ships no utterances; ValueError: a split it does not have, bad codes."""
    root = embedded_root(lm)
    path = root / "utterances.safetensors"
    rows, utts = load_shipped_utterances(path, splits=[split])
    if not utts:
        raise ValueError(f"{path} has no usable {split!r} utterance")
    order = torch.arange(len(utts)) if seed is None else \
        torch.randperm(len(utts), generator=torch.Generator().manual_seed(seed))
    fr = frames_from_utterances(lm, [utts[int(i)] for i in order], max_frames=max_frames, progress=progress,
                                source={"kind": "shipped", "file": str(path), "split": split, "seed": seed,
                                        "n_split_utterances": len(utts)})
    fr.utterance = order[fr.utterance]  # back to the index in the split
    return fr


@torch.no_grad()
def frames_from_contexts(code_predictor, context: torch.Tensor, *, sampling: Sampling | None = None, seed: int = 0,
                         frames_per_utterance: int = 1) -> Frames:
    """Frames whose codes the inner loop samples (AR, the deployed warpers) from given ``context`` (no talker);
    ``frames_per_utterance`` consecutive frames share an utterance id (for splits)."""
    gen = torch.Generator(device=context.device).manual_seed(seed)
    codes = torch.cat([decode_frame(code_predictor, context[i: i + 4096], decoder=AR(), sampling=sampling,
                                    generator=gen).codes for i in range(0, context.shape[0], 4096)])
    utt = torch.arange(context.shape[0]) // max(1, frames_per_utterance)
    return Frames(context.float().cpu(), codes.cpu(), utt, None,
                  {"kind": "contexts", "n": int(context.shape[0]), "seed": seed,
                   "sampling": repr(sampling or Sampling())})
