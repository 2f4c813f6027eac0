"""The generated prose (tools/results_doc.py): docs/results.md and the README's results at a glance say
what a figures folder holds, laid out from the notebooks' headline numbers; `make check-figures` lists them when they
do not (negative controls: an edited results document, an edited README block, a changed headline)."""

from __future__ import annotations

import json
import re

import pytest

from tools import results_doc as R


def problems(entries) -> list[str]:
    """What is wrong with a ``headline`` list of :func:`entry` dicts (a ``unit`` of :data:`R.UNITS`, a ``source``
    naming a table or figure file), one line each (empty: well formed)."""
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
        if h["unit"] not in R.UNITS:
            out.append(f"entry {i} ({h.get('text')}): unit {h['unit']!r} not one of {R.UNITS}")
        if not isinstance(h["source"], str) or not re.fullmatch(r"\d\d_[\w.-]+\.(md|csv|json|png)", h["source"]):
            out.append(f"entry {i} ({h.get('text')}): source {h['source']!r} does not name a figures file")
        if not isinstance(h["glance"], bool):
            out.append(f"entry {i} ({h.get('text')}): glance is not true or false")
    return out


def _folder(tmp_path, value=1.2345):
    fig = tmp_path / "figures"
    fig.mkdir()
    prov = {"git": {"revision": "abcdef0123"}, "params": {"notebook": "04_calibrating_the_tree"},
            "hardware": {"cpu": "Test CPU"}}
    (fig / "04_metrics.json").write_text(json.dumps({"provenance": prov, "headline": [
        {"text": "speedup of the fastest speculative decoder over stepped AR", "value": value, "unit": "x",
         "source": "04_speed.md", "glance": True},
        {"text": "frames timed", "value": 120, "unit": ""}]}))
    (fig / "00_other.json").write_text("{}")  # not a metrics file: ignored
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(f"# x\n\n{R.BEGIN}\nold\n{R.END}\n\nmore\n")
    return fig, root


def test_written_results_say_what_the_figures_hold(tmp_path):
    fig, root = _folder(tmp_path)
    text = R.render_results(fig)
    assert "## 04_calibrating_the_tree" in text and "**1.23x** (`figures/04_speed.md`)" in text
    assert "revision abcdef0" in text and "Test CPU" in text and "frames timed: **120**" in text
    glance = R.render_glance(fig)
    assert glance.startswith(R.BEGIN) and glance.endswith(R.END) and "| 1.23x |" in glance
    assert "frames timed" not in glance  # not marked glance
    assert R.check(fig, root)  # nothing written yet: both out of date
    R.write(fig, root)
    assert R.check(fig, root) == []
    readme = (root / "README.md").read_text()
    assert readme.startswith("# x\n\n") and readme.endswith("\n\nmore\n")  # only the block is rewritten


def test_stale_prose_is_listed(tmp_path):
    fig, root = _folder(tmp_path)
    R.write(fig, root)
    doc = root / "docs" / "results.md"
    doc.write_text(doc.read_text().replace("1.23x", "2.47x"))  # a hand edit
    assert any("docs/results.md does not say what" in ln for ln in R.check(fig, root))
    R.write(fig, root)
    (fig / "04_metrics.json").write_text((fig / "04_metrics.json").read_text().replace("1.2345", "1.5"))  # a new run
    lines = R.check(fig, root)
    assert len(lines) == 2 and "README.md" in lines[1]


def test_a_readme_without_the_block_is_one_line(tmp_path):
    fig, root = _folder(tmp_path)
    (root / "README.md").write_text("# no block\n")
    with pytest.raises(ValueError, match="has no <!-- results:begin --> ... <!-- results:end --> block"):
        R.write(fig, root)


def test_entries_a_notebook_builds():
    import numpy as np

    hs = R.headline(R.entry("speedup over AR", np.float64(1.5), "x", "04_speed.md", glance=True),
                    R.entry("absent in smoke mode", None, "ms", "04_speed.md"),
                    R.entry("not a number", float("nan"), "", "04_speed.md"),
                    R.entry("auto's choice", "chain:4", "", "07_auto.md"))
    assert [h["text"] for h in hs] == ["speedup over AR", "auto's choice"]
    assert type(hs[0]["value"]) is float and hs[0]["glance"] is True and hs[1]["glance"] is False
    assert problems(hs) == []
    assert problems([]) and problems(None)
    bad = [{**hs[0], "unit": "furlongs"}, {**hs[0], "source": "figures/04_speed.md"}, {"text": "x", "value": 1}]
    assert len(problems(bad)) == 3
