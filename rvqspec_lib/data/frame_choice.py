"""Which teacher-forced frames a command trains or evaluates on, chosen from what it was given: a frames file, a
dataset and its codec, texts the model speaks, else the utterances shipped beside the model, else built-in texts.
Everything is checked before the model loads; errors are one line naming the command's flag and the fix."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rvqspec_lib.data.frame_sources import DEFAULT_TEXTS, frames_from_dataset, frames_from_model, frames_from_shipped
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.models.drafter_files import model_drafter_dir
from rvqspec_lib.models.loader import EMBEDDED_MODEL
from rvqspec_lib.models.speech_tokenizers import load_codec


def read_lines(path: str | os.PathLike, flag: str) -> list[str]:
    """The non-blank lines (stripped) of a UTF-8 text file given as ``flag``.

    Raises:
        ValueError: a missing file, a folder, other bytes than UTF-8, no line with text (one line naming the fix).
    """
    p = Path(path)
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "does not exist"
        raise ValueError(f"{flag} {p} {what}: give a UTF-8 text file, one sentence a line (check the path)")
    try:
        lines = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                         "convert it (iconv -t utf-8)") from None
    if not lines:
        raise ValueError(f"{flag} {p} has no sentence (only blank lines): one sentence a line")
    return lines


#: The index of a folder of frame shards (``rvqspec extract-frames``; :mod:`rvqspec_lib.training.distributed`).
SHARD_INDEX = "index.json"


def check_frames_path(path: str | None, flag: str, make: str) -> str | None:
    """Why frames given as ``flag`` cannot be read, or ``None`` (also for no ``path``): a frames file, or a folder with
    the :data:`SHARD_INDEX` of ``rvqspec extract-frames`` and every shard it lists. The message names ``make``, the
    command that makes them (``--out PATH`` added)."""
    if path is None or Path(path).is_file():
        return None
    p, make = Path(path), f"{make} --out {path}"
    if not p.exists():
        return f"{flag} {path} does not exist: make it with `{make}` (or give a frames file, .safetensors)"
    if not (p / SHARD_INDEX).is_file():
        return f"{flag} {path} holds no {SHARD_INDEX} (extract-frames writes it when every shard is done): run `{make}`"
    try:
        missing = [name for name in json.loads((p / SHARD_INDEX).read_text())["shards"] if not (p / name).is_file()]
    except (ValueError, KeyError, TypeError):
        return f"{flag} {path} holds an {SHARD_INDEX} that extract-frames did not write: run `{make}` again"
    return f"{flag} {path} misses shard {missing[0]} of its {SHARD_INDEX}: run `{make}` again" if missing else None


def check_dataset_flags(dataset: str | None, codec: str | None, language: str = "auto") -> None:
    """A dataset needs the codec that turns its audio into codes; ``codec`` and ``language`` are read only with one.

    Raises:
        ValueError: one line naming the flag.
    """
    if dataset and not codec:
        raise ValueError("--dataset needs --codec (the codec that turns its audio into codes)")
    if not dataset and codec:
        raise ValueError("--codec is used only with --dataset (it turns the dataset's audio into codes)")
    if not dataset and language != "auto":
        raise ValueError("--language is used only with --dataset (the prompt language of its utterances)")


@dataclass
class FrameSource:
    """The frame source of ``model``: at most one of ``frames_file`` (saved by :meth:`Frames.save`), ``dataset``
    (a local ``save_to_disk`` folder of audio + text, VoxPopuli schema, encoded by ``codec``; prompts in
    ``language``) or ``texts_file`` (sentences the model speaks, one a line); none given: the model's shipped
    utterances, else :data:`DEFAULT_TEXTS`. ``frames``: how many to use (>= 1); ``seed`` seeds the shipped order and
    the model's speech. :meth:`of` reads the fields from a command's parsed flags (the same names)."""

    model: str
    frames: int = 200
    frames_file: str | None = None
    dataset: str | None = None
    codec: str | None = None
    language: str = "auto"
    texts_file: str | None = None
    seed: int = 0

    @classmethod
    def of(cls, flags) -> "FrameSource":
        """The source of parsed flags (``argparse.Namespace``: ``model``, ``frames``, ``frames_file``, ...), checked.

        Raises:
            ValueError: see :meth:`check`.
        """
        source = cls(**{name: getattr(flags, name) for name in cls.__dataclass_fields__})
        source.check()
        return source

    def check(self) -> None:
        """Raises ValueError (one line): fewer than one frame, two sources, a flag the chosen source does not read
        (silently ignored, it would mislead), an unreadable texts file."""
        if self.frames < 1:
            raise ValueError(f"--frames must be >= 1, got {self.frames}")
        given = [f"--{n.replace('_', '-')}" for n in ("frames_file", "dataset", "texts_file") if getattr(self, n)]
        if len(given) > 1:
            raise ValueError(f"give one frame source, not {' and '.join(given)}")
        check_dataset_flags(self.dataset, self.codec, self.language)
        if self.texts_file:
            read_lines(self.texts_file, "--texts-file")

    @property
    def shipped(self) -> bool:
        """No source given and the model ships utterances (the embedded model must: FileNotFoundError otherwise)."""
        if self.frames_file or self.dataset or self.texts_file or model_drafter_dir(self.model) is None:
            return False
        try:
            embedded_root(self.model)
            return True
        except FileNotFoundError:
            if str(self.model) == EMBEDDED_MODEL:  # the shipped model must have its data: never fall back silently
                raise
            return False

    def load(self, lm, split: str, limit: int | None = None) -> Frames:
        """The first ``limit`` (default :attr:`frames`) frames, ``split`` (training, validation, evaluation) of shipped
        utterances; fewer where the source has fewer."""
        limit = self.frames if limit is None else limit
        progress = sys.stderr.isatty()
        if self.frames_file:
            fr = Frames.load(self.frames_file)
        elif self.dataset:
            fr = frames_from_dataset(self.dataset, lm, load_codec(self.codec), language=self.language,
                                     max_frames=limit, progress=progress)
        elif self.shipped:
            fr = frames_from_shipped(lm, split, max_frames=limit, seed=self.seed, progress=progress)
        else:  # the model speaks the texts in turn (at most 200 frames each) until there are enough frames
            texts = read_lines(self.texts_file, "--texts-file") if self.texts_file else list(DEFAULT_TEXTS)
            parts, have = [], 0
            while have < limit:
                i = len(parts)
                parts.append(frames_from_model(lm, [texts[i % len(texts)]], seed=self.seed + i,
                                               max_frames=min(200, limit - have)))
                parts[-1].utterance[:] = i
                have += len(parts[-1])
            fr = Frames.cat(parts)
        return fr.subset(torch.arange(limit)) if len(fr) > limit else fr
