"""The table to act on (bench.table), and ``rvqspec bench --backend NAME --dtype PRECISION``.

Behaviour only (no timed assertion): rows are keyed by structured fields (the decoder's label, kind, nodes, fused),
never by a label to parse; on a trained model the ``fused speculative`` row names the fused frame it timed (a
negative control that fused runners do not leak into ``best speculative``); a backend outside FULL_BACKENDS times
only the first full backend's picks; every row's ``x_fused_ar`` is its ms per frame over the fused AR row's, exactly.
The replay's absent row is in tests/test_replay.py. An onnx backend with a precision other than float32 is one line
naming the fix before any model loads; eager runs a precision on tiny-random.
"""

from __future__ import annotations

import pytest


def _table(**kw):
    from bench.table import bench_table

    kw = {"models": ("embedded",), "precisions": ("float32",), "backends": ("eager", "native"), "repeats": 1,
          "warmup": 0, "chains": (4,), "budgets": (4,), "auto": False, "n_contexts": 2, "progress": False, **kw}
    return bench_table(**kw)


@pytest.fixture(scope="module")
def embedded_table():
    """native as a LATER backend (what compile or onnx are), so that nothing compiles."""
    from bench import table as T

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "FULL_BACKENDS", ("eager",))
        return _table()


def test_rows_are_keyed_by_fields_and_a_later_backend_times_the_first_ones_picks(embedded_table):
    from bench.table import DECODER_FIELDS, ROWS, format_table

    rows = embedded_table["rows"]
    assert [r["row"] for r in rows] == list(ROWS) * 2 and all(r["weights"] == "trained" for r in rows)
    first, later = ({r["row"]: r for r in rows[i * len(ROWS):(i + 1) * len(ROWS)]} for i in (0, 1))
    fused = first["fused speculative"]
    assert {k: fused[k] for k in DECODER_FIELDS} == {"decoder": "chain:4", "kind": "chain", "drafter": "heads",
                                                       "nodes": 4, "lossy": False, "fused": True}
    assert fused["ms_per_frame"] > 0 and fused["tokens_per_call"] >= 1.0 and fused["build_s"] >= 0
    assert fused["note"].startswith("fastest of 1 fused frames timed; built in")
    best = first["best speculative"]
    assert best["fused"] is False and best["decoder"] in ("chain:4", "tree:calibrated-sampled:4",
                                                          "tree:calibrated-point-mass:4")
    assert (first["stepped AR"]["kind"], first["stepped AR"]["fused"], first["fused AR"]["fused"]) == \
        ("ar", False, True)
    # the later backend: only the first backend's picks (its best and its fastest fused frame)
    assert later["fused speculative"]["decoder"] == "chain:4" and later["fused speculative"]["backend"] == "native"
    assert later["fused speculative"]["note"].startswith("the eager rows' fastest fused frame; built in")
    assert later["best speculative"]["decoder"] == best["decoder"] and later["best speculative"]["note"] == \
        "the eager rows' best"
    assert set(embedded_table["meta"]["fused_build_s"]) == {f"embedded float32 {b} {d}/{b}" for b in ("eager", "native")
                                                            for d in ("ar", "chain:4")}
    text = format_table(embedded_table)
    assert "| x_fused_ar |" in text and "| fused speculative | chain:4 (eager, fused) |" in text


def test_the_floor_uses_the_faster_of_two_bandwidths(embedded_table):
    """The AR frame's floor: 15 calls' weight bytes at the faster of the bandwidths measured before and after the
    timing (a bandwidth read on a busy moment would put frames below their floor), x floor its ratio."""
    from bench.floor import call_weight_bytes, floor_ms
    from rvqspec_lib.models.loader import load_model

    bw = embedded_table["meta"]["bandwidth"]
    assert bw["gb_per_s"] == max(bw["gb_per_s_before"], bw["gb_per_s_after"])
    cp = load_model("embedded").code_predictor
    want = floor_ms(15 * call_weight_bytes(cp)["bytes"], bw["gb_per_s"])
    for r in embedded_table["rows"]:
        assert r["floor_ar_ms"] == pytest.approx(want)
        if r["ms_per_frame"]:
            assert r["x_floor_ar"] == pytest.approx(r["ms_per_frame"] / want)


def test_the_ratio_column_is_the_ratio_of_the_two_rows(embedded_table):
    rows = embedded_table["rows"]
    for part in (rows[:5], rows[5:]):
        by = {r["row"]: r for r in part}
        fused_ar = by["fused AR"]["ms_per_frame"]
        assert by["fused speculative"]["x_fused_ar"] == by["fused speculative"]["ms_per_frame"] / fused_ar
        assert by["best speculative"]["x_fused_ar"] == by["best speculative"]["ms_per_frame"] / fused_ar
        assert by["fused AR"]["x_fused_ar"] == 1.0
        assert by["auto"]["x_fused_ar"] is None and by["auto"]["decoder"] is None  # absent rows have no ratio


def test_native_backend_times_every_decoder_and_auto_may_choose_a_fused_frame():
    """native, a full backend: stepped calls through the C forward, its fused AR frame and fused chain one C call a
    frame, every decoder timed; auto chooses among stepped and fused runners and its row is the chosen runner's
    (the same runner is timed once)."""
    from rvqspec_lib.device.kernels import cpforward

    if not cpforward.available():
        pytest.fail(f"the native forward must build on the test machines: {cpforward.unavailable_reason()}")
    res = _table(auto=True, auto_frames=2)
    native = {r["row"]: r for r in res["rows"] if r["backend"] == "native"}
    assert native["stepped AR"]["ms_per_frame"] > 0 and native["fused AR"]["ms_per_frame"] > 0
    assert native["fused speculative"]["decoder"] == "chain:4" and native["fused speculative"]["fused"]
    assert native["best speculative"]["note"] == "best of 2 timed"  # every decoder, as a full backend
    assert native["fused speculative"]["x_fused_ar"] == pytest.approx(
        native["fused speculative"]["ms_per_frame"] / native["fused AR"]["ms_per_frame"])
    auto = native["auto"]
    assert auto["ms_per_frame"] > 0 and auto["note"] == f"auto chose {auto['decoder']}{', fused' * auto['fused']}"


def test_bad_table_arguments_are_one_line_before_any_model_loads(no_load):
    from bench.table import check_table_args

    for kw, words in ((dict(backends=["eager", "eager"]), "name each backend once"),
                      (dict(backends=["cuda"]), "the table times eager, native, compile, onnx"),
                      (dict(precisions=["bfloat16"]), "the table always has float32"),
                      (dict(chains=[9]), "2..8"), (dict(budgets=[99]), "outside 2..64")):
        args = {"models": ["embedded"], "precisions": ["float32"], "backends": ["eager"], **kw}
        with pytest.raises(ValueError) as e:
            check_table_args(args.pop("models"), args.pop("precisions"), args.pop("backends"), **args)
        assert words in str(e.value) and "\n" not in str(e.value), (kw, str(e.value))


@pytest.mark.parametrize("argv, words", [
    (["--backends", "onnx", "--dtype", "bfloat16"],
     "--backends onnx is not available here: the onnx backend runs float32 modules, not bfloat16"),
    (["--backends", "onnx", "--dtype", "int8"], "the onnx backend runs float32 modules, not int8"),
    (["--backends", "eager", "--dtype", "float32,int8"], "--dtype float32,int8: give one of"),
])
def test_backend_precision_errors_are_one_line_before_any_model_loads(capsys, no_load, argv, words):
    from rvqspec_lib.cli.main import main

    assert main(["bench", "frames", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_backend_eager_runs_a_precision_on_tiny_random(tmp_path, capsys):
    import json

    from rvqspec_lib.cli.main import main
    from rvqspec_lib.device.precision import ACTIVATION_DTYPE, native_precisions

    low = [p for p in native_precisions() if p != "float32"]
    if not low:
        pytest.skip("this CPU runs no precision but float32 natively")
    prec = "int8" if "int8" in low else low[0]
    out = tmp_path / "b.json"
    assert main(["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--dtype", prec, "--decoders",
                 "ar,chain:4", "--repeats", "1", "--warmup", "0", "--no-progress", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"cpu, {prec}" in text and "chain:4" in text and "fused" in text
    saved = json.loads(out.read_text())
    assert saved["precision"] == prec and saved["meta"]["dtype"] == str(ACTIVATION_DTYPE[prec]).replace("torch.", "")


@pytest.mark.parametrize("argv, words", [
    (["latency", "--model", "tiny-random", "--noise-target", "0"],
     "--noise-target 0 is not a relative standard error: give a fraction > 0"),
    (["latency", "--model", "tiny-random", "--noise-target", "0.02", "--repeats", "1"],
     "--noise-target needs --repeats >= 2"),
    (["table", "--noise-target", "0.02", "--repeats", "1"], "--noise-target needs --repeats >= 2"),
    (["frames", "--model", "tiny-random", "--noise-target", "0.02", "--repeats", "1"],
     "--noise-target needs --repeats >= 2"),
])
def test_noise_target_errors_are_one_line_before_any_model_loads(capsys, no_load, argv, words):
    from rvqspec_lib.cli.main import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert "noise_target" not in err and "repeats (" not in err  # the flags, never the library's argument names


def test_caption_says_how_many_frames_a_noise_target_made():
    from bench.table import _frames_words

    fixed = {"repeats": 5, "noise_target": None, "noise": []}
    assert _frames_words(fixed) == "5"
    runs = [{"repeats": 5, "max_repeats": 20, "rel_se_max": 0.012}, {"repeats": 11, "max_repeats": 20,
                                                                     "rel_se_max": 0.019}]
    assert _frames_words({**fixed, "noise_target": 0.02, "noise": runs}) == (
        "5-11 (noise target 2.0 %, at most 20, median's relative standard error <= 1.9 %)")


def _table_row(model, prec, backend, row, decoder, kind, ms, tpc=None, weights="trained", x_floor=None):
    return {"model": model, "weights": weights, "precision": prec, "backend": backend, "row": row,
            "decoder": decoder, "kind": kind, "drafter": None, "nodes": None, "lossy": False if kind else None,
            "fused": row.startswith("fused"), "ms_per_frame": ms, "tokens_per_call": tpc, "x_floor_ar": x_floor}


def test_fastest_by_model_and_round_costs_read_the_rows():
    from bench.table import fastest_by_model, round_costs

    rows = [_table_row("embedded", "float32", "native", "stepped AR", "ar", "ar", 18.0, 1.0),
            _table_row("embedded", "float32", "native", "fused AR", "ar", "ar", 6.0, None, x_floor=0.9),
            _table_row("embedded", "float32", "native", "best speculative", "chain:3", "chain", 15.0, 2.0),
            _table_row("embedded", "float32", "native", "fused speculative", "chain:3", "chain", 5.0, 2.0),
            _table_row("embedded", "int8", "native", "fused AR", "ar", "ar", 2.0, None),
            _table_row("embedded", "int8", "native", "fused speculative", "chain:3", "chain", 1.8, 1.9),
            _table_row("big", "float32", "eager", "stepped AR", "ar", "ar", 300.0, 1.0, weights="timing replay"),
            _table_row("big", "float32", "eager", "fused speculative", None, None, None)]  # absent: a replay
    by = {f["model"]: f for f in fastest_by_model({"rows": rows})}
    assert by["embedded"]["fastest"]["ms_per_frame"] == 1.8 and by["embedded"]["fastest_ar"]["ms_per_frame"] == 2.0
    assert by["embedded"]["fastest_speculative"]["precision"] == "int8"
    assert by["embedded"]["speculative_over_ar"] == pytest.approx(1.8 / 2.0)
    assert by["big"]["fastest_speculative"] is None and by["big"]["speculative_over_ar"] is None
    costs = round_costs({"rows": rows})
    assert [(c["precision"], c["decoder"]) for c in costs] == [("float32", "chain:3"), ("int8", "chain:3")]
    assert costs[0]["x_fused_ar"] == pytest.approx(5.0 / 6.0) and costs[0]["x_floor_ar"] == 0.9
    assert costs[0]["round_over_ar_call"] == pytest.approx(2.0 * 5.0 / 6.0)  # a round costs 1.67 AR calls, commits 2
    assert costs[1]["round_over_ar_call"] == pytest.approx(1.9 * 1.8 / 2.0)
