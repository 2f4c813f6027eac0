"""The run-time record of ``make paper`` (its last step): the run's wall time and each notebook's papermill duration,
found through the folder's ``.NN_name.done`` stamps, printed and written beside the figures (docs/reproducibility.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tools import results_doc
from rvqspec_lib.common.paths import REPO_ROOT
from rvqspec_lib.common.provenance import provenance, save_notebook_record, save_table

#: the record's file stem in the figures folder
RECORD_STEM = "paper_run"


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def notebook_times(stamps: list[str | os.PathLike], run_id: str) -> list[dict]:
    """A row per stamp (``<run id> <UTC time> <executed notebook>``, as the Makefile writes it): ``{"notebook",
    "executed_now", "executed_utc", "papermill_s" (``None``: unknown), "executed_notebook"}``. Raises
    FileNotFoundError: a stamp is missing."""
    rows = []
    for s in map(Path, stamps):
        name = s.name.removeprefix(".").removesuffix(".done")
        fields = s.read_text().split()
        rid, when, nb = (fields + ["", "", ""])[:3]
        duration = None
        try:
            meta = json.loads(Path(nb).read_text()).get("metadata", {}).get("papermill", {})
            duration = float(meta["duration"]) if meta.get("duration") is not None else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        rows.append({"notebook": name, "executed_now": rid == run_id, "executed_utc": when,
                     "papermill_s": duration, "executed_notebook": nb})
    return rows


def write_record(fig_dir: str | os.PathLike, run_tag: str, start_ns: int | str, stamps: list[str | os.PathLike],
                 *, now_ns: int | None = None, params: dict | None = None) -> tuple[list[str], dict | None]:
    """Summarise a finished ``make paper`` started at ``start_ns`` (its ``RUN_ID``; not a number: wall time unknown)
    and, when it executed a notebook, write the record (a row per notebook and a ``total`` row). Returns ``(lines to
    print, save_table's paths or None when no notebook ran: the previous record kept)``. Raises FileNotFoundError: a
    stamp is missing; OSError."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    wall = (now_ns - int(start_ns)) / 1e9 if str(start_ns).isdigit() else None
    rows = notebook_times(stamps, str(start_ns))
    ran = [r for r in rows if r["executed_now"]]
    known = [r["papermill_s"] for r in rows if r["papermill_s"] is not None]
    total = sum(known) if len(known) == len(rows) else None
    width = max([len(r["notebook"]) for r in rows] + [5])
    lines = [f"paper {run_tag}: wall time {_clock(wall)} for this make ({len(ran)} of {len(rows)} notebooks "
             "executed now); notebook times (papermill):"]
    for r in rows:
        how = "now" if r["executed_now"] else f"earlier ({r['executed_utc']})"
        lines.append(f"  {r['notebook']:<{width}}  {_clock(r['papermill_s']):>8}  {how}")
    lines.append(f"  {'total':<{width}}  {_clock(total):>8}  (the notebooks' durations summed)")
    if not ran:
        lines.append(f"  no notebook ran: {Path(fig_dir) / RECORD_STEM}.md kept from the run that made it")
        return lines, None
    table = [dict(r) for r in rows]
    table.append({"notebook": "total", "executed_now": None, "executed_utc": None, "papermill_s": total,
                  "executed_notebook": None})
    took = f"{wall:.0f} s" if wall is not None else "an unknown time"
    caption = (f"make paper {run_tag}: this make executed {len(ran)} of {len(rows)} notebooks in {took} of "
               f"wall time; papermill_s is each notebook's duration, the total row their sum"
               f"{'' if total is not None else ' (unknown: an executed notebook is missing)'}; {os.cpu_count()} cores")
    prov = provenance({**(params or {}), "run_tag": run_tag, "wall_s": wall, "notebooks_executed_now":
                       [r["notebook"] for r in ran], "total_papermill_s": total})
    paths = save_table(table, Path(fig_dir) / RECORD_STEM, prov, caption=caption)
    lines.append(f"  -> {paths['md']}")
    for r in ran:  # the executed notebooks kept beside the figures (a full run) get their provenance record
        nb = Path(r["executed_notebook"] or "")
        if nb.is_file() and Path(fig_dir).resolve() in nb.resolve().parents:
            save_notebook_record(nb, provenance({**(params or {}), "notebook": r["notebook"]}))
    if Path(fig_dir).resolve() == (REPO_ROOT / "figures").resolve():  # the committed figures: their prose too
        lines += [f"  -> {p}" for p in results_doc.write(fig_dir, REPO_ROOT)]
    return lines, paths


def read_record(fig_dir: str | os.PathLike) -> dict | None:
    """The run-time record a finished ``make paper`` left in ``fig_dir`` (:func:`write_record`), or ``None`` where
    there is none or it cannot be read: ``{"fig_dir", "run_tag", "wall_s" (None: unknown), "created_utc",
    "revision", "cpu", "cores", "notebooks": {name: papermill seconds}}`` (notebooks whose time is unknown left
    out)."""
    base = Path(fig_dir) / RECORD_STEM
    try:
        prov = json.loads(base.with_suffix(".provenance.json").read_text())
        lines = base.with_suffix(".csv").read_text().splitlines()
    except (OSError, ValueError):
        return None
    header = lines[0].split(",") if lines else []
    if "notebook" not in header or "papermill_s" not in header:
        return None
    i, j = header.index("notebook"), header.index("papermill_s")
    times = {}
    for ln in lines[1:]:
        f = ln.split(",")
        if len(f) > max(i, j) and f[i] != "total" and f[j]:
            try:
                times[f[i]] = float(f[j])
            except ValueError:  # a damaged or hand-edited record: no usable time for that notebook
                continue
    params = prov.get("params", {})
    hw = prov.get("hardware") or {}
    return {"fig_dir": str(fig_dir), "run_tag": params.get("run_tag"), "wall_s": params.get("wall_s"),
            "created_utc": prov.get("created_utc"), "revision": (prov.get("git") or {}).get("revision"),
            "cpu": hw.get("cpu"), "cores": hw.get("cpu_count"), "notebooks": times}


def scheduled_wall_s(times: dict[str, float], timing: list[str], jobs: int) -> float:
    """The wall time of ``make paper``'s schedule for notebook durations ``times`` (s): the notebooks whose number is
    not in ``timing`` first, ``jobs`` at a time (in name order, each to the slot that frees first, as make hands them
    out), then the timing notebooks one after another (the Makefile's TIMING_NB, PAPER_JOBS)."""
    slow = [t for n, t in times.items() if n.split("_")[0] in timing]
    slots = [0.0] * max(1, int(jobs))
    for _, t in sorted((n, t) for n, t in times.items() if n.split("_")[0] not in timing):
        slots[slots.index(min(slots))] += t
    return max(slots) + sum(slow)


#: the run-time record (``paper_run.*``, copied with its provenance) of a full run of the real-size 0.6B release
#: layout at the notebooks' CPU sizes on this project's build machine: the projection of such a run
#: (docs/reproducibility.md#how-long-a-run-took)
CPU_REFERENCE = Path("data") / "paper_runs" / "checkpoint-cpu"


def projection(fig_dir: str | os.PathLike, run_tag: str, *, model_tag: str = "", timing: list[str] = (),
               jobs: int = 2, root: str | os.PathLike = REPO_ROOT, cpu_sized: bool = False) -> str:
    """One line for the start of ``make paper``: its PROJECTED wall time if every notebook runs, and the inputs of
    the projection, or why there is none. In order: (1) this folder's last record of the same run tag (its wall
    time); (2) for a full run of another model, that model's smoke record (``build/smoke_figures/<model_tag>``) with
    each notebook scaled by its full/smoke ratio on the shipped model (``figures/`` against
    ``build/smoke_figures/``), put through :func:`scheduled_wall_s`; or, where the run takes the notebooks' CPU sizes
    (``cpu_sized``: a checkpoint on a machine with no GPU), the wall time of the committed reference run
    (:data:`CPU_REFERENCE`), its CPU named. Never raises on missing or odd records."""
    root = Path(root)
    tag = f"paper {run_tag}"
    own = read_record(fig_dir)
    if own and own["run_tag"] == run_tag and own["wall_s"]:
        return (f"{tag}: PROJECTED wall time about {_clock(own['wall_s'])} if every notebook runs: this folder's "
                f"last run of the same kind took that ({own['created_utc']}, revision {str(own['revision'])[:7]}); "
                "a projection, not a measurement")
    if not run_tag.startswith("full") or not model_tag:
        return f"{tag}: no projected wall time (this folder has no record of a run like it)"
    if cpu_sized:
        ref = read_record(root / CPU_REFERENCE)
        if not ref or not ref["wall_s"]:
            return f"{tag}: no projected wall time: the reference run at the CPU sizes ({CPU_REFERENCE}) is missing"
        return (f"{tag}: PROJECTED wall time about {_clock(ref['wall_s'])} if every notebook runs (the notebooks' "
                f"CPU sizes): the reference full run of the real-size 0.6B release layout at the CPU sizes took that "
                f"on {ref['cpu'] or 'an unnamed CPU'} with {ref['cores'] or '?'} cores ({ref['created_utc']}, "
                f"revision {str(ref['revision'])[:7]}; {CPU_REFERENCE}); this machine's speed is not accounted for: "
                "a projection, not a measurement")
    smoke = read_record(root / "build" / "smoke_figures" / model_tag)
    ref_full, ref_smoke = read_record(root / "figures"), read_record(root / "build" / "smoke_figures")
    if not smoke or not smoke["notebooks"]:
        return (f"{tag}: no projected wall time: `make paper MODEL=... SMOKE=1` with the same model first gives one "
                f"(its notebook times, scaled by the shipped model's full/smoke ratios)")
    if not ref_full or not ref_smoke:
        return (f"{tag}: no projected wall time: the shipped model's full and smoke run-time records "
                "(figures/paper_run.csv, build/smoke_figures/paper_run.csv from `make paper SMOKE=1`) are its inputs")
    scaled = {n: t * ref_full["notebooks"][n] / ref_smoke["notebooks"][n] for n, t in smoke["notebooks"].items()
              if ref_smoke["notebooks"].get(n) and n in ref_full["notebooks"]}
    if len(scaled) < len(smoke["notebooks"]):
        return f"{tag}: no projected wall time: the records do not name the same notebooks"
    wall = scheduled_wall_s(scaled, list(timing), jobs)
    worst = max(scaled, key=scaled.get)
    return (f"{tag}: PROJECTED wall time about {_clock(wall)} if every notebook runs (longest {worst}, about "
            f"{_clock(scaled[worst])}): inputs: this model's smoke run ({smoke['fig_dir']}, "
            f"{_clock(sum(smoke['notebooks'].values()))} of notebooks) with each notebook scaled by its full/smoke "
            f"ratio on the shipped model (figures/ and build/smoke_figures/), {jobs} notebooks side by side and the "
            f"timing notebooks {' '.join(timing) or '(none)'} alone; a projection, not a measurement")


def _cpu_sized(model: str, cpu_sizes: str) -> bool:
    """Whether a full run of ``model`` takes every notebook's CPU sizes (paper.checkpoint.takes_cpu_sizes's rule on a
    machine with no GPU: CPU_SIZES not off, :func:`~rvqspec_lib.models.loader.checkpoint_on_cpu`); False on any doubt
    and on a GPU, where notebooks 04, 06 and 07 still take theirs: no reference run projects that mix."""
    if not model or cpu_sizes.lower() in ("0", "false", "no"):
        return False
    try:
        from rvqspec_lib.models.loader import checkpoint_on_cpu
        return checkpoint_on_cpu(model)
    except Exception:  # a projection never stops make paper: no CPU sizes assumed
        return False


def main(argv: list[str] | None = None) -> int:
    """The Makefile's last step of ``make paper``: exit 0, or 1 with one line when a stamp is missing."""
    ap = argparse.ArgumentParser(description="Print and record the run time of a finished `make paper`.")
    ap.add_argument("--fig-dir", required=True)
    ap.add_argument("--run-tag", required=True)
    ap.add_argument("--start-ns", default="", help="when the make started (its RUN_ID, date +%%s%%N)")
    ap.add_argument("--params", default="", help="the papermill parameters of the run, kept in the provenance")
    ap.add_argument("--project", action="store_true",
                    help="print the run's projected wall time (the start of `make paper`) instead of its record")
    ap.add_argument("--model-tag", default="", help="with --project: the figures folder's name for MODEL")
    ap.add_argument("--timing", default="", help="with --project: the timing notebooks' numbers (TIMING_NB)")
    ap.add_argument("--jobs", type=int, default=2, help="with --project: notebooks side by side (PAPER_JOBS)")
    ap.add_argument("--model", default="", help="with --project: MODEL (a real-size checkpoint on a machine with no "
                    "GPU takes the CPU sizes, projected from their reference runs)")
    ap.add_argument("--cpu-sizes", default="", help="with --project: CPU_SIZES (0, false or no: the full sizes)")
    ap.add_argument("stamps", nargs="*")
    args = ap.parse_args(argv)
    if args.project:
        print(projection(args.fig_dir, args.run_tag, model_tag=args.model_tag, timing=args.timing.split(),
                         jobs=args.jobs, root=Path.cwd(), cpu_sized=_cpu_sized(args.model, args.cpu_sizes)))
        return 0
    if not args.stamps:
        ap.error("give the notebooks' stamps (or --project)")
    try:
        lines, _ = write_record(args.fig_dir, args.run_tag, args.start_ns, args.stamps,
                                params={"papermill": args.params} if args.params else None)
    except FileNotFoundError as e:
        print(f"paper: run-time record not written: {e.filename} is missing: run `make paper` again", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
