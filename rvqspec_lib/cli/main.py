"""The ``rvqspec`` command line (docs/cli.md): the parser, the dispatch, the global flags and Ctrl-C. The flags of
each command are in :mod:`rvqspec_lib.cli.args` (bench: :mod:`bench.cli`), the work in one module per
command, imported only when that command runs (:data:`COMMANDS`), so ``rvqspec --help`` never imports torch.
Conventions (docs/cli.md#what-every-command-shares): bad input exits 2 with one line naming the fix before any model
loads; Ctrl-C exits 130 leaving no partial output; ``--threads`` before or after the command (after wins)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from importlib.metadata import entry_points
from typing import Sequence

from rvqspec_lib.cli.common import OUTPUT_FLAGS, OneLineParser, _die, add_threads_arg, check_output_folder, \
    check_output_path, resolve_threads

#: command -> its help line. ``args.a_b(parser)`` adds the flags of ``a-b`` (no torch); the module ``a_b`` does the
#: work, ``run(args, threads) -> exit status`` (``threads``: the resolved ``--threads``, 0 = torch's choice).
COMMANDS = {
    "synth": "speak a text with a chosen inner-loop decoder",
    "prepare": "get a checkpoint ready for --decoder paper and auto (frames, offsets, trees, auto's timing)",
    "train-drafter": "train position-aware offsets or Medusa heads",
    "eval-acceptance": "tokens per call and acceptance of a drafter",
    "export": "one code-predictor graph to ONNX (run and checked here) or Core ML (notebook 06)",
    "eval-wer": "WER parity and code-distribution tests of the decoders against AR (notebook 05)",
    "extract-frames": "teacher-forced frames of a split, one shard per process (accelerate launch)",
    "train-drafter-parallel": "train a drafter data-parallel over processes (accelerate launch -m "
                              "rvqspec_lib.cli.train_drafter_parallel)",
}

#: the entry-point group of command plug-ins (``bench``): a module with ``HELP``, ``add_args(parser)`` and ``run``
PLUGIN_GROUP = "rvqspec.commands"


def plugins() -> dict[str, str]:
    """Commands added by installed packages: name -> module path (``{"bench": "bench.cli"}``)."""
    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}


def _commands() -> dict[str, tuple[str | None, str, str]]:
    """Command -> (help line or ``None``: the module's ``HELP``, ``module:function`` adding its flags, module)."""
    own = {n: (h, f"args:{n.replace('-', '_')}", n.replace("-", "_")) for n, h in COMMANDS.items()}
    return {**own, **{n: (None, f"{m}:add_args", m) for n, m in plugins().items() if n not in COMMANDS}}


def _load(ref: str):
    """``"args:synth"`` -> :func:`rvqspec_lib.cli.args.synth`; ``"synth"`` -> the module; ``"bench.cli:add_args"``."""
    module, _, attr = ref.partition(":")
    mod = importlib.import_module(module if "." in module else f"rvqspec_lib.cli.{module}")
    return getattr(mod, attr) if attr else mod


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``rvqspec`` parser: global ``--threads``, one sub-parser per command, the flags of ``commands`` (all)."""
    parser = OneLineParser(prog="rvqspec", description="rvqspec: lossless speculative decoding of the RVQ inner loop "
                                                       "of Qwen3-TTS")
    add_threads_arg(parser, dest="global_threads")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, (help_line, add_args, module) in _commands().items():
        help_line = help_line or importlib.import_module(module).HELP  # a plug-in's (a light module: no torch)
        p = sub.add_parser(name, help=help_line, description=help_line)
        if commands is None or name in commands:
            _load(add_args)(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rvqspec`` console script. Returns the exit status: 0, 2 on bad input, 130 on Ctrl-C."""
    started = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # only the command named on the line gets its flags (and imports its parser's module)
        args = build_parser([a for a in argv if a in _commands()][:1]).parse_args(argv)
        args._started = started
        return _dispatch(args)
    except KeyboardInterrupt:  # outputs are written atomically: nothing partial is left behind
        clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # a progress bar may hold the line: start it afresh
        print(f"{clear}rvqspec: interrupted", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    try:
        threads = resolve_threads(args.threads, args.global_threads)
        for attr, flag in OUTPUT_FLAGS.items():  # synth makes a missing parent folder; synth --out - is standard output
            if (path := getattr(args, attr, None)) is None or path == "-":
                continue
            if attr == "out" and args.cmd in ("export", "extract-frames"):  # their --out is a folder
                problem = check_output_folder(path)
            else:
                problem = check_output_path(path, flag, make_parents=args.cmd == "synth")
            if problem:
                raise ValueError(problem)
    except ValueError as e:
        return _die(str(e))
    command = _load(_commands()[args.cmd][2])
    from safetensors import SafetensorError  # loaded with the command's module (torch's) by now

    try:
        return command.run(args, threads)
    except SafetensorError as e:  # a file that is not safetensors (or truncated): name it, no traceback
        return _die(f"cannot read a .safetensors file ({e}): check the --model / --drafter-path / --frames-file "
                    "files, or rebuild them (make embedded, rvqspec train-drafter)")
    except ValueError as e:
        return _die(str(e))
    except OSError as e:  # missing files, permissions, a full disk: the outputs were not written (atomic)
        return _die(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))


def accelerate_main(command: str):
    """The ``main(argv=None)`` that ``accelerate launch -m rvqspec_lib.cli.<module>`` runs: ``rvqspec <command>``."""
    return lambda argv=None: main([command, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
