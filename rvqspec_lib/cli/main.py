"""Command line: ``rvqspec synth`` (speak a text with any inner-loop decoder), ``rvqspec bench`` (per-call latency),
``rvqspec train-drafter`` and ``rvqspec eval-acceptance`` (drafters of paper Table 2). One module per command
(:mod:`rvqspec_lib.cli.synth`, ``.bench``, ``.train_drafter``, ``.eval_acceptance``), shared helpers in
:mod:`rvqspec_lib.cli.common`; this module holds the parser, the dispatch, the global flags and Ctrl-C.

Examples::

    rvqspec synth --model embedded --text "The weather is fine today." --out out.wav --decoder chain --window 4
    rvqspec synth --model tiny-random --text "Hello world." --out out.wav --decoder tree --tree "0;1;0,0;0,0,0"
    rvqspec bench --model qwen3-tts-0.6b-random --json bench.json
    rvqspec bench --model embedded --backend onnx        # frame times of AR, the fused frame, a chain and a tree
    rvqspec export --model qwen3-tts-0.6b-random --format onnx --graph verify --nodes 8 --out build/export
    rvqspec train-drafter --model ./Qwen3-TTS-12Hz-0.6B-CustomVoice --drafter offsets --frames-file train.safetensors
    rvqspec eval-acceptance --model ./Qwen3-TTS-12Hz-0.6B-CustomVoice --drafter offsets --json acceptance.json
    rvqspec train-drafter --model embedded --drafter offsets     # shipped training / validation utterances,
    rvqspec eval-acceptance --model embedded --drafter offsets   # -> data/embedded/model/drafters/; evaluation split

Conventions of every command: bad input exits with status 2 and one line ``rvqspec: error: ...`` naming the fix,
before any model loads; Ctrl-C exits with status 130 and one line ``rvqspec: interrupted``, leaving no partial
output file (outputs are written atomically); ``--threads`` (before or after the command; after wins) sets torch's
CPU threads: default 1, 0 keeps torch's choice.

Nothing here imports torch or transformers at module level: ``rvqspec --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from rvqspec_lib.cli import (
    bench,
    eval_acceptance,
    eval_wer,
    export,
    extract_frames,
    synth,
    train_drafter,
    train_drafter_parallel,
)
from rvqspec_lib.cli.common import (
    OUTPUT_FLAGS,
    OneLineParser,
    _die,
    add_threads_arg,
    check_output_path,
    resolve_threads,
)

#: command name -> (module with add_args(parser) and run(args, threads), help line). ``threads`` is the resolved
#: ``--threads`` value (0 = torch's choice); each command applies it (common.apply_threads) after its cheap checks.
COMMANDS = {
    "synth": (synth, "speak a text with a chosen inner-loop decoder"),
    "bench": (bench, "per-call latency of the talker and the code predictor"),
    "train-drafter": (train_drafter, "train position-aware offsets or Medusa heads"),
    "eval-acceptance": (eval_acceptance, "tokens per call and acceptance of a drafter"),
    "export": (export, "one code-predictor graph to ONNX (run and checked here) or Core ML (notebook 05)"),
    "eval-wer": (eval_wer, "WER parity and code-distribution tests of the decoders against AR (notebook 04)"),
    "extract-frames": (extract_frames, "teacher-forced frames of a split, one shard per process (accelerate launch)"),
    "train-drafter-parallel": (train_drafter_parallel, "train a drafter data-parallel over processes "
                                                       "(accelerate launch -m rvqspec_lib.cli.train_drafter_parallel)"),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``rvqspec`` parser: global ``--threads`` and one sub-parser per command. A
    :class:`~rvqspec_lib.cli.common.OneLineParser`, as are its sub-parsers: bad input is one line naming the fix."""
    parser = OneLineParser(prog="rvqspec", description="rvqspec: lossless speculative decoding of the "
                                     "RVQ inner loop of Qwen3-TTS")
    add_threads_arg(parser, dest="global_threads")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, (module, help_line) in COMMANDS.items():
        module.add_args(sub.add_parser(name, help=help_line, description=help_line))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rvqspec`` console script. Returns the exit status: 0, 2 on bad input, 130 on Ctrl-C."""
    started = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        args._started = started
        return _dispatch(args)
    except KeyboardInterrupt:  # outputs are written atomically: nothing partial is left behind
        clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # a progress bar may hold the line: start it afresh
        print(f"{clear}rvqspec: interrupted", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    try:
        threads = resolve_threads(args.threads, args.global_threads)
    except ValueError as e:
        return _die(str(e))
    for attr, flag in OUTPUT_FLAGS.items():
        if args.cmd == "train-drafter" and attr == "out" and args.out is None:
            continue  # the default file may go into a new drafters/ folder beside the model: train-drafter makes it
        if args.cmd == "export" and attr == "out":
            continue  # a folder here (export checks it itself)
        problem = check_output_path(getattr(args, attr, None), flag)
        if problem:
            return _die(problem)
    from safetensors import SafetensorError

    try:
        return COMMANDS[args.cmd][0].run(args, threads)
    except SafetensorError as e:  # a file that is not safetensors (or truncated): name it, no traceback
        return _die(f"cannot read a .safetensors file ({e}): check the --model / --drafter-path / --frames-file "
                    "files, or rebuild them (make embedded, rvqspec train-drafter)")
    except ValueError as e:
        return _die(str(e))
    except OSError as e:  # missing files, permissions, a full disk: the outputs were not written (atomic)
        if e.filename and e.strerror:
            return _die(f"{e.filename}: {e.strerror}")
        return _die(str(e))


if __name__ == "__main__":
    sys.exit(main())
