"""The frame source of ``train-drafter`` and ``eval-acceptance`` (flags: :func:`rvqspec_lib.cli.args.frame_source`),
checked before the model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rvqspec_lib.cli.common import check_seed, note, read_text_file
from rvqspec_lib.data.frame_sources import DEFAULT_TEXTS, frames_from_dataset, frames_from_model, frames_from_shipped
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.models.drafter_files import model_drafter_dir
from rvqspec_lib.models.loader import EMBEDDED_MODEL
from rvqspec_lib.models.speech_tokenizers import load_codec


def texts_from_file(path: str) -> list[str]:
    """The non-empty lines of a UTF-8 --texts-file. Raises ValueError (one line): missing, not UTF-8, no text."""
    texts = [t.strip() for t in read_text_file(path, "--texts-file").splitlines() if t.strip()]
    if not texts:
        raise ValueError(f"--texts-file {path} has no text: one sentence a line")
    return texts


def check_frame_source_args(args) -> None:
    """One frame source at most, no flag the chosen source does not read (silently ignored, it would mislead), a
    valid --seed, --frames >= 1, a readable --texts-file.

    Raises:
        ValueError: one line naming the flag.
    """
    check_seed(args.seed)
    if args.frames < 1:
        raise ValueError(f"--frames must be >= 1, got {args.frames}")
    given = [f"--{n.replace('_', '-')}" for n in ("frames_file", "dataset", "texts_file") if getattr(args, n)]
    if len(given) > 1:
        raise ValueError(f"give one frame source, not {' and '.join(given)}")
    if not args.dataset:
        if args.codec:
            raise ValueError("--codec is used only with --dataset (it turns the dataset's audio into codes)")
        if args.language != "auto":
            raise ValueError("--language is used only with --dataset (the prompt language of its utterances)")
    if args.texts_file:
        texts_from_file(args.texts_file)


def shipped_root(model: str) -> Path | None:
    """Where the model's shipped utterances are, ``None`` for models without them (FileNotFoundError for the embedded
    model, which must have them)."""
    if model_drafter_dir(model) is None:
        return None
    try:
        return embedded_root(model)
    except FileNotFoundError:
        if str(model) == EMBEDDED_MODEL:  # the shipped model must have its data: never fall back silently
            raise
        return None


def uses_shipped(args) -> bool:
    """No other frame source was given and the model ships utterances."""
    return not (args.frames_file or args.dataset or args.texts_file) and shipped_root(args.model) is not None


def frames_from_args(args, lm, split: str = "training", max_frames: int | None = None):
    """The first ``max_frames`` (default --frames) frames of --frames-file, --dataset + --codec, --texts-file, else
    the model's shipped utterances of ``split``, else the model speaking built-in texts."""
    limit = args.frames if max_frames is None else max_frames  # >= 1: checked by the commands before loading
    if args.frames_file:
        fr = Frames.load(args.frames_file)
    elif args.dataset:
        if not args.codec:
            raise ValueError("--dataset needs --codec (the codec that turns its audio into codes)")
        fr = frames_from_dataset(args.dataset, lm, load_codec(args.codec), language=args.language,
                                 max_frames=limit, progress=sys.stderr.isatty())
    elif uses_shipped(args):
        fr = frames_from_shipped(lm, split, max_frames=limit, seed=args.seed,
                                 progress=sys.stderr.isatty())
    else:
        texts = texts_from_file(args.texts_file) if args.texts_file else list(DEFAULT_TEXTS)
        parts, have, i = [], 0, 0
        while have < limit:
            text = texts[i % len(texts)]
            fr = frames_from_model(lm, [text], seed=args.seed + i, max_frames=min(200, limit - have))
            fr.utterance[:] = i
            parts.append(fr)
            have += len(fr)
            i += 1
        fr = Frames.cat(parts)
    if len(fr) > limit:
        fr = fr.subset(torch.arange(limit))
    return fr


def note_fewer_frames(frames, asked: int) -> None:
    """A note when the frame source has fewer frames than --frames asked for."""
    if len(frames) < asked:
        note(f"--frames {asked} asked, the source has {len(frames)}: using them all")
