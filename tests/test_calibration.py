"""Tree calibration: the greedy builder, the per-child acceptance table, and predicted vs measured tokens per call."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rvqspec_lib.eval.acceptance import decoder_statistics, exact_statistics
from rvqspec_lib.eval.calibration import (
    calibrate,
    pool_by_offset,
    sampled_child_acceptance,
)
from rvqspec_lib.data.frame_sources import frames_from_contexts
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.decoding.decoder_names import tree_from_calibration
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.trees import DraftTree, expected_tokens, grow_tree


def test_grow_tree_is_greedy_and_valid():
    v = [[0.5, 0.2, 0.1], [0.4, 0.1, 0.05], [0.3, 0.1, 0.0]]
    paths = grow_tree(v, 5, sampled=False)
    assert paths == [(0,), (1,), (0, 0), (2,), (1, 0)]
    DraftTree.from_paths(paths)  # a valid tree (every prefix present)
    assert expected_tokens(paths, v) == pytest.approx(1 + 0.5 + 0.2 + 0.2 + 0.1 + 0.08)
    # every prefix of the list is the best tree of its size: brute force over all valid trees of 3 nodes
    import itertools
    cands = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    best = max((t for t in itertools.combinations(cands, 3) if all(len(p) == 1 or p[:-1] in t for p in t)),
               key=lambda t: expected_tokens(t, v))
    assert expected_tokens(paths[:3], v) == pytest.approx(expected_tokens(best, v))


def test_grow_tree_sampled_children_come_in_order():
    v = [[0.3, 0.9], [0.5, 0.5]]  # child 1 more valuable than child 0: still drawn after it
    paths = grow_tree(v, 3, sampled=True)
    assert paths.index((0,)) < paths.index((1,))
    for p in paths:
        if p[-1] > 0:
            assert p[:-1] + (p[-1] - 1,) in paths
    assert grow_tree(v, 3, sampled=False)[0] == (1,)  # point-mass ranks may be skipped


@pytest.mark.parametrize("bad", [[], [[0.5], [0.2, 0.1]], [[1.5]], [[float("nan")]]])
def test_grow_tree_rejects_bad_tables(bad):
    with pytest.raises(ValueError):
        grow_tree(bad, 2, sampled=False)


@pytest.fixture(scope="module")
def small():
    """A 4-group (3 codes a frame) code predictor of the official classes, heads sharpened, and frames whose codes
    are samples of p from random contexts."""
    cfg = tiny_config_dict(n_code_groups=4, codebook_size=16)
    cp = build_from_config(cfg, seed=0).talker.code_predictor
    with torch.no_grad():
        for head in cp.lm_head:
            head.weight.mul_(20.0)
    h = cfg["talker_config"]["hidden_size"]
    ctx = torch.randn(64, 2, h, generator=torch.Generator().manual_seed(0))
    return cp, frames_from_contexts(cp, ctx, seed=1)


def test_child_zero_acceptance_equals_alpha(small):
    """Child 0 of a sampled node is accepted with sum min(p, q) in expectation: the Monte Carlo table agrees with the
    exact alpha to 4 standard errors (64 frames x 2 start depths x 200 draws)."""
    cp, frames = small
    exact = exact_statistics(cp, ReusedHeads(), frames.context, frames.codes, n_ahead=2)
    child = sampled_child_acceptance(cp, ReusedHeads(), frames.context, frames.codes, n_ahead=2, max_children=3,
                                     draws=200, seed=0)
    ok = ~np.isnan(exact["alpha"])
    assert np.allclose(child[..., 0][ok], exact["alpha"][ok], atol=0.03)
    # probabilities of disjoint events: children's acceptances sum to at most 1
    assert np.all(np.nansum(child, -1)[ok] <= 1 + 1e-9)


def test_predicted_tokens_per_call_matches_measured(small):
    """The calibration's E(N) for each kind and budget is within 5% of the tokens per call measured by decoding
    4,000 frames (a different seed, contexts re-used: the prediction is exact in expectation up to the offsets'
    independence; SE of the measurement < 0.5%)."""
    cp, frames = small
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 4, 8), draws=50, seed=0)
    ctx = frames.context.repeat(64, 1, 1)
    for kind in ("point-mass", "sampled"):
        for b in (2, 4, 8):
            tree = tree_from_calibration(cal, kind, b)
            assert tree.tree(3).n_nodes == b - 1 and tree.sampled == (kind == "sampled")
            got = decoder_statistics(cp, ReusedHeads(), ctx, tree, seed=3)["tokens_per_call"]
            pred = cal[kind]["predicted_tokens_per_call"][str(b)]
            assert math.isclose(pred, got, rel_tol=0.05), (kind, b, pred, got)
    assert set(cal["best_kind"].values()) <= {"point-mass", "sampled"}


def test_calibration_errors(small):
    cp, frames = small
    with pytest.raises(ValueError, match="2..64"):
        calibrate(cp, ReusedHeads(), frames, budgets=(1, 4))
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 3), draws=1)
    with pytest.raises(ValueError, match="node budget 16"):
        tree_from_calibration(cal, "sampled", 16)
    with pytest.raises(ValueError, match="kind beam"):
        tree_from_calibration(cal, "beam", 2)


def test_pool_by_offset_skips_missing_start_depths():
    t = np.array([[[0.5, 0.1]], [[np.nan, np.nan]], [[0.3, 0.1]]])
    assert np.allclose(pool_by_offset(t), [[0.4, 0.1]])


def test_calibration_file_round_trip_and_names(small, tmp_path):
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name
    from rvqspec_lib.models.named_decoders import resolve
    from rvqspec_lib.models.tree_files import load_calibration, save_calibration

    cp, frames = small
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 4, 8), draws=1)
    path = save_calibration(cal, tmp_path / "trees" / "heads.json")
    assert not list(path.parent.glob("*.tmp"))
    assert load_calibration(path, n_codes=3, codebook_size=16) == cal
    read = load_calibration(path, n_codes=3, codebook_size=16)
    t = resolve("calibrated-sampled:8", None, calibrations={"heads": read})  # a calibration in hand: no model needed
    assert t.decoder.sampled and t.decoder.tree(3).n_nodes == 7 and t.label == "tree:calibrated-sampled:8"
    best = resolve("calibrated:4", None, calibrations={"heads": read})
    assert best.decoder.sampled == (cal["best_kind"]["4"] == "sampled")
    assert best.label == f"tree:calibrated-{cal['best_kind']['4']}:4"
    d = parse_decoder_name("tree:calibrated-point-mass:64")
    assert (d.tree_kind, d.budget) == ("point-mass", 64)
    for bad, word in (("calibrated:1", "outside 2..64"), ("calibrated:65", "outside 2..64"),
                      ("calibrated-beam:4", "unknown tree name"), ("calibratedx:4", "unknown tree name")):
        with pytest.raises(ValueError, match=word):
            parse_decoder_name(f"tree:{bad}")
    with pytest.raises(ValueError, match="codebook_size = 16, this model has 2048"):
        load_calibration(path, n_codes=3, codebook_size=2048)
    with pytest.raises(ValueError, match="n_codes = 3, this model has 15"):
        load_calibration(path, n_codes=15)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a calibration file"):
        load_calibration(tmp_path / "junk.json")
    with pytest.raises(FileNotFoundError, match="calibrate first"):
        load_calibration(tmp_path / "missing.json")


def test_predicted_vs_measured_reads_each_decoders_own_calibration(small):
    """Calibrated trees read the prediction stored for their kind and budget, chains compute it from the tables; the
    measurement is decoder_statistics' on the same contexts and seed."""
    from rvqspec_lib.decoding.decoders import Chain
    from rvqspec_lib.eval.acceptance import predicted_tokens_per_call
    from paper.calibration_checks import predicted_vs_measured
    from rvqspec_lib.eval.calibration import tables_from_calibration
    from rvqspec_lib.models.named_decoders import resolve_all

    cp, frames = small
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 3), draws=1, seed=0)
    named = resolve_all(["ar", "tree:calibrated-point-mass:3", "tree:calibrated-sampled:2", "chain:2"], None,
                        calibrations={"heads": cal})
    ctx = frames.context[:24]
    rows = predicted_vs_measured(cp, named, ctx, calibrations={"heads": cal}, seed=5)
    by = {r["decoder"]: r for r in rows}
    assert list(by) == ["ar", "tree:calibrated-point-mass:3", "tree:calibrated-sampled:2", "chain:2"]
    assert by["ar"]["predicted_tokens_per_call"] == by["ar"]["measured_tokens_per_call"] == 1.0
    assert by["tree:calibrated-point-mass:3"]["predicted_tokens_per_call"] == \
        cal["point-mass"]["predicted_tokens_per_call"]["3"]
    assert by["tree:calibrated-sampled:2"]["sampled"] and not by["tree:calibrated-point-mass:3"]["sampled"]
    assert by["chain:2"]["predicted_tokens_per_call"] == pytest.approx(
        predicted_tokens_per_call(tables_from_calibration(cal), Chain(2), 3))
    tree = named["tree:calibrated-point-mass:3"].decoder
    assert by["tree:calibrated-point-mass:3"]["measured_tokens_per_call"] == \
        decoder_statistics(cp, None, ctx, tree, seed=5)["tokens_per_call"]
    for r in rows:
        assert r["frames"] == 24 and r["nodes"] >= 1
        assert r["relative_error"] == pytest.approx(r["predicted_tokens_per_call"] / r["measured_tokens_per_call"] - 1)
    # a chain without its drafter's calibration has no prediction, and says so with None
    bare = predicted_vs_measured(cp, [Chain(2)], ctx)
    assert bare[0]["predicted_tokens_per_call"] is None and bare[0]["relative_error"] is None
    with pytest.raises(ValueError, match="no decoder"):
        predicted_vs_measured(cp, [], ctx)


def test_temperature_sweep_rows_and_the_overtaking_temperatures(small):
    from paper.calibration_checks import point_mass_overtakes, temperature_sweep

    cp, frames = small
    rows = temperature_sweep(cp, frames.context[:32], frames.context[32:48], temperatures=(1.0, 0.2), budget=3,
                             seed=0)
    assert [(r["temperature"], r["kind"], r["nodes"]) for r in rows] == [
        (1.0, "point-mass", 3), (1.0, "sampled", 3), (0.2, "point-mass", 3), (0.2, "sampled", 3)]
    assert all(r["measured_tokens_per_call"] >= 1.0 and r["predicted_tokens_per_call"] >= 1.0 for r in rows)
    assert all(0 <= r["top1_target_mass"] <= 1 and 0 <= r["first_child_acceptance"] <= 1 for r in rows)
    assert rows[0]["top1_target_mass"] == rows[1]["top1_target_mass"]  # one calibration per temperature
    assert rows == temperature_sweep(cp, frames.context[:32], frames.context[32:48], temperatures=(1.0, 0.2),
                                     budget=3, seed=0)  # one seed, one answer
    with pytest.raises(ValueError, match="positive"):
        temperature_sweep(cp, frames.context[:4], frames.context[:4], temperatures=(0.0,))
    synth = [{"temperature": t, "kind": k, "measured_tokens_per_call": v}
             for t, k, v in ((0.9, "point-mass", 1.2), (0.9, "sampled", 2.0), (0.1, "point-mass", 2.5),
                             (0.1, "sampled", 2.1), (0.05, "point-mass", 2.0))]
    assert point_mass_overtakes(synth) == [0.1]  # 0.05 has no sampled row: not compared
