"""What every ``rvqspec`` command shares: the one-line parser and errors, output-path checks, the thread count,
range, seed and text checks. Light: no torch at module level (``rvqspec --help`` stays fast; tests/test_cli.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Sequence

from rvqspec_lib.common import files


def _die(msg: str) -> int:
    """Print ``rvqspec: error: <msg>`` on stderr as ONE line (several lines joined with " | "); return 2."""
    one = " | ".join(line.strip() for line in str(msg).splitlines() if line.strip())
    print(f"rvqspec: error: {one}", file=sys.stderr)
    return 2


def note(msg: str) -> None:
    """A one-line ``note: ...`` on stderr (something the user should know; not an error)."""
    print(f"note: {msg}", file=sys.stderr)


def note_fewer_frames(frames, asked: int, flag: str = "--frames") -> None:
    """A note when a frame source has fewer frames than ``flag`` asked for."""
    if len(frames) < asked:
        note(f"{flag} {asked} asked, the source has {len(frames)}: using them all")


#: argparse destination -> what its choices are, for ``--dtype float16 is not a precision ... takes`` (else "a value")
CHOICE_NOUNS = {"dtype": "a precision", "drafter": "a drafter", "loss": "a training loss", "backend": "a backend",
                "frame": "a kind of frame runner", "codes_to_audio": "a way from codes to audio",
                "teacher_codes": "a source of teacher codes", "dataset_kind": "a dataset kind",
                "fmt": "a format", "graph": "a graph", "target": "a deployment target"}

#: Largest seed: seeds go to ``torch.Generator.manual_seed`` (64 bits), some plus a small offset per utterance.
SEED_MAX = 2**63 - 1

#: argparse type functions -> what their values are, for "--repeats abc is not a whole number".
_TYPE_NOUNS = {int: "a whole number", float: "a number"}


class OutOfRange(argparse.ArgumentTypeError):
    """A value outside its flag's range (:func:`number`): the parser words it ``<flag> must be ..., got <value>``."""


def number(kind=int, lo=0, hi=None, what: str = "", open_: bool = False):
    """An argparse ``type=``: ``kind(text)`` in ``lo..hi`` (``hi=None``: unbounded; ``open_``: bounds excluded).
    Raises ValueError (not a ``kind``) or :class:`OutOfRange` (``must be >= lo<what>, got v`` and the like)."""
    text = (f"{'>' if open_ else '>='} {lo}" if hi is None else f"in ({lo}, {hi})" if open_ else f"in {lo}..{hi}")

    def convert(s: str):
        v = kind(s)
        if not ((lo < v if open_ else lo <= v) and (hi is None or (v < hi if open_ else v <= hi))):
            raise OutOfRange(f"must be {text}{what}, got {v}")
        return v
    convert.kind = kind
    return convert


def _either(names) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class OneLineParser(argparse.ArgumentParser):
    """The parser of every command: bad input is ONE line ``rvqspec: error: <what is wrong>: <the fix>``, exit 2, no
    usage block. argparse's hooks ``_check_value``/``_get_value`` word choices and types; :meth:`one_line` the rest."""

    def _flag(self, action) -> str:
        if action is None:
            return "argument"
        if action.option_strings:
            return max(action.option_strings, key=len)  # the long form: --dtype, not -d
        return "command" if isinstance(action, argparse._SubParsersAction) else str(action.metavar or action.dest)

    def _check_value(self, action, value):
        if action.choices is None or value in action.choices:
            return
        if isinstance(action, argparse._SubParsersAction):
            raise self._ready(f"{value!r} is not an {self.prog} command: use {_either(action.choices)} ({self.prog} "
                              "--help says what each does)")
        raise self._ready(f"{self._flag(action)} {value} is not {CHOICE_NOUNS.get(action.dest, 'a value')} "
                          f"{self.prog} takes: use {_either(action.choices)}")

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            flag, noun, example = self._flag(action), _TYPE_NOUNS.get(getattr(action.type, "kind", action.type)), \
                action.default
            if isinstance(e.__context__, OutOfRange):
                raise self._ready(f"{flag} {e.message}") from None
            if noun is None:  # an ArgumentTypeError of the project's own type functions: its message names the fix
                raise self._ready(f"{flag} {arg_string}: {e.message}") from None
            fix = f"give e.g. {flag} {example}" if isinstance(example, (int, float)) and \
                not isinstance(example, bool) else f"write {noun} after {flag}"
            raise self._ready(f"{flag} {arg_string} is not {noun}: {fix}") from None

    def _ready(self, msg: str) -> argparse.ArgumentError:
        """An ArgumentError whose message is already the one line."""
        self._ready_message = msg
        return argparse.ArgumentError(None, msg)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, remembering the command (``bench table``) to name in the error about unknown flags."""
        ns, extra = super().parse_known_args(args, namespace)
        names, parser = [], self
        while (subs := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]):
            if (name := getattr(ns, subs[0].dest, None)) not in subs[0].choices:
                break
            names.append(name)
            parser = subs[0].choices[name]
        self._last_command, self._last_parser = " ".join(names) or None, parser
        return ns, extra

    def error(self, message: str):
        """Print ``message`` as one line naming the fix and exit with status 2 (no usage block)."""
        print(f"rvqspec: error: {self.one_line(message)}", file=sys.stderr)
        self.exit(2)

    def one_line(self, message: str) -> str:
        """argparse's error ``message`` (from this parser) reworded as one line naming the fix."""
        if message == getattr(self, "_ready_message", None):
            return message
        where, match = self.prog, lambda pattern: re.fullmatch(pattern, message)
        if (m := match(r"the following arguments are required: (.*)")):
            missing = [a.strip() for a in m.group(1).split(",")]
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and (subs[0].metavar or subs[0].dest) in missing:
                return f"give a command: {_either(subs[0].choices)} ({where} --help says what each does)"
            return (f"{where} needs {_either(missing)}: add {'it' if len(missing) == 1 else 'them'} ({where} --help "
                    "describes every flag)")
        if (m := match(r"one of the arguments (.*) is required")):
            return f"{where} needs one of {_either(m.group(1).split())}: add one"
        if (m := match(r"unrecognized arguments: (.*)")):
            hint = getattr(getattr(self, "_last_parser", None), "unknown_flag_hint", None)  # e.g. bench's jobs'
            if hint and (line := hint(m.group(1).split())):
                return line
            cmd = f" {self._last_command}" if getattr(self, "_last_command", None) else ""
            return f"{where}{cmd} has no argument {m.group(1)}: {where}{cmd} --help lists the flags"
        if (m := match(r"argument (\S+): not allowed with argument (\S+)")):
            return f"{m.group(1)} and {m.group(2)} exclude each other: give one of them"
        if (m := match(r"argument (\S+): expected (.*) arguments?")):
            return f"{m.group(1).split('/')[-1]} needs a value: give it after the flag ({where} --help)"
        if (m := match(r"ambiguous option: (\S+) could match (.*)")):
            return f"{m.group(1)} could be {_either(m.group(2).split(', '))}: write the flag out"
        if (m := match(r"argument (\S+): (.*)")):
            return f"{m.group(1).split('/')[-1]}: {m.group(2)} ({where} --help)"
        return f"{message} ({where} --help)"


#: argparse destinations that name an output file, and their flags: checked by ``main`` before any command runs.
OUTPUT_FLAGS = {"out": "--out", "json": "--json", "json_path": "--json", "curve_json": "--curve-json"}


def _folder_problem(folder: Path, flag: str, path) -> str | None:
    """Why no file can be written in ``folder`` (or made in its nearest existing ancestor), or ``None``."""
    base = next((q for q in (folder, *folder.parents) if q.exists()), Path("."))
    if not base.is_dir():
        return f"{flag} {path}: {base} is a file, not a folder: choose another location"
    try:
        files.temp_beside(base / ".rvqspec-probe").unlink()
    except OSError as e:
        made = "" if base == folder else f", so the folder {folder} cannot be created in {base}"
        return (f"{flag} {path}: no file can be written in {base} ({e.strerror}){made}: choose a writable folder, or "
                f"make this one writable (chmod u+w {base})")
    return None


def make_folder(folder: str | os.PathLike, flag: str) -> Path:
    """Create ``folder`` and its missing parents; returns it. Raises ValueError (one line naming ``flag``)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {folder}: cannot create the folder ({e.strerror or e}): choose another location") \
            from None
    return Path(folder)


def check_output_path(path: str | os.PathLike | None, flag: str, *, make_parents: bool = False) -> str | None:
    """Why an output path cannot be written (real probes, nothing left behind), or ``None`` (also for no path)."""
    if path is None:
        return None
    if not str(path).strip():
        return f"{flag} is an empty path: give a file name"
    p = Path(path)
    if p.is_dir() or p.name in ("", ".", ".."):
        return f"{flag} {path} is a folder: give a file name inside it"
    if not p.parent.exists() and not make_parents:
        return f"output folder {p.parent} does not exist: create it or choose another {flag}"
    if not p.parent.is_dir():
        return _folder_problem(p.parent, flag, path)
    try:
        if p.exists():
            open(p, "a").close()
        files.temp_beside(p).unlink()
    except OSError as e:
        return f"{flag} {path} is not writable ({e.strerror}): choose another location"
    return None


def check_outputs(paths: Sequence[tuple[str | os.PathLike | None, str]], *, make_parents: bool = False) -> None:
    """:func:`check_output_path` on ``(path, flag)`` pairs, no two the same file. Raises ValueError (one line)."""
    seen: dict[Path, str] = {}
    for path, flag in paths:
        if (problem := check_output_path(path, flag, make_parents=make_parents)):
            raise ValueError(problem)
        if path is not None and seen.setdefault(Path(path).resolve(), flag) != flag:
            raise ValueError(f"{flag} {path} is also written as {seen[Path(path).resolve()]}: give each output its "
                             "own name")


def check_output_folder(path: str | os.PathLike) -> str | None:
    """Why ``--out`` cannot be an output FOLDER, or ``None``: a file, or nothing creatable in it (a real probe)."""
    out = Path(path)
    return f"--out {out} is a file: give a folder" if out.is_file() else _folder_problem(out, "--out", out)


def add_threads_arg(parser: argparse.ArgumentParser, *, dest: str = "threads") -> None:
    """``--threads`` (``None``: not given; :func:`resolve_threads`)."""
    parser.add_argument("--threads", dest=dest, type=number(int, 0, what=" (0 keeps torch's choice)"), metavar="N",
                        help="torch CPU threads: default 1 (on a small shared machine more threads spin-wait and "
                        "run several times slower), 0 keeps torch's choice, N uses N. Given after the command it wins "
                        "over `rvqspec --threads N <command>`")


def resolve_threads(command_flag: int | None, global_flag: int | None) -> int:
    """The command's ``--threads``, else the global one, else 1 (0 keeps torch's choice)."""
    return command_flag if command_flag is not None else global_flag if global_flag is not None else 1


def apply_threads(n: int) -> int:
    """``torch.set_num_threads(n)`` unless ``n == 0``; returns torch's thread count."""
    import torch

    if n:
        torch.set_num_threads(n)
    return int(torch.get_num_threads())


def threads_text(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def check_device(args, cpu_only: str | None = None, fix: str = "") -> str:
    """Resolve ``args.device`` in place and return it (:func:`~rvqspec_lib.common.machine.resolve_device`).
    ``cpu_only``: what runs on the CPU alone (``"--backend native"``): ``auto`` is the CPU, another device is refused
    naming ``fix``. Raises ValueError (one line): an unknown device, one not here, one ``cpu_only`` refuses."""
    from rvqspec_lib.common.machine import resolve_device  # light; torch only inside

    if cpu_only and str(args.device).strip().lower() == "auto":
        args.device = "cpu"
        return args.device
    args.device = resolve_device(args.device)
    if cpu_only and args.device != "cpu":
        raise ValueError(f"{cpu_only} runs on the CPU only, not --device {args.device}: give --device cpu (or auto)"
                         + (f", or {fix}" if fix else ""))
    return args.device


def load(args, threads: int, random: str = "", cpu_only: str | None = None, check=None, **kwargs):
    """The model of ``--model`` on ``--device`` (:func:`check_device`) after the thread count is applied; ``kwargs``:
    :func:`~rvqspec_lib.models.loader.load_model`'s. ``random``: what random weights make meaningless (a note).
    ``check(model)`` raises on what the model cannot do: run on its config before loading, and on the loaded model.
    Returns ``(model, threads, seconds to load)``. Raises ValueError (one line)."""
    from rvqspec_lib.models import loader

    if check is not None and (facts := loader.model_facts(args.model)) is not None:
        check(facts)
    check_device(args, cpu_only)
    threads, t = apply_threads(threads), time.perf_counter()
    lm = loader.load_model(args.model, device=args.device, **kwargs)
    if check is not None:
        check(lm)
    if lm.is_random and random:
        note(f"{args.model} has RANDOM weights: {random}")
    return lm, threads, time.perf_counter() - t


def timings(threads: int, **seconds: float) -> str:
    """The end of a command's summary line: ``load 1.0 s, train 2.0 s, total 3.0 s | 1 thread``."""
    return f"{', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())} | {threads_text(threads)}"


def write_json(path, record: dict) -> None:
    """``--json``: ``record`` written atomically to ``path`` and a ``wrote`` line; nothing without a path."""
    if path:
        files.write_json_atomic(path, record)
        print(f"wrote {path}")


def parallel_device(args):
    """This process of a data-parallel run (:class:`~rvqspec_lib.training.distributed.Parallel`): alone on ``--device``;
    under ``accelerate launch`` on accelerate's device (``--device auto``; another kind is refused: ValueError)."""
    from dataclasses import replace

    from rvqspec_lib.training.distributed import Parallel

    par = Parallel.detect()
    if par.world == 1:
        return replace(par, device=check_device(args))
    asked = str(args.device).strip().lower()
    if asked != "auto" and asked.split(":")[0] != par.device.split(":")[0]:
        raise ValueError(f"--device {asked}: accelerate launch runs this process on {par.device}; give --device auto, "
                         "or choose the device with accelerate (accelerate launch --cpu for the CPU)")
    args.device = par.device  # accelerate's "cpu:0" is the CPU to resolve_device too
    return par


def check_utf8(text: str, flag: str) -> None:
    """Raises ValueError (one line) when ``text`` holds bytes that are not UTF-8 (lone surrogates in argv)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"character U+{ord(bad):04X}"
        raise ValueError(f"{flag} is not valid UTF-8 ({byte} at character {e.start}): convert it to UTF-8 (e.g. "
                         "iconv -f latin1 -t utf-8)") from None


def check_tree_ranks(names, codebook_size: int, max_rank: int | None = None) -> None:
    """Raises ValueError (one line) when a decoder name's tree drafts a rank outside the codebook, or ``--max-rank``
    exceeds it."""
    if max_rank is not None and max_rank > codebook_size:
        raise ValueError(f"--max-rank {max_rank} exceeds the codebook ({codebook_size} codes)")
    for d in names:
        top = max((max(p) for p in getattr(d, "paths", None) or ()), default=-1)
        if top >= codebook_size:
            raise ValueError(f"decoder {d.text!r}: tree rank {top} is out of range for this model's codebook of "
                             f"{codebook_size} codes: use ranks 0..{codebook_size - 1}")
