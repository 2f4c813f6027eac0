"""The interleaved benchmark functions (rvqspec_lib.eval.speed) on tiny-random: what the rows mean, not how fast."""

from __future__ import annotations

import pytest
import torch

from rvqspec_lib.eval import speed as S
from rvqspec_lib.models.fused import FusedARFrame
from rvqspec_lib.models.lean import LeanCodePredictor
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.predictor import OfficialBackend


@pytest.fixture(scope="module")
def cp():
    return load_model("tiny-random").code_predictor


def test_time_frames_rows(cp):
    ctx = S.random_contexts(cp, 3)
    out = S.time_frames(cp, ctx, {"AR": AR(), "Chain4": Chain(4), "Tree": Tree()},
                        {"official": OfficialBackend(cp), "lean": LeanCodePredictor(cp)},
                        fused={"eager": FusedARFrame(cp, compile=False)}, repeats=3, warmup=1, progress=False)
    rows = {(r["decoder"], r["backend"]): r for r in out["rows"]}
    assert set(rows) == {(d, b) for d in ("AR", "Chain4", "Tree") for b in ("official", "lean")} | {(S.FUSED,
                                                                                                    "eager")}
    for (d, b), r in rows.items():
        assert r["p10_ms"] <= r["ms_per_frame"] <= r["p90_ms"]
        assert 0 <= r["model_ms"] <= r["ms_per_frame"] and 0 <= r["outside_share"] < 1
        if d != S.FUSED:
            assert r["heads_ms"] > 0 and r["speedup_vs_ar"] > 0
    for b in ("official", "lean"):
        assert rows[("AR", b)]["tokens_per_call"] == 1.0 and rows[("AR", b)]["calls_per_frame"] == 15
        assert rows[("AR", b)]["speedup_vs_ar"] == 1.0
        assert rows[("Chain4", b)]["tokens_per_call"] >= 1.0
    assert rows[(S.FUSED, "eager")]["speedup_vs_fused"] == 1.0 and rows[(S.FUSED, "eager")]["calls_per_frame"] == 1
    # the same frames through both backends (bit-identical forward): the same tokens per call
    assert rows[("Tree", "official")]["tokens_per_call"] == rows[("Tree", "lean")]["tokens_per_call"]
    meta = out["meta"]
    assert meta["threads"] == torch.get_num_threads() and meta["dtype"] == "float32" and meta["repeats"] == 3
    assert "other_cpu_frac" in meta and "cpu" in meta


def test_timed_backend_changes_nothing_but_the_clock(cp):
    ctx = S.random_contexts(cp, 2)
    clock = S.Clock()
    ref = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(0))
    got = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(0),
                       backend=S.TimedBackend(OfficialBackend(cp), clock),
                       drafter=S.TimedDrafter(ReusedHeads(), clock))
    assert torch.equal(ref.codes, got.codes) and torch.equal(ref.calls, got.calls)
    assert clock.model_s > 0 and clock.heads_s > 0


def test_verify_cost_curve_rows(cp):
    out = S.verify_cost_curve(cp, {"official": OfficialBackend(cp), "lean": LeanCodePredictor(cp)},
                              query_sizes=(1, 2, 8), repeats=2, warmup=1, progress=False)
    rows = out["rows"]
    assert [(r["backend"], r["query_positions"]) for r in rows] == [(b, q) for b in ("official", "lean")
                                                                    for q in (1, 2, 8)]
    assert all(r["ratio_to_q1"] == 1.0 for r in rows if r["query_positions"] == 1)
    assert all(r["median_ms"] > 0 for r in rows)


def test_batch_throughput_rows(cp):
    out = S.batch_throughput(cp, S.random_contexts(cp, 5), {"AR": AR(), "Chain4": Chain(4)},
                             {"lean": LeanCodePredictor(cp)}, batch_sizes=(1, 4),
                             fused={"eager": FusedARFrame(cp, compile=False)}, repeats=2, warmup=0, progress=False)
    rows = {(r["decoder"], r["batch"]): r for r in out["rows"]}
    assert set(rows) == {(d, b) for d in ("AR", "Chain4", S.FUSED) for b in (1, 4)}
    for (d, b), r in rows.items():
        assert r["frames_per_s"] == pytest.approx(b / (r["ms_per_batch"] / 1e3))
    assert rows[("AR", 4)]["tokens_per_call"] == 1.0 and rows[("AR", 1)]["speedup_vs_ar"] == 1.0


def test_bad_input_is_one_line(cp):
    with pytest.raises(ValueError, match=r"contexts must be a \(N >= 1, 2, \d+\) tensor"):
        S.time_frames(cp, torch.zeros(3, 2), {"AR": AR()}, {"o": OfficialBackend(cp)}, progress=False)
    with pytest.raises(ValueError, match="include 1"):
        S.verify_cost_curve(cp, {"o": OfficialBackend(cp)}, query_sizes=(2, 4), progress=False)
    with pytest.raises(ValueError, match="batch sizes"):
        S.batch_throughput(cp, S.random_contexts(cp, 2), {"AR": AR()}, {"o": OfficialBackend(cp)}, batch_sizes=(0,),
                           progress=False)


def test_format_rows():
    md = S.format_rows([{"a": 1.23456, "b": None, "c": "x"}])
    assert md.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1.23 |  | x |"]


def test_time_frames_fused_chain_rows(cp):
    """The fused speculative chain as extra conditions: its own row per window, tokens per call from its calls."""
    from rvqspec_lib.models.fused_spec import FusedChainFrame

    from rvqspec_lib.models.fused_tree import FusedTreeFrame

    chains = [FusedChainFrame(cp, w, compile=False) for w in (2, 4)]
    tree = FusedTreeFrame(cp, [(0,), (1,), (0, 0)], compile=False)  # a tree frame: its own label and node budget
    out = S.time_frames(cp, S.random_contexts(cp, 2), {"AR": AR()}, {"lean": LeanCodePredictor(cp)},
                        fused={"lean": FusedARFrame(cp, compile=False)}, fused_spec={"lean": chains + [tree]},
                        repeats=2, warmup=1, progress=False)
    rows = {(r["decoder"], r["backend"]): r for r in out["rows"]}
    assert set(rows) == {("AR", "lean"), (S.FUSED, "lean"), ("fused-chain2", "lean"), ("fused-chain4", "lean"),
                         ("fused-tree4", "lean")}
    assert rows[("fused-tree4", "lean")]["nodes"] == 4
    for w in (2, 4):
        r = rows[(f"fused-chain{w}", "lean")]
        assert r["nodes"] == w and 1.0 <= r["tokens_per_call"] <= 15 / 2
        assert 15 / 8 <= r["calls_per_frame"] <= 15  # a round commits 1..window codes
        assert r["speedup_vs_ar"] > 0 and r["speedup_vs_fused"] > 0 and r["heads_ms"] == 0


def test_noise_target_stops_between_min_and_max(cp, monkeypatch):
    """With a noise target the loops run at least ``repeats`` and at most ``max_repeats`` rounds, all conditions each
    round, stopping where the rule says; ``meta`` records what was made. Without one: exactly ``repeats``."""
    from rvqspec_lib.eval import noise

    ctx = S.random_contexts(cp, 3)
    decs, bes = {"AR": AR(), "Chain4": Chain(4)}, {"lean": LeanCodePredictor(cp)}
    # a target every median meets once 2 samples exist: exactly the minimum
    out = S.time_frames(cp, ctx, decs, bes, repeats=3, warmup=0, progress=False, noise_target=1e9, max_repeats=9)
    m = out["meta"]
    assert (m["repeats"], m["noise_target"], m["max_repeats"]) == (3, 1e9, 9)
    assert set(m["rel_se"]) == {"AR/lean", "Chain4/lean"} and all(v >= 0 for v in m["rel_se"].values())
    # a rule that is met at round 5 (of min 3, max 9): the loop stops there, every condition timed 5 times
    seen = []

    def at_five(samples, target, lo, hi):
        seen.append((min(map(len, samples.values())), max(map(len, samples.values())), target, lo, hi))
        return min(map(len, samples.values())) >= 5

    monkeypatch.setattr(noise, "should_stop", at_five)
    out = S.time_frames(cp, ctx, decs, bes, repeats=3, warmup=0, progress=False, noise_target=0.02, max_repeats=9)
    assert out["meta"]["repeats"] == 5 and out["meta"]["max_repeats"] == 9
    assert seen == [(n, n, 0.02, 3, 9) for n in range(1, 6)]  # interleaved: all conditions each round
    out = S.verify_cost_curve(cp, bes, query_sizes=(1, 2), repeats=2, warmup=0, progress=False, noise_target=0.02)
    assert out["meta"]["repeats"] == 5 and out["meta"]["max_repeats"] == 8 and set(out["meta"]["rel_se"]) == {
        "lean/1", "lean/2"}
    out = S.batch_throughput(cp, ctx, {"AR": AR()}, bes, batch_sizes=(1, 2), repeats=2, warmup=0, progress=False,
                             noise_target=0.02, max_repeats=6)
    assert out["meta"]["repeats"] == 5 and set(out["meta"]["rel_se"]) == {"AR/lean/1", "AR/lean/2"}
    # a rule never met: the cap
    monkeypatch.setattr(noise, "should_stop", lambda s, t, lo, hi: min(map(len, s.values())) >= hi)
    out = S.time_frames(cp, ctx, decs, bes, repeats=2, warmup=0, progress=False, noise_target=0.02, max_repeats=4)
    assert out["meta"]["repeats"] == 4


def test_no_noise_target_is_a_fixed_count(cp):
    ctx = S.random_contexts(cp, 3)
    decs, bes = {"AR": AR(), "Chain4": Chain(4)}, {"lean": LeanCodePredictor(cp)}
    a = S.time_frames(cp, ctx, decs, bes, repeats=4, warmup=0, progress=False)
    b = S.time_frames(cp, ctx, decs, bes, repeats=4, warmup=0, progress=False, noise_target=None)
    for out in (a, b):
        assert (out["meta"]["repeats"], out["meta"]["noise_target"], out["meta"]["max_repeats"]) == (4, None, 4)
    # the same frames decoded (paired seeds): the same tokens per call
    assert [r["tokens_per_call"] for r in a["rows"]] == [r["tokens_per_call"] for r in b["rows"]]
    assert S.verify_cost_curve(cp, bes, query_sizes=(1,), repeats=3, warmup=0, progress=False)["meta"]["repeats"] == 3
    with pytest.raises(ValueError, match="needs a noise_target"):
        S.time_frames(cp, ctx, decs, bes, repeats=4, progress=False, max_repeats=8)
    with pytest.raises(ValueError, match=">= 2"):
        S.verify_cost_curve(cp, bes, query_sizes=(1,), repeats=1, progress=False, noise_target=0.02)
    with pytest.raises(ValueError, match="> 0"):
        S.batch_throughput(cp, ctx, {"AR": AR()}, bes, repeats=2, progress=False, noise_target=0)
