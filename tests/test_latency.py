"""eval/latency (notebook 01): the native pair beside the official one in one interleaved run, and the call budget at
the tokens per call named decoders measure on a trained model."""

import json

import pytest
import torch

from bench import latency
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.models.backends import available
from rvqspec_lib.models.loader import load_model

needs_native = pytest.mark.skipif(not available("native")[0], reason="the native forward is absent on this CPU")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


@needs_native
def test_the_native_talker_step_computes_the_official_step(tiny):
    """Same inputs, same logits (float32: the summation order only), each cropped back after every call."""
    official, crop = latency.official_step(tiny.talker, 6, seed=3)
    native, n_crop = latency.native_step(NativeTalker(tiny.talker, max_context=7), 6, seed=3)
    for _ in range(2):
        torch.testing.assert_close(native(), official(), rtol=1e-4, atol=1e-4)
        crop(), n_crop()
    with pytest.raises(ValueError, match="talker_context"):
        latency.native_step(NativeTalker(tiny.talker, max_context=7), 0)


@needs_native
def test_bench_model_with_the_native_pair(tiny):
    qs = (1, 2)
    r = latency.bench_model(tiny, query_sizes=qs, warmup=0, repeats=2, progress=False, native=True)
    n = r["native"]
    assert n["talker_step"]["median_ms"] > 0 and [x["n_queries"] for x in n["code_predictor"]] == list(qs)
    assert n["code_predictor"][0]["ratio_to_1"] == 1.0  # over the native t(1), not the official one
    d = n["derived"]
    assert d["frame_ms_ar"] == pytest.approx(d["t_talker_ms"] + (tiny.n_code_groups - 1) * d["t_inner_ms"])
    rows = latency.latency_rows(r)
    assert [(x["forward"], x["n_queries"]) for x in rows] == [
        ("official", 1), ("official", 1), ("official", 2), ("native", 1), ("native", 1), ("native", 2)]
    assert rows[3]["call"].startswith("talker step") and rows[3]["median_ms"] == n["talker_step"]["median_ms"]
    text = latency.format_latency(r)
    assert "frame (AR, official)" in text and "frame (AR, native)" in text
    json.dumps(r)
    with pytest.raises(ValueError, match="already times the native"):
        latency.bench_model(tiny, query_sizes=qs, backend="native", native=True, progress=False)


def test_bench_model_without_native_has_no_native_rows(tiny):
    r = latency.bench_model(tiny, query_sizes=(1,), warmup=0, repeats=1, progress=False)
    assert "native" not in r and {x["forward"] for x in latency.latency_rows(r)} == {"official"}


def test_calls_at_tokens_per_call_of_named_decoders():
    from rvqspec_lib.data.frame_sources import frames_from_shipped
    from rvqspec_lib.models.frame import inner_sampling

    lm = load_model("embedded")
    ctx = frames_from_shipped(lm, "evaluation", max_frames=6, seed=0).context
    names = ["ar", "chain:4", "tree:calibrated-point-mass:8", "paper:8"]
    rows = latency.calls_at_tokens_per_call(lm, names, ctx, sampling=inner_sampling(lm), seed=0)
    assert [r["decoder"] for r in rows] == ["ar", "chain:4", "tree:calibrated-point-mass:8", "paper:8"]
    assert [r["drafter"] for r in rows] == [None, "heads", "heads", "offsets"]
    ar = rows[0]
    assert ar["tokens_per_call"] == 1.0 and ar["calls_per_s"] == 200.0 and ar["reduction_vs_ar"] == 1.0
    for r in rows:
        b = latency.call_budget(12.5, 16, r["tokens_per_call"])
        assert r["calls_per_s"] == pytest.approx(b["calls_per_s"]) and r["frames"] == 6 and r["model"] == "embedded"
        assert 1.0 <= r["tokens_per_call"] <= 15
    again = latency.calls_at_tokens_per_call(lm, names, ctx, sampling=inner_sampling(lm), seed=0)
    assert [r["tokens_per_call"] for r in again] == [r["tokens_per_call"] for r in rows]  # seeded
    with pytest.raises(ValueError):
        latency.calls_at_tokens_per_call(lm, ["chain:99"], ctx)


def test_model_row_flattens_both_pairs(tiny):
    r = latency.bench_model(tiny, query_sizes=(1, 2, 32), warmup=0, repeats=1, progress=False)
    row = latency.model_row(r)  # t(q)/t(1) at the largest q <= 16 timed: 2
    assert row["model"] == "tiny-random" and row["random_weights"] is True and row["calls_per_s_realtime"] == 200.0
    assert row["t_inner_ms"] == r["derived"]["t_inner_ms"] and row["t(2)/t(1)"] == r["code_predictor"][1]["ratio_to_1"]
    assert row["native_t_inner_ms"] is None and row["native_t(2)/t(1)"] is None  # the native pair was not timed


def test_inner_share_from_bytes(tiny):
    from bench.floor import call_weight_bytes, talker_step_bytes

    b = latency.inner_share_from_bytes(tiny, talker_context=8)
    t = talker_step_bytes(tiny.talker, context=8)
    cp = call_weight_bytes(tiny.code_predictor)["bytes"]
    assert b["talker_step_bytes"] == t["bytes"] and b["talker_kv_bytes"] == t["kv_bytes"] > 0
    n = tiny.n_code_groups - 1
    assert b["inner_share"] == pytest.approx(n * cp / (t["bytes"] + t["kv_bytes"] + n * cp))
