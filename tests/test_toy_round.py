"""The toy round of notebook 02_the_lossless_rule (paper/toy_round.py): exact laws against what
``walk_tree`` draws, the closed forms of docs/methods.md, and negative controls.

Seeds are fixed, so every statistical check either always passes or always fails; Monte Carlo comparisons allow 4
standard errors, G-tests fail at p < 1e-3 (docs/methods.md#testing-losslessness). The whole file runs in seconds.
"""

from __future__ import annotations

import math

import pytest
import torch

from rvqspec_lib.decoding import verify
from rvqspec_lib.decoding.decoders import DEFAULT_TREE, Chain, Tree
from rvqspec_lib.decoding.trees import DraftTree
from paper import toy_round as toy

ALPHA = 1e-3
V = 6
P = torch.tensor([0.05, 0.30, 0.25, 0.20, 0.15, 0.05])
Q = torch.tensor([0.30, 0.35, 0.12, 0.05, 0.10, 0.08])
TRANSITION = torch.tensor([[{0: 0.20, 1: 0.55, 2: 0.10}.get((j - c) % V, 0.05) for j in range(V)] for c in range(V)])
Q_OFFSETS = torch.stack([Q, torch.tensor([0.05, 0.15, 0.35, 0.25, 0.12, 0.08]),
                         torch.tensor([0.04, 0.10, 0.20, 0.36, 0.22, 0.08])])
TARGET = toy.ToyTarget(P, TRANSITION)
CHAIN = Chain(4).tree(15)
TREE = Tree(DEFAULT_TREE).tree(15)
WIDE = DraftTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


# ---- the target and the one-draft pieces ----------------------------------------------------------------------------
def test_toy_target_checks_its_tables_and_its_joint_is_the_product_of_conditionals():
    with pytest.raises(ValueError, match="sum to 1"):
        toy.ToyTarget(torch.tensor([0.5, 0.6]), torch.eye(2))
    with pytest.raises(ValueError, match="non-negative"):
        toy.ToyTarget(torch.tensor([1.5, -0.5]), torch.eye(2))
    with pytest.raises(ValueError, match=r"\(V, V\)"):
        toy.ToyTarget(torch.tensor([0.5, 0.5]), torch.eye(3))
    joint = TARGET.joint(3)
    assert joint.shape == (V, V, V) and float(joint.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(joint[1, 2, 3]) == pytest.approx(TARGET.path_probability([1, 2, 3]), abs=1e-15)
    assert TARGET.continuation(4, 0).shape == () and float(TARGET.continuation(4, 2).sum()) == pytest.approx(1.0)
    codes = torch.tensor([[9, 1, 2, 2, 3]])  # root code never read
    p = TARGET.node_p(codes)
    assert torch.allclose(p[0, 0], P) and torch.allclose(p[0, 2], TRANSITION[2])


def test_single_draft_breakdown_gives_back_p_and_its_pieces():
    b = toy.single_draft_breakdown(P, Q)
    p, q = P.double(), Q.double()
    assert torch.allclose(b["output"], p, atol=1e-12)
    assert torch.allclose(b["accepted"], torch.minimum(p, q), atol=1e-7)
    assert torch.allclose(b["accept_prob"], torch.clamp(p / q, max=1.0), atol=1e-6)
    assert float(b["accepted"].sum()) == pytest.approx(1 - float(b["tv"]), abs=1e-7)
    assert float(b["reject_prob"]) == pytest.approx(float(b["tv"]), abs=1e-7)
    assert torch.allclose(b["residual"], torch.clamp(p - q, min=0) / torch.clamp(p - q, min=0).sum(), atol=1e-6)
    # negative control: SSD's tolerance keeps too much, and its output is what its rule says
    lossy = toy.single_draft_breakdown(P, Q, tolerance=0.4)
    keep = q * torch.clamp(p / q + 0.4, max=1.0)
    assert torch.allclose(lossy["output"], keep + (1 - keep.sum()) * b["residual"], atol=1e-6)
    assert float((lossy["output"] - p).abs().sum()) > 0.1
    # p == q: every draft kept
    same = toy.single_draft_breakdown(P, P)
    assert torch.allclose(same["accept_prob"], torch.ones(V, dtype=torch.float64)) and float(same["reject_prob"]) < 1e-7


def test_residual_steps_zero_point_masses_and_subtract_a_sampled_q():
    steps = toy.residual_steps(P, [1, 0])
    assert steps.shape == (3, V) and torch.allclose(steps.sum(1), torch.ones(3, dtype=torch.float64))
    left = P.double().clone()
    left[[1, 0]] = 0
    assert torch.allclose(steps[2], left / left.sum()) and float(steps[1, 1]) == 0.0
    sampled = toy.residual_steps(P, [0], Q)
    excess = torch.clamp(P.double() - Q.double(), min=0)
    assert torch.allclose(sampled[1], excess / excess.sum(), atol=1e-7)


# ---- drafts and commits ------------------------------------------------------------------------------------------
def test_draft_node_codes_follow_the_decoder():
    codes = toy.draft_node_codes(TREE, Q_OFFSETS)
    top = torch.topk(Q_OFFSETS, 2, dim=-1).indices
    # nodes: (0,), (1,), (0,0), (0,0,0): top-2 at offset 1, top code at offsets 2 and 3
    assert codes.tolist() == [[0, int(top[0, 0]), int(top[0, 1]), int(top[1, 0]), int(top[2, 0])]]
    drafts = torch.tensor([[4, 5, 3], [0, 1, 2]])
    assert toy.draft_node_codes(CHAIN, Q_OFFSETS, drafts, root_code=7).tolist() == [[7, 4, 5, 3], [7, 0, 1, 2]]
    with pytest.raises(ValueError, match="chain"):
        toy.draft_node_codes(TREE, Q_OFFSETS, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"K >= the tree's depth"):
        toy.draft_node_codes(TREE, Q_OFFSETS[:2])
    with pytest.raises(ValueError, match="no node"):
        toy.draft_node_codes(DraftTree.from_paths([]), Q_OFFSETS)


def test_committed_codes_are_the_accepted_path_then_the_drawn_code():
    node_codes = torch.tensor([[0, 3, 4, 5], [0, 1, 2, 2], [0, 5, 5, 5]])
    walk = verify.WalkResult(path=torch.tensor([[1, 2], [-1, -1], [1, 2]]), n_accepted=torch.tensor([2, 0, 2]),
                             last_node=torch.tensor([2, 0, 2]), next_code=torch.tensor([1, 4, -1]))
    codes, n = toy.committed_codes(walk, node_codes)
    assert codes.tolist() == [[3, 4, 1], [4, -1, -1], [5, 5, -1]] and n.tolist() == [3, 1, 2]
    assert toy.node_frequencies(walk, 3).tolist() == [1.0, 2 / 3, 2 / 3, 0.0]


# ---- exact laws ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree, sampled", [(CHAIN, True), (TREE, False), (WIDE, False), (DraftTree.chain(2), True)],
                         ids=["chain4", "default-tree", "wide-tree", "chain3"])
@pytest.mark.parametrize("depths_left", [4, 2])
def test_a_round_then_ar_gives_the_exact_joint(tree, sampled, depths_left):
    law = toy.exact_round_law(TARGET, Q_OFFSETS, tree, sampled=sampled, depths_left=depths_left)
    assert sum(law.outcomes.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(1 <= len(c) <= depths_left for c in law.outcomes)
    n = 4
    assert float((law.completed_joint(TARGET, n) - TARGET.joint(n)).abs().max()) < 1e-12
    assert float((law.first_code(V) - TARGET.first).abs().max()) < 1e-12
    assert float(law.length_pmf(depths_left).sum()) == pytest.approx(1.0, abs=1e-12)
    assert law.node_tried[0] == law.node_accepted[0] == 1.0
    assert bool((law.node_accepted <= law.node_tried + 1e-15).all())
    if depths_left > tree.max_depth:  # a code is drawn after every node: E = 1 + sum of node probabilities
        assert law.expected_committed == pytest.approx(1 + float(law.node_accepted[1:].sum()), abs=1e-12)
    if not sampled:  # point-mass: a node is kept with the target probability of its whole path
        codes = toy.draft_node_codes(tree, Q_OFFSETS)
        p_path = TARGET.path_probabilities(tree, codes)
        valid = tree.depth <= depths_left
        assert torch.allclose(law.node_accepted[valid], p_path[valid], atol=1e-12)


def test_the_lossy_tolerance_bends_the_exact_law():
    law = toy.exact_round_law(TARGET, Q_OFFSETS, CHAIN, sampled=True, tolerance=0.4)
    gap = float((law.completed_joint(TARGET, 4) - TARGET.joint(4)).abs().sum() / 2)
    assert gap > 0.1
    ok = toy.exact_round_law(TARGET, Q_OFFSETS, CHAIN, sampled=True)
    assert law.expected_committed > ok.expected_committed  # it keeps more drafts than p allows


def test_path_nodes_read_the_ancestor_row():
    assert [toy.path_nodes(WIDE, v) for v in range(WIDE.n_nodes + 1)] == \
        [(), (1,), (2,), (3,), (1, 4), (1, 5), (2, 6), (1, 4, 7)]


# ---- Monte Carlo through walk_tree against the exact law ------------------------------------------------------------
@pytest.mark.parametrize("tree, sampled", [(CHAIN, True), (TREE, False), (WIDE, False)],
                         ids=["chain4", "default-tree", "wide-tree"])
def test_walk_tree_rounds_match_the_exact_law(tree, sampled):
    n = 20_000
    law = toy.exact_round_law(TARGET, Q_OFFSETS, tree, sampled=sampled)
    r = toy.toy_round(TARGET, Q_OFFSETS, tree, sampled=sampled, n_rows=n, generator=torch.Generator().manual_seed(1))
    assert r.committed.shape[0] == n and bool((r.n_committed >= 1).all())
    k = r.n_committed.double()
    assert abs(float(k.mean()) - law.expected_committed) <= 4 * float(k.std()) / math.sqrt(n)
    freq = toy.node_frequencies(r.walk, tree.n_nodes)
    se = torch.sqrt(law.node_accepted * (1 - law.node_accepted) / n) + 1e-12
    assert bool(((freq - law.node_accepted).abs() <= 4 * se).all())
    # the first committed code follows p (G-test), and so does the joint of two codes, completed from the target
    assert toy.g_test(torch.bincount(r.committed[:, 0], minlength=V), TARGET.first)["p_value"] >= ALPHA


def test_monte_carlo_g_test_passes_the_rule_and_rejects_lossy_ones():
    single = DraftTree.chain(1)
    n = 20_000

    def pval(tol):
        r = toy.toy_round(TARGET, Q[None], single, sampled=True, n_rows=n, generator=torch.Generator().manual_seed(0),
                          tolerance=tol, depths_left=1)
        assert bool((r.n_committed == 1).all())  # one code in this toy frame
        return toy.g_test(torch.bincount(r.committed[:, 0], minlength=V), TARGET.first)["p_value"]

    assert pval(0.0) >= ALPHA
    assert pval(0.4) < ALPHA and pval(1.0) < ALPHA


# ---- trace_walk --------------------------------------------------------------------------------------------------
def test_trace_walk_replays_walk_tree_on_random_rounds():
    for seed in range(40):
        for tree, sampled in ((CHAIN, True), (WIDE, False)):
            tr = toy.trace_round(TARGET, Q_OFFSETS, tree, sampled=sampled,
                                 generator=torch.Generator().manual_seed(seed))
            # the same generator state gives the same round as toy_round's single row
            r = toy.toy_round(TARGET, Q_OFFSETS, tree, sampled=sampled, n_rows=1,
                              generator=torch.Generator().manual_seed(seed))
            got = [c["code"] for c in tr["committed"]]
            assert got == [c for c in r.committed[0].tolist() if c >= 0]
            kept = [s["node"] for s in tr["steps"] if s.get("accepted")]
            assert kept == [i for i in r.walk.path[0].tolist() if i >= 0]
            tried = [s for s in tr["steps"] if "accepted" in s]
            assert all((s["u"] < s["ratio"]) == s["accepted"] for s in tried)
            assert tr["steps"][-1]["draw"] in ("residual", "bonus") and tr["n_committed"] == len(got)


def test_trace_walk_refuses_a_walk_it_cannot_replay(monkeypatch):
    """Negative control: a walk whose decisions are not the ones its random numbers give raises."""
    p = torch.zeros(1, 2, V)
    p[0, :, 1] = 1.0  # the target never gives code 0, so a point-mass draft of code 0 is always rejected
    codes = torch.tensor([[0, 0]])
    children = torch.tensor([[1], [-1]])
    ones = torch.ones(1, 2, dtype=torch.bool)
    fake = verify.WalkResult(torch.tensor([[1]]), torch.tensor([1]), torch.tensor([1]), torch.tensor([3]))
    monkeypatch.setattr(verify, "walk_tree", lambda *a, **k: fake)
    with pytest.raises(RuntimeError, match="order of walk_tree's random draws"):
        toy.trace_walk(p, codes, children, ones, ones, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="one row"):
        toy.trace_walk(p.expand(2, -1, -1), codes.expand(2, -1), children, ones.expand(2, -1), ones.expand(2, -1),
                       torch.Generator())


# ---- the G-test ---------------------------------------------------------------------------------------------------
def test_g_test_pools_small_bins_and_catches_impossible_outcomes():
    pmf = torch.tensor([0.5, 0.3, 0.19, 0.01, 0.0])
    exact = pmf * 1000
    res = toy.g_test(exact, pmf)
    assert res["p_value"] == pytest.approx(1.0) and res["df"] == 3 and res["n"] == 1000
    pooled = toy.g_test(torch.tensor([50.0, 30, 19, 1, 0]), pmf)  # the 0.01 bin (expected 1) pooled with 0.19
    assert pooled["df"] == 2
    assert toy.g_test(torch.tensor([500.0, 300, 190, 9, 1]), pmf)["p_value"] == 0.0  # an impossible code drawn
    assert toy.g_test(torch.tensor([700.0, 200, 90, 10, 0]), pmf)["p_value"] < ALPHA
    with pytest.raises(ValueError, match="same number of bins"):
        toy.g_test(torch.ones(3), pmf)


def test_g_test_power_grows_with_the_sample():
    # tests/test_lossless.py's worst case: df 511 at level 1e-3 needs 50,000 frames for power 0.9 at TV 0.03
    assert toy.g_test_power(50_000, 511, tv=0.03, level=1e-3) >= 0.9 > toy.g_test_power(40_000, 511, tv=0.03,
                                                                                           level=1e-3)
    assert toy.g_test_power(1_000, 5, tv=0.03, level=1e-3) < toy.g_test_power(20_000, 5, tv=0.03, level=1e-3)


# ---- the figures of the rule ------------------------------------------------------------------------------------
def test_rule_figures_draw_from_the_results():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paper.plots import RULE_COLORS, plot_ancestor_mask, plot_round, plot_tree_ids

    assert set(RULE_COLORS) >= {"p", "q", "residual"}
    fig, axes = plt.subplots(2, 4)
    for row, (tree, sampled) in zip(axes, ((CHAIN, True), (TREE, False))):
        plot_round(row, toy.trace_round(TARGET, Q_OFFSETS, tree, sampled=sampled,
                                        generator=torch.Generator().manual_seed(3)), title="t")
    texts = [t.get_text() for ax in axes.flat for t in ax.texts]
    assert any(t.startswith("try node 1") for t in texts) and any("for one call" in t for t in texts)
    plt.close(fig)
    fig, (a0, a1) = plt.subplots(1, 2)
    plot_tree_ids(a0, WIDE, codes=toy.draft_node_codes(WIDE, Q_OFFSETS)[0])
    plot_ancestor_mask(a1, WIDE)
    assert [t.get_text() for t in a1.get_xticklabels()] == [str(i) for i in range(WIDE.n_nodes + 1)]
    assert sum(t.get_text() == "1" for t in a1.texts) == int(WIDE.ancestors.sum())
    assert {t.get_text() for t in a0.texts} >= {str(i) for i in range(WIDE.n_nodes + 1)}
    plt.close(fig)
