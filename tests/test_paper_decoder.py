"""The notebooks' helpers for the paper's decoder (rvqspec_lib.eval.paper_decoder) and the paired interval of tokens
per call (rvqspec_lib.eval.parity.paired_ratio_difference): exact values, and negative controls."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rvqspec_lib.eval import paper_decoder as PD
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
    assert PD.best_budget(cal) == 4
    assert PD.best_budget(cal, budgets=[8, 32]) == 8
    with pytest.raises(ValueError, match="none of the budgets"):
        PD.best_budget(cal, budgets=[16])


def _lang(codes, calls, n=None):
    codes, calls = np.asarray(codes, float), np.asarray(calls, float)
    return {"n_utterances": len(codes), "tokens_per_call": {"value": codes.sum() / calls.sum(), "ci_low": 0.0,
                                                            "ci_high": 9.0},
            "per_utterance": {"paper-N32": {"codes": list(codes), "calls": list(calls)},
                              "tree-pm-N32": {"codes": list(codes), "calls": list(calls * 1.1)}}}


def test_transfer_rows_and_the_answer_come_from_the_numbers():
    en = _lang([150.0] * 6, [100.0, 101.0, 99.0, 100.0, 102.0, 98.0])
    de = _lang([150.0] * 6, [140.0, 141.0, 139.0, 140.0, 142.0, 138.0])  # clearly fewer tokens per call
    es = _lang([150.0] * 6, [100.0, 99.0, 101.0, 100.0, 98.0, 102.0])  # as English
    for r in (en, de, es):
        r["tokens_per_call"] = {"paper-N32": r["tokens_per_call"], "tree-pm-N32": r["tokens_per_call"]}
    rows = PD.transfer_rows({"en": en, "de": de, "es": es}, "paper-N32", baseline="tree-pm-N32")
    by = {r["language"]: r for r in rows}
    assert "minus_english" not in by["en"] and by["en"]["ratio_to_english"] == 1.0
    assert by["de"]["minus_english"] == pytest.approx(150 * 6 / 840 - 150 * 6 / 600)
    assert by["de"]["minus_english_ci_high"] < 0 and by["es"]["minus_english_ci_low"] <= 0 <= \
        by["es"]["minus_english_ci_high"]
    assert all(r["gain_ci_low"] > 0 for r in rows)  # the baseline needs 10% more calls on every utterance
    text = PD.transfer_answer(rows)
    assert "lower than English in de;" in text and "kept (interval includes 0) in es" in text
    with pytest.raises(ValueError, match="needs the 'en' results"):
        PD.transfer_rows({"de": de}, "paper-N32")


def test_named_decoders_give_each_drafter_its_own_calibrated_tree():
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.tree_files import tree_file
    from rvqspec_lib.decoding.drafters import PositionOffsets

    lm = load_model("embedded")
    assert PD.has_paper_decoder(lm)
    decs = PD.named_decoders(lm, ["ar", "chain:4", "paper", "tree:calibrated-point-mass:32",
                                  "tree:calibrated-point-mass:32@offsets"])
    assert list(decs) == ["ar", "chain4", "paper-N32", "tree-pm-N32", "tree-pm-N32@offsets"]
    offsets = json.loads(tree_file(lm, "offsets").read_text())["point-mass"]["order"][:31]
    heads = json.loads(tree_file(lm, "heads").read_text())["point-mass"]["order"][:31]
    assert [list(p) for p in decs["paper-N32"].paths] == offsets == [list(p) for p in decs["tree-pm-N32@offsets"].paths]
    assert [list(p) for p in decs["tree-pm-N32"].paths] == heads
    assert isinstance(decs["paper-N32"].drafter, PositionOffsets) and decs["tree-pm-N32"].drafter is None
    assert offsets != heads  # negative control: the two drafters' calibrations give different trees
    assert PD.drafter_calibration(lm, "no-such-drafter") is None
    with pytest.raises(ValueError, match="not shipped|no drafter|train"):
        PD.named_decoders(lm, ["chain:4@no-such-drafter"])
