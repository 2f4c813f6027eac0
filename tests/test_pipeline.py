"""The pipeline table (bench/table.py, ``rvqspec bench pipeline``; docs/streaming.md): its rows add up
(the frame on one thread is the parts' sum, on all cores their overlapped maximum, shares sum to one, AR's gains are
one), floors and Amdahl's words come from the rows, a replay is labelled and streams placeholder codes, the quoted
ports stay in their own rows, and bad flags are one line before any model loads. Behaviour only: no speed is
asserted."""

from __future__ import annotations

import json

import pytest
import torch

import rvqspec_lib.models.loader as loader
from rvqspec_lib.cli.main import main
from rvqspec_lib.decoding.decode import FrameResult
from bench import table as PL
from rvqspec_lib.models.backends import available

pytestmark = pytest.mark.skipif(not available("native")[0], reason="the pipeline runs the native forward")


@pytest.fixture(scope="module")
def result():
    return PL.pipeline_table(models=["tiny-random"], precisions=["float32"], frames=4, batches=(1, 2), repeats=2,
                             warmup=0, stream_repeats=1, chains=(4,), budgets=(4,), auto_frames=2, n_contexts=2,
                             codec_config="tiny")


def test_rows_add_up(result):
    rows = result["rows"]
    assert [r["row"] for r in rows] == list(PL.PIPELINE_ROWS)
    for r in rows:
        assert r["weights"].startswith("timing replay: acceptance of") and r["model"] == "tiny-random"
        assert r["frame_1t_ms"] == pytest.approx(r["talker_ms"] + r["inner_ms"] + r["codec_ms"])
        assert r["frame_2c_ms"] == pytest.approx(max(r["talker_ms"] + r["inner_ms"], r["codec_ms"]))
        assert r["rtf_1t"] == pytest.approx(r["frame_1t_ms"] / 80) and r["rtf_2c"] == pytest.approx(
            r["frame_2c_ms"] / 80)
        assert sum(r[f"{p}_share"] for p in PL.PARTS) == pytest.approx(1.0)
        for p in PL.PARTS:
            assert r[f"{p}_floor_ms"] > 0 and r[f"{p}_x_floor"] == pytest.approx(r[f"{p}_ms"] / r[f"{p}_floor_ms"])
            assert r[f"{p}_cpu_ms"] >= 0
        assert r["dominant"] == max(PL.PARTS, key=lambda p: r[f"{p}_ms"])
        assert r["moves_frame"].startswith("one thread: ") and "all cores: " in r["moves_frame"]
    ar = rows[0]
    assert ar["decoder"] == "ar" and ar["fused"] and ar["inner_gain"] == ar["frame_gain_1t"] == 1.0
    best = rows[1]
    assert best["kind"] in ("chain", "calibrated", "tree") and not best["fused"]  # a replay is stepped
    assert best["inner_gain"] == pytest.approx(ar["inner_ms"] / best["inner_ms"])
    assert result["meta"]["codec_peak_gflops"] and result["meta"]["bandwidth"]["gb_per_s"] > 0


def test_streams_and_concurrency(result):
    streams = result["streams"]
    # one stream per distinct runner and layout (auto's pick, when it is the best speculative one, is streamed once)
    runners = {(r["decoder"], r["fused"]) for r in result["rows"]}
    assert sorted((s["decoder"], s["fused"], s["layout"]) for s in streams) == sorted(
        (d, f, lay) for d, f in runners for lay in PL.LAYOUTS)
    assert all(r[f"stream_ttfa_ms_{t}"] is not None for r in result["rows"] for t in ("1t", "2c"))
    for s in streams:
        assert s["batch"] == 1 and s["frames"] == 4 and s["weights"].startswith("timing replay")
        # the speculative frames replay the oracle (placeholder codes streamed); AR needs no replay (random codes)
        # (auto's row carries the label exactly when auto chose a speculative decoder)
        assert (s["replay"] is None) == (s["kind"] not in ("chain", "calibrated", "tree"))
        assert s["audio_s"] == pytest.approx(4 * 0.08) and s["chunks"] and s["ttfa_ms"] > 0
        assert s["realtime"] == (s["frame_ms"] <= 80)
    row = next(r for r in result["rows"] if r["row"] == "AR")
    s = next(s for s in streams if s["row"] == "AR" and s["layout"] == "all cores")
    assert row["stream_ttfa_ms_2c"] == s["ttfa_ms"] and row["stream_rtf_2c"] == s["rtf"]
    conc = result["concurrency"]
    assert {(c["row"], c["batch"], c["layout"]) for c in conc} == {
        (r, b, lay) for r in ("AR", "best speculative") for b in (1, 2) for lay in PL.LAYOUTS}
    assert all(not c["fused"] for c in conc)  # batched rows share the verify call: stepped
    for s in result["sustained"]:
        fit = [c["batch"] for c in conc if c["realtime"] and (c["row"], c["layout"]) == (s["row"], s["layout"])]
        assert s["streams"] == max(fit, default=0) and s["batches"] == [1, 2]


def test_quoted_ports_stay_in_their_own_rows_and_columns(result, tmp_path):
    rows = PL.pipeline_rows(result)
    quoted = [r for r in rows if r["weights"] == "QUOTED, not measured here"]
    assert len(quoted) == len(PL.PUBLIC_PIPELINES) and all(r.get("frame_1t_ms") is None for r in quoted)
    assert {r["quoted_rtf"] for r in quoted} >= {"0.95", "0.52-0.69"}
    assert all(r["quoted_rtf"] is None for r in rows if r not in quoted)
    out = PL.save(result, tmp_path / "p", {"params": {}})
    assert "quoted" in (tmp_path / "p.md").read_text().splitlines()[0]
    assert out["streams"]["csv"].is_file() and out["concurrency"]["csv"].is_file()
    assert json.loads((tmp_path / "p.json").read_text())["streams"][0]["chunks"]


def test_what_moves_names_the_dominant_part_and_its_floor():
    r = {"talker_ms": 10.0, "inner_ms": 20.0, "codec_ms": 50.0, "talker_floor_ms": 5.0, "inner_floor_ms": 10.0,
         "codec_floor_ms": 25.0, "frame_1t_ms": 80.0, "talker_share": 0.125, "inner_share": 0.25, "codec_share": 0.625}
    got = PL.what_moves(r)
    assert got["dominant"] == "codec" == got["headroom_part"] and got["frame_1t_at_floor_ms"] == 55.0 and \
        got["bottleneck_2c"] == "codec decoding"
    assert ("the codec decoder (62% of the frame, the largest share and the furthest above its floor: at its floor "
            "the frame would be 55 ms, not 80)") in got["moves_frame"]
    # the largest share near its floor: the part with the most headroom is named, the largest share beside it
    r["codec_floor_ms"] = 48.0
    got = PL.what_moves(r)
    assert got["dominant"] == "codec" and got["headroom_part"] == "inner" and got["frame_1t_at_floor_ms"] == 70.0
    assert ("the inner loop, the furthest above its floor of the parts with one (10.0 ms over it: at its floor the "
            "frame would be 70 ms, not 80), though the codec decoder is the largest share (62% of the frame)") \
        in got["moves_frame"]
    r["codec_floor_ms"] = None  # the largest share without a floor: said
    assert "the codec decoder is the largest share (62% of the frame; no floor computed for it)" in \
        PL.what_moves(r)["moves_frame"]
    for p in PL.PARTS:
        r[f"{p}_floor_ms"] = None
    got = PL.what_moves(r)
    assert got["frame_1t_at_floor_ms"] is None and got["headroom_part"] is None and "no floor" in got["moves_frame"]


def test_placeholder_codes_make_a_replay_streamable():
    class Sealed:
        acceptance, name = "the oracle", "chain:4"

        def __call__(self, context, generator=None):
            return FrameResult(torch.full((1, 15), -1), torch.tensor([7]), replay="timing replay: x")

    wrapped = PL.PlaceholderCodes(Sealed())
    res = wrapped(torch.zeros(1, 2, 8))
    assert torch.equal(res.codes, torch.zeros(1, 15, dtype=torch.long)) and res.replay == "timing replay: x"
    assert wrapped.acceptance == "the oracle" and wrapped.name == "chain:4" and res.calls.tolist() == [7]


@pytest.mark.parametrize("extra, needle", [
    (["--chunk-frames", "0"], "--chunk-frames must be in 1..--frames (40), got 0"),
    (["--chunk-frames", "5", "--frames", "4"], "--chunk-frames must be in 1..--frames (4)"),
    (["--batches", "0"], "--batches 0: streams run together are whole numbers >= 1: give e.g. 1,2,4"),
    (["--dtype", "float16"], "--dtype float16 is a GPU precision here"),
    (["--models", "nope"], "nope"),
    (["--stream-repeats", "0"], "--stream-repeats must be >= 1"),
    (["--table-out", "/proc/x/y"], "--table-out /proc/x/y: its folder cannot be made"),
])
def test_bad_pipeline_flags_are_one_line_before_loading(capsys, monkeypatch, extra, needle):
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded before the check"))
    try:
        rc = main(["bench", "pipeline", *extra])
    except SystemExit as e:  # the parser's own checks
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and err.count("\n") == 1 and needle in err, err


def test_a_replays_ar_runs_unreplayed_so_only_speculative_rows_carry_the_label():
    """auto may choose stepped AR on a given machine: that runner must carry no replay (AR accepts nothing)."""
    from rvqspec_lib.eval.replay import default_acceptance

    setup = PL.build_setup("tiny-random", "float32", acceptance=default_acceptance(), chains=(4,), budgets=(4,),
                           n_contexts=2, codec_config="tiny")
    ar, chain = setup.runner("ar", False), setup.runner("chain:4", False)
    assert not isinstance(ar, PL.PlaceholderCodes) and getattr(ar, "acceptance", None) is None
    assert isinstance(chain, PL.PlaceholderCodes) and chain.acceptance is setup.oracle
