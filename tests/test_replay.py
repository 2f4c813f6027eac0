"""Timing replay (rvqspec_lib.eval.replay: the acceptance hook of decode_frame, and its tables): the replayed
acceptance follows its table, the frame is sealed (never audio), and a malformed table is one line naming the fix.

Statistical tests: chi-square goodness of fit at level 1e-4 each (two tests of a correct oracle: a false failure
for an unlucky seed has probability at most 2e-4; the seeds are fixed, so the tests are deterministic). Each has a
negative control that must be rejected at the same level: the same counts against a table with two entries moved,
and the real (not replayed) acceptance of the random weights against the table.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from rvqspec_lib.decoding.decode import RoundPlan, Verified, decode_frame
from rvqspec_lib.decoding.decoders import Chain, Tree
from rvqspec_lib.eval import replay as R
from rvqspec_lib.eval.replay import AcceptanceOracle

LEVEL = 1e-4
N = 15  # codes per frame of tiny-random and of the replayed architectures


def _const(rows_by_offset, n=N):
    """A [start depth][offset][child] table equal for every start depth."""
    return [[list(r) for r in rows_by_offset] for _ in range(n - 1)]


class _State:
    def __init__(self, s):
        self.s = s


def _walk_counts(table, paths, *, rows=4000, reps=5, seed=0):
    """Final node of the replayed walk over a point-mass tree, counted over rows x reps walks (start depth 3)."""
    tree = Tree(paths).tree(N)
    plan = RoundPlan.build(tree, N, sampled=False, device="cpu")
    o = AcceptanceOracle({"point-mass": table}, "test", seed=seed)
    m1 = plan.n_query
    ver = Verified(torch.zeros(rows, m1, 4), torch.full((rows, m1, 8), 1 / 8), torch.ones(rows, m1, dtype=torch.bool),
                   torch.ones(rows, m1, dtype=torch.bool), torch.zeros(rows, m1, dtype=torch.long))
    counts = np.zeros(m1)
    for _ in range(reps):
        w = o.walk(plan, _State(torch.full((rows,), 3)), None, ver)
        counts += np.bincount(w.last_node.numpy(), minlength=m1)
        assert bool((w.next_code >= 0).all()) and bool((w.n_accepted == (w.path >= 0).sum(1)).all())
    return counts, tree


def _expected_last(table_by_offset, tree):
    """P(the walk ends at node v) under the oracle's model: children of a node are disjoint events."""
    probs = np.zeros(tree.n_nodes + 1)
    reach = {0: 1.0}
    for v in range(tree.n_nodes + 1):  # nodes in path order: parents first
        kids = [int(c) for c in tree.children[v] if c >= 0]
        acc = [table_by_offset[int(tree.depth[c]) - 1][int(tree.rank[c])] for c in kids]
        for c, a in zip(kids, acc):
            reach[c] = reach[v] * a
        probs[v] = reach[v] * (1 - sum(acc))
    return probs


def test_replayed_walk_follows_the_table_and_a_moved_table_is_rejected():
    paths = [(0,), (1,), (2,), (0, 0)]
    table = [[0.3, 0.2, 0.1, 0.0], [0.5, 0.0, 0.0, 0.0]]
    counts, tree = _walk_counts(_const(table), paths)
    exp = _expected_last(table, tree)
    assert abs(exp.sum() - 1) < 1e-12
    assert chisquare(counts, counts.sum() * exp).pvalue > LEVEL
    moved = _expected_last([[0.2, 0.3, 0.1, 0.0], [0.5, 0.0, 0.0, 0.0]], tree)  # ranks 0 and 1 swapped
    assert chisquare(counts, counts.sum() * moved).pvalue < LEVEL  # negative control


def test_start_depth_selects_the_row_and_invalid_nodes_never_accept():
    rows = [[[1.0 if s == 3 else 0.0]] for s in range(1, N)]
    o = AcceptanceOracle({"sampled": rows}, "test")
    assert o.probability("sampled", 3, 1, 0) == 1.0 and o.probability("sampled", 2, 1, 0) == 0.0
    assert o.probability("sampled", 3, 2, 0) == 0.0 and o.probability("sampled", 3, 1, 5) == 0.0  # outside: 0
    with pytest.raises(ValueError, match="no point-mass acceptance table"):
        o.probability("point-mass", 1, 1, 0)


@pytest.fixture(scope="module")
def tiny():
    from rvqspec_lib.models.loader import load_model

    return load_model("tiny-random", seed=0)


def _chain_calls(cp, ctx, acceptance, *, reps=6):
    """Accepted drafts per call of Chain(4) at start depths s <= n - 3 (all three drafts exist), pooled."""
    acc, start = [], []
    for r in range(reps):
        res = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(r), acceptance=acceptance)
        a, s = res.accepted[:, 1:].reshape(-1), res.start_depth[:, 1:].reshape(-1)
        keep = (s >= 1) & (s <= N - 3)
        acc.append(a[keep])
        start.append(s[keep])
    return torch.cat(acc).numpy(), torch.cat(start).numpy()


def _chain_expected(alpha, starts):
    """Expected counts of 0..3 accepted drafts: accept offset t with alpha[s-1][t-1], stop at the first rejection."""
    exp = np.zeros(4)
    for s in starts:
        a = [alpha[s - 1][t][0] for t in range(3)]
        reach = 1.0
        for k in range(3):
            exp[k] += reach * (1 - a[k])
            reach *= a[k]
        exp[3] += reach
    return exp


def test_replayed_chain_frames_match_the_shipped_table_and_the_real_acceptance_does_not(tiny):
    from rvqspec_lib.eval.speed import random_contexts

    cp = tiny.code_predictor
    table = R.default_acceptance()  # the embedded model's calibration, as a replay uses by default
    alpha = table.tables["sampled"]
    ctx = random_contexts(cp, 64, seed=1)
    acc, starts = _chain_calls(cp, ctx, table.oracle(seed=0))
    counts = np.bincount(acc, minlength=4).astype(float)
    assert counts.sum() > 1000
    assert chisquare(counts, _chain_expected(alpha, starts)).pvalue > LEVEL
    real, real_starts = _chain_calls(cp, ctx, None, reps=2)  # negative control: random weights' own acceptance
    real_counts = np.bincount(real, minlength=4).astype(float)
    assert chisquare(real_counts, _chain_expected(alpha, real_starts)).pvalue < LEVEL


def test_a_replayed_frame_is_sealed_and_labelled(tiny):
    from rvqspec_lib.eval.speed import random_contexts

    cp = tiny.code_predictor
    table = R.default_acceptance()
    res = decode_frame(cp, random_contexts(cp, 2), decoder=Tree(), generator=torch.Generator().manual_seed(0),
                       acceptance=table.oracle())
    assert bool((res.codes == -1).all())
    assert res.replay == table.text and res.replay.startswith("timing replay: acceptance of the embedded model")
    assert res.replay.endswith(", weights random")
    assert int(res.calls.min()) >= 1 and res.committed.sum(1).tolist() == [N, N]  # every code committed once
    plain = decode_frame(cp, random_contexts(cp, 2), decoder=Tree(), generator=torch.Generator().manual_seed(0))
    assert plain.replay is None and bool((plain.codes >= 0).all())  # negative control: a decoded frame is not sealed


def _write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


@pytest.mark.parametrize("obj, words", [
    ("not json", "not JSON"),
    ({"format": "other"}, "not an acceptance table"),
    ({"format": R.FORMAT}, "no table"),
    ({"format": R.FORMAT, "sampled": [[[0.5]]] * 3}, "3 start depths; the inner loop has 14"),
    ({"format": R.FORMAT, "sampled": [[0.5, 0.6]]}, "add up to more than 1"),
    ({"format": R.FORMAT, "sampled": [[1.5]]}, "outside [0, 1]"),
    ({"format": R.FORMAT, "sampled": [[0.5], [0.2, 0.1]]}, "not rectangular"),
    ({"format": R.FORMAT, "sampled": [0.5]}, "1 dimensions"),
    ({"format": R.FORMAT, "point-mass": [["x"]]}, "not a probability"),
])
def test_malformed_tables_are_one_line_naming_the_fix(tmp_path, obj, words):
    p = _write(tmp_path, "t.json", obj)
    with pytest.raises(ValueError) as e:
        R.read_acceptance(p)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and "docs/precision.md#timing-replay" in msg and str(p) in msg


def test_good_json_and_calibration_files_read(tmp_path):
    j = R.read_acceptance(_write(tmp_path, "a.json", {"format": R.FORMAT, "source": "my model",
                                                      "sampled": [[0.9], [0.8]]}))
    assert j.label == "my model" and len(j.tables["sampled"]) == N - 1 and j.tables["sampled"][5] == [[0.9], [0.8]]
    cal = R.read_acceptance("data/embedded/model/trees/heads.json")
    assert set(cal.tables) == {"point-mass", "sampled"} and "1500 calibration frames" in cal.label


# ---------------------------------------------------------------------------------------------------------------------
# the command line and the table (rvqspec bench table; bench.table)
# ---------------------------------------------------------------------------------------------------------------------
def test_bench_refuses_a_malformed_table_before_any_model_loads(tmp_path, capsys, no_load):
    from rvqspec_lib.cli.main import main

    bad = _write(tmp_path, "bad.json", {"format": R.FORMAT, "sampled": [[[0.5]]] * 2})
    for argv in (["bench", "table", "--acceptance", str(bad)],
                 ["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--acceptance", str(bad)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "2 start depths" in err and "docs/precision.md#timing-replay" in err
    with pytest.raises(SystemExit) as e:  # a replay is for frames and table: the parser says so
        main(["bench", "latency", "--model", "tiny-random", "--acceptance", str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "--acceptance is a flag of rvqspec bench frames, table and pipeline, not of bench latency" in err, err


def test_table_refuses_an_absent_backend_before_any_model_loads(capsys, monkeypatch, no_load):
    import importlib.util

    from rvqspec_lib.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert main(["bench", "table", "--backends", "eager,onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--backends onnx is not available here: missing Python packages: onnxruntime" in err
    assert "pip install -r requirements.txt" in err
    monkeypatch.setattr(importlib.util, "find_spec", real)  # negative control: present, it passes the check
    from bench.table import check_table_args

    if real("onnxruntime") is not None:
        check_table_args(["tiny-random"], ["float32"], ["eager", "onnx"])


def test_table_rows_on_tiny_random_are_labelled_replays(tmp_path):
    from rvqspec_lib.common.provenance import provenance
    from bench.table import ROWS, bench_table, save

    res = bench_table(models=("tiny-random",), precisions=("float32",), backends=("eager",), repeats=1, warmup=0,
                      chains=(4,), budgets=(4,), auto=False, n_contexts=2, progress=False)
    assert [r["row"] for r in res["rows"]] == list(ROWS)
    by = {r["row"]: r for r in res["rows"]}
    table = R.default_acceptance()
    assert all(r["weights"] == table.text for r in res["rows"])
    for name in ("stepped AR", "fused AR", "best speculative"):
        r = by[name]
        assert r["ms_per_frame"] > 0 and r["rtf"] == r["ms_per_frame"] / 80.0
        assert r["x_floor_ar"] == r["ms_per_frame"] / r["floor_ar_ms"]
    best = by["best speculative"]
    assert best["decoder"] in ("chain:4", "tree:calibrated-sampled:4", "tree:calibrated-point-mass:4")
    assert best["fused"] is False and best["kind"] in ("chain", "calibrated") and best["nodes"] == 4
    assert by["auto"]["ms_per_frame"] is None and "absent" in by["auto"]["note"]
    # a replay cannot drive a fused frame (its acceptance is inside it): absent, with that reason
    fused = by["fused speculative"]
    assert fused["ms_per_frame"] is None and fused["decoder"] is None and fused["x_fused_ar"] is None
    assert fused["note"] == "absent: a timing replay cannot drive a fused frame (its acceptance is inside it)"
    assert by["fused AR"]["fused"] is True and by["stepped AR"]["fused"] is False  # AR has no acceptance to replay
    assert any("public C port" in f and "quoted" in f for f in res["footer"])
    out = save(res, tmp_path / "t", provenance({}))
    md = out["md"].read_text()
    assert "timing replay: acceptance of" in md and "public C port" in md and out["json"].is_file()
