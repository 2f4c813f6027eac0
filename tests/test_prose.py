"""Prose that the run writes (docs/style.md#numbers-in-prose).

* A notebook's Markdown cell never types a measured number: a sentence stating one is a code cell that renders
  Markdown from the results (``IPython.display.Markdown``).
* README.md and docs/*.md quote a measured number only in a paragraph (or a table together with the paragraph that
  introduces it) that cites a committed table by name (`figures/NN_name.md`, `.csv`, `.json`, the run-time record
  `figures/paper_run.md`, or `data/embedded/eval.json`), and the number is in one of the tables it cites, up to the digits shown.

What counts as a measured number, and what is exempt, is defined once here (:func:`measured_numbers`) and described in
docs/style.md; the negative controls below check that a typed number, an uncited one and one absent from its table
each make the check fail.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))
PROSE_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Units after a number that make it a measurement (speedups, shares, times, sizes, distances).
MEASURED_UNITS = ("x", "×", "%", "ms", "s", "MB", "GB", "dB", "nats")
#: A number token: optional sign, digits (thousands commas allowed), decimals, exponent, then an optional unit.
_NUMBER = re.compile(
    r"(?<![\w.§/#@-])([-+−]?)(\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+−]?\d+)?)(?:\s?(" +
    "|".join(re.escape(u) for u in MEASURED_UNITS) + r")(?![ \t]*[\d(]))?(?!\w|\.\d|,\d{3})")  # "2 x 15": a product
#: Facts of the model config and parameters of a run, removed before scanning: they are not measurements.
ALLOWED = [
    r"12\.5\s*(?:Hz|frames|times|×|x\b)",          # the 12 Hz codec's frame rate (config)
    r"\b(?:80|40|20) ms\b",                         # one codec frame, two, one log-mel hop (config)
    r"(?:torch|Python|transformers|qwen-tts|macOS|ONNX Runtime|onnxruntime)\s*[=v]*\s*\d+(?:\.\d+)+",  # versions
    r"\b(?:T|temperature|temperatures|beta|top-k|top-p|lr|level|alpha|tolerance|TV|shift of|power|penalty|theta|rate|relative)"
    r"\s*[=:]?\s*"
    r"\d+(?:\.\d+)?(?:e[-+−]?\d+)?(?:\s*(?:/|,|and|to|-)\s*\d+(?:\.\d+)?(?:e[-+−]?\d+)?)*",  # run parameters
    r"(?:<|>|≤|≥|<=|>=|below|above|at least|at most|under|over|within|up to)\s*[-+]?\d+(?:\.\d+)?"
    r"(?:e[-+−]?\d+)?\s*(?:x|×|%)?",                # thresholds and tolerances, not results
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s*(?:min|minutes|h|hours)\b",  # how long a command runs
    r"\b(?:90|95|99)%",                             # confidence levels
    r"\b(?:p10|p90)\b",
]
_ALLOWED = re.compile("|".join(f"(?:{a})" for a in ALLOWED))
#: A sentence containing one of these words quotes a published value (the paper's or a cited work's), not ours.
QUOTE_MARKERS = re.compile(r"\b(?:paper|paper's|reported|reports|quoted|arXiv)\b", re.IGNORECASE)
#: A committed results file, cited by name (the `figures/` prefix may be left out).
_CITATION = re.compile(r"`((?:figures/)?(?:[\w.-]+/)?\d\d_[\w.-]+\.(?:md|csv|json)|figures/paper_run\.(?:md|csv)"
                       r"|data/embedded/eval\.json)`")


def _strip_code(text: str) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)          # link targets
    return re.sub(r"https?://\S+", " ", text)


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?;])\s+(?=[A-Z*(])|\n\s*\n", text)


def measured_numbers(text: str) -> list[tuple[str, str, str]]:
    """The measured-looking numbers of a piece of Markdown prose, as ``(number, unit, sentence)``.

    A number is measured-looking when it has a decimal point or an exponent, or is followed by one of
    :data:`MEASURED_UNITS`. Not counted: code (fences and backtick spans), link targets, the facts and parameters of
    :data:`ALLOWED`, and every number of a sentence that names its published source (:data:`QUOTE_MARKERS`).
    """
    found = []
    for sentence in _sentences(_strip_code(text)):
        if QUOTE_MARKERS.search(sentence):
            continue
        scan = _ALLOWED.sub(" ", sentence)
        for m in _NUMBER.finditer(scan):
            sign, num, unit = m.group(1), m.group(2), m.group(3) or ""
            if "." in num or "e" in num or unit:
                found.append((sign.replace("−", "-") + num, unit, " ".join(sentence.split())))
    return found


def notebook_violations(path: Path) -> list[str]:
    """Measured numbers typed in a notebook's Markdown cells (jupytext percent file), one message each."""
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(path)
    return [f"{path.name} cell {i}: {num}{unit!s} typed in Markdown ({sentence[:120]!r})"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for num, unit, sentence in measured_numbers(cell.source)]


#: A heading that quotes others (:data:`QUOTE_MARKERS`) or marks a dated log of one-off environment checks ("log")
#: exempts its whole section: a log records what was tried once, with its date, and states no result of the method.
_EXEMPT_HEADING = re.compile(r"^#+ .*(?:\b(?:reported|quoted)\b|\(log\b)", re.IGNORECASE)


def _sections(text: str) -> list[str]:
    """The file without the sections under an exempt heading (until the next heading of the same or a higher level)."""
    keep, skip_level = [], None
    for line in text.splitlines():
        h = re.match(r"^(#+) ", line)
        if h and skip_level is not None and len(h.group(1)) <= skip_level:
            skip_level = None
        if h and skip_level is None and _EXEMPT_HEADING.match(line):
            skip_level = len(h.group(1))
        keep.append("" if skip_level is not None else line)
    return keep


def _units(text: str) -> list[str]:
    """Paragraphs and list items of a Markdown file; a table is one unit with the paragraph just before it."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    blocks, cur, in_table = [], [], False
    for line in _sections(text):
        is_table = line.lstrip().startswith("|")
        new_item = re.match(r"\s*(?:[*-]|\d+\.)\s", line) is not None
        if not line.strip() or line.startswith("#") or (new_item and not is_table) or (in_table and not is_table):
            if cur and not (is_table and not in_table and line.strip()):
                blocks.append("\n".join(cur))
                cur = []
            if not line.strip() or line.startswith("#"):
                in_table = False
                continue
        if is_table and not in_table and blocks and not cur:
            cur = [blocks.pop()]  # the paragraph that introduces the table
        in_table = is_table
        cur.append(line)
    if cur:
        blocks.append("\n".join(cur))
    return blocks


def _table_values(path: Path) -> list[Decimal]:
    return [Decimal(v) for v in re.findall(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", path.read_text().replace(",", ""))]


def _in_table(num: str, unit: str, values: list[Decimal]) -> bool:
    """``num`` (as shown) equals a value of the table rounded to the digits shown (a share in % may be a fraction)."""
    shown = abs(Decimal(num.replace(",", "")))
    if "e" in num:  # scientific: the shown significant digits
        mant = num.split("e")[0].lstrip("+-")
        half = Decimal(5) * shown.scaleb(-len(mant.replace(".", "")))
    else:
        decimals = len(num.split(".")[1]) if "." in num else 0
        half = Decimal(5).scaleb(-decimals - 1)
    for v in values:
        for c in ((abs(v), abs(v) * 100) if unit == "%" else (abs(v),)):
            if abs(c - shown) <= half + Decimal("1e-12"):
                return True
    return False


def prose_violations(path: Path, root: Path = REPO) -> list[str]:
    """Measured numbers of a README/docs file that cite no committed table, or are absent from the ones cited."""
    out = []
    for unit_text in _units(path.read_text()):
        found = measured_numbers(unit_text)
        if not found:
            continue
        cited = _CITATION.findall(unit_text)
        files = []
        for c in cited:
            p = root / c if c.startswith(("figures/", "data/")) else root / "figures" / c
            if not p.is_file():
                out.append(f"{path.name}: cites {c}, which is not a committed file")
            else:
                files.append(p)
        if len(files) < len(cited):
            continue
        if not cited:
            out.append(f"{path.name}: {', '.join(n + u for n, u, _ in found)} quoted with no committed table cited "
                       f"({found[0][2][:120]!r})")
            continue
        values = [v for p in files for v in _table_values(p)]
        for num, unit, sentence in found:
            if not _in_table(num, unit, values):
                out.append(f"{path.name}: {num}{unit} is in none of {', '.join(cited)} ({sentence[:120]!r})")
    return out


# ----------------------------------------------------------------------------------------------------------------------
# The checks on this repository
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_markdown_types_no_measured_number(src):
    assert notebook_violations(src) == []


@pytest.mark.parametrize("path", PROSE_FILES, ids=[p.name for p in PROSE_FILES])
def test_quoted_numbers_are_in_the_tables_they_cite(path):
    assert prose_violations(path) == []


# ----------------------------------------------------------------------------------------------------------------------
# Negative controls: each rule fails where it should
# ----------------------------------------------------------------------------------------------------------------------
def test_typed_number_in_a_notebook_markdown_cell_fails(tmp_path):
    src = tmp_path / "99_probe.py"
    src.write_text("# %% [markdown]\n# The chain is 1.62x faster than AR.\n\n"
                   "# %%\nx = 1.62  # code may hold numbers\n\n"
                   "# %% [markdown]\n# Real time needs 12.5 Hz × 16 codebooks; the paper reports 2.47 tokens per "
                   "call (paper: 2.47).\n")
    bad = notebook_violations(src)
    assert len(bad) == 1 and "1.62x" in bad[0]


@pytest.mark.parametrize("text, n", [
    ("speedup 1.62x", 1), ("65% of the frame", 1), ("0.252 WER", 1), ("3.8 s of loop", 1), ("p 9e-94", 1),
    ("N = 16 nodes, 1,500 frames, 100 sentences", 0), ("12.5 Hz, 80 ms, 16 codebooks, 15 calls", 0),
    ("torch 2.13, Python 3.11", 0), ("at T 0.9 / top-k 50", 0), ("the paper's 2.47", 0), ("`1.62x` in code", 0),
    ("fail at p < 1e-3", 0), ("2 x 15 tests, 16 x 2048", 0), ("the 0.6B model", 0), ("about 3.8 h", 0), ("a 95% interval", 0),
])
def test_what_counts_as_a_measured_number(text, n):
    assert len(measured_numbers(text)) == n, measured_numbers(text)


def test_readme_number_absent_from_its_table_fails(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "99_probe.md").write_text("| decoder | speedup |\n| --- | ---: |\n| chain4 | 1.634 |\n")
    readme = tmp_path / "README.md"
    readme.write_text("Chain 4 runs 1.63x AR (`figures/99_probe.md`).\n\n"
                      "Chain 4 runs 1.70x AR (`99_probe.md`).\n\n"
                      "Chain 4 runs 1.63x AR on this machine.\n\n"
                      "Chain 4 runs 1.63x AR (`figures/99_missing.md`).\n\n"
                      "**Speed** (`figures/99_probe.md`):\n\n| decoder | vs AR |\n|---|---:|\n| chain 4 | 1.6x |\n"
                      "| chain 8 | 1.9x |\n")
    bad = prose_violations(readme, root=tmp_path)
    assert len(bad) == 4, bad
    assert "1.70x is in none of 99_probe.md" in bad[0]
    assert "no committed table cited" in bad[1]
    assert "not a committed file" in bad[2]
    assert "1.9x is in none" in bad[3]  # a table row is checked against the tables its introduction cites


def test_the_calibration_split_size_is_one_number_read_from_the_data():
    """Notebooks 00, 03 and 04 print the shipped calibration split's size from this function, never typed."""
    from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances, shipped_split_sizes

    sizes = shipped_split_sizes("embedded")
    _, utts = load_shipped_utterances(embedded_root("embedded") / "utterances.safetensors", splits=["calibration"])
    assert sizes["calibration"]["utterances"] == len(utts) > 0
    assert sizes["calibration"]["frames"] == sum(int(u.codes.shape[0]) for u in utts)
    assert set(sizes) >= {"training", "validation", "evaluation", "calibration"}
