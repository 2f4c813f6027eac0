"""Two runs from two CPUs: `python -m tools.reproducibility A B --across-cpus` accepts in notebook 05's sampled tables
what their stated intervals allow and nothing else (docs/reproducibility.md#on-another-cpu). Exact checks on small
hand-made run folders, with negative controls: a conclusion that changes, and a value that must be equal everywhere."""

from __future__ import annotations

import csv
from pathlib import Path

from tools import reproducibility as R

HEADER = ["decoder", "wer", "diff_vs_ar", "ci95_low", "ci95_high", "p_value", "flagged", "n_utterances"]
ROWS = [["ar", "0.30", "", "", "", "", "", "30"],
        ["paper:32", "0.32", "0.02", "-0.08", "0.12", "0.60", "False", "30"]]


def _run(folder: Path, rows, codec_wer: str = "0.134") -> Path:
    folder.mkdir(parents=True)
    for name, header, body in (("05_wer_parity.csv", HEADER, rows),
                               ("00_codec_quality.csv", ["condition", "wer"], [["original", codec_wer]])):
        with (folder / name).open("w", newline="") as f:
            csv.writer(f).writerows([header, *body])
    return folder


def _compare(tmp_path: Path, rows, codec_wer: str = "0.134"):
    a = _run(tmp_path / "a", ROWS)
    b = _run(tmp_path / "b", rows, codec_wer)
    accepted: list[str] = []
    return R.compare_runs(a, b, across_cpus=accepted), accepted, R.compare_runs(a, b)


def test_within_the_stated_interval_is_accepted_and_listed(tmp_path):
    rows = [["ar", "0.31", "", "", "", "", "", "29"],  # no interval in AR's row: within 10%
            ["paper:32", "0.36", "0.05", "-0.06", "0.15", "0.41", "False", "30"]]  # half the interval is 0.10
    diffs, accepted, same_cpu = _compare(tmp_path, rows)
    assert diffs == []
    assert len(accepted) == 7 and all("05_wer_parity.csv" in line for line in accepted)
    assert same_cpu  # on one CPU the same change is a difference (the promise there is bit for bit)


def test_a_changed_conclusion_or_a_value_beyond_the_interval_is_a_difference(tmp_path):
    for changed in (["paper:32", "0.32", "0.02", "-0.08", "0.12", "0.01", "False", "30"],   # p crosses 0.05
                    ["paper:32", "0.32", "0.02", "-0.08", "0.12", "0.60", "True", "30"],    # a flag flips
                    ["paper:32", "0.45", "0.02", "-0.08", "0.12", "0.60", "False", "30"]):  # 0.13 > 0.10
        diffs, _, _ = _compare(tmp_path / changed[1 if changed[1] != "0.32" else 5] / changed[6], [ROWS[0], changed])
        assert len(diffs) == 1 and "05_wer_parity.csv" in diffs[0]


def test_the_recogniser_on_fixed_audio_must_be_equal_on_every_cpu(tmp_path):
    diffs, accepted, _ = _compare(tmp_path, ROWS, codec_wer="0.135")
    assert diffs == ["00_codec_quality.csv: column 'wer' differs first in row 1: '0.134' vs '0.135'"] and accepted == []


def test_the_rules_name_tables_and_columns_that_exist():
    figures = Path(__file__).resolve().parent.parent / "figures"
    for stem, rule in R.ACROSS_CPUS.items():
        path = figures / f"{stem}.csv"
        assert path.exists(), f"ACROSS_CPUS names {stem}, which make paper does not write"
        if isinstance(rule, tuple) and rule != R.ALL:
            header = path.read_text().splitlines()[0].split(",")
            assert set(rule) <= set(header), f"{stem}: no interval columns {rule}"
