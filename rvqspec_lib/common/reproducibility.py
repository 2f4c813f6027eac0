"""Which outputs of ``make paper`` are timings, and a comparison of two runs that ignores exactly those.

Two runs of the notebooks at one seed, on one machine and with the same parameters (``THREADS`` included), must
write the same numbers everywhere except in timings: wall-clock measurements, what is computed from them (speedups,
ratios of times, real-time factors, bandwidth floors), choices made from them (``--decoder auto``, a "best" row
picked by speed) and how many timing rounds a noise target asked for. This module is the one list of those
(docs/reproducibility.md#what-must-be-identical-between-two-runs-at-one-seed says it in words):

* :data:`TIMING_NOTEBOOKS`: the notebooks that time (``01``, ``03``, ``05``; the Makefile's ``TIMING_NB``). The
  others (``00``, ``02``, ``04``) hold no timing but the ones listed here (their run times);
* :data:`TIMING_COLUMNS`: per table (the CSV's file name without ``.csv``), the columns that are timings, as
  :mod:`fnmatch` patterns (some column names carry a model's name); :data:`ALL` marks a table whose rows
  themselves are picked by timings;
* :data:`TIMING_JSON_KEYS`: keys of result JSON files whose values are timings or records of the run (the
  ``provenance`` record: when, where, the load), skipped at any depth; :data:`TIMING_JSON_FILES`: the timing
  notebooks' JSON files that mix timings into everything (their tables are compared instead).

Everything else must be identical, byte for byte as written: a table not listed here has no timing column.

Public functions:

* :func:`timing_columns` -- the timing columns of one table;
* :func:`compare_tables` / :func:`compare_json` / :func:`compare_safetensors` -- the differences between two CSV /
  JSON / safetensors files, timings and run records left out;
* :func:`compare_runs` -- every table, result JSON and ``.safetensors`` file of two output folders;
* :func:`main` -- the command line: ``python -m rvqspec_lib.common.reproducibility RUN_A RUN_B [--notebooks 00,04]
  [--figures]`` (exit 1 and one line per difference when the runs differ).

Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import sys
from pathlib import Path
from typing import Iterable

#: the notebooks that measure time (each runs alone in `make paper`: the Makefile's TIMING_NB)
TIMING_NOTEBOOKS = ("01", "03", "05")
#: marks a table whose every column may differ between runs (its rows are chosen by timings)
ALL = ("*",)

_LOOP_SHARE = ("ms_per_frame", "p10_ms", "p90_ms", "model_ms", "heads_ms", "outside_ms", "outside_share",
               "outside_forward_share")
_FRAME_TIMES = (*_LOOP_SHARE, "speedup_vs_ar", "speedup_vs_fused")
_CALL_TIMES = ("median_ms", "p10_ms", "p90_ms", "ratio_to_q1")

#: Per table stem: the columns that are timings or computed from timings (fnmatch patterns). A table that is not
#: listed has none: every column must be identical between two runs at one seed.
TIMING_COLUMNS: dict[str, tuple[str, ...]] = {
    # 02: how long each epoch took
    "02_training_curves": ("wall_s",),
    # 01: call latencies, the DRAM floor (measured bandwidth), the companions' timed frames
    "01_latency": ("median_ms", "p10_ms", "p90_ms", "min_ms", "ratio_to_1", "n"),
    "01_floor": ("t1_ms", "t*_over_t1", "floor_ms", "t1_over_floor"),
    "01_models_compared": ("t_talker_ms", "t_inner_ms", "frame_ms_ar", "rtf_ar", "inner_share_ar", "t(*)/t(1)"),
    # 03: verify costs, frame times, batches, the bench table, auto's choice, projections from measured costs
    "03_verify_cost": _CALL_TIMES,
    "03_verify_cost_compare_model": _CALL_TIMES,
    "03_speed": _FRAME_TIMES,
    "03_loop_share_compare_model": _LOOP_SHARE,
    "03_batches": ("ms_per_batch", "p10_ms", "p90_ms", "frames_per_s", "speedup_vs_ar"),
    "03_projection_compare_model": ("t(N)/t(1) (measured)", "projected_speedup"),
    "03_paper_devices": ALL,  # this machine's rows: the fastest N measured here
    "03_auto": ALL,  # the shortlist and the choice come from measured verify costs and frame times
    "03_bench_table": ALL,  # "best speculative" is the fastest one; OVERSUBSCRIBED notes
    # 05: frame times per backend, verify costs, export times, the bench table
    "05_frame_times": _FRAME_TIMES,
    "05_paper_frame_times": _FRAME_TIMES,
    "05_verify_cost": _CALL_TIMES,
    "05_summary": ALL,  # the best decoder per backend is the fastest one
    "05_speedup_vs_n": ("*measured*", "*PROJECTION*"),
    "05_exported_graphs": ("export_s",),
    "05_paper_export": ("export_s",),
    "05_bench_table": ALL,
    "05_coreml_calls": ALL,  # Core ML call times (macOS only)
    # make paper's own record of how long each notebook took
    "paper_run": ALL,
}

#: Keys of result JSON files (``NN_metrics.json``, ``02_acceptance.json``, drafters' and trees' ``.json``) skipped at
#: any depth: the provenance record (when, where, the machine's load) and run times.
TIMING_JSON_KEYS = frozenset({"provenance", "created_utc", "wall_s", "timings_s", "elapsed_s"})
#: Result JSON files of the timing notebooks that mix timings into every part (their numbers are in the tables
#: above, compared there): not compared as JSON. (``05_metrics.json`` is WER parity's since the renumbering: it
#: holds no timing but its ``wall_s``, and is compared.)
TIMING_JSON_FILES = frozenset({"01_bench.json", "01_metrics.json", "03_metrics.json", "03_bench_table.json",
                               "05_bench_table.json"})

SIDECAR_SUFFIX = ".provenance.json"


def timing_columns(table: str, columns: Iterable[str]) -> list[str]:
    """The timing columns among ``columns`` of the table ``table``.

    Args:
        table: the table's stem (``"03_speed"``) or a path to its CSV (the stem is taken).
        columns: the table's header.
    Returns:
        The columns matching the table's :data:`TIMING_COLUMNS` patterns, in header order (every column for a table
        marked :data:`ALL`; none for a table not listed).
    """
    stem = Path(str(table)).name.removesuffix(".csv")
    patterns = TIMING_COLUMNS.get(stem, ())
    return [c for c in columns if any(fnmatch.fnmatchcase(c, p) for p in patterns)]


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def compare_tables(a: str | Path, b: str | Path) -> list[str]:
    """Differences between two CSV files of one table, its timing columns left out.

    Cells are compared as the text written (byte for byte: ``0.1`` and ``0.10`` differ).

    Args:
        a, b: the two CSV files (their names give the table, see :func:`timing_columns`).
    Returns:
        One line per difference (header, row count, first differing cell per column), empty when identical.
    """
    a, b = Path(a), Path(b)
    name = a.name
    ca, ra = _read_csv(a)
    cb, rb = _read_csv(b)
    if ca != cb:
        return [f"{name}: columns differ: {ca} vs {cb}"]
    skip = set(timing_columns(name, ca))
    if len(ra) != len(rb):
        return [f"{name}: {len(ra)} rows vs {len(rb)}"]
    out = []
    for j, col in enumerate(ca):
        if col in skip:
            continue
        for i, (x, y) in enumerate(zip(ra, rb)):
            vx, vy = (x[j] if j < len(x) else None), (y[j] if j < len(y) else None)
            if vx != vy:
                out.append(f"{name}: column {col!r} differs first in row {i + 1}: {vx!r} vs {vy!r}")
                break
    return out


def _relative(x, root: tuple[str, ...] | None):
    """A string naming a path inside the run folder (``root``: its spellings, as given and resolved), as
    ``<run>/...``: two runs write into two folders."""
    if root and isinstance(x, str):
        for r in root:
            if x == r or x.startswith(r + "/"):
                return "<run>" + x[len(r):]
    return x


def _json_diff(x, y, where: str, out: list[str], limit: int = 5, roots: tuple = (None, None)) -> None:
    if len(out) >= limit:
        return
    x, y = _relative(x, roots[0]), _relative(y, roots[1])
    if isinstance(x, dict) and isinstance(y, dict):
        keys = [k for k in dict.fromkeys([*x, *y]) if k not in TIMING_JSON_KEYS]
        for k in keys:
            if k not in x or k not in y:
                out.append(f"{where}.{k}: only in {'the first' if k in x else 'the second'}")
            else:
                _json_diff(x[k], y[k], f"{where}.{k}", out, limit, roots)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            out.append(f"{where}: {len(x)} items vs {len(y)}")
            return
        for i, (u, v) in enumerate(zip(x, y)):
            _json_diff(u, v, f"{where}[{i}]", out, limit, roots)
    elif type(x) is not type(y) or (x != y and not (x != x and y != y)):  # NaN == NaN here: JSON writes both the same
        out.append(f"{where}: {x!r} vs {y!r}"[:300])


def compare_json(a: str | Path, b: str | Path, *, roots: tuple[str | Path, str | Path] | None = None) -> list[str]:
    """Differences between two result JSON files, the keys of :data:`TIMING_JSON_KEYS` left out at any depth.

    Args:
        a, b: the two files.
        roots: the two runs' folders: a string naming a path inside its run's folder is compared relative to it
            (``02_metrics.json`` names the drafters it wrote by their paths).
    Returns:
        One line per difference (at most five per file: the first ones), empty when identical.
    """
    a, b = Path(a), Path(b)
    out: list[str] = []
    r = tuple(tuple(dict.fromkeys((str(Path(x).absolute()), str(Path(x).resolve())))) for x in roots) if roots \
        else (None, None)
    _json_diff(json.loads(a.read_text()), json.loads(b.read_text()), a.name, out, roots=r)
    return out


def _safetensors_parts(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (JSON; its ``__metadata__`` values that hold JSON parsed) and its data bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = {}
    for k, v in (header.pop("__metadata__", None) or {}).items():
        try:
            meta[k] = json.loads(v)
        except (TypeError, ValueError):
            meta[k] = v
    header["__metadata__"] = meta
    return header, raw[8 + n:]


def compare_safetensors(a: str | Path, b: str | Path) -> list[str]:
    """Differences between two safetensors files (a drafter's weights): the tensors' bytes, names, dtypes and
    shapes, and the header's metadata with :data:`TIMING_JSON_KEYS` left out (a drafter's file embeds its
    provenance record, whose time differs from run to run).

    Returns:
        One line per difference, empty when the weights and the description agree.
    """
    a, b = Path(a), Path(b)
    (ha, da), (hb, db) = _safetensors_parts(a), _safetensors_parts(b)
    out: list[str] = []
    _json_diff(ha, hb, a.name, out)
    if da != db:
        out.append(f"{a.name}: the tensors' bytes differ")
    return out


def _outputs(folder: Path, figures: bool) -> dict[str, Path]:
    """The comparable outputs of a run folder by relative path: ``*.csv``, result ``*.json`` (not the provenance
    sidecars, not :data:`TIMING_JSON_FILES`) and ``*.safetensors``, and with ``figures`` the ``*.png`` / ``*.pdf``
    of the notebooks that do not time, in the folder and its result subfolders (``02_drafters/``, ``02_trees/``);
    the work folders of rendered audio (``*_work``) and hidden files (make's stamps) are left out."""
    found = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file() or any(part.endswith("_work") or part.startswith(".") for part in rel.parts):
            continue
        if p.suffix in (".csv", ".safetensors") or (p.suffix == ".json" and not p.name.endswith(SIDECAR_SUFFIX)
                                                     and p.name not in TIMING_JSON_FILES) or \
                (figures and p.suffix in (".png", ".pdf") and not rel.parts[0].startswith(TIMING_NOTEBOOKS)):
            found[str(rel)] = p
    return found


def compare_runs(a: str | Path, b: str | Path, *, notebooks: Iterable[str] | None = None,
                 figures: bool = False) -> list[str]:
    """Every difference between two runs' output folders that is not a timing.

    Args:
        a, b: two output folders (``out_dir`` of the notebooks, e.g. two ``make paper SMOKE=1 FIG_DIR=...``).
        notebooks: only outputs whose names start with these numbers (``("00", "04")``); ``None``: all.
        figures: also compare the figures (``.png``, ``.pdf``) of the notebooks that do not time, byte for byte
            (their files carry no date: :func:`rvqspec_lib.common.provenance.save_figure`).
    Returns:
        One line per difference, empty when the runs agree: files present in one folder only, CSV cells
        (:func:`compare_tables`), JSON values (:func:`compare_json`, paths inside each run's folder taken relative
        to it), weights (:func:`compare_safetensors`), figure bytes.
    Raises:
        FileNotFoundError: a folder does not exist.
    """
    a, b = Path(a), Path(b)
    for d in (a, b):
        if not d.is_dir():
            raise FileNotFoundError(f"no run folder at {d}: pass the out_dir of a notebook run")
    fa, fb = _outputs(a, figures), _outputs(b, figures)
    if notebooks is not None:
        prefixes = tuple(str(n) for n in notebooks)
        fa = {k: v for k, v in fa.items() if k.startswith(prefixes)}
        fb = {k: v for k, v in fb.items() if k.startswith(prefixes)}
    out = [f"{k}: only in {a if k in fa else b}" for k in sorted(set(fa) ^ set(fb))]
    for k in sorted(set(fa) & set(fb)):
        pa, pb = fa[k], fb[k]
        if pa.suffix == ".csv":
            out += compare_tables(pa, pb)
        elif pa.suffix == ".json":
            out += compare_json(pa, pb, roots=(a, b))
        elif pa.suffix == ".safetensors":
            out += compare_safetensors(pa, pb)
        elif pa.read_bytes() != pb.read_bytes():
            out.append(f"{k}: the bytes differ")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m rvqspec_lib.common.reproducibility RUN_A RUN_B [--notebooks 00,04] [--figures]``: exit 0 when the
    runs agree outside timings, else 1 with one line per difference."""
    ap = argparse.ArgumentParser(prog="python -m rvqspec_lib.common.reproducibility",
                                 description="compare two runs' outputs, timings left out (docs/reproducibility.md)")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--notebooks", default="", help="comma-separated notebook numbers (default: every output)")
    ap.add_argument("--figures", action="store_true", help="also compare the figures of the notebooks that do not time")
    args = ap.parse_args(argv)
    nbs = [n.strip() for n in args.notebooks.split(",") if n.strip()] or None
    diffs = compare_runs(args.run_a, args.run_b, notebooks=nbs, figures=args.figures)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s) outside timings" if diffs else "identical outside timings")
    return 1 if diffs else 0


__all__ = ["TIMING_NOTEBOOKS", "ALL", "TIMING_COLUMNS", "TIMING_JSON_KEYS", "TIMING_JSON_FILES", "timing_columns",
           "compare_tables", "compare_json", "compare_safetensors", "compare_runs", "main"]


if __name__ == "__main__":
    sys.exit(main())
