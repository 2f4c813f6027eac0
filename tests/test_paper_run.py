"""`make paper` under Ctrl-C, its run-time record, and the timing notebooks kept apart (docs/reproducibility.md).

The Makefile's own rules run in a temporary copy of the repository (the real Makefile, the real .venv linked) on two
tiny notebooks that save a table through ``save_table`` and need no torch: the second one holds still until the test
sends SIGINT to the whole make (as a terminal's Ctrl-C does); the first one's stamp must stand, the second must leave
no stamp, no table and no temporary file, and the next `make paper` must execute the second only. The record's
arithmetic is checked on hand-made stamps and executed notebooks, and the timing notebooks' order-only chain in make's
own database, with a negative control.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import makefile_repo

from tools import paper_run

REPO = Path(__file__).resolve().parent.parent

NOTEBOOK = '''# %% tags=["parameters"]
out_dir = "figures"
threads = 1

# %%
import os, pathlib, time
from rvqspec_lib.common.provenance import provenance, save_table
out = pathlib.Path(out_dir)
with open(out.parent / "executions.log", "a") as f:
    f.write("{name}\\n")
save_table([{{"x": 1}}], out / "{name}_early", provenance())
if os.environ.get("HOLD_NOTEBOOK") == "{name}":
    (out.parent / "{name}.held").write_text(str(os.getpid()))
    time.sleep(60)  # the test interrupts here
save_table([{{"x": 2}}], out / "{name}_late", provenance())
'''


def _copy(tmp_path: Path, names: list[str], template: str = NOTEBOOK) -> Path:
    r, _ = makefile_repo(tmp_path)
    jupytext = pytest.importorskip("jupytext")
    (r / "build").mkdir()
    for n in names:
        (r / "notebooks" / f"{n}.py").write_text(template.format(name=n, repo=r))
        # converted here, newer than the source, so make takes them as made (a jupytext process costs seconds)
        jupytext.write(jupytext.read(r / "notebooks" / f"{n}.py"), r / "build" / f"{n}.ipynb")
    return r


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env["PYTHONPATH"] = str(REPO)  # the notebooks and the record import this checkout's library
    return {**env, **extra}


def _make(r: Path, *args: str) -> list[str]:
    return [shutil.which("make"), "-C", str(r), "-o", "voices", "-o", ".venv/.installed", *args]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".part" in p.name)

# records when it started and ended (seconds since the epoch)
SPAN_NOTEBOOK = '''# %% tags=["parameters"]
out_dir = "figures"
threads = 1

# %%
import pathlib, time
t0 = time.time()
time.sleep(2.0)
pathlib.Path("{repo}/{name}.span").write_text(f"{{t0}} {{time.time()}}")
'''


def test_sigint_leaves_no_half_output_and_the_rerun_runs_only_what_it_stopped(tmp_path):
    r = _copy(tmp_path, ["90_first", "91_second"])
    # a full run's executed notebooks go beside the figures (committed); papermill's partial ones stay under build/
    fig, part = r / "figures", r / "build" / "executed" / "full-t1"
    exe = fig / "notebooks"
    proc = subprocess.Popen(_make(r, "paper"), env=_env(HOLD_NOTEBOOK="91_second"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # a pytest-xdist worker ignores SIGINT, and an ignored signal is inherited: give make
                            # the default handler a user's shell gives it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    held, stamp1 = r / "91_second.held", fig / ".90_first.done"
    try:  # (make paper runs the two side by side: wait for the first to end and the second to hold)
        deadline = time.monotonic() + 120
        while not (held.exists() and stamp1.exists()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held.exists() and stamp1.exists(), (proc.communicate(timeout=30)[0] if proc.poll() is not None
                                                   else "never held")
        before = (stamp1.read_text(), stamp1.stat().st_mtime_ns)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the signal goes to make's whole process group
        out = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if held.exists():  # the notebook's kernel runs in its own session: end it, by its id, if it outlived make
            try:
                os.kill(int(held.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    assert proc.returncode != 0, out
    # the first notebook's stamp stands untouched; the second has none, nor its late table, nor any temporary file
    assert (stamp1.read_text(), stamp1.stat().st_mtime_ns) == before
    assert not (fig / ".91_second.done").exists(), out
    assert not (fig / "91_second_late.csv").exists() and not (fig / "91_second_late.provenance.json").exists()
    assert (fig / "91_second_early.csv").read_text() == "x\n1\n"  # what it finished before Ctrl-C is whole
    assert _leftovers(fig) == [], _leftovers(fig)
    assert (exe / "90_first.ipynb").is_file() and not (exe / "91_second.ipynb").exists()  # no half notebook named final
    assert not (fig / "paper_run.md").exists()  # no run-time record of an unfinished run
    # the next make paper: only the second notebook executes
    res = subprocess.run(_make(r, "paper"), env=_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "executed now: 91_second" in res.stdout and "90_first (executed" in res.stdout, res.stdout
    # (the first make ran the two side by side, in either order; the second ran only the one it stopped)
    log = (r / "executions.log").read_text().split()
    assert sorted(log[:2]) == ["90_first", "91_second"] and log[2:] == ["91_second"], log
    assert (fig / ".91_second.done").is_file() and (fig / "91_second_late.csv").read_text() == "x\n2\n"
    assert (exe / "91_second.ipynb").is_file() and not (part / "91_second.partial.ipynb").exists()
    assert json.loads((exe / "91_second.provenance.json").read_text())["files"] == ["91_second.ipynb"]
    assert _leftovers(fig) == []
    # the record: printed at the end and written beside the figures, this make's notebook marked as run now
    assert "wall time" in res.stdout and "notebook times (papermill)" in res.stdout
    rows = (fig / "paper_run.csv").read_text().splitlines()
    assert rows[0].split(",")[:4] == ["notebook", "executed_now", "executed_utc", "papermill_s"]
    assert [x.split(",")[:2] for x in rows[1:]] == [["90_first", "False"], ["91_second", "True"], ["total", ""]]
    prov = json.loads((fig / "paper_run.provenance.json").read_text())
    assert prov["params"]["notebooks_executed_now"] == ["91_second"] and prov["params"]["run_tag"] == "full-t1"


# ---- the record's numbers ------------------------------------------------------------------------------------------
def _stamp(folder: Path, name: str, run_id: str, duration: float | None) -> Path:
    nb = folder / f"{name}.ipynb"
    meta = {"papermill": {"duration": duration}} if duration is not None else {}
    nb.write_text(json.dumps({"metadata": meta, "cells": []}))
    s = folder / f".{name}.done"
    s.write_text(f"{run_id} 2026-12-01T00:00:00Z {nb}\n")
    return s


def test_record_sums_papermill_durations_and_marks_what_ran(tmp_path):
    stamps = [_stamp(tmp_path, "00_a", "111", 12.5), _stamp(tmp_path, "01_b", "222", 30.0)]
    lines, paths = paper_run.write_record(tmp_path, "full-t1", 222, stamps, now_ns=222 + 45 * 10**9)
    assert lines[0].startswith("paper full-t1: wall time 0:45 for this make (1 of 2 notebooks executed now)")
    assert lines[1].split() == ["00_a", "0:12", "earlier", "(2026-12-01T00:00:00Z)"]  # round half to even
    assert lines[2].split() == ["01_b", "0:30", "now"] and lines[3].split()[:2] == ["total", "0:42"]
    rows = [ln.split(",") for ln in paths["csv"].read_text().splitlines()]
    assert [(x[0], x[3]) for x in rows] == [("notebook", "papermill_s"), ("00_a", "12.5"), ("01_b", "30.0"),
                                            ("total", "42.5")]
    caption = paths["md"].read_text().splitlines()[0]
    assert "executed 1 of 2 notebooks in 45 s of wall time" in caption
    # an executed notebook that is gone: its time and the total are unknown, not zero
    (tmp_path / "00_a.ipynb").unlink()
    lines, paths = paper_run.write_record(tmp_path, "full-t1", 222, stamps, now_ns=222 + 10**9)
    assert lines[1].split()[1] == "?" and lines[3].split()[1] == "?"
    assert "unknown" in paths["md"].read_text().splitlines()[0]


def test_no_notebook_ran_keeps_the_record(tmp_path):
    stamps = [_stamp(tmp_path, "00_a", "111", 1.0)]
    lines, paths = paper_run.write_record(tmp_path, "full-t1", 999, stamps, now_ns=1000)
    assert paths is None and "kept" in lines[-1] and not (tmp_path / "paper_run.csv").exists()
    # a make start that is not a number (`date +%s%N` where %N is unknown) leaves the wall time unknown, no error
    assert paper_run.write_record(tmp_path, "full-t1", "1700N", stamps)[0][0].startswith("paper full-t1: wall time ?")


def test_a_damaged_record_drops_the_unreadable_time_without_a_traceback(tmp_path):
    stamps = [_stamp(tmp_path, "00_a", "5", 12.0), _stamp(tmp_path, "01_b", "5", 30.0)]
    paper_run.write_record(tmp_path, "full-t1", 5, stamps, now_ns=5 + 10**9)
    csv = tmp_path / "paper_run.csv"
    csv.write_text(csv.read_text().replace(",30.0,", ",thirty,"))  # edited by hand
    assert paper_run.read_record(tmp_path)["notebooks"] == {"00_a": 12.0}


def _record(folder: Path, run_tag: str, times: dict[str, float], wall_s: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stamps = [_stamp(folder, n, "7", t) for n, t in times.items()]
    paper_run.write_record(folder, run_tag, 7, stamps, now_ns=7 + int(wall_s * 1e9))


def test_scheduled_wall_time_runs_others_side_by_side_then_the_timing_ones():
    # 00 and 02 start together; 03 takes the slot 02 frees (at 1 s), 05 the one 00 frees (at 10 s); then 01 and 04
    times = {"00_a": 10.0, "01_t": 3.0, "02_b": 1.0, "03_c": 20.0, "04_t": 4.0, "05_d": 5.0}
    assert paper_run.scheduled_wall_s(times, ["01", "04"], 2) == 21.0 + 7.0
    assert paper_run.scheduled_wall_s(times, ["01", "04"], 1) == sum(times.values())  # one at a time: the sum
    assert paper_run.scheduled_wall_s(times, [], 2) == 24.0  # negative control: none waits (03 after 01, 02)


def test_projection_names_its_inputs_or_says_why_there_is_none(tmp_path):
    ref = {"00_a": 10.0, "01_t": 4.0, "03_c": 20.0}
    _record(tmp_path / "figures", "full-t1", {n: 10 * t for n, t in ref.items()}, 300.0)
    _record(tmp_path / "build" / "smoke_figures", "smoke-t1", ref, 30.0)
    kw = dict(model_tag="ckpt", timing=["01"], jobs=2, root=tmp_path)
    fig = tmp_path / "figures" / "ckpt"
    # no smoke run of the model yet: the line names the command that gives a projection
    assert "make paper MODEL=... SMOKE=1" in paper_run.projection(fig, "full-ckpt-t1", **kw)
    # its smoke run, twice the shipped model's smoke times: each notebook x 10, then scheduled
    _record(tmp_path / "build" / "smoke_figures" / "ckpt", "smoke-ckpt-t1", {n: 2 * t for n, t in ref.items()}, 70)
    line = paper_run.projection(fig, "full-ckpt-t1", **kw)
    want = paper_run.scheduled_wall_s({"00_a": 200.0, "01_t": 80.0, "03_c": 400.0}, ["01"], 2)
    assert want == 480.0 and f"PROJECTED wall time about {paper_run._clock(want)} " in line
    assert "longest 03_c" in line and "not a measurement" in line
    # the folder's own record of the same kind wins; a record of another kind (smoke) is not read as one
    _record(fig, "full-ckpt-t1", {"00_a": 1.0}, 5000.0)
    assert "about 1:23:20" in paper_run.projection(fig, "full-ckpt-t1", **kw)
    assert "no projected wall time" in paper_run.projection(tmp_path / "build" / "smoke_figures" / "ckpt",
                                                            "smoke-ckpt-t2", **kw)
    # the shipped model's references missing: said, never a traceback
    (tmp_path / "figures" / "paper_run.csv").unlink()
    assert "no projected" in paper_run.projection(tmp_path / "figures" / "other", "full-other-t1",
                                                  **{**kw, "model_tag": "ckpt"})


def test_a_cpu_sized_checkpoint_run_is_projected_from_the_committed_cpu_reference(tmp_path):
    ref = {"00_a": 10.0, "01_t": 4.0, "03_c": 20.0}
    _record(tmp_path / "figures", "full-t1", {n: 10 * t for n, t in ref.items()}, 300.0)  # the shipped model: x10
    _record(tmp_path / "build" / "smoke_figures", "smoke-t1", ref, 30.0)
    _record(tmp_path / "build" / "smoke_figures" / "ckpt", "smoke-ckpt-t1", ref, 30.0)
    kw = dict(model_tag="ckpt", timing=["01"], jobs=2, root=tmp_path, cpu_sized=True)
    fig = tmp_path / "figures" / "ckpt"
    line = paper_run.projection(fig, "full-ckpt-t1", **kw)  # no reference committed: said, not the shipped ratios
    assert "no projected wall time" in line and str(paper_run.CPU_REFERENCE) in line
    _record(tmp_path / paper_run.CPU_REFERENCE, "full-ref-t1", {n: 3 * t for n, t in ref.items()}, 4000.0)
    line = paper_run.projection(fig, "full-ckpt-t1", **kw)
    rec = paper_run.read_record(tmp_path / paper_run.CPU_REFERENCE)
    assert "PROJECTED wall time about 1:06:40 " in line and "CPU sizes" in line and "not a measurement" in line
    assert f"on {rec['cpu']} with {rec['cores']} cores" in line and rec["cores"] and rec["cpu"]
    # the same smoke record without the CPU sizes: the shipped model's ratios (x10)
    want10 = paper_run.scheduled_wall_s({n: 10 * t for n, t in ref.items()}, ["01"], 2)
    assert f"about {paper_run._clock(want10)} " in paper_run.projection(fig, "full-ckpt-t1", **{**kw, "cpu_sized": False})
    assert not paper_run._cpu_sized("embedded", "") and not paper_run._cpu_sized("", "")
    assert not paper_run._cpu_sized("/no/such/folder", "") and not paper_run._cpu_sized("x", "0")


# ---- timing notebooks never overlap ----------------------------------------------------------------------------------
def _order_only(r: Path, *args: str) -> dict[str, list[str]]:
    """Each stamp's order-only prerequisites in make's database (``make -p``, nothing run)."""
    res = subprocess.run(_make(r, "-pq", "paper-run", *args), env=_env(), capture_output=True, text=True, timeout=60)
    out = {}
    for ln in res.stdout.splitlines():
        if ln.startswith("figures/.") and ".done:" in ln and "%" not in ln:
            target, _, prereq = ln.partition(":")
            out[Path(target).name] = [Path(p).name for p in prereq.partition("|")[2].split() if p != "voices"]
    return out


def test_timing_notebooks_are_chained_order_only(tmp_path):
    # the Makefile's timing notebooks are 01 04 06 07; here 06 is missing (a gap)
    r = _copy(tmp_path, ["00_x", "01_t", "02_y", "04_t", "05_z", "07_t"])
    others = [".00_x.done", ".02_y.done", ".05_z.done"]
    got = {k: sorted(v) for k, v in _order_only(r).items()}
    # every timing notebook after the previous one and after every notebook without timing (they run first, side
    # by side); those wait for nothing
    assert got == {".00_x.done": [], ".01_t.done": others, ".02_y.done": [], ".04_t.done": sorted(others + [".01_t.done"]),
                   ".05_z.done": [], ".07_t.done": sorted(others + [".04_t.done"])}
    # negative control: without timing notebooks nothing is ordered (the parse above can see no order, too)
    assert all(v == [] for v in _order_only(r, "TIMING_NB=").values())
    # a gap (no 04) chains 07 to 01; only timing notebooks: just the chain
    assert _order_only(r, "NB_SRC=notebooks/01_t.py notebooks/07_t.py")[".07_t.done"] == [".01_t.done"]
    assert _order_only(r, "NB_SRC=notebooks/01_t.py notebooks/07_t.py")[".01_t.done"] == []


def test_paper_runs_the_notebooks_side_by_side_and_the_timing_ones_alone(tmp_path):
    """Under `make paper` (-j2 by default) the notebooks without timing overlap and no timing notebook overlaps any
    other: each fake notebook records its start and end time; the intervals are compared."""
    r = _copy(tmp_path, ["00_x", "01_t", "02_y", "04_t"], template=SPAN_NOTEBOOK)
    res = subprocess.run(_make(r, "paper"), env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    span = {p.stem: tuple(map(float, p.read_text().split())) for p in r.glob("*.span")}
    assert sorted(span) == ["00_x", "01_t", "02_y", "04_t"]
    overlap = lambda a, b: min(span[a][1], span[b][1]) > max(span[a][0], span[b][0])
    assert overlap("00_x", "02_y")  # side by side (the negative control of the checks below: overlaps are seen)
    for t in ("01_t", "04_t"):
        assert not any(overlap(t, o) for o in span if o != t), (t, span)
