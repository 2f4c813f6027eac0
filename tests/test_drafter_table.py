"""Table 2 here (paper.drafter_table), the drafters' training plan (paper.drafter_training.train_drafters) and
the drafter styles of the figures (paper.plots), on the tiny random model: fast checks of structure, names, fields
and arithmetic (what the numbers mean is tested in test_drafters.py and test_calibration.py; the notebook runs them on
the embedded model).

* every decoder is built by name: the chains and the small tree by their labels, each drafter's own tree as
  ``tree:calibrated-point-mass:N@LABEL`` and the deployed offsets' as ``paper:N``, its rows carrying the fields;
* Table 2's measured columns are copied from the results they come from; the paper's values only in ``paper: ...``;
* the margin of a drafter against itself is zero; the headroom is seeded; the chain rows find windows by fields;
* training several drafters: one row per rate, the curve rows, errors before training; the verifier's p cached or
  not gives the same drafter (negative control: another seed does not).
"""

from __future__ import annotations

import math

import pytest
import torch

from rvqspec_lib.data.frame_sources import frames_from_contexts
from rvqspec_lib.decoding.decoder_names import parse_decoder_name
from rvqspec_lib.decoding.drafters import PositionOffsets, ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval import acceptance as A
from paper import drafter_table as T
from paper import plots
from paper.notebook_measures import saturation_window
from rvqspec_lib.models.drafter_files import make_drafter
from rvqspec_lib.models.loader import load_model
from paper.drafter_training import TABLE2_DRAFTERS, train_drafters
from rvqspec_lib.training.drafters import train_drafter

SAMPLING = Sampling()
BUDGETS = (4, 32)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def frames(tiny):
    cp = tiny.code_predictor
    ctx = torch.randn(12, 2, cp.model.codec_embedding[0].embedding_dim, generator=torch.Generator().manual_seed(0))
    return frames_from_contexts(cp, ctx, sampling=SAMPLING, seed=1, frames_per_utterance=3)


def _offsets(cp, seed: int, loss: str):
    d = make_drafter("offsets", cp, fresh=True)
    with torch.no_grad():
        d.offsets.add_(0.5 * torch.randn(d.offsets.shape, generator=torch.Generator().manual_seed(seed)))
    d.provenance = {"loss": loss, "lr": 0.01, "best_epoch": 2}
    return d


@pytest.fixture(scope="module")
def drafters(tiny):
    cp = tiny.code_predictor
    return {"heads": ReusedHeads(), "offsets-ce": _offsets(cp, 1, "ce"), "offsets-tv": _offsets(cp, 2, "tv")}


@pytest.fixture(scope="module")
def measured(tiny, drafters, frames):
    cp = tiny.code_predictor
    results = T.evaluate_drafters(cp, drafters, frames, sampling=SAMPLING, seed=0)
    cals = T.calibrate_drafters(cp, drafters, frames, sampling=SAMPLING, budgets=BUDGETS, draws=1)
    own = T.own_tree_rows(cp, drafters, cals, frames, sampling=SAMPLING)
    return results, cals, own


def test_every_drafter_meets_the_same_decoders_by_name(measured, drafters):
    results, _, _ = measured
    assert list(results) == list(drafters)
    for lab, r in results.items():
        assert list(r["tokens_per_call"]) == list(T.EVAL_DECODERS), lab
        assert all(1.0 <= v <= 15.0 for v in r["tokens_per_call"].values())
        chains = {v["nodes"] for v in r["decoders"].values() if v["kind"] == "chain"}
        assert chains == set(range(2, 9))
    assert T.EVAL_DECODERS[-1] == "tree:0;1;0,0;0,0,0" == parse_decoder_name(T.EVAL_DECODERS[-1]).label


@pytest.mark.parametrize("bad", ["tree:calibrated:16", "chain:4@offsets", "ar", "paper"])
def test_evaluate_drafters_refuses_decoders_that_read_files_or_name_a_drafter(tiny, frames, bad):
    with pytest.raises(ValueError):
        T.evaluate_drafters(tiny.code_predictor, {"heads": ReusedHeads()}, frames, decoders=[bad])
    with pytest.raises(ValueError, match="no drafter"):
        T.evaluate_drafters(tiny.code_predictor, {}, frames)


def test_each_drafter_has_its_own_tree_named_in_the_grammar(measured, drafters):
    _, cals, own = measured
    assert set(cals) == set(drafters) and all(c["budgets"] == [4, 32] for c in cals.values())
    by = {r["drafter"]: r for r in own}
    assert len(own) == len(drafters) and all(r["nodes"] == 32 for r in own)  # the paper's budget by default
    assert by["heads"]["decoder"] == "tree:calibrated-point-mass:32" and by["heads"]["kind"] == "calibrated"
    assert by["offsets-ce"]["decoder"] == "tree:calibrated-point-mass:32@offsets-ce"
    assert by["offsets-tv"]["decoder"] == "tree:calibrated-point-mass:32@offsets-tv"  # never paper:N (the shipped)
    assert all(r["kind"] == "calibrated" for r in own)
    for lab, r in by.items():
        assert r["predicted"] == cals[lab]["point-mass"]["predicted_tokens_per_call"]["32"]
        assert r["predicted_sampled"] == cals[lab]["sampled"]["predicted_tokens_per_call"]["32"]
        assert r["tokens_per_call"] >= 1.0 and r["sampled"] is False
    # negative control: the trees differ between drafters (one shared tree would give everyone the heads')
    assert cals["heads"]["point-mass"]["table"] != cals["offsets-ce"]["point-mass"]["table"]
    assert T.own_tree_name("offsets-kl", 16) == "tree:calibrated-point-mass:16@offsets-kl"
    rows = T.predicted_by_budget(cals)
    assert len(rows) == len(drafters) * 2 * len(BUDGETS)
    assert {(r["kind"], r["nodes"]) for r in rows} == {(k, n) for k in ("point-mass", "sampled") for n in BUDGETS}


def test_own_trees_refuse_what_they_cannot_build(tiny, drafters, frames, measured):
    _, cals, _ = measured
    cp = tiny.code_predictor
    with pytest.raises(ValueError, match="no calibration"):
        T.own_tree_rows(cp, drafters, {"heads": cals["heads"]}, frames)
    with pytest.raises(ValueError):
        T.own_tree_rows(cp, {"heads": ReusedHeads()}, cals, frames, budgets=(16,))  # not calibrated


def test_table2_copies_its_columns_and_keeps_the_paper_apart(tiny, measured, drafters):
    results, cals, own = measured
    n_cp = sum(p.numel() for p in tiny.code_predictor.parameters())
    rows = T.table2(results, own, cals, drafters, params_code_predictor=n_cp, params_model=10 * n_cp, K=3)
    by = {r["label"]: r for r in rows}
    assert list(by) == list(drafters)
    own_by = {r["drafter"]: r for r in own}
    for lab, r in by.items():
        assert r["tree_N32_tokens_per_call"] == own_by[lab]["tokens_per_call"]
        assert r["decoder"] == own_by[lab]["decoder"]
        assert r["best_N"] == 32 and r["tree_bestN_predicted"] == r["tree_N32_predicted"]  # E(N) never falls
        chains = {w: results[lab]["tokens_per_call"][f"chain:{w}"] for w in range(2, 9)}
        assert r["chain_best"] == max(chains.values()) == chains[r["chain_best_window"]]
        assert r["chain4_tokens_per_call"] == chains[4]
        assert r["small_tree_tokens_per_call"] == results[lab]["tokens_per_call"]["tree:0;1;0,0;0,0,0"]
        assert r["added_params"] == drafters[lab].params_added
        assert r["pct_model"] == pytest.approx(r["pct_code_predictor"] / 10)
    assert by["heads"]["added_params_at_0.6B"] == 0 and by["offsets-ce"]["added_params_at_0.6B"] == 3072
    assert by["heads"]["loss"] is None and by["offsets-tv"]["loss"] == "tv" and by["offsets-ce"]["kept_epoch"] == 2
    # the paper's values only in their own columns, only for the rows the paper has
    assert {lab: r["paper: toks/step (N 32 tree)"] for lab, r in by.items()} == \
        {"heads": 1.70, "offsets-ce": 2.47, "offsets-tv": None}
    assert by["offsets-ce"]["paper: added params"] == "3,072" and by["offsets-tv"]["paper: added params"] is None
    assert T.best_by(rows, "tree_N32_tokens_per_call") == max(rows, key=lambda r: r["tree_N32_tokens_per_call"])["label"]
    with pytest.raises(ValueError, match="no results"):
        T.table2(results, [r for r in own if r["drafter"] != "heads"], cals, drafters, params_code_predictor=1,
                  params_model=1, K=3)


def test_margin_of_a_drafter_against_itself_is_zero(tiny, drafters, frames, measured):
    results, _, _ = measured
    cp = tiny.code_predictor
    same = {"heads": ReusedHeads(), "copy": ReusedHeads()}
    (row,) = T.margin_rows(cp, same, frames, sampling=SAMPLING)
    assert row["difference"] == 0 and row["ci95_low"] == row["ci95_high"] == 0 and "chain4_gain" not in row
    rows = T.margin_rows(cp, drafters, frames, sampling=SAMPLING, results=results)
    assert [r["drafter"] for r in rows] == ["offsets-ce", "offsets-tv"]
    for r in rows:
        assert r["ci95_low"] <= r["difference"] <= r["ci95_high"] and r["n_utterances"] == 4 and r["n_frames"] == 12
        assert r["chain4_gain"] == pytest.approx(results[r["drafter"]]["tokens_per_call"]["chain:4"]
                                                 - results["heads"]["tokens_per_call"]["chain:4"])
        assert [k for k in r if k.startswith("difference_t")] == ["difference_t1", "difference_t2", "difference_t3"]
    with pytest.raises(ValueError, match="baseline"):
        T.margin_rows(cp, {"offsets-ce": drafters["offsets-ce"]}, frames)


def test_headroom_rows_are_seeded_and_bounded(tiny, drafters, frames):
    cp = tiny.code_predictor
    kw = dict(n_frames=4, samples=2, n_ahead=2, sampling=SAMPLING)
    hr, rows = T.headroom_rows(cp, drafters, frames, seed=3, **kw)
    again, _ = T.headroom_rows(cp, drafters, frames, seed=3, **kw)
    other, _ = T.headroom_rows(cp, drafters, frames, seed=4, **kw)
    assert hr == again and hr != other and hr["n_frames"] == 4
    assert [r["offset_t"] for r in rows] == [1, 2] and "offsets-tv_captured" in rows[0]
    for lab, acc in hr["drafters"].items():
        assert all(a <= c + 1e-9 for a, c in zip(acc, hr["ceiling"])), lab


def test_acceptance_tables_and_chain_windows_come_from_the_results(measured, drafters):
    results, _, _ = measured
    tables = T.acceptance_tables(results, K=3)
    assert [r["depth"] for r in tables["by_depth"]] == list(range(2, results["heads"]["n_codes"] + 1))
    for lab in drafters:
        assert [r[lab] for r in tables["by_offset"]] == results[lab]["exact"]["alpha_by_offset"]
        depth = A.acceptance_by_depth([[math.nan if v is None else v for v in row]
                                       for row in results[lab]["exact"]["alpha"]], max_offset=3)
        assert [r[lab] for r in tables["by_depth"]] == pytest.approx(list(depth[2:]), nan_ok=True)
    rank = tables["rank"]
    assert len(rank) == 3 * len(drafters) and {r["offset_t"] for r in rank} == {1, 2, 3}
    for r in rank:  # a point-mass draft of rank r is kept with E[p(x_r)]: summed over ranks, at most 1
        ranks = [r[k] for k in r if k.startswith("rank")]
        assert r["top_ranks_total"] == pytest.approx(sum(ranks)) and r["top_ranks_total"] <= 1 + 1e-9
    rows, saturation = T.chain_window_rows(results)
    assert len(rows) == 7 * len(drafters) and [r["window"] for r in rows[:7]] == list(range(2, 9))
    assert all(r["decoder"] == f"chain:{r['window']}" for r in rows)
    assert saturation == {lab: saturation_window(r) for lab, r in results.items()}


def test_drafter_family_and_the_figures_styles():
    assert [T.drafter_family(x) for x in ("heads", "offsets-tv", "medusa", "medusa-tv")] == \
        ["heads", "offsets", "medusa", "medusa"]
    purple, brown = plots.DECODER_COLORS["offsets"], plots.DECODER_COLORS["medusa"]
    assert plots.decoder_color({"drafter": "offsets-tv"}) == purple == plots.drafter_style("offsets-ce")["color"]
    assert plots.decoder_color({"kind": "calibrated", "drafter": "offsets-kl", "sampled": False}) == purple
    assert plots.drafter_style("medusa-tv")["color"] == brown == plots.drafter_style("medusa")["color"]
    assert plots.drafter_style("heads")["color"] == plots.DECODER_COLORS["heads"]
    assert plots.decoder_color("chain:4") == plots.DECODER_COLORS["chain"]  # the heads drafting a chain: the chain's
    styles = {plots.drafter_style(x)["marker"] + plots.drafter_style(x)["ls"] for x in
              ("offsets-ce", "offsets-kl", "offsets-tv")}
    assert len(styles) == 3  # one colour, three looks
    assert plots.sampling_words(Sampling()) == "temperature 0.9, top-k 50"
    assert plots.sampling_words({"temperature": 1.0, "top_k": 0, "top_p": 0.8, "greedy": False}) == "temperature 1, top-p 0.8"
    assert plots.sampling_words(Sampling(greedy=True)) == "greedy"


def test_train_drafters_trains_the_plan_and_refuses_a_bad_one(tiny, frames):
    cp = tiny.code_predictor
    train, val = frames.subset(torch.arange(0, 9)), frames.subset(torch.arange(9, 12))
    plan = {lab: TABLE2_DRAFTERS[lab] for lab in ("offsets-ce", "medusa-tv")}
    run = train_drafters(cp, plan, train, val, K=3, lrs={"offsets-ce": [1e-2, 1e-3]}, sampling=SAMPLING,
                         batch_size=4, max_epochs=1, patience=1, seed=0)
    assert list(run.drafters) == ["offsets-ce", "medusa-tv"]
    assert [(r["drafter"], r["lr"]) for r in run.lr_rows] == [("offsets-ce", 1e-2), ("offsets-ce", 1e-3),
                                                             ("medusa-tv", 1e-3)]  # medusa: its default rate
    assert isinstance(run.drafters["offsets-ce"], PositionOffsets)
    assert run.drafters["medusa-tv"].provenance["loss"] == "tv"
    curve = run.curve_rows()
    assert {r["drafter"] for r in curve} == set(plan) and {r["epoch"] for r in curve} == {0, 1}
    assert set(curve[0]) == {"drafter", "epoch", "train_loss", "val_loss", "val_acceptance_t1", "val_acceptance_t2",
                             "val_acceptance_t3", "wall_s"}
    for bad in ({}, {"x": ("offsets", "mse")}, {"x": ("heads", "ce")}):
        with pytest.raises(ValueError):
            train_drafters(cp, bad, train, val, K=3)


def test_caching_the_verifier_distribution_does_not_change_training(tiny, frames):
    cp = tiny.code_predictor
    train, val = frames.subset(torch.arange(0, 9)), frames.subset(torch.arange(9, 12))
    kw = dict(loss="tv", sampling=SAMPLING, batch_size=4, max_epochs=2, patience=2, lr=1e-2)

    def curve(**extra):
        res = train_drafter(make_drafter("offsets", cp, fresh=True), cp, train, val, **{"seed": 0, **kw, **extra})
        return [v for c in res.curve[1:] for v in (c["train_loss"], c["val_loss"], c["val_acceptance"])]

    cached, per_batch, other = curve(), curve(cache_mb=0), curve(seed=5)  # cache_mb 0: p computed at every step
    assert cached == pytest.approx(per_batch, rel=1e-5)
    assert other != pytest.approx(cached, rel=1e-5)  # negative control: another batch order trains another drafter
