"""Provenance of every result file (docs/style.md#results-and-provenance): which code, parameters and machine made
it, as a ``<stem>.provenance.json`` sidecar or a ``"provenance"`` key; hostname-free (results are committed). Every
writer here is all-or-nothing (:func:`rvqspec_lib.common.files.atomic_outputs`).
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Mapping

from rvqspec_lib.common.files import atomic_outputs, json_text, json_types, write_json_atomic, write_text_atomic
from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.common.paths import REPO_ROOT


#: The committed results folder and where smoke runs aimed at it go instead, relative to the repository root.
FIGURES_DIRNAME = "figures"
SMOKE_FIGURES_DIRNAME = "build/smoke_figures"


def resolve_out_dir(out_dir: str | os.PathLike, *, smoke: bool = False, root: str | os.PathLike | None = None) -> Path:
    """The output folder, created: relative paths from ``root`` (default :data:`~rvqspec_lib.common.paths.REPO_ROOT`)
    whatever the working directory; with ``smoke``, a folder in ``<root>/figures`` (through ``..`` or symlinks too)
    moves under ``<root>/build/smoke_figures``, said on stdout, so a smoke run never overwrites the committed results.
    Raises OSError: the folder cannot be created."""
    base = Path(root).expanduser().resolve() if root is not None else REPO_ROOT
    p = Path(out_dir).expanduser()
    if not p.is_absolute():
        p = base / p
    if smoke:
        figures = (base / FIGURES_DIRNAME).resolve()
        resolved = p.resolve()
        if resolved == figures or resolved.is_relative_to(figures):
            target = (base / SMOKE_FIGURES_DIRNAME / resolved.relative_to(figures)).resolve()
            print(f"smoke run: not writing into the committed {figures} (results of `make paper`); "
                  f"outputs go to {target}")
            p = target
    p.mkdir(parents=True, exist_ok=True)
    return p


#: The tracked sources a result is made from (git pathspecs), what ``dirty`` and ``make check-figures`` compare;
#: outputs, tests, docs and untracked files are not sources (docs/reproducibility.md).
SOURCE_PATHS = ("rvqspec_lib", "bench", "paper", "recipes", "tools", "notebooks", "scripts", "data", "Makefile",
                "requirements.txt", "pyproject.toml", "environment.yml")


def git_output(*args: str, root: str | os.PathLike | None = None) -> str | None:
    """The stdout of ``git <args>`` in ``root`` (default :data:`REPO_ROOT`); ``None`` if git is missing or fails."""
    try:
        out = subprocess.run(["git", *args], cwd=root if root is not None else REPO_ROOT, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def changed_sources(root: str | os.PathLike | None = None) -> list[str] | None:
    """Sorted tracked :data:`SOURCE_PATHS` files (both names of a rename) whose working-tree or staged content differs
    from ``HEAD``; ``None`` when git is unavailable or ``root`` is not a checkout with a commit."""
    if git_output("rev-parse", "--verify", "-q", "HEAD", root=root) is None:
        return None
    out = git_output("--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=no", "--",
                     *SOURCE_PATHS, root=root)
    if out is None:
        return None
    fields, names, i = out.split("\0"), set(), 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        names.add(entry[3:])
        if entry[0] in "RC":  # a rename or copy: the next field is its old name
            names.add(fields[i])
            i += 1
    return sorted(names)


def git_revision(root: str | os.PathLike | None = None) -> dict:
    """``{"revision": HEAD's sha or None, "dirty", "changed_sources"}`` (:func:`changed_sources`; ``None`` without
    git) of the sources a result is made from (older records lack ``changed_sources``: docs/reproducibility.md)."""
    rev = git_output("rev-parse", "--verify", "-q", "HEAD", root=root)
    changed = changed_sources(root) if rev else None
    return {"revision": rev.strip() if rev else None, "dirty": None if changed is None else bool(changed),
            "changed_sources": changed}


def hardware() -> dict:
    """Device summary, no hostname: CPU, cores, torch threads (only if torch is imported), load, accelerator."""
    torch = sys.modules.get("torch")
    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "accelerator": None,
        "platform": platform.platform(terse=True),
    }
    if torch is not None and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(0)
    return info


#: module -> distribution whose version a record carries
_VERSIONED = {"torch": "torch", "transformers": "transformers", "qwen_tts": "qwen-tts", "numpy": "numpy",
              "pandas": "pandas", "matplotlib": "matplotlib"}


def _versions() -> dict:
    """Versions of Python and the main packages: ``__version__`` if imported, else the installed distribution's (no
    import: qwen_tts alone takes seconds), ``None`` if not installed."""
    v = {"python": platform.python_version()}
    for mod, dist in _VERSIONED.items():
        m = sys.modules.get(mod)
        got = getattr(m, "__version__", None) if m is not None else None
        if got is None:
            try:
                got = version(dist)
            except PackageNotFoundError:  # a missing optional package is recorded as None, never an error
                got = None
        v[mod] = str(got) if got is not None else None
    return v


def provenance(params: Mapping[str, Any] | None = None, seed: int | None = None) -> dict:
    """Provenance record for a result: ``git``, ``created_utc``, ``params`` (JSON types), ``seed`` (``None``: nothing
    random drawn), ``hardware``, ``versions``, ``argv``. No hostname or user name."""
    return {
        "git": git_revision(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "params": json_types(dict(params or {})),
        "seed": seed,
        "hardware": hardware(),
        "versions": _versions(),
        "argv": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else [],
    }


def _sidecar_path(stem: Path) -> Path:
    return stem.with_name(stem.name + ".provenance.json")


def _sidecar_text(prov: Mapping, files: Iterable[Path]) -> str:
    """The sidecar's JSON: the record plus the names of the files it describes (final names, not temporary ones)."""
    record = dict(prov)
    record["files"] = [p.name for p in files]
    return json_text(record, indent=2) + "\n"


def _records(table) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) from a pandas DataFrame or a list of dicts (columns in first-seen order)."""
    if hasattr(table, "to_dict") and hasattr(table, "columns"):  # pandas DataFrame
        cols = [str(c) for c in table.columns]
        rows = [list(r) for r in table.itertuples(index=False, name=None)]
        return cols, rows
    recs = list(table)
    if not recs or not all(isinstance(r, Mapping) for r in recs):
        raise TypeError("save_table expects a pandas DataFrame or a non-empty list of dicts")
    cols: list[str] = []
    for r in recs:
        cols += [str(k) for k in r if str(k) not in cols]
    return cols, [[r.get(c) for c in cols] for r in recs]


def _fmt_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """GitHub-flavoured markdown table (no ``tabulate`` needed). Floats are shown with 4 significant digits."""
    head = "| " + " | ".join(_fmt_cell(c) for c in columns) + " |"
    sep = "|" + "|".join(" ---: " if rows and isinstance(rows[0][i], (int, float)) and not isinstance(rows[0][i], bool)
                         else " --- " for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(_fmt_cell(v) for v in r) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"


def save_table(table, path_stem: str | os.PathLike, prov: Mapping, *, caption: str | None = None) -> dict:
    """Write a DataFrame or non-empty list of dicts as ``<stem>.csv`` (full precision), ``<stem>.md`` (4 significant
    digits, ``caption`` first) and the sidecar. Returns ``{"csv", "md", "provenance"}`` paths. Raises TypeError:
    another ``table``; OSError."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    cols, rows = _records(table)
    csv_path, md_path = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".md")
    side = _sidecar_path(stem)
    with atomic_outputs([csv_path, md_path, side]) as (tmp_csv, tmp_md, tmp_side):
        with tmp_csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            w.writerows([["" if v is None else v for v in r] for r in rows])
        tmp_md.write_text((f"*{caption}*\n\n" if caption else "") + markdown_table(cols, rows))
        tmp_side.write_text(_sidecar_text({**prov, "caption": caption} if caption else prov, [csv_path, md_path]))
    return {"csv": csv_path, "md": md_path, "provenance": side}


def save_figure(fig, path_stem: str | os.PathLike, prov: Mapping) -> dict:
    """Write a matplotlib figure as ``<stem>.png`` and ``<stem>.pdf`` (no creation date: the same numbers give the
    same files) plus the sidecar. Returns ``{"png", "pdf", "provenance"}`` paths. Raises OSError."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, pdf = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")
    side = _sidecar_path(stem)
    with atomic_outputs([png, pdf, side]) as (tmp_png, tmp_pdf, tmp_side):
        fig.savefig(tmp_png, format="png", dpi=150, bbox_inches="tight", metadata={"Software": None})
        fig.savefig(tmp_pdf, format="pdf", bbox_inches="tight",
                    metadata={"CreationDate": None, "Creator": None, "Producer": None})
        tmp_side.write_text(_sidecar_text(prov, [png, pdf]))
    return {"png": png, "pdf": pdf, "provenance": side}


def save_audio(wav, sample_rate: int, path_stem: str | os.PathLike, prov: Mapping) -> Path:
    """Write ``(samples,)`` float audio (numpy or torch) as ``<stem>.wav`` (16-bit mono, limited to 0.95 of full scale,
    never amplified) plus the sidecar; returns the path. Raises ValueError: not one non-empty mono waveform,
    or a sample rate <= 0."""
    import numpy as np  # noqa: PLC0415 (numpy and soundfile: the audio writers only; provenance stays light)
    import soundfile as sf  # noqa: PLC0415

    x = np.asarray(wav.detach().cpu() if hasattr(wav, "detach") else wav, dtype=np.float32).reshape(-1) \
        if getattr(wav, "ndim", 1) <= 1 or min(getattr(wav, "shape", (1,))) == 1 else None
    if x is None or x.size == 0 or int(sample_rate) <= 0:
        raise ValueError("save_audio takes one non-empty mono waveform (samples,) and a sample rate > 0")
    top = float(np.abs(x).max())
    if top > 0.95:
        x = x * (0.95 / top)
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out, side = stem.with_name(stem.name + ".wav"), _sidecar_path(stem)
    with atomic_outputs([out, side]) as (tmp_wav, tmp_side):
        sf.write(str(tmp_wav), x, int(sample_rate), subtype="PCM_16", format="WAV")
        tmp_side.write_text(_sidecar_text(prov, [out]))
    return out


def save_notebook_record(notebook: str | os.PathLike, prov: Mapping) -> Path:
    """The sidecar of an executed notebook beside the figures (``NN_name.provenance.json``), written by ``make
    paper``'s last step, so that ``make check-figures`` tells a stale executed notebook like a stale figure."""
    nb = Path(notebook)
    side = _sidecar_path(nb.with_suffix(""))
    write_text_atomic(side, _sidecar_text(prov, [nb]))
    return side


def save_json(obj: Mapping, path: str | os.PathLike, prov: Mapping) -> Path:
    """Write a metrics dict as JSON (NaN/inf as ``null``) with ``prov`` under ``"provenance"``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(json_types(obj))
    record["provenance"] = json_types(prov)
    write_json_atomic(path, record, indent=2)  # whole or absent, even on Ctrl-C
    return path
