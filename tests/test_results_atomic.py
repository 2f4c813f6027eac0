"""Figures and tables appear whole or not at all (docs/style.md, "never a half-written output file").

:func:`rvqspec_lib.common.provenance.save_figure` and :func:`~rvqspec_lib.common.provenance.save_table` write their
three files (PNG + PDF or CSV + Markdown, and the provenance sidecar) through temporary files in the same folder and
``os.replace``. A Ctrl-C is simulated by a writer that puts half its bytes on disk and then raises
``KeyboardInterrupt``: the previous files must be left byte for byte, with no temporary file beside them, and a first
save that is interrupted must leave nothing. The negative control: the same second save, not interrupted, does change
the files (so "unchanged" is not vacuous).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.figure  # noqa: E402
import pytest  # noqa: E402

from rvqspec_lib.common import provenance as P  # noqa: E402

PROV = {"params": {"test": True}, "seed": 0}  # a record's shape is irrelevant here: only the files are checked


def _figure(y):
    fig = matplotlib.figure.Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1, 2], y)
    return fig


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _interrupt_on(fmt: str):
    """A ``Figure.savefig`` that writes half of the real output for ``fmt`` and raises KeyboardInterrupt."""
    real = matplotlib.figure.Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        real(self, fname, *args, **kwargs)
        if kwargs.get("format") == fmt:
            with open(fname, "r+b") as f:
                f.truncate(max(1, f.seek(0, 2) // 2))
            raise KeyboardInterrupt
    return savefig


@pytest.mark.parametrize("fmt", ["png", "pdf"])
def test_interrupted_figure_save_keeps_the_old_files(tmp_path, monkeypatch, fmt):
    stem = tmp_path / "01_curve"
    P.save_figure(_figure([0, 1, 0]), stem, PROV)
    before = _snapshot(tmp_path)
    assert set(before) == {"01_curve.png", "01_curve.pdf", "01_curve.provenance.json"}

    with monkeypatch.context() as m:
        m.setattr(matplotlib.figure.Figure, "savefig", _interrupt_on(fmt))
        with pytest.raises(KeyboardInterrupt):
            P.save_figure(_figure([2, 0, 2]), stem, {**PROV, "seed": 1})
    assert _snapshot(tmp_path) == before  # same names (no .part file), same bytes

    # negative control: the same save, not interrupted, rewrites all three
    P.save_figure(_figure([2, 0, 2]), stem, {**PROV, "seed": 1})
    after = _snapshot(tmp_path)
    assert set(after) == set(before)
    assert all(after[n] != before[n] for n in before), [n for n in before if after[n] == before[n]]


def test_interrupted_first_figure_save_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _interrupt_on("pdf"))
    with pytest.raises(KeyboardInterrupt):
        P.save_figure(_figure([0, 1, 0]), tmp_path / "00_new", PROV)
    assert list(tmp_path.iterdir()) == []  # no truncated PDF, no PNG without provenance, no temporary file


def test_interrupted_table_save_keeps_the_old_files(tmp_path, monkeypatch):
    stem = tmp_path / "02_table"
    P.save_table([{"decoder": "AR", "tokens_per_call": 1.0}], stem, PROV)
    before = _snapshot(tmp_path)
    assert set(before) == {"02_table.csv", "02_table.md", "02_table.provenance.json"}

    def interrupted(cols, rows):  # the CSV is already written (to its temporary file) when the Markdown starts
        raise KeyboardInterrupt
    new = [{"decoder": "chain4", "tokens_per_call": 2.5}]
    with monkeypatch.context() as m:
        m.setattr(P, "markdown_table", interrupted)
        with pytest.raises(KeyboardInterrupt):
            P.save_table(new, stem, PROV)
    assert _snapshot(tmp_path) == before

    P.save_table(new, stem, {**PROV, "seed": 1})  # negative control
    after = _snapshot(tmp_path)
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)
    assert "chain4" in after["02_table.csv"].decode()


def test_sidecar_names_the_final_files_and_modes_are_usual(tmp_path):
    import json
    import os
    import stat

    out = P.save_figure(_figure([0, 1, 0]), tmp_path / "f", PROV)
    side = json.loads(out["provenance"].read_text())
    assert side["files"] == ["f.png", "f.pdf"]  # not the temporary names
    mask = os.umask(0)
    os.umask(mask)
    for p in out.values():
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p  # as a plain open() would make it
