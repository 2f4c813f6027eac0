"""Provenance of every result file: which code, which parameters, which machine made it.

Every figure and table the project writes gets a sidecar ``<stem>.provenance.json`` (docs/style.md#results-and-provenance, "a good paper
companion"), so a number in the paper can be traced to a git revision, a seed and the hardware that measured it.
The record is hostname-free on purpose: result files are committed and shared.

Public functions:

* :func:`resolve_out_dir` -- where a result goes (a smoke run aimed at ``figures/`` goes to ``build/smoke_figures/``).
* :func:`provenance`   -- the record itself (a JSON-able dict).
* :func:`git_revision` -- its ``git`` part: the revision, and whether (and which) tracked sources differ from it
  (:data:`SOURCE_PATHS`, :func:`changed_sources`; docs/reproducibility.md).
* :func:`save_table`   -- a table as ``.csv`` + ``.md`` + sidecar.
* :func:`save_figure`  -- a matplotlib figure as ``.png`` + ``.pdf`` + sidecar.
* :func:`save_json`    -- a metrics dict as ``.json`` with the provenance embedded (read back by tests).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Mapping

from rvqspec_lib.common.files import atomic_outputs, usual_mode, write_text_atomic  # noqa: F401  (usual_mode)
from rvqspec_lib.common.machine import cpu_model  # noqa: F401 -- also offered here (eval imports it so)
from rvqspec_lib.common.paths import REPO_ROOT


#: The committed results folder (``make paper`` refreshes it) and where smoke runs aimed at it go instead, both
#: relative to the repository root (docs/style.md#results-and-provenance).
FIGURES_DIRNAME = "figures"
SMOKE_FIGURES_DIRNAME = "build/smoke_figures"


def resolve_out_dir(out_dir: str | os.PathLike, *, smoke: bool = False, root: str | os.PathLike | None = None) -> Path:
    """Resolve an output folder: absolute paths are kept, relative ones are taken from the repository root; a SMOKE
    run never writes into the committed ``figures/``.

    So ``"figures"`` means ``<repo>/figures`` whatever the working directory of the notebook kernel is (JupyterLab,
    papermill, nbconvert or ``make paper``). With ``smoke=True`` a folder that is ``<repo>/figures`` or lies inside
    it (relative or absolute, through ``..`` or symlinks) is replaced by the same place under
    ``<repo>/build/smoke_figures`` (``figures/x`` -> ``build/smoke_figures/x``), and one line on stdout says so:
    a smoke run's tiny-model numbers must never overwrite the committed results. The folder is created if missing.

    Args:
        out_dir: the folder asked for (a notebook's ``out_dir`` parameter, a script's ``--out``).
        smoke: the run is a smoke run (small parameters, a tiny model): redirect as above.
        root: the repository root the relative paths and ``figures/`` are taken from (default
            :data:`rvqspec_lib.common.paths.REPO_ROOT`; tests point it at a temporary folder).

    Returns:
        the absolute folder to write to (existing).

    Raises:
        OSError: the folder cannot be created (a file in the way, no permission).
    """
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


#: The tracked sources a result is made from, as git pathspecs relative to the repository root: the library, the
#: notebooks, the scripts, the shipped data, and the files that pin the environment and the run. This one list is what
#: ``dirty`` (:func:`git_revision`) and ``make check-figures`` (:mod:`rvqspec_lib.common.figure_check`) compare; a
#: run's own outputs (``figures/``, ``build/``), the tests, the docs and untracked scratch files are not sources
#: (docs/reproducibility.md).
SOURCE_PATHS = ("rvqspec_lib", "notebooks", "scripts", "data", "Makefile", "requirements.txt", "pyproject.toml",
                "environment.yml")
#: :data:`SOURCE_PATHS` as git pathspecs (``git status`` / ``git diff -- ...``). ``make paper`` writes nothing inside
#: them: the shipped drafters and trees beside the embedded model are sources the notebooks read (notebook 03
#: deploys, notebook 04 writes ``trees/heads.json``, only when asked: ``save_to_model`` / ``write_trees``).
SOURCE_PATHSPECS = SOURCE_PATHS


def git_output(*args: str, root: str | os.PathLike | None = None) -> str | None:
    """The raw stdout of ``git <args>`` run in ``root`` (default :data:`REPO_ROOT`), or ``None`` when git is missing or fails."""
    try:
        out = subprocess.run(["git", *args], cwd=root if root is not None else REPO_ROOT, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def changed_sources(root: str | os.PathLike | None = None) -> list[str] | None:
    """The tracked source files (:data:`SOURCE_PATHS`) whose
    working-tree or staged content differs from ``HEAD``.

    ``git status --porcelain -z --untracked-files=no`` limited to the sources: an edited, staged, deleted or renamed
    tracked file counts; an untracked file (scratch, a notebook's ``.ipynb`` under ``build/``) and every file outside
    the sources (``figures/``, ``build/``, ``tests/``, ``docs/``) do not.

    Args:
        root: the repository (default :data:`rvqspec_lib.common.paths.REPO_ROOT`; tests point it at a temporary one).

    Returns:
        sorted paths relative to the root (both names of a rename), ``[]`` when the sources equal ``HEAD``, ``None``
        when git is unavailable or ``root`` is not a checkout with a commit.

    Source: git-status(1), "Porcelain Format Version 1" (``XY PATH``; with ``-z`` a rename's old name follows as the
    next NUL-separated field) and gitglossary(7) "pathspec" (the ``:(exclude)`` magic).
    """
    if git_output("rev-parse", "--verify", "-q", "HEAD", root=root) is None:
        return None
    out = git_output("--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=no", "--",
                     *SOURCE_PATHSPECS, root=root)
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
    """Git state of the sources a result is made from.

    Args:
        root: the repository (default :data:`rvqspec_lib.common.paths.REPO_ROOT`).

    Returns:
        ``{"revision": <40-hex sha or None>, "dirty": <bool or None>, "changed_sources": <list of paths or None>}``.
        ``revision`` is ``HEAD``, the commit the sources equal when ``dirty`` is false; ``dirty`` is true when a
        tracked source file (:data:`SOURCE_PATHSPECS`) differs from it, and ``changed_sources`` names those files
        (:func:`changed_sources`). A run's own outputs (``figures/``, ``build/``) and untracked files never make a
        record dirty. ``revision`` is ``None`` outside a git checkout or before the first commit; ``dirty`` and
        ``changed_sources`` are ``None`` when git is unavailable. The key ``changed_sources`` marks a record written
        by this rule (older records have only ``revision`` and ``dirty``, whose ``dirty`` also counted untracked files
        and is unreliable: docs/reproducibility.md).
    """
    rev = git_output("rev-parse", "--verify", "-q", "HEAD", root=root)
    changed = changed_sources(root) if rev else None
    return {"revision": rev.strip() if rev else None, "dirty": None if changed is None else bool(changed),
            "changed_sources": changed}


def hardware() -> dict:
    """Device summary: CPU model and core count, torch thread count, 1-minute load average (other processes
    competing for the cores distort CPU timings), accelerator name (if any). No hostname.

    torch is asked only when the process has imported it (every notebook and timing command has): a record written
    by a process that never used torch (``make paper``'s run-time record) has ``torch_threads`` and ``accelerator``
    ``None`` instead of paying for the import."""
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
    """Python's version and those of the main packages: ``module.__version__`` when the process has imported it,
    else the installed distribution's (``importlib.metadata``, no import: qwen_tts alone takes seconds), ``None``
    when not installed."""
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


def _jsonable(x: Any) -> Any:
    """Best-effort conversion to JSON types (numpy scalars, tensors of one element, paths, tuples, NaN -> None)."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return str(x)
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:  # numpy / torch scalar
        return _jsonable(x.item())
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return str(x)


def provenance(params: Mapping[str, Any] | None = None, seed: int | None = None) -> dict:
    """Provenance record for a result.

    Args:
        params: the parameters that produced the result (notebook parameters, CLI arguments). Values are converted
            to JSON types (tuples -> lists, numpy scalars -> Python, other objects -> ``str``).
        seed: the seed used, or ``None`` when nothing random was drawn.

    Returns:
        JSON-able dict with keys ``git`` (``revision``, ``dirty``), ``created_utc`` (ISO 8601, seconds),
        ``params``, ``seed``, ``hardware`` (CPU model, cores, torch threads, accelerator), ``versions``
        (python, torch, transformers, qwen_tts, ...) and ``argv``. No hostname or user name.
    """
    return {
        "git": git_revision(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "params": _jsonable(dict(params or {})),
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
    return json.dumps(_jsonable(record), indent=2) + "\n"


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
    """Write a table as ``<stem>.csv`` (full precision), ``<stem>.md`` (4 significant digits) and the sidecar.

    The three files are written all-or-nothing (:func:`rvqspec_lib.common.files.atomic_outputs`: temporary files in
    the same folder, then ``os.replace``, the sidecar last): an error or Ctrl-C while writing leaves the previous
    files as they were (or none) and no temporary file.

    Args:
        table: a pandas DataFrame or a non-empty list of dicts (one dict per row).
        path_stem: output path without extension, e.g. ``figures/01_latency``; parent folders are created.
        prov: a record from :func:`provenance`.
        caption: one line the Markdown table starts with and the sidecar keeps (``"caption"``): what a projection
            is made of and leaves out, or an OVERSUBSCRIBED warning (docs/style.md#benchmarks). The CSV stays plain.

    Returns:
        ``{"csv": Path, "md": Path, "provenance": Path}``.

    Raises:
        TypeError: ``table`` is neither a DataFrame nor a list of dicts.
        OSError: the folder cannot be written (nothing is left behind).
    """
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


def save_figure(fig, path_stem: str | os.PathLike, prov: Mapping, *, dpi: int = 150) -> dict:
    """Write a matplotlib figure as ``<stem>.png`` (``dpi``) and ``<stem>.pdf`` plus the provenance sidecar.

    The PDF/PNG metadata carry no creation date, so re-running with the same numbers gives the same files
    (the date lives in the sidecar). The three files are written all-or-nothing, as :func:`save_table`'s: a Ctrl-C
    during ``savefig`` leaves no truncated PDF and no figure without its provenance.

    Returns:
        ``{"png": Path, "pdf": Path, "provenance": Path}``.

    Raises:
        OSError: the folder cannot be written (nothing is left behind).
    """
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, pdf = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")
    side = _sidecar_path(stem)
    with atomic_outputs([png, pdf, side]) as (tmp_png, tmp_pdf, tmp_side):
        fig.savefig(tmp_png, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
        fig.savefig(tmp_pdf, format="pdf", bbox_inches="tight",
                    metadata={"CreationDate": None, "Creator": None, "Producer": None})
        tmp_side.write_text(_sidecar_text(prov, [png, pdf]))
    return {"png": png, "pdf": pdf, "provenance": side}


def save_audio(wav, sample_rate: int, path_stem: str | os.PathLike, prov: Mapping, *, peak: float = 0.95) -> Path:
    """Write a listening example as ``<stem>.wav`` (16-bit PCM, mono) plus the provenance sidecar, all-or-nothing:
    what a notebook plays with ``IPython.display.Audio(filename=...)`` and what the committed notebooks play.

    Args:
        wav: ``(samples,)`` float waveform (numpy or torch), any scale: peak-limited to ``peak`` of full scale when
            louder (never amplified). sample_rate: in Hz (the 12 Hz codec's 24000). path_stem: without ``.wav``.
        prov: :func:`provenance`'s record.

    Returns:
        the ``.wav`` path.

    Raises:
        ValueError: not a 1-D waveform, or an empty one, or a sample rate <= 0.
    """
    import numpy as np  # noqa: PLC0415 (numpy and soundfile: the audio writers only; provenance stays light)
    import soundfile as sf  # noqa: PLC0415

    x = np.asarray(wav.detach().cpu() if hasattr(wav, "detach") else wav, dtype=np.float32).reshape(-1) \
        if getattr(wav, "ndim", 1) <= 1 or min(getattr(wav, "shape", (1,))) == 1 else None
    if x is None or x.size == 0 or int(sample_rate) <= 0:
        raise ValueError("save_audio takes one non-empty mono waveform (samples,) and a sample rate > 0")
    top = float(np.abs(x).max())
    if top > peak:
        x = x * (peak / top)
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out, side = stem.with_name(stem.name + ".wav"), _sidecar_path(stem)
    with atomic_outputs([out, side]) as (tmp_wav, tmp_side):
        sf.write(str(tmp_wav), x, int(sample_rate), subtype="PCM_16", format="WAV")
        tmp_side.write_text(_sidecar_text(prov, [out]))
    return out


def save_notebook_record(notebook: str | os.PathLike, prov: Mapping) -> Path:
    """The provenance sidecar of an executed notebook kept beside the figures (``<figures>/notebooks/NN_name.ipynb``
    -> ``NN_name.provenance.json``, listing the notebook), written by ``make paper``'s last step
    (:mod:`rvqspec_lib.common.paper_run`), so that ``make check-figures`` tells a stale executed notebook like a stale
    figure."""
    nb = Path(notebook)
    side = _sidecar_path(nb.with_suffix(""))
    write_text_atomic(side, _sidecar_text(prov, [nb]))
    return side


def save_json(obj: Mapping, path: str | os.PathLike, prov: Mapping) -> Path:
    """Write a metrics dict as JSON with its provenance under the key ``"provenance"``.

    Args:
        obj: JSON-able metrics (numpy/torch scalars are converted; NaN/inf become ``null``).
        path: output file (``.json``); parent folders are created. Written atomically
            (:func:`rvqspec_lib.common.files.write_text_atomic`): a failure leaves no half-written file.
        prov: a record from :func:`provenance`.

    Returns:
        the path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(_jsonable(obj))
    record["provenance"] = _jsonable(prov)
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")  # whole or absent, even on Ctrl-C
    return path
