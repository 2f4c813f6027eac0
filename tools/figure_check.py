"""``make check-figures``: a results folder passes when every provenance record in it names one git revision R, none
is dirty, and the tracked sources are unchanged between R and ``HEAD``; else one line per problem
(docs/reproducibility.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools import results_doc
from rvqspec_lib.common.paths import REPO_ROOT
from rvqspec_lib.common.provenance import SOURCE_PATHS, git_output

SIDECAR_SUFFIX = ".provenance.json"
#: the fix every failing check names
REGENERATE = "regenerate every figure with one `make paper` on a clean checkout and commit figures/"


@dataclass(frozen=True)
class Record:
    """One result's provenance: ``name`` (path in the folder, sidecar suffix dropped), ``revision``, ``dirty``,
    ``changed_sources``, ``error`` when unreadable, and the ``files`` a sidecar describes (relative to the folder)."""

    name: str
    revision: str | None
    dirty: bool | None
    changed_sources: tuple[str, ...] | None
    error: str | None = None
    files: tuple[str, ...] = ()


def _git_record(path: Path) -> tuple[dict | None | str, tuple[str, ...]]:
    """``(the git object of a provenance file, the files its sidecar lists)``; ``None`` when the JSON carries no
    provenance; a message when damaged."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"unreadable ({type(e).__name__})", ()
    if not isinstance(data, dict):
        return (None if not path.name.endswith(SIDECAR_SUFFIX) else "not a JSON object"), ()
    files = tuple(str(f) for f in data.get("files", []) if isinstance(f, str)) \
        if path.name.endswith(SIDECAR_SUFFIX) else ()
    if not path.name.endswith(SIDECAR_SUFFIX):
        data = data.get("provenance")
        if not isinstance(data, dict) or "git" not in data:
            return None, ()
    git = data.get("git")
    return (git if isinstance(git, dict) else "no git record"), files


def read_records(fig_dir: str | os.PathLike) -> list[Record]:
    """A :class:`Record` per ``*.provenance.json`` and per ``*.json`` with a ``provenance.git`` under ``fig_dir``
    (hidden files skipped), sorted by name. Raises FileNotFoundError: ``fig_dir`` is not a folder."""
    root = Path(fig_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{fig_dir} is not a folder")
    out = []
    for p in sorted(root.rglob("*.json")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue  # temporary files of a writer (.<name>.<random>.part.json), stamps
        name = rel.as_posix().removesuffix(SIDECAR_SUFFIX)
        git, files = _git_record(p)
        if git is None:
            continue
        if isinstance(git, str):
            out.append(Record(name, None, None, None, error=git))
            continue
        changed = git.get("changed_sources")
        where = rel.parent.as_posix()
        out.append(Record(name, git.get("revision") or None, git.get("dirty"),
                          tuple(changed) if isinstance(changed, list) else None,
                          files=tuple(f if where == "." else f"{where}/{f}" for f in files)))
    return out


@dataclass
class Report:
    """What :func:`check_figures` found: a line per problem, its kind in ``kinds`` (empty, damaged, stale, behind,
    changed, unknown, missing, results: docs/reproducibility.md#make-check-figures); ``ok``: no line."""

    fig_dir: str
    head: str | None
    records: list[Record]
    lines: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lines

    @property
    def revisions(self) -> dict[str | None, list[Record]]:
        groups: dict[str | None, list[Record]] = {}
        for r in self.records:
            if r.error is None:
                groups.setdefault(r.revision, []).append(r)
        return groups

    def add(self, kind: str, line: str) -> None:
        self.kinds.append(kind)
        self.lines.append(line)


_short = lambda rev: rev[:7] if rev else "no revision"  # noqa: E731


def _changed_between(rev: str, root) -> list[str] | None:
    """Source files that differ between ``rev`` and ``HEAD`` (committed content), ``None`` when ``rev`` is unknown."""
    if git_output("cat-file", "-e", f"{rev}^{{commit}}", root=root) is None:
        return None
    out = git_output("diff", "--name-only", rev, "HEAD", "--", *SOURCE_PATHS, root=root)
    return None if out is None else sorted(ln for ln in out.splitlines() if ln)


def _commit_time(rev: str | None, root) -> int:
    out = git_output("show", "-s", "--format=%ct", rev, root=root) if rev else None
    return int(out.strip()) if out and out.strip().isdigit() else 1 << 62


def _check_files(rep: Report, folder: Path, label: str, notebooks: bool, base: Path) -> None:
    """The ``missing`` lines: listed files that are gone and (``notebooks``) paper notebooks without executed copy."""
    for r in rep.records:
        gone = [f for f in r.files if not (folder / f).is_file()]
        if gone:
            rep.add("missing", f"{label}{r.name}: its record lists files that are gone: {', '.join(gone)}")
    if not notebooks:
        return
    have = {r.name for r in rep.records}
    for src in sorted((base / "notebooks").glob("[0-9][0-9]_*.py")):
        if f"notebooks/{src.stem}" not in have or not (folder / "notebooks" / f"{src.stem}.ipynb").is_file():
            rep.add("missing", f"{label}notebooks/{src.stem}.ipynb: no executed copy of notebooks/{src.name} "
                               "with its record")


def check_figures(fig_dir: str | os.PathLike = "figures", root: str | os.PathLike | None = None, *,
                  notebooks: bool | None = None, results=None) -> Report:
    """The :class:`Report` of whether a results folder (relative to the repository ``root``) is one clean run of the
    code at ``HEAD``. ``notebooks``: require executed copies of the paper notebooks (default: for ``figures``);
    ``results``: ``(folder) -> [problem lines]`` (:func:`tools.results_doc.check`). Raises
    FileNotFoundError: ``fig_dir`` is not a folder."""
    base = Path(root) if root is not None else REPO_ROOT
    folder = Path(fig_dir) if Path(fig_dir).is_absolute() else base / fig_dir
    label = str(fig_dir).rstrip("/") + "/"
    head = git_output("rev-parse", "--verify", "-q", "HEAD", root=base)
    rep = Report(label, head.strip() if head else None, read_records(folder))
    if not rep.records:
        rep.add("empty", f"{label} holds no provenance files: run `make paper`")
        return rep
    for r in rep.records:
        if r.error:
            rep.add("damaged", f"{label}{r.name}: provenance {r.error}")
    _check_files(rep, folder, label, (folder.name == "figures" and folder.parent == base) if notebooks is None
                 else notebooks, base)
    for line in (results(folder) if results is not None else []):
        rep.add("results", line)
    groups = rep.revisions
    one = len(groups) == 1
    for rev in sorted(groups, key=lambda g: (_commit_time(g, base), str(g))):
        recs = groups[rev]
        dirty = [r for r in recs if r.dirty is not False]
        changed = _changed_between(rev, base) if rev else None
        if one and not dirty and changed == []:
            continue  # the one clean run, and the sources are those of HEAD
        what = f"{len(dirty)} dirty"
        named = sorted({s for r in dirty for s in (r.changed_sources or ())})
        if named:
            what += " in " + ", ".join(named)
        if not one or dirty or rev is None:
            rep.add("stale", f"{label} {len(recs)} results made at {_short(rev)} ({what}): "
                             + ", ".join(r.name for r in recs))
        if rev is None:
            continue
        if changed is None:
            rep.add("unknown", f"{label} revision {_short(rev)} is not in this clone's history (a shallow clone: "
                               "`git fetch --unshallow`), so its sources cannot be compared with HEAD")
        elif changed:
            if one and not dirty:
                rep.add("behind", f"{label} all {len(recs)} results made at {_short(rev)}, before the sources "
                                 "changed: " + ", ".join(r.name for r in recs))
            rep.add("changed", f"{label} sources changed between {_short(rev)} and HEAD {_short(rep.head)} "
                               f"({len(changed)}): " + ", ".join(changed))
    return rep


def suite_failures(rep: Report) -> list[str]:
    """The lines of :func:`check_figures` that fail the test suite: not one clean run (sources changed since are
    reported and pass while the library changes; docs/reproducibility.md)."""
    return [ln for ln, k in zip(rep.lines, rep.kinds) if k in ("empty", "damaged", "stale", "missing", "results")]


def main(argv: list[str] | None = None, *, root: str | os.PathLike | None = None, echo=None) -> int:
    """``scripts/check_figures.py [--figures DIR]``: print the lines and a verdict; exit 0 (one clean run of
    ``HEAD``), 1 (not) or 2 (no folder). ``echo`` receives every line instead of stdout/stderr."""
    out = echo or print
    err = echo or (lambda line: print(line, file=sys.stderr))
    ap = argparse.ArgumentParser(description="Check that the committed figures are one clean `make paper` run of "
                                             "the sources at HEAD (docs/reproducibility.md).")
    ap.add_argument("--figures", default="figures", help="results folder (default: figures, from the repository root)")
    args = ap.parse_args(argv)
    base = Path(root) if root is not None else REPO_ROOT
    own = (base / args.figures).resolve() == (base / "figures").resolve()
    try:  # the repository's own figures: its generated prose (docs/results.md, the README block) must match them
        rep = check_figures(args.figures, root=root,
                            results=(lambda folder: results_doc.check(folder, base)) if own else None)
    except FileNotFoundError as e:
        err(f"check-figures: {e}: pass --figures DIR, a folder `make paper` wrote")
        return 2
    for ln in rep.lines:
        out(ln)
    if rep.ok:
        out(f"check-figures: {rep.fig_dir} is one clean run of HEAD {_short(rep.head)} "
            f"({len(rep.records)} results): OK")
        return 0
    out(f"check-figures: FAIL, {len(rep.lines)} problems in {rep.fig_dir} ({len(rep.records)} results, "
        f"{len(rep.revisions)} revisions): {REGENERATE}")
    return 1
