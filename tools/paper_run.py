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


def main(argv: list[str] | None = None) -> int:
    """The Makefile's last step of ``make paper``: exit 0, or 1 with one line when a stamp is missing."""
    ap = argparse.ArgumentParser(description="Print and record the run time of a finished `make paper`.")
    ap.add_argument("--fig-dir", required=True)
    ap.add_argument("--run-tag", required=True)
    ap.add_argument("--start-ns", required=True, help="when the make started (its RUN_ID, date +%%s%%N)")
    ap.add_argument("--params", default="", help="the papermill parameters of the run, kept in the provenance")
    ap.add_argument("stamps", nargs="+")
    args = ap.parse_args(argv)
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
