"""A result's ``dirty`` flag reports changes to the tracked sources only (docs/reproducibility.md).

:func:`rvqspec_lib.common.provenance.git_revision` runs on a temporary git repository laid out like this one: a run's
own outputs (``figures/``, ``build/``),
the docs, the tests and untracked scratch change and the record stays clean;
an edit to a tracked library file, notebook, Makefile or the drafters and trees shipped beside the model (in the working tree or only staged, a deletion, a rename)
makes it dirty and names the files; reverting the edit, or committing it, makes it clean again (the negative controls:
the flag is not stuck either way).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rvqspec_lib.common.provenance import SOURCE_PATHS, changed_sources, git_revision

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    return subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    files = {"rvqspec_lib/common/a.py": "A = 1\n", "notebooks/00_x.py": "# %%\n", "scripts/s.py": "",
             "data/d.txt": "d\n", "data/embedded/model/drafters/offsets.json": "{}\n",
             "data/embedded/model/trees/heads.json": "{}\n", "data/embedded/model/trees/offsets.json": "{}\n",
             "Makefile": "all:\n", "requirements.txt": "torch\n", "docs/x.md": "doc\n",
             "tests/test_x.py": "", "figures/00_t.csv": "x\n1\n", "figures/00_t.provenance.json": "{}\n",
             "README.md": "r\n", ".gitignore": "build/\n"}
    for name, text in files.items():
        (r / name).parent.mkdir(parents=True, exist_ok=True)
        (r / name).write_text(text)
    git(r, "init", "-q")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "one")
    return r


def test_a_clean_checkout_names_head_and_is_clean(repo):
    assert git_revision(repo) == {"revision": git(repo, "rev-parse", "HEAD"), "dirty": False, "changed_sources": []}


def test_outputs_docs_tests_and_scratch_leave_it_clean(repo):
    (repo / "figures" / "00_t.csv").write_text("x\n2\n")  # a run rewrites its committed outputs
    (repo / "figures" / "01_new.png").write_bytes(b"png")  # and adds new ones
    (repo / "build" / "executed").mkdir(parents=True)
    (repo / "build" / "executed" / "00_x.ipynb").write_text("{}")
    (repo / "docs" / "x.md").write_text("edited\n")
    (repo / "tests" / "test_x.py").write_text("# edited\n")
    (repo / "rvqspec_lib" / "common" / "scratch.py").write_text("untracked\n")  # untracked scratch, even in sources
    (repo / "notes.txt").write_text("scratch\n")
    assert git(repo, "status", "--porcelain")  # the tree IS dirty in git's sense: the old rule said dirty
    assert git_revision(repo)["dirty"] is False and changed_sources(repo) == []


@pytest.mark.parametrize("path", ["rvqspec_lib/common/a.py", "notebooks/00_x.py", "Makefile", "data/d.txt",
                                  "requirements.txt", "scripts/s.py", "data/embedded/model/trees/offsets.json",
                                  # the shipped drafters and trees are inputs of the notebooks, never run outputs
                                  "data/embedded/model/trees/heads.json", "data/embedded/model/drafters/offsets.json"])
def test_a_tracked_source_edit_is_dirty_and_named(repo, path):
    (repo / "figures" / "00_t.csv").write_text("x\n2\n")  # outputs changing too do not hide it or get named
    (repo / path).write_text("edited\n")
    assert git_revision(repo) == {"revision": git(repo, "rev-parse", "HEAD"), "dirty": True,
                                  "changed_sources": [path]}
    git(repo, "checkout", "--", path)  # reverted: clean again
    assert git_revision(repo)["dirty"] is False


def test_staged_deleted_and_renamed_sources_count(repo):
    (repo / "rvqspec_lib" / "common" / "a.py").write_text("A = 2\n")
    git(repo, "add", "rvqspec_lib/common/a.py")  # staged only: the working tree equals the index
    assert changed_sources(repo) == ["rvqspec_lib/common/a.py"]
    git(repo, "commit", "-qm", "two")  # committed: the revision moves, and the sources equal it
    assert git_revision(repo) == {"revision": git(repo, "rev-parse", "HEAD"), "dirty": False, "changed_sources": []}
    (repo / "scripts" / "s.py").unlink()
    git(repo, "mv", "notebooks/00_x.py", "notebooks/00_y.py")
    assert changed_sources(repo) == ["notebooks/00_x.py", "notebooks/00_y.py", "scripts/s.py"]


def test_outside_a_checkout_nothing_is_claimed(tmp_path):
    assert git_revision(tmp_path) == {"revision": None, "dirty": None, "changed_sources": None}
    git(tmp_path, "init", "-q")  # a repository without a commit: no revision to name
    assert git_revision(tmp_path) == {"revision": None, "dirty": None, "changed_sources": None}


def test_the_source_list_is_the_documented_one():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "reproducibility.md").read_text()
    assert all(f"`{p}" in doc for p in SOURCE_PATHS), SOURCE_PATHS
    assert not {"figures", "build", "tests", "docs"} & set(SOURCE_PATHS)
