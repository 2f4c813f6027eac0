"""Benchmark helpers and provenance files: config-derived call budget, timing contract, result shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rvqspec_lib.cli.main import main as cli_main
from rvqspec_lib.common.provenance import provenance, save_figure, save_json, save_table
from rvqspec_lib.eval import bench

REPO = Path(__file__).resolve().parent.parent
CFG_06B = REPO / "data" / "configs" / "Qwen3-TTS-12Hz-0.6B-CustomVoice"


def _shipped_06b_rates() -> tuple[float, int]:
    """frame_rate_hz and n_code_groups read straight from the shipped 0.6B config files."""
    st = json.loads((CFG_06B / "speech_tokenizer" / "config.json").read_text())
    cfg = json.loads((CFG_06B / "config.json").read_text())
    return st["output_sample_rate"] / st["decode_upsample_rate"], cfg["talker_config"]["num_code_groups"]


# ---------------------------------------------------------------------------------------------------------------------
# call budget
# ---------------------------------------------------------------------------------------------------------------------
def test_call_budget_from_shipped_config_is_200():
    fr, groups = _shipped_06b_rates()
    assert (fr, groups) == (12.5, 16)
    b = bench.call_budget(fr, groups)
    assert b["calls_per_s"] == 200.0
    assert b["calls_per_s_ar"] == 200.0 and b["reduction"] == 1.0
    assert b["inner_calls_per_frame"] == 15 and b["calls_per_frame"] == 16


def test_call_budget_at_paper_tokens_per_call():
    fr, groups = _shipped_06b_rates()
    b = bench.call_budget(fr, groups, bench.PAPER_TOKENS_PER_CALL)
    assert b["calls_per_s"] == pytest.approx(88.4, abs=0.1)  # 12.5 * (1 + 15 / 2.47)
    assert b["reduction"] == pytest.approx(200 / b["calls_per_s"])


def test_budget_table_labels_paper_value():
    rows = bench.budget_table(12.5, 16)
    assert [r["tokens_per_call"] for r in rows] == list(bench.DEFAULT_TOKENS_PER_CALL)
    (paper,) = [r for r in rows if r["note"] == "paper's reported value"]
    assert paper["tokens_per_call"] == 2.47
    assert rows[0]["calls_per_s"] == 200.0 and rows[0]["note"] == "plain AR"
    assert all(a["calls_per_s"] > b["calls_per_s"] for a, b in zip(rows, rows[1:]))  # more tpc, fewer calls


@pytest.mark.parametrize("args", [(0, 16, None), (12.5, 1, None), (12.5, 16, 0.0), (12.5, 16, -1.0)])
def test_call_budget_rejects_bad_input(args):
    with pytest.raises(ValueError):
        bench.call_budget(*args)


def test_inner_share():
    assert bench.inner_share(10.0, 10.0, 15) == pytest.approx(15 / 16)
    assert bench.inner_share(0.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        bench.inner_share(0.0, 0.0)
    with pytest.raises(ValueError):
        bench.inner_share(-1.0, 1.0)


# ---------------------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------------------
def test_other_cpu_fraction():
    assert bench.other_cpu_fraction(None, (1.0, 2.0, 0.0)) is None
    assert bench.other_cpu_fraction((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)) is None  # no time elapsed
    assert bench.other_cpu_fraction((0.0, 0.0, 0.0), (3.0, 4.0, 1.0)) == pytest.approx(0.5)  # 2 of 4 cpu-s by others
    assert bench.other_cpu_fraction((0.0, 0.0, 0.0), (1.0, 4.0, 2.0)) == 0.0  # clipped (tick rounding)
    r = {"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": 0.5}
    assert bench.cpu_oversubscribed(r) is True  # one busy core of two: above OTHER_CPU_LIMIT
    assert bench.cpu_oversubscribed({**r, "other_cpu_frac": bench.OTHER_CPU_LIMIT}) is False  # at the limit: quiet
    assert bench.cpu_oversubscribed({**r, "other_cpu_frac": 0.1, "threads": 2}) is True  # threads wanting cores
    assert bench.cpu_oversubscribed({**r, "other_cpu_frac": 0.02}) is False
    assert bench.cpu_oversubscribed({**r, "device": "cuda"}) is None
    assert bench.cpu_oversubscribed({**r, "other_cpu_frac": None}) is None
    snap = bench._cpu_snapshot()
    if snap is not None:  # Linux
        busy, total, own = snap
        assert 0 <= busy <= total and own >= 0


def test_oversubscribed_note_names_the_share():
    assert bench.oversubscribed_note({"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": 0.634}) == \
        "OVERSUBSCRIBED: other processes used 63% of the CPU"
    assert bench.oversubscribed_note({"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": 0.05}) == ""


@pytest.mark.parametrize("shares, runs, note", [
    ([0.05], 1, ""),                      # quiet: measured once
    ([0.63, 0.04], 2, ""),                # oversubscribed, then quiet: re-measured once, the quiet run kept
    ([0.63, 0.45], 2, "OVERSUBSCRIBED: other processes used 45% of the CPU"),  # still: the quieter run, labelled
    ([0.45, 0.63], 2, "OVERSUBSCRIBED: other processes used 45% of the CPU"),
])
def test_measure_quietly_remeasures_once_with_the_cpu_share_faked(shares, runs, note):
    calls = []

    def measure():  # a timing whose CPU share is faked: the i-th run reports shares[i]
        calls.append(len(calls))
        return {"meta": {"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": shares[len(calls) - 1]},
                "run": len(calls) - 1}

    result, info = bench.measure_quietly(measure, meta=lambda r: r["meta"])
    assert len(calls) == runs and info["attempts"] == shares[:runs]
    assert result["meta"]["other_cpu_frac"] == min(shares[:runs]) and info["note"] == note
    assert info["oversubscribed"] is bool(note)


def test_oversubscribed_bench_says_so_in_the_figure_title():
    from rvqspec_lib.eval.plots import bench_title

    r = {"model": {"name": "m"}, "random_weights": False, "device": "cpu", "device_name": "x", "dtype": "float32",
         "threads": 1, "torch": "2", "cpu_count": 2, "other_cpu_frac": 0.63}
    assert "OVERSUBSCRIBED: other processes used 63% of the CPU" in bench_title(r)
    assert "OVERSUBSCRIBED" not in bench_title({**r, "other_cpu_frac": 0.01})  # the negative control


def test_time_call_excludes_warmup_and_resets_outside():
    calls, resets = [], []
    stats = bench.time_call(lambda: calls.append(torch.is_inference_mode_enabled()), warmup=2, repeats=5,
                            reset=lambda: resets.append(1))
    assert len(calls) == 7 and len(resets) == 7 and all(calls)
    assert stats["n"] == 5
    assert 0 <= stats["min_ms"] <= stats["p10_ms"] <= stats["median_ms"] <= stats["p90_ms"]
    with pytest.raises(ValueError):
        bench.time_call(lambda: None, repeats=0)


def test_time_call_noise_target_between_min_and_max(monkeypatch):
    from rvqspec_lib.eval import noise

    calls = []
    assert bench.time_call(lambda: calls.append(1), warmup=1, repeats=3, noise_target=1e9)["n"] == 3  # met at once
    assert len(calls) == 4
    monkeypatch.setattr(noise, "should_stop", lambda s, t, lo, hi: len(s["call"]) >= 6)  # met at 6 of 3..10
    stats = bench.time_call(lambda: None, warmup=0, repeats=3, noise_target=0.02, max_repeats=10)
    assert stats["n"] == 6 and stats["rel_se"] is not None
    monkeypatch.setattr(noise, "should_stop", lambda s, t, lo, hi: len(s["call"]) >= hi)  # never met: the cap
    assert bench.time_call(lambda: None, warmup=0, repeats=3, noise_target=0.02)["n"] == 4 * 3
    with pytest.raises(ValueError, match=">= 2"):
        bench.time_call(lambda: None, repeats=1, noise_target=0.02)


@pytest.fixture(scope="module")
def tiny():
    from rvqspec_lib.models.loader import load_model

    return load_model("tiny-random")


def test_bench_model_tiny_keys_and_positive_times(tiny):
    qs = (1, 2, 4)
    r = bench.bench_model(tiny, query_sizes=qs, warmup=1, repeats=2, progress=False)
    for key in ("model", "random_weights", "timing_only", "device", "device_name", "dtype", "threads", "torch",
                "transformers", "prefix_len", "talker_context", "talker_step", "code_predictor", "derived",
                "load_avg_1m_before", "load_avg_1m_after", "other_cpu_frac", "cpu_oversubscribed"):
        assert key in r, key
    assert r["random_weights"] is True and r["timing_only"] is True
    assert r["device"] == "cpu" and r["dtype"] == "float32" and r["threads"] == torch.get_num_threads()
    assert r["talker_step"]["median_ms"] > 0 and r["talker_step"]["n"] == 2
    assert [row["n_queries"] for row in r["code_predictor"]] == list(qs)
    for row in r["code_predictor"]:
        assert row["median_ms"] > 0 and row["min_ms"] > 0 and row["n"] == 2
        assert row["ratio_to_1"] == pytest.approx(row["median_ms"] / r["code_predictor"][0]["median_ms"])
    assert r["code_predictor"][0]["ratio_to_1"] == 1.0
    d = r["derived"]
    assert d["calls_per_s_realtime"] == tiny.frame_rate_hz * tiny.n_code_groups
    assert 0 < d["inner_share_ar"] < 1
    assert d["frame_ms_ar"] == pytest.approx(d["t_talker_ms"] + (tiny.n_code_groups - 1) * d["t_inner_ms"])
    json.dumps(r)  # JSON-able as it is
    table = bench.format_table(r)
    assert "RANDOM weights" in table and "threads" in table and "dtype float32" in table
    assert len(bench.latency_rows(r)) == 1 + len(qs)


def test_bench_leaves_model_usable(tiny):
    """The timed calls crop their caches; a fresh forward of the code predictor still works and is unchanged."""
    cp = tiny.code_predictor
    x = torch.randn(1, 3, tiny.talker.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before = cp.model(inputs_embeds=cp.small_to_mtp_projection(x)).last_hidden_state
        bench.bench_code_predictor(tiny, query_sizes=(2,), warmup=0, repeats=1, progress=False)
        after = cp.model(inputs_embeds=cp.small_to_mtp_projection(x)).last_hidden_state
    torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_cli_main_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = cli_main(["bench", "--model", "tiny-random", "--repeats", "1", "--warmup", "0", "--queries", "1,2",
                   "--no-progress", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "code predictor" in printed and "talker step" in printed
    rec = json.loads(out.read_text())
    assert [r["n_queries"] for r in rec["code_predictor"]] == [1, 2]
    assert rec["provenance"]["params"]["model"] == "tiny-random"


def test_cli_rejects_bad_queries():
    import argparse

    from rvqspec_lib.cli.bench import add_args

    parser = add_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--queries", "0,2"])


# ---------------------------------------------------------------------------------------------------------------------
# provenance files
# ---------------------------------------------------------------------------------------------------------------------
def test_provenance_record_and_files(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    prov = provenance({"model": "tiny-random", "qs": (1, 2)}, seed=3)
    for key in ("git", "created_utc", "params", "seed", "hardware", "versions"):
        assert key in prov
    assert prov["params"]["qs"] == [1, 2] and prov["seed"] == 3
    assert {"python", "torch", "transformers"} <= set(prov["versions"])
    assert "hostname" not in json.dumps(prov).lower()

    recs = [{"a": 1, "b": 0.5}, {"a": 2, "b": None, "c": "x|y"}]
    paths = save_table(recs, tmp_path / "t", prov)
    assert paths["csv"].read_text().splitlines()[0] == "a,b,c"
    md = paths["md"].read_text().splitlines()
    assert md[0] == "| a | b | c |" and len(md) == 4 and "x\\|y" in md[3]
    assert json.loads(paths["provenance"].read_text())["files"] == ["t.csv", "t.md"]
    save_table(pd.DataFrame(recs), tmp_path / "df", prov)
    assert (tmp_path / "df.provenance.json").exists()
    with pytest.raises(TypeError):
        save_table([], tmp_path / "empty", prov)

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = save_figure(fig, tmp_path / "sub" / "f", prov)
    plt.close(fig)
    assert paths["png"].stat().st_size > 0 and paths["pdf"].stat().st_size > 0
    assert (tmp_path / "sub" / "f.provenance.json").exists()

    p = save_json({"x": float("nan"), "y": torch.tensor(2.0)}, tmp_path / "m.json", prov)
    rec = json.loads(p.read_text())
    assert rec["x"] is None and rec["y"] == 2.0 and rec["provenance"]["seed"] == 3
