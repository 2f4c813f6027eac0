"""Smoke runs never touch ``figures/``; notebooks default to one thread; ``make paper`` runs what it says.

docs/style.md#results-and-provenance. The notebooks themselves are run in smoke mode with ``out_dir="figures"`` in
tests/test_notebooks.py (a temporary view of the repository); here: the rule itself
(:func:`rvqspec_lib.common.provenance.resolve_out_dir` with ``root`` pointed at a temporary folder), that every
notebook applies it and its thread default, and the Makefile's stamps, on a probe notebook that runs in seconds.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import makefile_repo

from rvqspec_lib.common.provenance import resolve_out_dir

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))


# ---- resolve_out_dir ----------------------------------------------------------------------------------------------
@pytest.fixture
def root(tmp_path):
    r = tmp_path / "repo"
    (r / "figures").mkdir(parents=True)
    (r / "figures" / "01_metrics.json").write_text("committed")
    return r


@pytest.mark.parametrize("asked, expected", [
    ("figures", "build/smoke_figures"),
    ("figures/", "build/smoke_figures"),
    ("figures/qwen3-tts-1.7b-random", "build/smoke_figures/qwen3-tts-1.7b-random"),
    ("figures/00_work", "build/smoke_figures/00_work"),
    ("build/../figures/x", "build/smoke_figures/x"),
    ("./figures", "build/smoke_figures"),
])
def test_smoke_run_aimed_at_figures_goes_to_build(root, asked, expected, capsys):
    before = sorted(p.name for p in (root / "figures").rglob("*"))
    got = resolve_out_dir(asked, smoke=True, root=root)
    assert got == (root / expected).resolve() and got.is_dir()
    assert sorted(p.name for p in (root / "figures").rglob("*")) == before  # nothing created under figures/
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "smoke run" in said and str(got) in said


def test_absolute_and_symlinked_paths_into_figures_are_redirected(root, tmp_path, capsys):
    assert resolve_out_dir(root / "figures" / "a", smoke=True, root=root) == (root / "build/smoke_figures/a").resolve()
    link = tmp_path / "link_to_figures"
    link.symlink_to(root / "figures", target_is_directory=True)
    assert resolve_out_dir(link / "b", smoke=True, root=root) == (root / "build/smoke_figures/b").resolve()
    assert not (root / "figures" / "a").exists() and not (root / "figures" / "b").exists()


@pytest.mark.parametrize("asked", ["build/smoke_figures", "figures_old", "elsewhere/figures"])
def test_smoke_run_elsewhere_is_left_alone(root, asked, capsys):
    assert resolve_out_dir(asked, smoke=True, root=root) == root / asked
    assert capsys.readouterr().out == ""


def test_full_run_writes_into_figures(root, capsys):
    # the negative control: without smoke the same call keeps figures/ (make paper refreshes the committed results)
    assert resolve_out_dir("figures", root=root) == root / "figures"
    assert resolve_out_dir("figures/x", smoke=False, root=root) == root / "figures" / "x"
    assert capsys.readouterr().out == ""


def test_default_root_is_the_repository(tmp_path):
    assert resolve_out_dir(tmp_path / "x") == tmp_path / "x"  # absolute paths kept
    assert resolve_out_dir(tmp_path / "y", smoke=True) == tmp_path / "y"


# ---- every notebook applies it, and one thread by default ---------------------------------------------------------
def _parameters_and_code(src: Path) -> tuple[dict, ast.Module]:
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(src)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), src.name
    params = {}
    for node in ast.parse(code[0].source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            params[node.targets[0].id] = ast.literal_eval(node.value)
    return params, ast.parse("\n".join(c.source for c in code[1:]))


@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_redirects_smoke_and_defaults_to_one_thread(src):
    params, tree = _parameters_and_code(src)
    assert params["threads"] == 1 and "smoke" in params and "out_dir" in params
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    outs = [c for c in calls if getattr(c.func, "id", None) == "resolve_out_dir"]
    assert outs, f"{src.name} never calls resolve_out_dir"
    for c in outs:  # every output folder: smoke passed on
        kw = {k.arg: k.value for k in c.keywords}
        assert isinstance(kw.get("smoke"), ast.Name) and kw["smoke"].id == "smoke", (src.name, ast.unparse(c))
    assert any(ast.unparse(c) == "resolve_out_dir(out_dir, smoke=smoke)" for c in outs), src.name
    sets = [ast.unparse(c) for c in calls if getattr(c.func, "attr", None) == "set_num_threads"]
    assert sets == ["torch.set_num_threads(int(threads))"], (src.name, sets)


# ---- make paper: stamps, parameters, and what it says it ran -------------------------------------------------------
PROBE = '''# %% tags=["parameters"]
smoke = False
threads = 1
out_dir = "figures"
model = ""

# %%
import json, pathlib
out = pathlib.Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
runs = out / "runs.jsonl"
with runs.open("a") as f:
    f.write(json.dumps({"smoke": smoke, "threads": threads, "model": model}) + "\\n")
'''


@pytest.fixture
def make_repo(tmp_path):
    """A folder with the real Makefile and apt script, the real .venv linked, and one probe notebook (no torch)."""
    r, make = makefile_repo(tmp_path)
    (r / "notebooks" / "90_probe.py").write_text(PROBE)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
        res = subprocess.run([make, "-C", str(r), "-o", ".venv/.installed", *args], capture_output=True, text=True,
                             timeout=300, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        return res

    return r, run


def _runs(folder: Path) -> list[dict]:
    f = folder / "runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def test_make_paper_runs_what_it_says(make_repo):
    r, run = make_repo
    smoke_dir = r / "build" / "smoke_figures"
    out = run("paper", "SMOKE=1").stdout
    assert "paper smoke-t1: executed now: 90_probe -> build/executed/smoke-t1/" in out, out
    assert _runs(smoke_dir) == [{"smoke": 1, "threads": 1, "model": ""}]
    assert (r / "build/executed/smoke-t1/90_probe.ipynb").is_file()
    # the same again: nothing runs, and it says so
    out = run("paper", "SMOKE=1").stdout
    assert "executed now: none" in out and "up to date, not run again" in out and "90_probe (executed" in out, out
    assert len(_runs(smoke_dir)) == 1
    # other threads: the smoke stamps of THREADS=1 are not taken for this run's; it runs, into smoke-t2
    out = run("paper", "SMOKE=1", "THREADS=2").stdout
    assert "paper smoke-t2: executed now: 90_probe -> build/executed/smoke-t2/" in out, out
    assert _runs(smoke_dir)[-1] == {"smoke": 1, "threads": 2, "model": ""}
    assert (r / "build/executed/smoke-t2/90_probe.ipynb").is_file()
    # and back: the folder now holds THREADS=2 outputs, so THREADS=1 runs again
    out = run("paper", "SMOKE=1").stdout
    assert "executed now: 90_probe" in out and _runs(smoke_dir)[-1]["threads"] == 1
    assert len(_runs(smoke_dir)) == 3
    assert not (r / "figures").exists()  # no smoke output ever went to figures/


def test_make_paper_smoke_refuses_figures(make_repo):
    r, _ = make_repo
    for fig in ("figures", "figures/x", str(r / "figures")):
        res = subprocess.run([shutil.which("make"), "-C", str(r), "-o", ".venv/.installed", "paper", "SMOKE=1",
                              f"FIG_DIR={fig}"], capture_output=True, text=True, timeout=60)
        assert res.returncode != 0 and "never into the committed figures/" in res.stderr, res.stderr
    assert not (r / "figures").exists()


def test_a_second_make_paper_refuses_while_one_holds_the_lock(make_repo):
    """Two `make paper` in one checkout: the second refuses with one line naming build/.paper.lock, before any
    notebook runs. The lock is held here with flock(2), as a running `make paper` holds it; released, the same command
    runs (the negative control)."""
    import fcntl

    r, run = make_repo
    if shutil.which("flock") is None:
        pytest.skip("no flock(1): the Makefile then takes no lock")
    (r / "build").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    with open(r / "build" / ".paper.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = subprocess.run([shutil.which("make"), "-C", str(r), "-o", ".venv/.installed", "paper", "SMOKE=1"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode != 0
        ours = [ln for ln in res.stderr.splitlines() if not ln.startswith("make")]  # make adds its own "***" line
        assert len(ours) == 1 and ours[0].startswith("paper: another make paper is running"), res.stderr
        assert "build/.paper.lock" in ours[0] and "wait for it" in ours[0]
        assert "papermill" not in res.stdout and not (r / "build" / "smoke_figures").exists(), res.stdout
    out = run("paper", "SMOKE=1").stdout  # lock released
    assert "paper smoke-t1: executed now: 90_probe" in out, out
    assert _runs(r / "build" / "smoke_figures") == [{"smoke": 1, "threads": 1, "model": ""}]
