"""Prose types no measured number (docs/style.md#numbers-in-prose): measured numbers live in the files a run writes.

* A notebook's Markdown cell never types a measured number: a sentence stating one is a code cell that renders
  Markdown from the results (``IPython.display.Markdown``).
* README.md (outside the block between ``<!-- results:begin -->`` and ``<!-- results:end -->``, which ``make paper``
  fills) and docs/*.md (all but docs/results.md, which ``make paper`` writes) type no measured number at all, outside
  sentences that quote a published source (the paper, a cited work) and sections headed as quoting others. A page
  that needs a measurement points to the section of docs/results.md or to the committed table it comes from. The
  generated files are checked by the test of their generator, not here.

What counts as a measured number, and what is exempt, is defined once here (:func:`measured_numbers`) and described in
docs/style.md; the negative controls below check that a typed number fails in a notebook, a docs page and the README,
cited table or not.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))
#: docs/results.md is written by ``make paper`` from the figures: the one page that holds measured numbers.
GENERATED_DOCS = ("results.md",)
PROSE_FILES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in GENERATED_DOCS)]
#: The README's generated block: ``make paper`` fills it from the figures (docs/results.md).
RESULTS_BLOCK = re.compile(r"<!-- results:begin -->.*?<!-- results:end -->", re.S)

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


#: A notebook cell headed as worked by hand ("### Greedy growth and E(N) by hand") types a toy's inputs and the
#: steps a reader redoes with a pencil; the code cell after it checks every one against the library.
_BY_HAND = re.compile(r"^#+ .*\bby hand\b", re.IGNORECASE | re.M)


def notebook_violations(path: Path) -> list[str]:
    """Measured numbers typed in a notebook's Markdown cells (jupytext percent file), one message each; a cell headed
    as worked by hand (:data:`_BY_HAND`) is exempt."""
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(path)
    return [f"{path.name} cell {i}: {num}{unit!s} typed in Markdown ({sentence[:120]!r})"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown" and not _BY_HAND.search(cell.source)
            for num, unit, sentence in measured_numbers(cell.source)]


#: A heading that quotes others (:data:`QUOTE_MARKERS`: "Headline numbers reported by others") exempts its whole
#: section: every number under it is a published one, with its source named in the section.
_EXEMPT_HEADING = re.compile(r"^#+ .*\b(?:reported|quoted)\b", re.IGNORECASE)


def _without_exempt_sections(text: str) -> str:
    """The text without the sections under an exempt heading (until the next heading of the same or a higher level)
    and without the README's generated results block."""
    text = RESULTS_BLOCK.sub(" ", text)
    keep, skip_level = [], None
    for line in text.splitlines():
        h = re.match(r"^(#+) ", line)
        if h and skip_level is not None and len(h.group(1)) <= skip_level:
            skip_level = None
        if h and skip_level is None and _EXEMPT_HEADING.match(line):
            skip_level = len(h.group(1))
        keep.append("" if skip_level is not None else line)
    return "\n".join(keep)


def prose_violations(path: Path) -> list[str]:
    """Measured numbers typed in a README or docs page, one message each (a citation of a table does not exempt one:
    the number goes to the generated docs/results.md and the page points there)."""
    return [f"{path.name}: {num}{unit} typed ({sentence[:120]!r}): point to docs/results.md or the committed table "
            f"instead" for num, unit, sentence in measured_numbers(_without_exempt_sections(path.read_text()))]


# ----------------------------------------------------------------------------------------------------------------------
# The checks on this repository
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_markdown_types_no_measured_number(src):
    assert notebook_violations(src) == []


@pytest.mark.parametrize("path", PROSE_FILES, ids=[p.name for p in PROSE_FILES])
def test_readme_and_docs_type_no_measured_number(path):
    assert prose_violations(path) == []


def test_the_generated_page_is_left_to_its_generator():
    assert REPO / "docs" / "results.md" not in PROSE_FILES
    assert REPO / "README.md" in PROSE_FILES and len(PROSE_FILES) > 5


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


def test_typed_number_in_a_docs_page_fails_cited_or_not(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "99_probe.md").write_text("| decoder | speedup |\n| --- | ---: |\n| chain:4 | 1.634 |\n")
    page = tmp_path / "probe.md"
    page.write_text("# Probe\n\nChain 4 runs 1.63x AR (`figures/99_probe.md`).\n\n"
                    "Chain 4 runs 1.63x AR on this machine.\n\n"
                    "The paper reports 2.47 tokens per call.\n\n"
                    "How fast it is: [docs/results.md](results.md#speed), from `figures/99_probe.md`.\n\n"
                    "## Measurements (log, 2026-12-03)\n\nThe stream took 55.9 ms a frame.\n\n"
                    "## Headline numbers reported by others\n\nvllm-omni: 6.5 ms per frame.\n\n"
                    "## After\n\n| decoder | vs AR |\n|---|---:|\n| chain 4 | 1.6x |\n")
    bad = prose_violations(page)
    assert [b.split(" typed")[0] for b in bad] == ["probe.md: 1.63x", "probe.md: 1.63x", "probe.md: 55.9ms",
                                                   "probe.md: 1.6x"], bad


def test_typed_number_in_the_readme_fails_outside_the_results_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# rvqspec\n\n## Results at a glance\n\n<!-- results:begin -->\n"
                      "| decoder | vs AR |\n|---|---:|\n| chain:4 | 1.63x |\n<!-- results:end -->\n\n"
                      "Chain 4 runs 1.63x AR.\n")
    bad = prose_violations(readme)
    assert len(bad) == 1 and "1.63x" in bad[0] and "Chain 4 runs" in bad[0], bad


def test_the_calibration_split_size_is_one_number_read_from_the_data():
    """Notebooks 00, 03 and 04 print the shipped calibration split's size from this function, never typed."""
    from paper.notebook_measures import shipped_split_sizes
    from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances

    sizes = shipped_split_sizes("embedded")
    _, utts = load_shipped_utterances(embedded_root("embedded") / "utterances.safetensors", splits=["calibration"])
    assert sizes["calibration"]["utterances"] == len(utts) > 0
    assert sizes["calibration"]["frames"] == sum(int(u.codes.shape[0]) for u in utts)
    assert set(sizes) >= {"training", "validation", "evaluation", "calibration"}
