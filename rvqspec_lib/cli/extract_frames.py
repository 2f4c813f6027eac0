"""``rvqspec extract-frames``: teacher-forced frames of many utterances, data-parallel under ``accelerate launch``
(docs/cli.md#rvqspec-extract-frames-and-train-drafter-parallel): one shard a process and the main process's
``index.json``, read by ``train-drafter-parallel``."""

from __future__ import annotations

import sys

from rvqspec_lib.cli.common import load, parallel_device
from rvqspec_lib.cli.main import accelerate_main
from rvqspec_lib.data.frame_choice import check_dataset_flags
from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances
from rvqspec_lib.models.speech_tokenizers import load_codec
from rvqspec_lib.training.distributed import extract_dataset_frames, extract_frames


def run(args, threads: int) -> int:
    """``rvqspec extract-frames`` in this process, one of several under ``accelerate launch``."""
    check_dataset_flags(args.dataset, args.codec, args.language)
    if not args.dataset:
        try:
            root = embedded_root(args.model)
        except FileNotFoundError:
            raise ValueError(f"{args.model} ships no utterances: pass --dataset and --codec") from None
    par = parallel_device(args)
    lm = load(args, threads)[0]
    progress = sys.stderr.isatty() and par.is_main
    if args.dataset:
        out = extract_dataset_frames(args.dataset, lm, load_codec(args.codec, device=par.device), args.out,
                                     parallel=par, language=args.language, max_items=args.max_utterances,
                                     progress=progress)
    else:
        _, utts = load_shipped_utterances(root / "utterances.safetensors", splits=[args.split],
                                          limit=args.max_utterances)
        out = extract_frames(lm, utts, args.out, parallel=par, batch_size=args.batch_size, progress=progress,
                             source={"split": args.split, "model": args.model, "device": lm.device})
    if par.is_main:
        print(f"wrote {par.world} shard(s) and index.json to {out} ({lm.device}, {lm.dtype})")
    return 0


#: ``python -m rvqspec_lib.cli.extract_frames`` (what ``accelerate launch -m`` runs): ``rvqspec extract-frames``.
main = accelerate_main("extract-frames")

if __name__ == "__main__":
    sys.exit(main())
