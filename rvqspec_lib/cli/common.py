"""Helpers every ``rvqspec`` command shares: one-line errors, output-path checks and atomic writes, the thread
count, seeds, and the decoder flags (``--decoder``, ``--window``, ``--tree``; the names themselves are parsed by
:mod:`rvqspec_lib.decoding.decoder_names`, the one grammar).

Nothing here imports torch at module level: ``rvqspec --help`` builds every command's parser from this module and
stays fast (tests/test_cli.py checks that torch is not imported).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from rvqspec_lib.decoding.decoders import (
    CHAIN_WINDOWS,
    DEFAULT_TREE,
    DEFAULT_WINDOW,
    MAX_WINDOW,
)


def _die(msg: str) -> int:
    """Print ``rvqspec: error: <msg>`` on stderr, on ONE line (a message from a library with several lines is joined
    with " | "); return exit status 2 (bad input, as argparse)."""
    one = " | ".join(line.strip() for line in str(msg).splitlines() if line.strip())
    print(f"rvqspec: error: {one}", file=sys.stderr)
    return 2


def note(msg: str) -> None:
    """A one-line ``note: ...`` on stderr (something the user should know; not an error)."""
    print(f"note: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------------------------
# the parser: argparse's errors as one line naming the fix
# --------------------------------------------------------------------------------------------------------------------
#: What the values of a ``choices=`` flag are, by argparse destination, for the one-line error (``--dtype float16
#: is not a precision rvqspec synth takes: ...``); a flag not listed here is "a value".
CHOICE_NOUNS = {
    "dtype": "a precision",
    "drafter": "a drafter",
    "loss": "a training loss",
    "decoder": "a decoder",
    "codes_to_audio": "a way from codes to audio",
    "teacher_codes": "a source of teacher codes",
    "dataset_kind": "a dataset kind",
}

#: argparse type functions -> what their values are, for "--repeats abc is not a whole number".
_TYPE_NOUNS = {int: "a whole number", float: "a number"}


def _either(names) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class OneLineParser(argparse.ArgumentParser):
    """The parser of every ``rvqspec`` command (sub-parsers inherit it): bad input is ONE line
    ``rvqspec: error: <what is wrong>: <the fix>`` on stderr and exit status 2 (``SystemExit(2)``, as argparse),
    never argparse's usage block. ``--help`` is unchanged.

    It rewrites argparse's own checks: a value outside ``choices=`` (named with :data:`CHOICE_NOUNS`, the choices
    listed), a value its ``type=`` refuses (a ``type`` raising ``argparse.ArgumentTypeError`` supplies the fix
    itself), a missing required flag or command, an unknown flag, two exclusive flags, a flag without its value.
    The two checks that know their flag are argparse's hooks ``_check_value`` and ``_get_value`` (private names,
    unchanged since Python 3.2); the others arrive as argparse's message and are rewritten by :meth:`one_line`, which
    passes an unknown message on unchanged (still one line).
    """

    def _flag(self, action) -> str:
        if action is None:
            return "argument"
        if action.option_strings:
            return max(action.option_strings, key=len)  # the long form: --dtype, not -d
        return "command" if isinstance(action, argparse._SubParsersAction) else str(action.metavar or action.dest)

    def _check_value(self, action, value):
        # argparse's hook for choices= (also the command name of the sub-parsers): same test, our sentence.
        if action.choices is None or value in action.choices:
            return
        choices = _either(action.choices)
        if isinstance(action, argparse._SubParsersAction):
            msg = f"{value!r} is not an {self.prog} command: use {choices} ({self.prog} --help says what each does)"
        else:
            noun = CHOICE_NOUNS.get(action.dest, "a value")
            msg = f"{self._flag(action)} {value} is not {noun} {self.prog} takes: use {choices}"
        raise self._ready(msg)

    def _get_value(self, action, arg_string):
        # argparse's hook for type=: a refused value names the flag, what it wants and an example.
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            flag = self._flag(action)
            if action.type in _TYPE_NOUNS:
                example = action.default if isinstance(action.default, (int, float)) and \
                    not isinstance(action.default, bool) else None
                noun = _TYPE_NOUNS[action.type]
                fix = f"give e.g. {flag} {example}" if example is not None else f"write {noun} after {flag}"
                msg = f"{flag} {arg_string} is not {_TYPE_NOUNS[action.type]}: {fix}"
            else:  # an ArgumentTypeError of the project's own type functions: its message names the fix
                msg = f"{flag} {arg_string}: {e.message}"
            raise self._ready(msg) from None

    def _ready(self, msg: str) -> argparse.ArgumentError:
        """An ArgumentError whose message is already the one line (argparse passes it on to :meth:`error`)."""
        self._ready_message = msg
        return argparse.ArgumentError(None, msg)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, with the command named in the error about unknown flags (``parse_args`` reports them)."""
        ns, extra = super().parse_known_args(args, namespace)
        self._last_command = next((getattr(ns, a.dest, None) for a in self._actions
                                   if isinstance(a, argparse._SubParsersAction)), None)
        return ns, extra

    def error(self, message: str):
        """Print ``message`` as one line naming the fix and exit with status 2 (no usage block)."""
        print(f"rvqspec: error: {self.one_line(message)}", file=sys.stderr)
        self.exit(2)

    def one_line(self, message: str) -> str:
        """argparse's error ``message`` (from this parser) rewritten as one line naming the fix."""
        import re

        if message == getattr(self, "_ready_message", None):
            return message
        where = self.prog
        if (m := re.fullmatch(r"the following arguments are required: (.*)", message)):
            missing = [a.strip() for a in m.group(1).split(",")]
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and (subs[0].metavar or subs[0].dest) in missing:
                return f"give a command: {_either(subs[0].choices)} ({where} --help says what each does)"
            return (f"{where} needs {_either(missing)}: add {'it' if len(missing) == 1 else 'them'} ({where} --help "
                    "describes every flag)")
        if (m := re.fullmatch(r"one of the arguments (.*) is required", message)):
            return f"{where} needs one of {_either(m.group(1).split())}: add one"
        if (m := re.fullmatch(r"unrecognized arguments: (.*)", message)):
            cmd = getattr(self, "_last_command", None)
            help_of = f"{where} {cmd}" if cmd else where
            return f"{where}{' ' + cmd if cmd else ''} has no argument {m.group(1)}: {help_of} --help lists the flags"
        if (m := re.fullmatch(r"argument (\S+): not allowed with argument (\S+)", message)):
            return f"{m.group(1)} and {m.group(2)} exclude each other: give one of them"
        if (m := re.fullmatch(r"argument (\S+): expected (.*) arguments?", message)):
            return f"{m.group(1).split('/')[-1]} needs a value: give it after the flag ({where} --help)"
        if (m := re.fullmatch(r"ambiguous option: (\S+) could match (.*)", message)):
            return f"{m.group(1)} could be {_either(m.group(2).split(', '))}: write the flag out"
        if (m := re.fullmatch(r"argument (\S+): (.*)", message)):
            return f"{m.group(1).split('/')[-1]}: {m.group(2)} ({where} --help)"
        return f"{message} ({where} --help)"


# --------------------------------------------------------------------------------------------------------------------
# output files
# --------------------------------------------------------------------------------------------------------------------
#: argparse destinations that name an output file, and their flags: checked by ``main`` before any command runs.
OUTPUT_FLAGS = {"out": "--out", "json": "--json", "json_path": "--json", "curve_json": "--curve-json"}


def check_output_path(path: str | os.PathLike | None, flag: str) -> str | None:
    """Why an output path cannot be written, or ``None`` if it can (``None`` path: nothing to check).

    Checked BEFORE any work, so no run is lost: an empty path, a folder, a missing folder, a file that exists but is
    read-only, and a folder where no file can be created (the atomic write puts a temporary file beside the target,
    :func:`rvqspec_lib.common.files.atomic_outputs`). The probes leave nothing behind.
    """
    from rvqspec_lib.common.files import temp_beside

    if path is None:
        return None
    if not str(path).strip():
        return f"{flag} is an empty path: give a file name"
    p = Path(path)
    if p.is_dir() or not p.name or p.name in (".", ".."):
        return f"{flag} {path} is a folder: give a file name inside it"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        return f"output folder {parent} does not exist: create it or choose another {flag}"
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is not a folder"
    try:  # real probes: permissions, read-only mounts and pseudo file systems all show up here
        if p.exists():
            with open(p, "a"):
                pass
        temp_beside(p).unlink()
    except OSError as e:
        return f"{flag} {path} is not writable ({e.strerror}): choose another location"
    return None


def check_outputs(paths: Sequence[tuple[str | os.PathLike | None, str]]) -> None:
    """:func:`check_output_path` on ``(path, flag)`` pairs; also refuses two outputs that are the same file.

    Raises:
        ValueError: the first problem, in one line.
    """
    seen: dict[Path, str] = {}
    for path, flag in paths:
        problem = check_output_path(path, flag)
        if problem:
            raise ValueError(problem)
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise ValueError(f"{flag} {path} is also the {seen[key]} file: give each output its own name")
        seen[key] = flag


def check_output_folder(path: str | os.PathLike, flag: str = "--out") -> str | None:
    """Why an output FOLDER cannot be written, or ``None`` if it can: checked before any work (``rvqspec export``).

    The folder must be a folder (not a file); if missing, its parent must exist (the command creates the folder);
    and a file must be creatable in the folder, or in the parent when the folder is still to be made (a real probe,
    left behind by nothing: permissions, read-only mounts and pseudo file systems show up here).
    """
    from rvqspec_lib.common.files import temp_beside

    out = Path(path)
    if out.exists() and not out.is_dir():
        return f"{flag} {out} is a file: give a folder"
    if not out.exists() and not out.parent.exists():
        return f"the parent of {flag} {out} does not exist: create it or choose another folder"
    where = out if out.exists() else out.parent
    try:
        temp_beside(where / ".rvqspec-probe").unlink()
    except OSError as e:
        return (f"{flag} {out}: no file can be written in {where} ({e.strerror}): choose a writable folder, or make "
                f"this one writable (chmod u+w {where})")
    return None


# --------------------------------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------------------------------
THREADS_HELP = ("torch CPU threads: default 1 (on a small shared machine more threads spin-wait and run several "
                "times slower), 0 keeps torch's choice, N uses N. Given after the command it wins over `rvqspec "
                "--threads N <command>`")


def add_threads_arg(parser: argparse.ArgumentParser, *, dest: str = "threads") -> None:
    """``--threads`` (default ``None`` = not given; :func:`resolve_threads` picks the value)."""
    parser.add_argument("--threads", dest=dest, type=int, default=None, metavar="N", help=THREADS_HELP)


def resolve_threads(command_flag: int | None, global_flag: int | None) -> int:
    """The one ``--threads`` rule of every command: the command's own flag if given, else the global one, else 1.
    0 means "keep torch's choice".

    Raises:
        ValueError: a negative count.
    """
    n = command_flag if command_flag is not None else global_flag if global_flag is not None else 1
    if n < 0:
        raise ValueError(f"--threads must be >= 0 (0 keeps torch's choice), got {n}")
    return n


def apply_threads(n: int) -> int:
    """``torch.set_num_threads(n)`` unless ``n == 0``; returns the thread count torch now uses."""
    import torch

    if n:
        torch.set_num_threads(n)
    return int(torch.get_num_threads())


def threads_text(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


# --------------------------------------------------------------------------------------------------------------------
# seeds, text
# --------------------------------------------------------------------------------------------------------------------
#: Largest seed: seeds go to ``torch.Generator.manual_seed`` (64 bits), some plus a small offset per utterance.
SEED_MAX = 2**63 - 1


def check_seed(seed: int, flag: str = "--seed") -> None:
    """Raises ValueError (one line) unless ``0 <= seed <= SEED_MAX``."""
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"{flag} must be in 0..{SEED_MAX} (2**63 - 1), got {seed}")


def check_utf8(text: str, flag: str) -> None:
    """Raises ValueError (one line) when ``text`` holds bytes that are not UTF-8 (Python keeps them in argv as lone
    surrogates, e.g. from a Latin-1 terminal or file)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"character U+{ord(bad):04X}"
        raise ValueError(f"{flag} is not valid UTF-8 ({byte} at character {e.start}): convert it to UTF-8 (e.g. "
                         "iconv -f latin1 -t utf-8)") from None


def read_text_file(path: str | os.PathLike, flag: str) -> str:
    """A UTF-8 text file's content; one-line errors for a missing file or other bytes."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p} is a folder: give a UTF-8 text file, one sentence a line")
    if not p.is_file():
        raise ValueError(f"{flag} {p} does not exist")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                         "convert it (iconv -t utf-8)") from None


# --------------------------------------------------------------------------------------------------------------------
# decoder flags
# --------------------------------------------------------------------------------------------------------------------
def format_paths(paths: Sequence[Sequence[int]]) -> str:
    """The command-line form of rank paths, the inverse of :func:`rvqspec_lib.decoding.trees.parse_paths`:
    ``((0,), (1,), (0, 0))`` -> ``"0;1;0,0"``."""
    return ";".join(",".join(str(int(r)) for r in p) for p in paths)


#: ``--tree`` default, formatted from the one constant :data:`rvqspec_lib.decoding.decoders.DEFAULT_TREE`.
DEFAULT_TREE_TEXT = format_paths(DEFAULT_TREE)
WINDOW_HELP = (f"chain window N ({CHAIN_WINDOWS[0]}..{MAX_WINDOW}, default {DEFAULT_WINDOW}): committed code + N-1 "
               "drafts")
TREE_HELP = f"tree rank paths: ';' between paths, ',' between ranks (default {DEFAULT_TREE_TEXT})"


DECODER_HELP = ("inner-loop decoder, one of: ar | chain[:N] | tree[:PATHS] | tree:calibrated[-point-mass|-sampled]:N "
                "| auto | paper[:N] | ssd-lossy[:BETA] (LOSSY control). paper = the paper's decoder: the offsets "
                "drafter shipped beside the model + ITS calibrated point-mass tree of N nodes (default 32, "
                "<model>/trees/offsets.json); add @DRAFTER to draft with another shipped drafter and use its own "
                "calibrated trees (e.g. tree:calibrated-point-mass:16@offsets); auto: the fastest on this device "
                "among AR, chains and the calibrated trees, timed once and cached")


def decoder_name_from_flags(decoder: str | None, window: int | None = None, tree: str | None = None, *,
                            without=("chain:best",)):
    """``--decoder`` (with the older ``--window`` / ``--tree`` companions) as ONE name of the grammar
    (:mod:`rvqspec_lib.decoding.decoder_names`): ``--decoder chain --window 6`` is ``chain:6``, ``--decoder tree --tree
    calibrated:16`` is ``tree:calibrated:16``. Returns a :class:`~rvqspec_lib.decoding.decoder_names.DecoderName`.

    ``without``: forms the command does not take, left out of an unknown name's list (default ``chain:best``,
    which only eval-wer chooses).

    Raises:
        ValueError: a flag the chosen decoder does not use, any bad name, window, budget or path (one line).
    """
    from rvqspec_lib.decoding.decoder_names import grammar, parse_decoder_name

    text = "ar" if decoder is None else decoder.strip()
    if not text:
        raise ValueError(f"--decoder is empty: give one of {grammar(without)}")
    if window is not None and text.startswith("chain:"):
        raise ValueError(f"--window {window} and --decoder {text} both give the window: write chain:{window}, or "
                         "drop --window")
    if window is not None and text != "chain":
        raise ValueError("--window is for --decoder chain; drop it or add --decoder chain (or write chain:N)")
    if tree is not None and text != "tree":
        raise ValueError("--tree is for --decoder tree; drop it or add --decoder tree (or write tree:PATHS)")
    if window is not None:
        text = f"chain:{window}"
    elif tree is not None:
        text = f"tree:{tree.strip()}"
    return parse_decoder_name(text, without=without)


def check_decoder_files(name, model: str, *, n_codes: int | None = None,
                        codebook_size: int | None = None) -> str | None:
    """Before loading: the files a decoder name reads beside the model exist and are sound: its drafter
    (``@DRAFTER``, ``paper``: ``<model>/drafters/<drafter>.safetensors``) and, for calibrated trees, ``paper`` and
    ``auto``, that drafter's calibration ``<model>/trees/<drafter>.json`` (shape checked, and against the model's
    sizes when given).

    Returns a one-line note when the tree used has fewer nodes than the name asks for (``paper`` without ``:N``
    capped to the largest calibrated budget below 32), else ``None``.

    Raises:
        ValueError, FileNotFoundError: one line naming the file and the fix (the recalibrate command).
    """
    from rvqspec_lib.models.drafter_files import check_shipped_drafter
    from rvqspec_lib.models.tree_files import load_calibration, recalibrate_command, tree_file

    if name.kind == "ar":
        return None
    check_shipped_drafter(model, name.drafter)
    if "calibration" not in name.needs:
        return None
    path = tree_file(model, name.drafter)
    what = f"--decoder {name.text}"
    if path is None:
        raise ValueError(f"{what} needs calibrated trees, and {model} has no folder to hold them: use a checkpoint "
                         "folder or the embedded model, or give --tree rank paths")
    if not path.is_file():
        raise FileNotFoundError(f"{what}: no calibrated trees at {path}: calibrate them with "
                                f"`{recalibrate_command(model, name.drafter)}`, or give --tree rank paths")
    cal = load_calibration(path, n_codes=n_codes, codebook_size=codebook_size, model=model, drafter=name.drafter)
    if name.kind in ("calibrated", "paper"):
        try:
            tree = name.calibrated_tree(cal)
        except ValueError as e:
            raise ValueError(f"{what}: {e} ({path})") from None
        used = len(tree.paths) + 1
        if used < name.budget:
            return (f"{name.text}: the {name.drafter} calibration ({path}) holds budgets up to {max(cal['budgets'])}; "
                    f"using N {used} (recalibrate: {recalibrate_command(model, name.drafter)})")
    return None


def build_decoder(name, lm, *, progress: bool = False, backends: dict | None = None):
    """The decoder object of a parsed name, once the model is loaded: the drafter loaded from the model's folder
    (``lm.folder``), the calibrated tree read from that drafter's calibration, ``auto`` chosen by timing (or from its
    cache).

    Returns ``(decoder, drafter, note)``: ``drafter`` is the module the decoder drafts with (``None``: the reused
    heads; the decoder carries it too); ``note`` says what ``auto`` chose and why (a cached choice says so), else
    ``None``. With ``backends`` (``{name: verify backend}``, e.g. the official module and the native forward),
    ``auto`` chooses the backend too and the result is ``(decoder, drafter, note, backend name)`` (a decoder other
    than ``auto``: the first backend's name).

    Raises:
        ValueError, FileNotFoundError: a calibration that does not fit the model, no calibration contexts.
    """
    from rvqspec_lib.models.drafter_files import shipped_drafter
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    cp = lm.code_predictor
    drafter = None if name.drafter == "heads" or name.kind == "ar" else shipped_drafter(lm, name.drafter, cp)
    cal = None
    if "calibration" in name.needs:
        path = tree_file(lm, name.drafter)
        if path is None:
            raise ValueError(f"--decoder {name.text} needs calibrated trees, and {lm.name} has no folder to hold them")
        cal = load_calibration(path, n_codes=lm.n_code_groups - 1, codebook_size=lm.codebook_size, model=lm.name,
                               drafter=name.drafter)
    if name.kind != "auto":
        dec = name.decoder(calibration=cal, drafter=drafter)
        return (dec, drafter, None) if backends is None else (dec, drafter, None, next(iter(backends)))
    from dataclasses import replace

    from rvqspec_lib.eval.budget import auto_decoder
    from rvqspec_lib.data.frame_sources import frames_from_shipped

    try:
        contexts = frames_from_shipped(lm, "calibration", max_frames=64).context
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"--decoder auto times decoders on the model's calibration frames, and there are none "
                         f"({str(e).splitlines()[0]}): choose a decoder instead") from None
    extra = {"backends": backends} if backends else {}
    choice = auto_decoder(lm.name, cp, cal, contexts, drafter=drafter, drafter_name=name.drafter, progress=progress,
                          **extra)
    dec = choice.decoder
    if drafter is not None and hasattr(dec, "drafter"):
        dec = replace(dec, drafter=drafter)
    if backends is None:
        return dec, drafter, f"--decoder auto chose {choice.reason}"
    return dec, drafter, f"--decoder auto chose {choice.reason}", choice.backend or next(iter(backends))


def check_tree_ranks(decoders, codebook_size: int) -> None:
    """Raises ValueError (one line) when a tree drafts a rank the codebook does not have (ranks 0..size-1)."""
    for d in decoders:
        paths = getattr(d, "paths", None)
        if not paths:
            continue
        top = max(max(p) for p in paths)
        if top >= codebook_size:
            what = f"decoder {d.text!r}" if isinstance(getattr(d, "text", None), str) else "--tree"
            raise ValueError(f"{what}: tree rank {top} is out of range for this model's codebook of "
                             f"{codebook_size} codes: "
                             f"use ranks 0..{codebook_size - 1}")
