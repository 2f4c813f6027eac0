"""The measured numbers in prose, generated: ``docs/results.md`` and the README's "results at a glance" block, written
by ``make paper`` from the figures it just made (docs/style.md#numbers-in-prose).

Every notebook's ``NN_metrics.json`` may hold a ``headline`` list, one entry per number: ``{"text", "value" (a number
or a short string), "unit", "source" (the committed table it comes from), "glance" (in the README's table)}``,
computed by the notebook (:func:`entry`, :func:`headline`), only laid out here. Standard library only
(``make check-figures`` runs it without the project's environment).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from rvqspec_lib.common.files import write_text_atomic
from rvqspec_lib.common.paths import REPO_ROOT

#: the generated document and the README block's markers
RESULTS_DOC = Path("docs") / "results.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
_METRICS = re.compile(r"^(\d\d)(?:_[\w-]+)?_metrics\.json$")


#: the units an entry may carry (an empty string for a count or a ratio without one)
UNITS = ("", "x", "%", "ms", "s", "dB")


def entry(text: str, value, unit: str = "", source: str = "", glance: bool = False) -> dict | None:
    """One headline entry, or ``None`` when ``value`` is missing (``None`` or NaN: e.g. a row absent in smoke mode).

    Numbers are stored as plain ``float``/``int`` (numpy scalars converted); a string value is kept as it is.
    """
    if value is None:
        return None
    if type(value) not in (bool, str, int, float):
        try:
            value = value.item()  # numpy / torch scalars (numpy's float64 is a float, but not a plain one)
        except (AttributeError, ValueError):
            return None
    if isinstance(value, float) and value != value:  # NaN
        return None
    return {"text": text, "value": value, "unit": unit, "source": source, "glance": bool(glance)}


def headline(*entries: dict | None) -> list[dict]:
    """The entries that are present (the ``None`` of :func:`entry` left out), in order."""
    return [e for e in entries if e is not None]


def problems(entries) -> list[str]:
    """What is wrong with a ``headline`` list, one line each (empty when every entry is well formed): a list of
    dicts with a non-empty ``text``, a number or short string ``value``, a ``unit`` of :data:`UNITS`, a ``source``
    naming a table or figure file, and a boolean ``glance``."""
    if not isinstance(entries, list) or not entries:
        return [f"headline is not a non-empty list: {entries!r}"]
    out = []
    for i, h in enumerate(entries):
        if not isinstance(h, dict) or set(h) != {"text", "value", "unit", "source", "glance"}:
            out.append(f"entry {i} is not {{text, value, unit, source, glance}}: {h!r}")
            continue
        if not isinstance(h["text"], str) or not h["text"].strip():
            out.append(f"entry {i} has no text")
        v = h["value"]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, (bool, str)) and
                len(str(v)) <= 60):
            out.append(f"entry {i} ({h.get('text')}): value {v!r} is not a number or a short string")
        if h["unit"] not in UNITS:
            out.append(f"entry {i} ({h.get('text')}): unit {h['unit']!r} not one of {UNITS}")
        if not isinstance(h["source"], str) or not re.fullmatch(r"\d\d_[\w.-]+\.(md|csv|json|png)", h["source"]):
            out.append(f"entry {i} ({h.get('text')}): source {h['source']!r} does not name a figures file")
        if not isinstance(h["glance"], bool):
            out.append(f"entry {i} ({h.get('text')}): glance is not true or false")
    return out


def _fmt(value, unit: str) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    else:
        text = str(value)
    return f"{text}{'' if not unit else ('' if unit in ('x', '%') else ' ') + unit}"


def headlines(fig_dir: str | os.PathLike) -> list[dict]:
    """Every headline entry of the folder's ``NN[_name]_metrics.json`` files, in notebook order, each with its
    ``notebook`` (the metrics file's number and title, from its provenance) added.

    Raises:
        FileNotFoundError: ``fig_dir`` is not a folder.
    """
    folder = Path(fig_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{fig_dir} is not a folder")
    out = []
    for p in sorted(folder.glob("*_metrics.json")):
        m = _METRICS.match(p.name)
        if not m:
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        prov = data.get("provenance") or {}
        nb = (prov.get("params") or {}).get("notebook") or p.name[: -len("_metrics.json")]
        for h in data.get("headline") or []:
            if isinstance(h, dict) and "text" in h and "value" in h:
                out.append({**h, "notebook": nb, "revision": (prov.get("git") or {}).get("revision"),
                            "cpu": (prov.get("hardware") or {}).get("cpu")})
    return out


def render_results(fig_dir: str | os.PathLike) -> str:
    """The text of ``docs/results.md``: one section per notebook, a line per headline number with its source."""
    hs = headlines(fig_dir)
    revs = sorted({h["revision"][:7] for h in hs if h.get("revision")})
    cpus = sorted({h["cpu"] for h in hs if h.get("cpu")})
    lines = ["# Results of the committed run", "",
             "Generated by `make paper` from the committed `figures/` (do not edit: a regeneration rewrites it). "
             f"Run: revision {', '.join(revs) or 'unknown'}; CPU: {'; '.join(cpus) or 'unknown'}. "
             "Each line names the table it comes from; the notebooks under `figures/notebooks/` show the figures "
             "and say why.", ""]
    current = None
    for h in hs:
        if h["notebook"] != current:
            current = h["notebook"]
            lines += [*([""] if lines[-1] else []), f"## {current}", ""]  # a blank line before each heading
        src = f" (`figures/{h['source']}`)" if h.get("source") else ""
        lines.append(f"- {h['text']}: **{_fmt(h['value'], h.get('unit', ''))}**{src}")
    if not hs:
        lines.append("No headline numbers in this folder: run `make paper`.")
    return "\n".join(lines).rstrip() + "\n"


def render_glance(fig_dir: str | os.PathLike) -> str:
    """The README block between :data:`BEGIN` and :data:`END` (markers included): a table of the headline numbers
    marked ``glance``."""
    hs = [h for h in headlines(fig_dir) if h.get("glance")]
    rows = ["| what | measured here | notebook |", "|---|---|---|"]
    rows += [f"| {h['text']} | {_fmt(h['value'], h.get('unit', ''))} | {h['notebook']} |" for h in hs]
    body = "\n".join(rows) if hs else "(no headline numbers yet: run `make paper`)"
    return (f"{BEGIN}\n{body}\n\nGenerated by `make paper` from `figures/` on the machine it ran on; every number, "
            f"with its source table, is in [docs/results.md](docs/results.md).\n{END}")


def _readme_block(text: str) -> str | None:
    i, j = text.find(BEGIN), text.find(END)
    return None if i < 0 or j < i else text[i: j + len(END)]


def write(fig_dir: str | os.PathLike, root: str | os.PathLike) -> list[Path]:
    """Write ``docs/results.md`` and the README block of the repository at ``root`` from ``fig_dir``; returns the
    paths written (both all-or-nothing).

    Raises:
        ValueError: the README has no block to fill (its markers are missing).
    """
    root = Path(root)
    doc = write_text_atomic(root / RESULTS_DOC, render_results(fig_dir))
    readme = root / "README.md"
    text = readme.read_text()
    block = _readme_block(text)
    if block is None:
        raise ValueError(f"{readme} has no {BEGIN} ... {END} block for the results at a glance: add the two lines")
    return [doc, write_text_atomic(readme, text.replace(block, render_glance(fig_dir)))]


def check(fig_dir: str | os.PathLike, root: str | os.PathLike) -> list[str]:
    """What is out of date: ``docs/results.md`` or the README block not what :func:`write` makes from ``fig_dir``
    (one line each; empty when both say what the figures hold)."""
    root = Path(root)
    out = []
    doc = root / RESULTS_DOC
    if not doc.is_file() or doc.read_text() != render_results(fig_dir):
        out.append(f"{RESULTS_DOC} does not say what {fig_dir} holds: `make paper` writes it (or run "
                   "`python -m rvqspec_lib.common.results_doc`)")
    readme = root / "README.md"
    block = _readme_block(readme.read_text()) if readme.is_file() else None
    if block != render_glance(fig_dir):
        out.append(f"README.md's results at a glance do not say what {fig_dir} holds: `make paper` writes them")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m rvqspec_lib.common.results_doc [--figures figures] [--check]``: write (or check) the generated
    results from the figures."""
    ap = argparse.ArgumentParser(description="Write docs/results.md and the README's results at a glance from figures/.")
    ap.add_argument("--figures", default="figures")
    ap.add_argument("--check", action="store_true", help="only say what is out of date (exit 1 if anything is)")
    args = ap.parse_args(argv)
    fig = Path(args.figures) if Path(args.figures).is_absolute() else REPO_ROOT / args.figures
    if args.check:
        lines = check(fig, REPO_ROOT)
        for ln in lines:
            print(ln)
        return 1 if lines else 0
    for p in write(fig, REPO_ROOT):
        print(f"results: wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
