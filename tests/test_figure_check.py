"""`make check-figures`: the committed figures are one clean run of the sources at HEAD (docs/reproducibility.md).

:func:`tools.figure_check.check_figures` runs on copies of the committed ``figures/`` (their provenance
files, with the git records rewritten) inside a temporary repository with three commits: A, then B (a library edit),
then C (a docs edit), then D (the drafters a regeneration deploys beside the model). A copy made at C, or at B (the sources did not change after it), passes; the negative controls
fail and say why: one record naming A (stale, with the library file changed since), a dirty record (naming its
changed file), a damaged one, an empty folder. Then the suite's rule on the committed tree: it reports while the
library moves on, and fails only when figures/ is not one clean run (it can fail: a copy mixing revisions).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools import figure_check as FC

REPO = Path(__file__).resolve().parent.parent
GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    return subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository with commits A (library v1), B (library v2), C (docs only), D (what a regeneration commits: the
    figures); returns (root, {name: sha})."""
    r = tmp_path_factory.mktemp("check") / "repo"
    (r / "rvqspec_lib").mkdir(parents=True)
    (r / "docs").mkdir()
    (r / "figures").mkdir()
    git(r, "init", "-q")
    shas = {}
    for name, path, text in (("A", "rvqspec_lib/lib.py", "v = 1\n"), ("B", "rvqspec_lib/lib.py", "v = 2\n"),
                             ("C", "docs/notes.md", "notes\n"),
                             ("D", "figures/00_t.csv", "x\n1\n")):
        (r / path).write_text(text)
        git(r, "add", "-A")
        git(r, "commit", "-qm", name)
        shas[name] = git(r, "rev-parse", "HEAD")
    return r, shas


def _copy_figures(dest: Path, revision: str) -> Path:
    """The committed figures' provenance files (sidecars and JSON with provenance) copied, made at ``revision``."""
    for src in sorted((REPO / "figures").rglob("*.json")):
        data = json.loads(src.read_text())
        prov = data if src.name.endswith(FC.SIDECAR_SUFFIX) else data.get("provenance")
        if not isinstance(prov, dict) or "git" not in prov:
            continue
        prov["git"] = {"revision": revision, "dirty": False, "changed_sources": []}
        out = dest / src.relative_to(REPO / "figures")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data))
        for f in data.get("files", []) if src.name.endswith(FC.SIDECAR_SUFFIX) else []:
            (out.parent / f).write_text("stand-in\n")  # the files a record lists (their content is not checked)
    return dest


def _set_git(folder: Path, name: str, **git_record) -> None:
    p = folder / name
    data = json.loads(p.read_text())
    (data if name.endswith(FC.SIDECAR_SUFFIX) else data["provenance"])["git"] = git_record
    p.write_text(json.dumps(data))


def test_a_consistent_copy_passes(repo, tmp_path):
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["C"])
    rep = FC.check_figures(fig, root=root)  # HEAD is D: only docs and the run's own outputs changed since C
    assert rep.ok and rep.lines == [] and len(rep.records) >= 50 and list(rep.revisions) == [shas["C"]]
    assert any("/" in r.name for r in rep.records)  # records in a subfolder (figures/02_drafters/) are checked too
    # made at B: only docs changed since, so the sources equal HEAD's, and it passes
    assert FC.check_figures(_copy_figures(tmp_path / "at_b", shas["B"]), root=root).ok


def test_one_older_revision_fails_and_is_named(repo, tmp_path):
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["C"])
    _set_git(fig, "04_trees.provenance.json", revision=shas["A"], dirty=False, changed_sources=[])
    rep = FC.check_figures(fig, root=root)
    assert not rep.ok
    old = [ln for ln in rep.lines if f"made at {shas['A'][:7]}" in ln]
    assert len(old) == 1 and old[0].endswith("(0 dirty): 04_trees"), rep.lines
    assert f"sources changed between {shas['A'][:7]} and HEAD {shas['D'][:7]} (1): rvqspec_lib/lib.py" \
        in " ".join(rep.lines)
    assert FC.suite_failures(rep)  # a folder mixing revisions fails the suite, too
    out = []
    assert FC.main(["--figures", str(fig)], root=root, echo=out.append) == 1
    assert out[-1].startswith("check-figures: FAIL") and "2 revisions" in out[-1] and out[:-1] == rep.lines


def test_a_dirty_record_fails_naming_its_changed_file(repo, tmp_path):
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["C"])
    _set_git(fig, "00_metrics.json", revision=shas["C"], dirty=True, changed_sources=["notebooks/00_x.py"])
    rep = FC.check_figures(fig, root=root)
    assert not rep.ok and rep.kinds == ["stale"]
    assert "(1 dirty in notebooks/00_x.py)" in rep.lines[0] and "00_metrics.json" in rep.lines[0]
    assert FC.suite_failures(rep) == rep.lines


def test_damaged_and_empty_folders_fail(repo, tmp_path):
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["C"])
    (fig / "01_latency.provenance.json").write_text('{"git": ')
    rep = FC.check_figures(fig, root=root)
    assert rep.kinds == ["damaged"] and "01_latency: provenance unreadable" in rep.lines[0]
    (tmp_path / "empty").mkdir()
    rep = FC.check_figures(tmp_path / "empty", root=root)
    assert rep.kinds == ["empty"] and FC.suite_failures(rep) == rep.lines
    out = []
    assert FC.main(["--figures", str(tmp_path / "missing")], root=root, echo=out.append) == 2
    assert len(out) == 1 and "is not a folder" in out[0]


def test_one_clean_run_behind_the_library_fails_the_check_but_not_the_suite(repo, tmp_path):
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["A"])  # one clean run, then the library changed (B)
    rep = FC.check_figures(fig, root=root)
    assert rep.kinds == ["behind", "changed"] and "rvqspec_lib/lib.py" in rep.lines[1]
    assert FC.suite_failures(rep) == []  # the suite reports it while the library is being changed


def test_the_committed_figures(capsys):
    """The suite's rule on the committed tree: figures/ must be one clean run (the sources may move on)."""
    rep = FC.check_figures("figures")
    with capsys.disabled():
        print(f"\ncheck-figures on the committed figures/: {'OK' if rep.ok else 'FAIL'} "
              f"({len(rep.lines)} problems, {len(rep.revisions)} revisions)")
    assert FC.suite_failures(rep) == [], "\n".join(FC.suite_failures(rep))


def test_make_check_figures_runs_the_script():
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    r = subprocess.run([make, "-n", "-C", str(REPO), "check-figures"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and "scripts/check_figures.py --figures figures" in r.stdout, r.stdout + r.stderr


def test_a_missing_listed_file_fails(repo, tmp_path):
    """Negative control: a record whose file is gone (a deleted audio example or figure) is listed as missing."""
    root, shas = repo
    fig = _copy_figures(tmp_path / "figures", shas["C"])
    (fig / "audio").mkdir(exist_ok=True)
    (fig / "audio" / "00_example.wav").write_text("RIFF")
    (fig / "audio" / "00_example.provenance.json").write_text(json.dumps(
        {"git": {"revision": shas["C"], "dirty": False, "changed_sources": []}, "files": ["00_example.wav"]}))
    assert FC.check_figures(fig, root=root).ok
    (fig / "audio" / "00_example.wav").unlink()
    rep = FC.check_figures(fig, root=root)
    assert not rep.ok and rep.kinds == ["missing"] and "audio/00_example: its record lists files that are gone: " \
        "audio/00_example.wav" in rep.lines[0]
    assert FC.suite_failures(rep) == rep.lines


def test_executed_notebooks_are_checked_like_figures(repo, tmp_path):
    """Every paper notebook needs its executed copy and record; a changed notebook makes them stale (negative
    controls: one missing, one notebook edited after the run)."""
    root, shas = repo
    (root / "notebooks").mkdir(exist_ok=True)
    (root / "notebooks" / "00_a.py").write_text("x = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "notebook")
    run = git(root, "rev-parse", "HEAD")
    fig = _copy_figures(tmp_path / "figures", run)
    rep = FC.check_figures(fig, root=root, notebooks=True)
    assert rep.kinds == ["missing"] and "notebooks/00_a.ipynb: no executed copy" in rep.lines[0]
    (fig / "notebooks").mkdir(exist_ok=True)
    (fig / "notebooks" / "00_a.ipynb").write_text("{}")
    (fig / "notebooks" / "00_a.provenance.json").write_text(json.dumps(
        {"git": {"revision": run, "dirty": False, "changed_sources": []}, "files": ["00_a.ipynb"]}))
    assert FC.check_figures(fig, root=root, notebooks=True).ok
    (root / "notebooks" / "00_a.py").write_text("x = 2\n")  # the notebook changed after the run
    git(root, "add", "-A")
    git(root, "commit", "-qm", "notebook edited")
    rep = FC.check_figures(fig, root=root, notebooks=True)
    assert not rep.ok and "changed" in rep.kinds and any("notebooks/00_a.py" in ln for ln in rep.lines)
