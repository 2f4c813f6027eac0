"""``rvqspec bench`` and its library: the call budget from the shipped config, the latency result's shape, the jobs
as a user runs them (one line for bad input, before any model loads), the frames job's
rows from one interleaved run, the GPU leg's JSON (frames with a calibration and the cost curve), and provenance
files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import cli as cli_bench
from bench import jobs as bench_jobs
from rvqspec_lib.cli.main import main as cli_main
from rvqspec_lib.common.provenance import provenance, save_figure, save_json, save_table
from bench import latency
from rvqspec_lib.eval import speed, timing
from rvqspec_lib.models import backends

REPO = Path(__file__).resolve().parent.parent
CFG_06B = REPO / "data" / "configs" / "Qwen3-TTS-12Hz-0.6B-CustomVoice"


def _shipped_06b_rates() -> tuple[float, int]:
    """frame_rate_hz and n_code_groups read straight from the shipped 0.6B config files."""
    st = json.loads((CFG_06B / "speech_tokenizer" / "config.json").read_text())
    cfg = json.loads((CFG_06B / "config.json").read_text())
    return st["output_sample_rate"] / st["decode_upsample_rate"], cfg["talker_config"]["num_code_groups"]


def _no_load(*a, **k):
    raise AssertionError("the model was loaded before the flags were checked")


# ---------------------------------------------------------------------------------------------------------------------
# call budget
# ---------------------------------------------------------------------------------------------------------------------
def test_call_budget_from_shipped_config_is_200():
    fr, groups = _shipped_06b_rates()
    assert (fr, groups) == (12.5, 16)
    b = latency.call_budget(fr, groups)
    assert b["calls_per_s"] == 200.0
    assert b["calls_per_s_ar"] == 200.0 and b["reduction"] == 1.0
    assert b["inner_calls_per_frame"] == 15 and b["calls_per_frame"] == 16


def test_call_budget_at_paper_tokens_per_call():
    fr, groups = _shipped_06b_rates()
    b = latency.call_budget(fr, groups, latency.PAPER_TOKENS_PER_CALL)
    assert b["calls_per_s"] == pytest.approx(88.4, abs=0.1)  # 12.5 * (1 + 15 / 2.47)
    assert b["reduction"] == pytest.approx(200 / b["calls_per_s"])


def test_budget_table_labels_paper_value():
    rows = latency.budget_table(12.5, 16)
    assert [r["tokens_per_call"] for r in rows] == list(latency.DEFAULT_TOKENS_PER_CALL)
    (paper,) = [r for r in rows if r["note"] == "paper's reported value"]
    assert paper["tokens_per_call"] == 2.47
    assert rows[0]["calls_per_s"] == 200.0 and rows[0]["note"] == "plain AR"
    assert all(a["calls_per_s"] > b["calls_per_s"] for a, b in zip(rows, rows[1:]))  # more tpc, fewer calls


@pytest.mark.parametrize("args", [(0, 16, None), (12.5, 1, None), (12.5, 16, 0.0), (12.5, 16, -1.0)])
def test_call_budget_rejects_bad_input(args):
    with pytest.raises(ValueError):
        latency.call_budget(*args)


def test_inner_share():
    assert latency.inner_share(10.0, 10.0, 15) == pytest.approx(15 / 16)
    assert latency.inner_share(0.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        latency.inner_share(0.0, 0.0)
    with pytest.raises(ValueError):
        latency.inner_share(-1.0, 1.0)


# ---------------------------------------------------------------------------------------------------------------------
# latency
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from rvqspec_lib.models.loader import load_model

    return load_model("tiny-random")


def test_bench_model_tiny_keys_and_positive_times(tiny):
    qs = (1, 2, 4)
    r = latency.bench_model(tiny, query_sizes=qs, warmup=1, repeats=2, progress=False)
    for key in ("model", "random_weights", "device", "device_name", "dtype", "threads", "torch", "prefix_len",
                "talker_context", "talker_step", "code_predictor", "derived", "load_avg_1min_before",
                "load_avg_1min_after", "other_cpu_frac", "cpu_oversubscribed", "backend", "repeats", "rel_se_max"):
        assert key in r, key
    assert r["random_weights"] is True and r["backend"] == "official" and "floor_ms" not in r
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
    table = latency.format_latency(r)
    assert "RANDOM weights" in table and "threads" in table and "dtype float32" in table and "2 repeats" in table
    assert len(latency.latency_rows(r)) == 1 + len(qs)
    with pytest.raises(ValueError, match="query sizes"):
        latency.bench_model(tiny, query_sizes=(0,), progress=False)


def test_bench_model_leaves_the_model_unchanged(tiny):
    """The timed calls write their own caches and crop the talker's; a fresh forward gives the same numbers."""
    cp = tiny.code_predictor
    x = torch.randn(1, 3, tiny.talker.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before = cp.model(inputs_embeds=cp.small_to_mtp_projection(x)).last_hidden_state
        latency.bench_model(tiny, query_sizes=(2,), warmup=0, repeats=1, progress=False)
        after = cp.model(inputs_embeds=cp.small_to_mtp_projection(x)).last_hidden_state
    torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_the_talker_step_is_cropped_back_after_every_call(tiny):
    call, reset = latency.official_step(tiny.talker, 5)
    for _ in range(3):
        assert call().shape == (1, tiny.talker.config.vocab_size)
        reset()
    with pytest.raises(ValueError, match="talker_context"):
        latency.official_step(tiny.talker, 0)


def test_the_parser_copies_agree_with_the_library():
    assert cli_bench.QUERY_SIZES == speed.QUERY_SIZES
    assert cli_bench.BACKENDS == backends.BACKENDS


def test_cli_latency_writes_json_with_the_floor(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(timing, "DEFAULT_BUFFER_BYTES", 1 << 22)
    out = tmp_path / "b.json"
    rc = cli_main(["bench", "latency", "--model", "tiny-random", "--repeats", "1", "--warmup", "0", "--queries",
                   "1,2", "--no-progress", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "code predictor" in printed and "talker step" in printed and "floor of a code-predictor call" in printed
    rec = json.loads(out.read_text())
    assert [r["n_queries"] for r in rec["code_predictor"]] == [1, 2]
    assert rec["provenance"]["params"]["model"] == "tiny-random" and rec["total_s"] > 0
    bw = rec["bandwidth"]  # read before and after the timing; the floor uses the faster
    assert bw["buffer_bytes"] == 1 << 22 and bw["gb_per_s"] == max(bw["gb_per_s_before"], bw["gb_per_s_after"])


@pytest.mark.parametrize("argv, needle", [
    ([], "give a job: rvqspec bench latency, precisions, frames, table or pipeline"),
])
def test_no_job_is_one_line(capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(bench_jobs.loader, "load_model", _no_load)
    assert cli_main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, needle", [
    (["latency", "--dtype", "float32,int8"], "--dtype float32,int8: give one of"),
    (["latency", "--dtype", "float16"], "float16 is a GPU precision here"),
    (["latency", "--backend", "tpu"], "--backends tpu: use some of official, eager, compile, onnx, native"),
    (["latency", "--noise-target", "0"], "--noise-target 0 is not a relative standard error"),
    (["latency", "--noise-target", "0.02", "--repeats", "1"], "--noise-target needs --repeats >= 2"),
    (["latency", "--device", "tpu"], "--device 'tpu': use cpu, cuda[:N] or mps"),
    (["precisions", "--dtype", "float64"], "--dtype float64: give some of float32, bfloat16, int8, int8-dynamic"),
    (["frames", "--backends", "coreml"], "rvqspec export --format coreml"),
    (["frames", "--decoders", "ar,ssd-lossy"], "ssd-lossy is a LOSSY control"),
    (["frames", "--decoders", "chain:best"], "--decoders chain:best: bench times named lossless decoders"),
    (["frames", "--decoders", "paper"], "the 'offsets' drafter is not shipped beside tiny-random"),
    (["frames", "--backends", "native", "--device", "cuda"], "--device cuda"),
])
def test_bad_flags_are_one_line_before_loading(capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(bench_jobs.loader, "load_model", _no_load)
    assert cli_main(["bench", argv[0], "--model", "tiny-random", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("job, seed", [("latency", -1), ("frames", 2**63)])
def test_a_seed_out_of_range_is_one_line_from_the_parser(capsys, monkeypatch, job, seed):
    monkeypatch.setattr(bench_jobs.loader, "load_model", _no_load)
    with pytest.raises(SystemExit) as e:  # the parser's own errors exit 2 as argparse does
        cli_main(["bench", job, "--model", "tiny-random", "--seed", str(seed)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"rvqspec: error: --seed must be in 0..9223372036854775807 (2**63 - 1), got {seed}" in err, err


# ---------------------------------------------------------------------------------------------------------------------
# frames
# ---------------------------------------------------------------------------------------------------------------------
def test_cli_frames_prints_every_runner_from_one_run(tmp_path, capsys):
    out = tmp_path / "f.json"
    rc = cli_main(["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--repeats", "2", "--warmup",
                   "0", "--no-progress", "--json", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(out.read_text())
    rows = {(r["decoder"], r["fused"]): r for r in res["rows"]}
    assert set(rows) == {("ar", False), ("chain:4", False), ("tree:0;1;0,0;0,0,0", False), ("ar", True),
                         ("chain:4", True)} and {r["backend"] for r in rows.values()} == {"eager"}
    assert rows[("ar", False)]["speedup_vs_ar"] == 1.0 and rows[("ar", True)]["speedup_vs_fused"] == 1.0
    for r in rows.values():  # the speedups are read off the medians of the same run
        assert r["speedup_vs_ar"] == pytest.approx(rows[("ar", False)]["ms_per_frame"] / r["ms_per_frame"])
    assert "| chain:4 | eager | True |" in cap.out and "backends eager" in cap.out and "2 repeats" in cap.out
    assert "16 random contexts (tokens per call mean little)" in cap.out and res["backends"] == ["eager"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_frames_times_a_bfloat16_checkpoint_in_the_dtype_asked(tmp_path, capsys, dtype):
    from tests.checkpoints import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", dtype=torch.bfloat16)  # stored in bfloat16, as the release
    out = tmp_path / "f.json"
    rc = cli_main(["bench", "frames", "--model", str(ckpt), "--backends", "eager", "--decoders", "ar", "--dtype", dtype,
                   "--repeats", "1", "--warmup", "0", "--no-progress", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    res = json.loads(out.read_text())
    assert {r["precision"] for r in res["rows"]} == {dtype}  # float32 asked: float32 run, never the stored bfloat16


@pytest.mark.parametrize("other, crowded", [(0.9, True), (0.0, False)])  # 0.0: negative control
def test_cli_frames_footer_says_oversubscribed(capsys, monkeypatch, other, crowded):
    monkeypatch.setattr(timing.LoadMonitor, "describe", lambda self: {"other_cpu_frac": other})
    rc = cli_main(["bench", "frames", "--model", "tiny-random", "--repeats", "2", "--warmup", "1", "--no-progress",
                   "--decoders", "ar"])
    out = capsys.readouterr().out
    assert rc == 0 and "every runner: 1 warm-up frame(s), then 2 repeats" in out, out
    assert ("OVERSUBSCRIBED: other processes used 90% of the CPU" in out) is crowded, out


def test_cli_frames_replay_has_no_fused_speculative_rows(tmp_path, capsys):
    cal = REPO / "data" / "embedded" / "model" / "trees" / "heads.json"
    rc = cli_main(["bench", "frames", "--model", "tiny-random", "--repeats", "1", "--warmup", "0", "--no-progress",
                   "--decoders", "chain:3", "--acceptance", str(cal), "--json", str(tmp_path / "r.json")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {(r["decoder"], r["fused"]) for r in rows} == {("ar", False), ("chain:3", False)}  # AR added: speedups
    assert "no fused speculative rows" in cap.out


# ---------------------------------------------------------------------------------------------------------------------
# the GPU leg's JSON (rvqspec bench frames --calibration --queries), as notebook 07 reads it
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_frames_with_calibration_and_queries_writes_what_notebook_07_reads(tmp_path, capsys):
    out, cal = tmp_path / "gpu.json", REPO / "data" / "embedded" / "model" / "trees" / "heads.json"
    assert cli_main(["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--decoders",
                     "chain:2,chain:4,tree:calibrated:4", "--calibration", str(cal), "--queries", "1,4", "--repeats",
                     "2", "--warmup", "0", "--no-progress", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["backends"] == ["eager"] and res["precision"] == "float32" and res["random_weights"] is True
    assert res["provenance"]["params"]["model"] == "tiny-random"
    rows = {(r["decoder"], r["fused"]): r for r in res["rows"]}
    assert {("ar", False), ("ar", True), ("chain:2", True), ("chain:4", True), ("chain:4", False)} <= set(rows)
    assert any(d.startswith("tree:calibrated") for d, _ in rows)  # the trees of --calibration
    assert rows[("ar", False)]["speedup_vs_ar"] == 1.0 and rows[("ar", True)]["speedup_vs_fused"] == 1.0
    (s,) = res["summary"]
    assert s["fused_spec_decoder"] in ("chain:2", "chain:4") and s["fused_ar_ms"] == rows[("ar", True)]["ms_per_frame"]
    assert [r["query_positions"] for r in res["verify_cost"]] == [1, 4] and res["verify_cost"][0]["ratio_to_q1"] == 1.0
    (p,) = res["projected"]  # E(4) of the calibration over t(4)/t(1) of the same run
    assert p["nodes"] == 4 and p["projected_speedup"] == pytest.approx(p["expected_tokens"] / p["cost_ratio"])
    assert "| chain:4 | eager | True |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [(["--queries", "2,4"], "--queries 2,4: put 1 among them"),
                                          (["--calibration", "no/such.json"], "--calibration no/such.json does not "
                                                                              "exist")])
def test_frames_gpu_leg_flags_are_one_line(capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(bench_jobs.loader, "load_model", _no_load)
    assert cli_main(["bench", "frames", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and needle in err and err.count("\n") == 1, err


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


def test_oversubscribed_bench_says_so_in_the_figure_title():
    from paper.plots import bench_title

    r = {"model": {"name": "m"}, "random_weights": False, "device": "cpu", "device_name": "x", "dtype": "float32",
         "threads": 1, "torch": "2", "cpu_count": 2, "other_cpu_frac": 0.63}
    assert "OVERSUBSCRIBED: other processes used 63% of the CPU" in bench_title(r)
    assert "OVERSUBSCRIBED" not in bench_title({**r, "other_cpu_frac": 0.01})  # the negative control
