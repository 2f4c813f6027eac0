"""The paper's decoder's helpers: its best node budget (paper.drafter_table.best_budget), Table 3's transfer
question (paper.wer_report.transfer_rows, transfer_answer) and the paired interval of tokens per call
(rvqspec_lib.eval.parity.paired_ratio_difference): exact values, and negative controls. Resolving the paper's decoder
by name: tests/test_named_decoders.py."""

from __future__ import annotations

import numpy as np
import pytest

from paper.drafter_table import best_budget
from paper.wer_report import transfer_answer, transfer_rows
from rvqspec_lib.eval.parity import paired_ratio_difference


def test_paired_ratio_difference_exact_and_paired():
    codes = [15.0, 30.0, 45.0, 15.0]
    calls_a, calls_b = [10.0, 20.0, 30.0, 12.0], [12.0, 24.0, 36.0, 13.0]
    d = paired_ratio_difference(codes, calls_a, codes, calls_b)
    assert d["difference"] == sum(codes) / sum(calls_a) - sum(codes) / sum(calls_b) and d["n"] == 4
    assert 0 < d["ci_low"] <= d["difference"] <= d["ci_high"]  # A needs fewer calls on every utterance
    same = paired_ratio_difference(codes, calls_a, codes, calls_a)
    assert same == {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 4}  # negative control: no difference
    with pytest.raises(ValueError, match="same utterances"):
        paired_ratio_difference(codes, calls_a, codes[:3], calls_b[:3])


def test_best_budget_is_the_highest_prediction_ties_to_the_smaller():
    cal = {"budgets": [2, 4, 8, 32], "point-mass": {"predicted_tokens_per_call": {"2": 1.1, "4": 1.3, "8": 1.3,
                                                                                "32": 1.2}}}
    assert best_budget(cal) == 4


def _lang(codes, calls, n=None):
    codes, calls = np.asarray(codes, float), np.asarray(calls, float)
    return {"n_utterances": len(codes), "tokens_per_call": {"value": codes.sum() / calls.sum(), "ci_low": 0.0,
                                                            "ci_high": 9.0},
            "per_utterance": {"paper:32": {"codes": list(codes), "calls": list(calls)},
                              "tree:calibrated-point-mass:32": {"codes": list(codes), "calls": list(calls * 1.1)}}}


def test_transfer_rows_and_the_answer_come_from_the_numbers():
    en = _lang([150.0] * 6, [100.0, 101.0, 99.0, 100.0, 102.0, 98.0])
    de = _lang([150.0] * 6, [140.0, 141.0, 139.0, 140.0, 142.0, 138.0])  # clearly fewer tokens per call
    es = _lang([150.0] * 6, [100.0, 99.0, 101.0, 100.0, 98.0, 102.0])  # as English
    for r in (en, de, es):
        r["tokens_per_call"] = {"paper:32": r["tokens_per_call"], "tree:calibrated-point-mass:32": r["tokens_per_call"]}
    rows = transfer_rows({"en": en, "de": de, "es": es}, "paper:32", baseline="tree:calibrated-point-mass:32")
    by = {r["language"]: r for r in rows}
    assert "minus_english" not in by["en"] and by["en"]["ratio_to_english"] == 1.0
    assert by["de"]["minus_english"] == pytest.approx(150 * 6 / 840 - 150 * 6 / 600)
    assert by["de"]["minus_english_ci_high"] < 0 and by["es"]["minus_english_ci_low"] <= 0 <= \
        by["es"]["minus_english_ci_high"]
    assert all(r["gain_ci_low"] > 0 for r in rows)  # the baseline needs 10% more calls on every utterance
    text = transfer_answer(rows)
    assert "lower than English in de;" in text and "not distinguishable from English (the interval includes 0) in es" \
        in text and "above 0" not in text and "everywhere" not in text
    # a language whose interval lies above 0 is said to be higher, never "kept" below an interval excluding 0
    fr = _lang([150.0] * 6, [80.0, 81.0, 79.0, 80.0, 82.0, 78.0])  # clearly more tokens per call
    fr["tokens_per_call"] = {"paper:32": fr["tokens_per_call"], "tree:calibrated-point-mass:32": fr["tokens_per_call"]}
    up = transfer_answer(transfer_rows({"en": en, "fr": fr}, "paper:32", baseline="tree:calibrated-point-mass:32"))
    assert "higher than English (the interval lies above 0) in fr" in up and "No language is below English" in up
    # the gain over the baseline: said to be absent only when every language's interval includes 0
    assert "not a gain the offsets add" not in text
    for r in (en, fr):  # the baseline's tree as good as the paper's on every utterance: no gain anywhere
        pu = r["per_utterance"]
        pu["tree:calibrated-point-mass:32"] = {"codes": list(pu["paper:32"]["codes"]),
                                               "calls": list(pu["paper:32"]["calls"])}
    same = transfer_answer(transfer_rows({"en": en, "fr": fr}, "paper:32", baseline="tree:calibrated-point-mass:32"))
    assert "includes 0 in every language" in same
    with pytest.raises(ValueError, match="needs the 'en' results"):
        transfer_rows({"de": de}, "paper:32")
