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
from rvqspec_lib.models.tree_files import tree_from_calibration
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
    from rvqspec_lib.models.tree_files import load_calibration, save_calibration
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name, parse_tree_name

    cp, frames = small
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 4, 8), draws=1)
    path = save_calibration(cal, tmp_path / "trees" / "heads.json")
    assert not list(path.parent.glob("*.tmp"))
    assert load_calibration(path, n_codes=3, codebook_size=16) == cal
    loaded = load_calibration(path, n_codes=3, codebook_size=16)
    t = parse_decoder_name("tree:calibrated-sampled:8").calibrated_tree(loaded)
    assert t.sampled and t.tree(3).n_nodes == 7
    best = parse_decoder_name("tree:calibrated:4").calibrated_tree(loaded)
    assert best.sampled == (cal["best_kind"]["4"] == "sampled")
    assert parse_tree_name("calibrated-point-mass:64") == ("point-mass", 64)
    for bad, word in (("calibrated:1", "outside 2..64"), ("calibrated:65", "outside 2..64"),
                      ("calibrated-beam:4", "unknown tree name"), ("best:4", "unknown tree name")):
        with pytest.raises(ValueError, match=word):
            parse_tree_name(bad)
    with pytest.raises(ValueError, match="codebook_size = 16, this model has 2048"):
        load_calibration(path, n_codes=3, codebook_size=2048)
    with pytest.raises(ValueError, match="n_codes = 3, this model has 15"):
        load_calibration(path, n_codes=15)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a calibration file"):
        load_calibration(tmp_path / "junk.json")
    with pytest.raises(FileNotFoundError, match="calibrate first"):
        load_calibration(tmp_path / "missing.json")
