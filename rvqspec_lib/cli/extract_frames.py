"""``rvqspec extract-frames``: teacher-forced frames of many utterances, data-parallel under ``accelerate launch``
(docs/cli.md#rvqspec-extract-frames-and-train-drafter-parallel): one shard a process and the main process's
``index.json``, read by ``train-drafter-parallel``."""

from __future__ import annotations

import sys
from pathlib import Path

from rvqspec_lib.cli import args as flags
from rvqspec_lib.cli.common import OneLineParser, _die, apply_threads, resolve_threads
from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances
from rvqspec_lib.models import loader
from rvqspec_lib.models.speech_tokenizers import load_codec
from rvqspec_lib.training.distributed import Parallel, extract_dataset_frames, extract_frames


def run(args, threads: int | None = None) -> int:
    """Run ``rvqspec extract-frames`` in this process (one of several under ``accelerate launch``)."""
    if args.codec and not args.dataset:
        return _die("--codec is used only with --dataset")
    if args.dataset and not args.codec:
        return _die("--dataset needs --codec (the codec that turns its audio into codes)")
    for flag, v in (("--max-utterances", args.max_utterances), ("--batch-size", args.batch_size)):
        if v is not None and v < 1:
            return _die(f"{flag} must be >= 1, got {v}")
    if Path(args.out).is_file():
        return _die(f"--out {args.out} is a file: give a folder")
    if not args.dataset:
        try:
            root = embedded_root(args.model)
        except FileNotFoundError:
            return _die(f"{args.model} ships no utterances: pass --dataset and --codec")
    apply_threads(resolve_threads(args.threads, None) if threads is None else threads)
    par = Parallel.detect()
    progress = sys.stderr.isatty() and par.is_main
    try:
        lm = loader.load_model(args.model, device=par.device)
        if args.dataset:
            out = extract_dataset_frames(args.dataset, lm, load_codec(args.codec, device=par.device), args.out,
                                         parallel=par, language=args.language, max_items=args.max_utterances,
                                         progress=progress)
        else:
            _, utts = load_shipped_utterances(root / "utterances.safetensors", splits=[args.split],
                                              limit=args.max_utterances)
            out = extract_frames(lm, utts, args.out, parallel=par, batch_size=args.batch_size, progress=progress,
                                 source={"split": args.split, "model": args.model})
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e).splitlines()[0])
    if par.is_main:
        print(f"wrote {par.world} shard(s) and index.json to {out}")
    return 0


def main(argv=None) -> int:
    """``python -m rvqspec_lib.cli.extract_frames`` (what ``accelerate launch -m`` runs)."""
    p = OneLineParser(prog="rvqspec extract-frames")
    flags.extract_frames(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
