"""The weight-streaming floor (bench.floor) and the per-precision table (``rvqspec bench precisions``,
bench.latency.bench_precisions).

No timed assertions: byte counts against a hand count of the tiny config, the bandwidth measurement's contract, and
the printed table's rows with the timing faked.
"""

from __future__ import annotations

import json

import pytest
import torch

from rvqspec_lib.cli.main import main as cli_main
from bench import floor, latency
from rvqspec_lib.eval import timing
from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict

# the tiny config (rvqspec_lib.models.configs.tiny_config_dict defaults): code predictor hidden 48, MLP 96, 2 layers,
# 4 query heads and 2 KV heads of 16, codebook 2048; talker hidden 64 (so small_to_mtp_projection is 64 -> 48)
H, I, L, QD, KVD, HD, V, HT = 48, 96, 2, 4 * 16, 2 * 16, 16, 2048, 64
LINEAR_W = H * QD + 2 * H * KVD + QD * H + 3 * H * I  # q, k, v, o, gate, up, down weights of one layer
LINEAR_OUT = QD + 2 * KVD + H + 2 * I + H  # their output channels (one int8 scale each)
NORMS = 2 * H + 2 * HD  # input and post-attention RMSNorm, q_norm and k_norm


def hand_bytes(prec: str) -> int:
    """Bytes one call reads, counted by hand from the config (module docstring of bench.floor)."""
    if prec in ("float32", "bfloat16"):
        e = 4 if prec == "float32" else 2
        return e * (L * (LINEAR_W + NORMS) + H + (HT * H + H) + H * V + HT)
    e = 2 if prec == "int8" else 4  # bytes of everything that is not an int8 weight: bf16 (int8), f32 (int8-dynamic)
    layers = L * (LINEAR_W * 1 + LINEAR_OUT * e + NORMS * e)  # int8 weights, scales, norms
    projection = HT * H + e * H + e * H  # int8 weight, scales, bias
    head = H * V + e * V
    return layers + e * H + projection + head + e * HT


@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_call_weight_bytes_equal_the_hand_count(prec):
    cp = PR.apply_precision(build_from_config(tiny_config_dict(), seed=0).talker.code_predictor, prec,
                            require_native=False)
    wb = floor.call_weight_bytes(cp)
    assert wb["bytes"] == hand_bytes(prec)
    assert sum(wb["parts"].values()) == wb["bytes"] == sum(wb["by_dtype"].values())
    assert wb["parts"]["embedding_rows"] == HT * (2 if prec in ("bfloat16", "int8") else 4)
    if prec.startswith("int8"):
        assert wb["by_dtype"]["int8"] == L * LINEAR_W + HT * H + H * V


def test_call_weight_bytes_of_the_0_6b_architecture():
    """The released 0.6B config (5 layers of 1024 wide, MLP 3072, 16 x 128 query and 8 x 128 KV heads, codebook
    2048, no projection): 80.7 M weights a call, 4 / 2 bytes each in float32 / bfloat16."""
    from pathlib import Path

    cfg = json.loads((Path(__file__).resolve().parent.parent / "data" / "configs" / "Qwen3-TTS-12Hz-0.6B-CustomVoice"
                      / "config.json").read_text())
    with torch.device("meta"):  # shapes only, no memory
        cp = build_from_config(cfg, dtype=torch.bfloat16).talker.code_predictor
    wb = floor.call_weight_bytes(cp)
    h, i, qd, kvd = 1024, 3072, 16 * 128, 8 * 128
    per_layer = h * qd + 2 * h * kvd + qd * h + 3 * h * i + 2 * h + 2 * 128
    assert wb["elements"] == 5 * per_layer + h + h * 2048 + h
    assert wb["bytes"] == 2 * wb["elements"]
    assert 80.5e6 < wb["elements"] < 81e6


def test_floor_ms():
    assert floor.floor_ms(2_000_000_000, 20.0) == pytest.approx(100.0)
    for bad in ((1, 0.0), (-1, 1.0)):
        with pytest.raises(ValueError):
            floor.floor_ms(*bad)


def _fake_clock(monkeypatch, ms_of):
    """Replace the wall clock of the timing harness by one that advances ``ms_of()`` per timed call."""
    t = [0.0]
    state = {"start": True}

    def perf_counter():
        if state["start"]:
            state["start"] = False
        else:
            t[0] += ms_of() / 1e3
            state["start"] = True
        return t[0]

    monkeypatch.setattr(timing.time, "perf_counter", perf_counter)


def test_bench_precisions_rows_and_ratios_with_a_fake_clock(monkeypatch):
    from rvqspec_lib.models.loader import load_model

    lm = load_model("tiny-random")
    _fake_clock(monkeypatch, lambda: 2.0)  # every call 2 ms
    bw = {"gb_per_s": 10.0, "gb_per_s_max": 11.0, "buffer_bytes": 1 << 29, "repeats": 7, "threads": 1,
          "llc_bytes": None, "buffer_exceeds_llc": None}
    r = latency.bench_precisions(lm, PR.PRECISIONS, warmup=1, repeats=3, bandwidth=bw, progress=False)
    assert [p["precision"] for p in r["precisions"]] == list(PR.PRECISIONS)
    for p in r["precisions"]:
        assert [row["n_queries"] for row in p["rows"]] == list(latency.PRECISION_QUERY_SIZES)
        assert all(row["median_ms"] == pytest.approx(2.0) and row["n"] == 3 for row in p["rows"])
        assert all(row["ratio_to_1"] == pytest.approx(1.0) for row in p["rows"])
        assert p["weight_bytes"]["bytes"] == hand_bytes(p["precision"])
        assert p["floor_ms"] == pytest.approx(hand_bytes(p["precision"]) / 10e9 * 1e3)
        assert p["t1_over_floor"] == pytest.approx(2.0 / p["floor_ms"])
    assert r["random_weights"] is True and r["repeats"] == 3 and r["backends"] == ["official"]
    assert PR.precision_of(lm.code_predictor) == "float32"  # the model itself is not converted
    json.dumps(r)
    text = latency.format_precision_table(r)
    lines = text.splitlines()
    assert "RANDOM weights: timing only" in lines[0] and "threads" in lines[0]
    assert lines[1].startswith("CPU ") and "native precisions: float32" in lines[1] and "bf16 flags" in lines[1]
    assert "read bandwidth 10.0 GB/s" in lines[2]
    assert lines[3] == ("| precision | backend | t1_ms | t2_over_t1 | t4_over_t1 | t8_over_t1 | t16_over_t1 | "
                        "mb_per_call | floor_ms | t1_over_floor |")
    for line, prec in zip(lines[5:], PR.PRECISIONS):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == [prec, "official"] and cells[2] == "2" and cells[3:7] == ["1"] * 4
    assert len(lines) == 5 + len(PR.PRECISIONS)
    rows = latency.precision_rows(r)  # the same result as table rows (notebook 07's 07_floor)
    assert [(x["precision"], x["backend"]) for x in rows] == [(p, "official") for p in PR.PRECISIONS]
    for x, p in zip(rows, r["precisions"]):
        assert x["t1_ms"] == pytest.approx(2.0) and x["t1_over_floor"] == p["t1_over_floor"]
        assert [k for k in x if k.endswith("_over_t1")] == ["t2_over_t1", "t4_over_t1", "t8_over_t1", "t16_over_t1"]
        assert x["mb_per_call"] == p["weight_bytes"]["bytes"] / 1e6 and x["floor_ms"] == p["floor_ms"]


def test_bench_precisions_times_the_native_forward_beside_the_official(monkeypatch):
    """backends=("official", "native"): one entry per (precision, backend), both against the same floor."""
    from rvqspec_lib.models.loader import load_model

    lm = load_model("tiny-random")
    _fake_clock(monkeypatch, lambda: 2.0)
    bw = {"gb_per_s": 10.0, "gb_per_s_max": 11.0, "buffer_bytes": 1 << 29, "repeats": 7, "threads": 1,
          "llc_bytes": None, "buffer_exceeds_llc": None}
    r = latency.bench_precisions(lm, ["float32", "int8-dynamic"], warmup=1, repeats=2, bandwidth=bw, progress=False,
                                 backends=("official", "native"))
    assert [(p["precision"], p["backend"]) for p in r["precisions"]] == [
        ("float32", "official"), ("float32", "native"), ("int8-dynamic", "official"), ("int8-dynamic", "native")]
    assert r["precisions"][0]["floor_ms"] == r["precisions"][1]["floor_ms"]
    lines = latency.format_precision_table(r).splitlines()
    assert [[c.strip() for c in ln.strip("|").split("|")][:2] for ln in lines[5:]] == [
        ["float32", "official"], ["float32", "native"], ["int8-dynamic", "official"], ["int8-dynamic", "native"]]
    with pytest.raises(ValueError, match="backends of official, eager"):
        latency.bench_precisions(lm, ["float32"], backends=("tpu",), bandwidth=bw, progress=False)
    with pytest.raises(ValueError, match="the onnx backend runs float32 modules"):
        latency.bench_precisions(lm, ["int8"], backends=("onnx",), bandwidth=bw, progress=False)


def test_cli_bench_precisions_prints_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(timing, "DEFAULT_BUFFER_BYTES", 1 << 22)
    monkeypatch.setattr(PR, "cpu_flags", lambda *a: frozenset({"avx512_bf16"}))
    out = tmp_path / "p.json"
    rc = cli_main(["bench", "precisions", "--model", "tiny-random", "--repeats", "1", "--warmup", "0",
                   "--no-progress", "--dtype", "float32,int8", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| t1_over_floor |" in printed and "\n| int8 | " in printed and "\n| float32 | " in printed
    rec = json.loads(out.read_text())
    from rvqspec_lib.device.kernels import cpforward

    both = cpforward.available()  # default backends: official and, where it builds, native
    assert [(p["precision"], p["backend"]) for p in rec["precisions"]] == (
        [("float32", "official"), ("float32", "native"), ("int8", "official"), ("int8", "native")] if both
        else [("float32", "official"), ("int8", "official")])
    assert [r["n_queries"] for r in rec["precisions"][0]["rows"]] == list(latency.PRECISION_QUERY_SIZES)
    bw = rec["bandwidth"]  # measured before and after the timing; the floor uses the faster
    assert bw["buffer_bytes"] == 1 << 22 and bw["gb_per_s"] == max(bw["gb_per_s_before"], bw["gb_per_s_after"])
    assert "before and" in printed and "after the timing" in printed


def test_cli_bench_precisions_with_talker_contexts_times_the_talker_on_the_same_floor(tmp_path, capsys, monkeypatch):
    """--talker-contexts: the talker step per precision and context (official, and native where it builds) against
    the floor of the SAME bandwidth reading as the code-predictor calls (what scripts/bench_talker.py did)."""
    monkeypatch.setattr(timing, "DEFAULT_BUFFER_BYTES", 1 << 22)
    out = tmp_path / "p.json"
    assert cli_main(["bench", "precisions", "--model", "tiny-random", "--repeats", "1", "--warmup", "0",
                     "--no-progress", "--dtype", "float32", "--queries", "1,2", "--talker-contexts", "4,8",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rec = json.loads(out.read_text())
    tk = rec["talker"]
    assert tk["bandwidth"] == rec["bandwidth"] and {r["context"] for r in tk["rows"]} == {4, 8}
    assert all(r["floor_ms"] == floor.floor_ms(r["weight_bytes"], rec["bandwidth"]["gb_per_s"]) for r in tk["rows"])
    assert "talker step (1 new position + codec_head)" in printed
    from rvqspec_lib.device.kernels import cpforward

    assert ("scan_cost" in tk) is cpforward.available() and ("KV scan" in printed) is cpforward.available()


def test_cli_bench_latency_of_one_dtype_prints_the_floor_line(capsys, monkeypatch):
    monkeypatch.setattr(timing, "DEFAULT_BUFFER_BYTES", 1 << 22)
    monkeypatch.setattr(PR, "cpu_flags", lambda *a: frozenset({"avx512_bf16"}))
    rc = cli_main(["bench", "latency", "--model", "tiny-random", "--repeats", "1", "--warmup", "0", "--no-progress",
                   "--queries", "1,2", "--dtype", "int8"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "dtype bfloat16 (code predictor int8)" in printed
    assert f"floor of a code-predictor call: {hand_bytes('int8') / 1e6:.1f} MB of weights" in printed
