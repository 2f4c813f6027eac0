"""The statistics of WER parity (rvqspec_lib.eval.parity): exact values on hand-made cases, the level of each test
under its null, its power against a stated shift, and negative controls that a test must flag.

False failures: the Monte Carlo checks below use fixed seeds, so each either always passes or always fails; their
tolerances are 4 standard errors of the simulated rate (a random seed would fail one of them with probability
below 1e-4 each).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from paper import notebook_measures as M
from paper import wer_report as R
from rvqspec_lib.eval import parity as S


def _utts(errors, words=None, refs=None, outliers=None):
    words = words or [10] * len(errors)
    refs = refs or [f"sentence {i}" for i in range(len(errors))]
    out = []
    for i, (e, w) in enumerate(zip(errors, words)):
        why = (outliers or {}).get(i, "")
        out.append({"ref": refs[i], "hyp": "", "rate": e / w, "substitutions": e, "deletions": 0, "insertions": 0,
                    "ref_units": w, "outlier": bool(why), "why": why})
    return out


# ----------------------------------------------------------------------------------------------------------------
# paired WER difference
# ----------------------------------------------------------------------------------------------------------------
def test_identical_runs_differ_by_exactly_nothing():
    a = _utts([3, 1, 4, 1, 5, 9, 2, 6])
    r = S.paired_wer_difference(a, a)
    assert r["difference"] == 0 and r["ci_low"] == 0 and r["ci_high"] == 0
    assert r["p_value"] == 1.0 and not r["detected"] and r["wer_a"] == r["wer_ref"] == 31 / 80


def test_paired_difference_value_and_a_clearly_worse_decoder_is_flagged():
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 5, 40).tolist()
    worse = [e + 2 for e in ref]  # two more errors in every utterance of 10 words: +0.2 WER
    r = S.paired_wer_difference(_utts(worse), _utts(ref))
    assert r["difference"] == pytest.approx(0.2) and r["ci_low"] == pytest.approx(0.2)
    assert r["detected"] and r["p_value"] < 1e-3
    # the negative control of the flag: the same errors shuffled between the two runs is not flagged
    mixed = [(a, b) if i % 2 else (b, a) for i, (a, b) in enumerate(zip(worse, ref))]
    r2 = S.paired_wer_difference(_utts([m[0] for m in mixed]), _utts([m[1] for m in mixed]))
    assert r2["difference"] == 0 and not r2["detected"]


def test_outliers_are_left_out_and_counted():
    ref = _utts([1] * 10)
    a = _utts([1] * 9 + [40], outliers={9: "repetition: 'the' x12"})
    r = S.paired_wer_difference(a, ref)
    assert r["n_outliers_a"] == 1 and r["n_outliers_either"] == 1 and r["n_utterances"] == 9
    assert r["difference"] == 0 and r["difference_with_outliers"] == pytest.approx(39 / 100)
    with pytest.raises(ValueError, match="same references"):
        S.paired_wer_difference(_utts([1, 2], refs=["a", "b"]), _utts([1, 2], refs=["a", "c"]))
    few = S.paired_wer_difference(_utts([1, 2]), _utts([1, 2], outliers={0: "x"}))
    assert few["n_utterances"] == 1 and math.isnan(few["ci_low"]) and not few["detected"] and few["note"]


def test_sign_flip_test_keeps_its_level_under_exchangeable_errors():
    """Under the null (both decoders draw an utterance's errors from one law), p < 0.05 happens at most 5% of the
    time (the test is exact up to the Monte Carlo of the flips): 300 simulated comparisons, 4 SE of slack."""
    rng = np.random.default_rng(1)
    hits = 0
    n = 300
    for i in range(n):
        lam = rng.uniform(0.5, 4, 30)
        a, b = rng.poisson(lam), rng.poisson(lam)
        hits += S.paired_wer_difference(_utts(a.tolist()), _utts(b.tolist()), n_boot=200, n_perm=500,
                                        seed=i)["p_value"] < 0.05
    assert hits / n <= 0.05 + 4 * math.sqrt(0.05 * 0.95 / n)


def test_sentences_needed_scales_as_one_over_the_squared_difference():
    z = stats.norm.isf(1e-3 / 2) + stats.norm.isf(0.2)
    assert M.sentences_needed(0.02, 0.01, 100) == pytest.approx(100 * (z * 0.01 / 0.02) ** 2)
    assert M.sentences_needed(0.01, 0.01, 100) == pytest.approx(4 * M.sentences_needed(0.02, 0.01, 100))
    assert M.sentences_needed(0.0, 0.01, 100) == math.inf


# ----------------------------------------------------------------------------------------------------------------
# two-sample test, power
# ----------------------------------------------------------------------------------------------------------------
def test_pooled_bins_expect_five_in_both_samples_and_respect_the_cap():
    rng = np.random.default_rng(2)
    a = np.bincount(rng.zipf(1.5, 3000) % 500, minlength=600)
    b = np.bincount(rng.zipf(1.5, 1000) % 500, minlength=600)
    for cap in (None, 16):
        bins = S.pooled_bins(a, b, max_bins=cap)
        assert (bins[(a + b) == 0] == -1).all() and (bins[(a + b) > 0] >= 0).all()
        k = bins.max() + 1
        tot = np.bincount(bins[bins >= 0], weights=(a + b)[bins >= 0], minlength=k)
        assert (tot * min(a.sum(), b.sum()) / (a.sum() + b.sum()) >= 5).all()
        assert cap is None or k <= cap


def test_two_sample_test_level_and_a_shift_is_flagged():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(50))
    x, y = rng.choice(50, 5000, p=p), rng.choice(50, 5000, p=p)
    same = S.two_sample_test(x, y, max_bins=16)
    assert same["p_value"] > 1e-3 and same["df"] == same["bins"] - 1 <= 15
    q = p.copy()
    top = np.argsort(-p)[:5]
    q[top] *= 1.5
    q /= q.sum()
    z = rng.choice(50, 5000, p=q)
    assert S.two_sample_test(x, z, max_bins=16)["p_value"] < 1e-6
    assert S.two_sample_test(np.zeros(10, int), np.zeros(5, int))["p_value"] == 1.0
    with pytest.raises(ValueError, match="non-negative integers"):
        S.two_sample_test(np.array([0.5]), np.array([1]))


def test_power_bound_holds_for_the_least_detectable_shift():
    """The bound of power_two_sample is met by simulation, with the shift in the direction the Cauchy-Schwarz bound
    is tight for (proportional to p: +tv on half the mass, -tv on the other half), 200 simulated pairs."""
    rng = np.random.default_rng(4)
    k, tv, n = 16, 0.05, 6000
    p = np.full(k, 1 / k)
    q = p * np.where(np.arange(k) < k // 2, 1 + 2 * tv, 1 - 2 * tv)
    assert 0.5 * np.abs(q - p).sum() == pytest.approx(tv)
    level = 1e-3
    df = k - 1
    bound = S.power_two_sample(n, n, df, tv=tv, level=level)
    assert 0.3 < bound < 0.99  # an informative case
    sims = 200
    hits = sum(S.two_sample_test(rng.choice(k, n, p=p), rng.choice(k, n, p=q), n_categories=k)["p_value"] < level
               for _ in range(sims))
    assert hits / sims >= bound - 4 * math.sqrt(bound * (1 - bound) / sims)


def test_samples_needed_and_detectable_tv_invert_the_power_bound():
    n = M.samples_needed(0.05, 15, power=0.9, level=1e-4)
    assert S.power_two_sample(n, n, 15, tv=0.05, level=1e-4) >= 0.9 > S.power_two_sample(n - 1, n - 1, 15, tv=0.05,
                                                                                        level=1e-4)
    tv = S.detectable_tv(n, n, 15, power=0.9, level=1e-4)
    assert tv == pytest.approx(0.05, rel=1e-3)
    assert M.samples_needed(0.0, 15) == math.inf and math.isnan(S.power_two_sample(10, 10, 0))


def test_holm_adjustment():
    adj = S.holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02])
    assert (S.holm([0.9, 0.8]) <= 1).all()


# ----------------------------------------------------------------------------------------------------------------
# outliers, bootstrap means, Table 1
# ----------------------------------------------------------------------------------------------------------------
def test_flag_outliers_by_wer_length_and_cap():
    u = _utts([1, 2, 1, 2, 1, 2, 1, 30])
    why = S.flag_outliers(u)
    assert [bool(w) for w in why] == [False] * 7 + [True] and "IQR" in why[7]
    why = S.flag_outliers(_utts([1] * 4), lengths=[10, 10, 50, 10], ref_lengths=[10, 10, 10, 10],
                          capped=[False, False, False, True])
    assert [bool(w) for w in why] == [False, False, True, True] and "frames" in why[2] and "cap" in why[3]
    rep = _utts([1, 1, 1, 1], outliers={1: "repetition: 'a' x5"})
    assert S.flag_outliers(rep)[1].startswith("repetition")
    with pytest.raises(ValueError, match="lengths"):
        S.flag_outliers(rep, lengths=[1])


def test_bootstrap_ratio_of_totals():
    r = S.bootstrap_mean([15, 15, 15], [15, 5, 6])
    assert r["value"] == pytest.approx(45 / 26) and r["ci_low"] <= r["value"] <= r["ci_high"]
    assert S.bootstrap_mean([3.0], [1.0]) == {"value": 3.0, "ci_low": 3.0, "ci_high": 3.0, "n": 1}
    d = S.bootstrap_difference([30, 30], [10, 10], [15, 15], [15, 15])
    assert d["difference"] == pytest.approx(2.0) and d["ci_low"] == d["ci_high"] == pytest.approx(2.0)


def test_table1_rows_group_and_sum():
    entries = [{"split": "evaluation", "role": "r", "language": lang, "seconds": s, "frames": f}
               for lang, s, f in (("de", 3600.0, 10), ("en", 1800.0, 5), ("en", 1800.0, 7))]
    entries.insert(0, {"split": "calibration", "role": "c", "language": "en", "seconds": 36.0, "frames": 2})
    rows = S.table1_rows(entries)
    assert [(r["split"], r["language"]) for r in rows] == [("calibration", "en"), ("evaluation", "en"),
                                                          ("evaluation", "de")]
    assert rows[1] == {"split": "evaluation", "role": "r", "language": "en", "samples": 2, "hours": 1.0,
                       "frames": 12}
    with pytest.raises(ValueError, match="lacks"):
        S.table1_rows([{"split": "x"}])
    used = S.entries_used([{"frames": 10, "seconds": 1.0}, {"frames": 10, "seconds": 2.0}], 15)
    assert [u["frames"] for u in used] == [10, 5] and used[1]["seconds"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------------------------
# WER tables and the verdicts in words
# ----------------------------------------------------------------------------------------------------------------
def _verdict(lang, decoder, *, lossy=False, flagged_by="none", **kw):
    row = {"language": lang, "decoder": decoder, "kind": "ssd-lossy" if lossy else "chain", "lossy": lossy,
           "lossless": not lossy, "code_min_p_holm": 0.5, "code_at": "rank depth 4", "level": 1e-3 / 30,
           "alpha": 1e-3, "n_per_sample": 300, "detectable_tv": 0.3, "max_tv_observed": 0.1, "flagged_by": flagged_by}
    return {**row, **kw}


def test_verdict_text_says_where_the_lossy_control_was_caught_and_why_it_was_missed():
    rows = [_verdict("en", "ar-seed2", max_tv_observed=0.12),
            _verdict("en", "ssd-lossy:0.4", lossy=True, flagged_by="code distribution (rank depth 4)",
                     code_min_p_holm=1e-11, wer_test="not flagged", wer_diff=-0.07, wer_ci_low=-0.2, wer_ci_high=0.1,
                     wer_n_utterances=16, wer_mde80=0.31, sentences_needed=281.5, free_wer_test="not flagged",
                     free_wer_diff=0.1, free_wer_ci_low=float("nan"), free_wer_ci_high=float("nan")),
            _verdict("es", "ar-seed2", max_tv_observed=0.15),
            _verdict("es", "chain:8", flagged_by="code distribution (code depth 2)"),
            _verdict("es", "ssd-lossy:0.4", lossy=True, code_min_p_holm=0.004, max_tv_observed=0.2,
                     samples_needed_code=633)]
    text = R.verdict_text(rows)
    en, es, alarms, last = text.split("\n\n")
    assert en.startswith("**en**, 300 codes per depth") and "was caught, by code distribution (rank depth 4)" in en
    assert "1.0e-11" in en and "-0.070 [-0.200, +0.100] over 16 utterances" in en and "282 sentences" in en
    assert "Free running: +0.100 (too few sentences for an interval)" in en  # no interval from NaN bounds
    assert "was missed" in es and "0.004" in es and "0.200" in es and "noise alone: 0.150" in es
    assert "633 codes per depth, 2.1 times this run's" in es
    assert alarms.endswith("es: `chain:8` (code distribution (code depth 2)).")  # a lossless decoder flagged
    assert last == "**The lossy control was caught in 1 of 2 languages** (en); missed in es."
    assert "none." in R.verdict_text(rows[:2]).split("\n\n")[1]  # no false alarm


def test_wer_table_keys_rows_by_fields_and_puts_the_floor_last():
    fields = {k: {"decoder": k, "kind": kind, "drafter": None, "nodes": 1, "lossy": kind == "ssd-lossy",
                  "sampled": False} for k, kind in (("ar", "ar"), ("ssd-lossy:0.4", "ssd-lossy"))}
    wer = {"ar": {"rate": 0.5, "cer": 0.3, "rate_without_outliers": 0.5, "n_outliers": 0, "per_utterance": [0.5] * 4,
                  "outliers": []},
           "ssd-lossy:0.4": {"rate": 0.6, "cer": 0.4, "rate_without_outliers": 0.55, "n_outliers": 1,
                             "per_utterance": [0.6] * 4,
                             "outliers": [{"index": 2, "why": "repetition", "ref": "a", "hyp": "b b b"}],
                             "vs_reference": {"difference": 0.05, "ci_low": -0.1, "ci_high": 0.2, "p_value": 0.4,
                                              "detected": False, "mde80": 0.3}}}
    rows = R.wer_table(wer, fields, ended={"ar": [True] * 4, "ssd-lossy:0.4": [True, False, True, True]},
                       floor={"rate": 0.2, "cer": 0.1, "n_utterances": 4})
    assert [r["decoder"] for r in rows] == ["ar", "ssd-lossy:0.4", R.TRUE_CODES]
    assert tuple(rows[1])[:6] == S.WER_ROW_FIELDS and rows[1]["lossy"] and rows[1]["ended_by_itself"] == 3
    assert rows[0]["diff_vs_ar"] is None and rows[1]["diff_vs_ar"] == 0.05 and rows[1]["n_utterances"] == 4
    assert rows[2]["wer"] == 0.2 and rows[2]["kind"] is None and "tokens_per_call" not in rows[0]
    assert R.outlier_rows({"inner loop": wer}) == [{"path": "inner loop", "decoder": "ssd-lossy:0.4", "index": 2,
                                                    "why": "repetition", "ref": "a", "hyp": "b b b"}]
    assert R.outlier_rows({"inner loop": {"ar": wer["ar"]}}) == []
