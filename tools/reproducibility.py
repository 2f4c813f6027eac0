"""Which outputs of ``make paper`` are timings (the one list of them), and a comparison of two runs that ignores
exactly those (docs/reproducibility.md#what-must-be-identical-between-two-runs-at-one-seed). Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
from pathlib import Path
from typing import Iterable

#: the notebooks that measure time (each runs alone in `make paper`: the Makefile's TIMING_NB)
TIMING_NOTEBOOKS = ("01", "04", "06", "07")
#: marks a table whose every column may differ between runs (its rows are chosen by timings)
ALL = ("*",)

_FRAME_TIMES = ("ms_per_frame", "p10_ms", "p90_ms", "model_ms", "heads_ms", "outside_ms", "outside_share",
                "speedup_vs_ar", "speedup_vs_fused")
_CALL_TIMES = ("median_ms", "p10_ms", "p90_ms", "ratio_to_q1")

#: Per table stem: the columns that are timings or computed from timings (fnmatch patterns). A table that is not
#: listed has none: every column must be identical between two runs at one seed.
TIMING_COLUMNS: dict[str, tuple[str, ...]] = {
    # 03 (drafters, not a timing notebook): how long each epoch took
    "03_training_curves": ("wall_s",),
    # 01: call latencies (official and native), the inner loop's share from them, the companions' timed calls
    "01_latency": ("median_ms", "p10_ms", "p90_ms", "min_ms", "ratio_to_1", "n"),
    "01_inner_share": ("t_talker_ms", "t_inner_ms", "frame_ms_ar", "rtf_ar", "inner_share_ar"),
    "01_models_compared": ("*t_talker_ms", "*t_inner_ms", "*frame_ms_ar", "*rtf_ar", "*inner_share_ar",
                           "*t(*)/t(1)"),  # the leading * also covers the native pair's native_... columns
    # 04: verify costs, frame times, projections from measured costs, the fastest AR and this machine's best N
    "04_verify_cost": _CALL_TIMES,
    "04_speed": _FRAME_TIMES,
    "04_projection_compare_model": ("cost_ratio", "projected_speedup"),
    "04_speedup_over_each_ar": ALL,  # which AR is fastest, and the fastest speculative runners, come from times
    "04_paper_devices": ALL,  # this machine's rows: the fastest N measured here
    # 06: export times, frame times and verify costs for Figure 4, the whole frame streamed (rows chosen by timings)
    "06_exported_graphs": ("export_s",),
    "06_frame_times": _FRAME_TIMES,
    "06_verify_cost": _CALL_TIMES,
    "06_speedup_vs_n": ("*measured*", "*PROJECTION*"),
    "06_paper_devices": ALL,
    "06_coreml_calls": ALL,  # Core ML call times (macOS only)
    "06_pipeline": ALL,  # the best speculative decoder is the fastest one; every part is a timing
    "06_pipeline_streams": ALL,
    "06_pipeline_concurrency": ALL,
    # 07: the call and the talker step against their floors, batches, auto's choice, the table to act on
    "07_floor": ("t1_ms", "t*_over_t1", "floor_ms", "t1_over_floor"),
    "07_talker": ("median_ms", "p10_ms", "p90_ms", "min_ms", "cpu_ms", "n", "floor_ms", "floor_kv_ms", "over_floor",
                  "over_floor_kv", "floor_cpu_ms", "cpu_over_floor", "cpu_over_floor_kv", "rel_se", "ratio_to_1"),
    "07_batches": ("ms_per_batch", "p10_ms", "p90_ms", "frames_per_s", "ms_per_frame", "speedup_vs_ar",
                   "speedup_vs_fused"),
    "07_auto": ALL,  # the shortlist and the choice come from measured verify costs and frame times
    "07_bench_table": ALL,  # "best speculative" is the fastest one; OVERSUBSCRIBED notes
    "07_round_costs": ALL,  # read off the table's fastest fused frames
    # make paper's own record of how long each notebook took
    "paper_run": ALL,
}

#: Keys of result JSON files (``NN_metrics.json``, ``03_acceptance.json``, drafters' and trees' ``.json``) skipped at
#: any depth: the provenance record (when, where, the machine's load) and run times.
TIMING_JSON_KEYS = frozenset({"provenance", "created_utc", "wall_s", "timings_s", "elapsed_s"})
#: Result JSON files of the timing notebooks that mix timings into every part (their numbers are in the tables
#: above, compared there): not compared as JSON.
TIMING_JSON_FILES = frozenset({"01_bench.json", "01_metrics.json", "04_metrics.json", "06_metrics.json",
                               "06_pipeline.json", "07_metrics.json", "07_bench_table.json"})

SIDECAR_SUFFIX = ".provenance.json"

#: On another CPU (``--across-cpus``; the rules: docs/reproducibility.md#on-another-cpu): the tables of notebook 05
#: whose numbers follow the decoders it samples, each with its rows' 95% interval columns (low, high), or a relative
#: tolerance where it states none (:data:`ALL`: any value). Every other value must be equal on every x86-64 CPU.
ACROSS_CPUS: dict[str, tuple[str, str] | float | tuple[str]] = {
    "05_wer_parity": ("ci95_low", "ci95_high"), "05_free_running": ("ci95_low", "ci95_high"),
    "05_table3": ("diff_ci_low", "diff_ci_high"), "05_verdicts": ("wer_ci_low", "wer_ci_high"),
    "05_transfer": ("ci_low", "ci_high"), "05_calibration": 0.05,
    "05_outliers": ALL,  # which utterances are outliers follows the words recognised
    "06_exported_graphs": 0.01,  # the exporter folds constants computed by the CPU's kernels: sizes move by bytes
}
ACROSS_REL = 0.10
#: columns that state an uncertainty themselves: they agree within a factor of two
ACROSS_SCALE = ("*mde*", "sentences_needed", "power*", "detectable*")
#: notebook 05's result JSON: its numbers are those of the tables above (None: compared there), its calibrated
#: trees' acceptance rates (probabilities) within 1e-6 (sums of floats in another order)
ACROSS_CPUS_JSON: dict[str, float | None] = {"05_metrics.json": None, "05_trees_heads.json": 1e-6}


def _num(v: str) -> float | None:
    return float(v) if isinstance(v, str) and v.strip() and v.replace(".", "", 1).replace("e-", "").replace(
        "e+", "").lstrip("-").isdigit() else None


def _agrees_across_cpus(rule, col: str, va: str, vb: str, rows: tuple[dict, dict]) -> bool:
    """Whether cell values ``va``/``vb`` of column ``col`` agree under an :data:`ACROSS_CPUS` ``rule``."""
    if rule == ALL:
        return True
    x, y = _num(va), _num(vb)
    if x is None or y is None or va.lower() in ("true", "false"):
        return va == vb  # words, flags, empty cells
    if "p_value" in col or col.endswith(("_p", "min_p_holm")):
        return (x < 0.05) == (y < 0.05)
    if any(fnmatch.fnmatchcase(col, c) for c in ACROSS_SCALE):
        return x == y or min(abs(x), abs(y)) * 2 >= max(abs(x), abs(y)) > 0
    tol = ACROSS_REL if not isinstance(rule, float) else rule
    tol = tol * max(abs(x), abs(y))
    if isinstance(rule, tuple):
        widths = [(_num(r.get(rule[1])) or 0.0) - (_num(r.get(rule[0])) or 0.0) for r in rows]
        tol = max(tol, max(widths) / 2)
    return abs(x - y) <= tol + 1e-12


def timing_columns(table: str, columns: Iterable[str]) -> list[str]:
    """The timing columns among the header ``columns`` of ``table`` (stem or CSV path), per :data:`TIMING_COLUMNS`."""
    stem = Path(str(table)).name.removesuffix(".csv")
    patterns = TIMING_COLUMNS.get(stem, ())
    return [c for c in columns if any(fnmatch.fnmatchcase(c, p) for p in patterns)]


def compare_tables(a: str | Path, b: str | Path, *, across_cpus: list[str] | None = None) -> list[str]:
    """A line per difference between two CSV files of one table (header, row count, first differing cell a column),
    its timing columns left out, cells compared as written (``0.1`` and ``0.10`` differ). ``across_cpus`` (a list):
    the table's cells are compared by its :data:`ACROSS_CPUS` rule, each difference the rule accepts appended there."""
    a, b = Path(a), Path(b)
    name = a.name
    (ca, *ra), (cb, *rb) = ([*csv.reader(p.open(newline=""))] or [[]] for p in (a, b))
    if ca != cb:
        return [f"{name}: columns differ: {ca} vs {cb}"]
    skip = set(timing_columns(name, ca))
    if skip == set(ca):  # every column a timing: which rows there are is chosen by timings too (auto's own row)
        return []
    rule = ACROSS_CPUS.get(name.removesuffix(".csv")) if across_cpus is not None else None
    if len(ra) != len(rb) and rule != ALL:
        return [f"{name}: {len(ra)} rows vs {len(rb)}"]
    out = []
    for j, col in enumerate(ca):
        if col in skip:
            continue
        for i, (x, y) in enumerate(zip(ra, rb)):
            vx, vy = (x[j] if j < len(x) else None), (y[j] if j < len(y) else None)
            if vx != vy and rule is not None and _agrees_across_cpus(rule, col, vx, vy, (dict(zip(ca, x)),
                                                                                        dict(zip(cb, y)))):
                across_cpus.append(f"{name}: column {col!r} row {i + 1}: {vx} vs {vy} (within the rule: {rule})")
            elif vx != vy:
                out.append(f"{name}: column {col!r} differs first in row {i + 1}: {vx!r} vs {vy!r}")
                break
    return out


def _relative(x, root: tuple[tuple[str, str], ...] | None):
    """A string naming a path inside the run folder or the checkout the run came from (``root``: ``(prefix,
    label)`` pairs, the run folder's spellings first) as ``<run>/...`` or ``<checkout>/...``: two clones compare
    equal."""
    if root and isinstance(x, str):
        for r, label in root:
            if x == r or x.startswith(r + "/"):
                return label + x[len(r):]
    return x


def _checkout_of(folder: Path) -> str | None:
    """The git checkout holding ``folder`` (the nearest parent with a ``.git``), or None."""
    return next((str(d) for d in [folder, *folder.parents] if (d / ".git").exists()), None)


def _json_diff(x, y, where: str, out: list[str], limit: int = 5, roots: tuple = (None, None), rel: float = 0):
    if len(out) >= limit:
        return
    x, y = _relative(x, roots[0]), _relative(y, roots[1])
    if isinstance(x, dict) and isinstance(y, dict):
        keys = [k for k in dict.fromkeys([*x, *y]) if k not in TIMING_JSON_KEYS]
        for k in keys:
            if k not in x or k not in y:
                out.append(f"{where}.{k}: only in {'the first' if k in x else 'the second'}")
            else:
                _json_diff(x[k], y[k], f"{where}.{k}", out, limit, roots, rel)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            out.append(f"{where}: {len(x)} items vs {len(y)}")
            return
        for i, (u, v) in enumerate(zip(x, y)):
            _json_diff(u, v, f"{where}[{i}]", out, limit, roots, rel)
    elif rel and type(x) is type(y) is float and abs(x - y) <= rel:
        return  # across CPUs (ACROSS_CPUS_JSON): floats within ``rel``
    elif type(x) is not type(y) or (x != y and not (x != x and y != y)):  # NaN == NaN here: JSON writes both the same
        out.append(f"{where}: {x!r} vs {y!r}"[:300])


def compare_json(a: str | Path, b: str | Path, *, roots: tuple[str | Path, str | Path] | None = None,
                 rel: float = 0) -> list[str]:
    """At most five differences between two result JSON files, :data:`TIMING_JSON_KEYS` left out at any depth; paths
    inside the runs' folders (``roots``) compared relative to them."""
    a, b = Path(a), Path(b)
    out: list[str] = []
    r = tuple(tuple((p, "<run>") for p in dict.fromkeys((str(Path(x).absolute()), str(Path(x).resolve())))) +
              tuple((c, "<checkout>") for c in [_checkout_of(Path(x).resolve())] if c) for x in roots) if roots \
        else (None, None)
    _json_diff(json.loads(a.read_text()), json.loads(b.read_text()), a.name, out, roots=r, rel=rel)
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
    """Differences between two safetensors files: tensors (bytes, names, dtypes, shapes) and the header's metadata
    without :data:`TIMING_JSON_KEYS`."""
    a, b = Path(a), Path(b)
    (ha, da), (hb, db) = _safetensors_parts(a), _safetensors_parts(b)
    out: list[str] = []
    _json_diff(ha, hb, a.name, out)
    if da != db:
        out.append(f"{a.name}: the tensors' bytes differ")
    return out


def _outputs(folder: Path, figures: bool) -> dict[str, Path]:
    """The comparable outputs of a run folder by relative path: tables, result JSON, safetensors and (``figures``)
    the non-timing notebooks' figures; work folders and hidden files left out."""
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
                 figures: bool = False, across_cpus: list[str] | None = None) -> list[str]:
    """Every difference between two runs' output folders that is not a timing (of the ``notebooks`` numbers only,
    when given). ``across_cpus`` (a list): the runs come from two CPUs; what :data:`ACROSS_CPUS` accepts is appended
    there instead. Raises FileNotFoundError: a folder does not exist."""
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
            out += compare_tables(pa, pb, across_cpus=across_cpus)
        elif across_cpus is not None and pa.name in ACROSS_CPUS_JSON and ACROSS_CPUS_JSON[pa.name] is None:
            continue
        elif pa.suffix == ".json" and across_cpus is not None and pa.name in ACROSS_CPUS_JSON:
            out += compare_json(pa, pb, roots=(a, b), rel=ACROSS_CPUS_JSON[pa.name])
        elif pa.suffix == ".json":
            out += compare_json(pa, pb, roots=(a, b))
        elif pa.suffix == ".safetensors":
            out += compare_safetensors(pa, pb)
        elif pa.read_bytes() != pb.read_bytes():
            if across_cpus is not None and any(t.startswith(k[:3]) for t in ACROSS_CPUS):
                across_cpus.append(f"{k}: the figure differs (drawn from the tables above)")
            else:
                out.append(f"{k}: the bytes differ")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.reproducibility RUN_A RUN_B [--notebooks 00,04] [--figures]``: exit 0 when the
    runs agree outside timings, else 1 with one line per difference."""
    ap = argparse.ArgumentParser(prog="python -m tools.reproducibility",
                                 description="compare two runs' outputs, timings left out (docs/reproducibility.md)")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--notebooks", default="", help="comma-separated notebook numbers (default: every output)")
    ap.add_argument("--figures", action="store_true", help="also compare the figures of the notebooks that do not time")
    ap.add_argument("--across-cpus", action="store_true", help="the runs come from two CPUs: the sampled tables of "
                    "notebook 05 agree within their stated intervals (ACROSS_CPUS), everything else must be equal")
    args = ap.parse_args(argv)
    nbs = [n.strip() for n in args.notebooks.split(",") if n.strip()] or None
    accepted: list[str] | None = [] if args.across_cpus else None
    diffs = compare_runs(args.run_a, args.run_b, notebooks=nbs, figures=args.figures, across_cpus=accepted)
    for line in accepted or []:
        print("expected on another CPU:", line)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s) outside timings" if diffs else "identical outside timings")
    return 1 if diffs else 0


__all__ = ["TIMING_NOTEBOOKS", "ALL", "TIMING_COLUMNS", "TIMING_JSON_KEYS", "TIMING_JSON_FILES", "ACROSS_CPUS",
           "timing_columns", "compare_tables", "compare_json", "compare_safetensors", "compare_runs", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
