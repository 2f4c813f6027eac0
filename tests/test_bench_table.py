"""The table to act on beside the fused speculative round (rvqspec_lib.eval.bench_table), and ``rvqspec bench
--backend NAME --dtype PRECISION``.

Behaviour only (no timed assertion): on a trained model the table has a ``fused speculative`` row naming the fused
round it timed (not a decode_frame decoder: a negative control that the fused rows do not leak into ``best
speculative``); a later backend times only the first backend's fastest fused round; every row's ``x_fused_ar`` is
its ms per frame over the fused AR row's, exactly. The replay's absent row is in tests/test_replay.py. An onnx backend
with a precision other than float32 is one line naming the fix before any model loads; eager runs a precision on
tiny-random.
"""

from __future__ import annotations

import pytest


def _no_load(*a, **k):
    raise AssertionError("a model was loaded before the bad input was refused")


@pytest.fixture
def no_load(monkeypatch):
    from rvqspec_lib.models import loader

    monkeypatch.setattr(loader, "load_model", _no_load)


@pytest.fixture(scope="module")
def embedded_table():
    from rvqspec_lib.eval.bench_table import bench_table

    # the same backend twice: the second acts as a later backend (what compile or onnx would be), without compiling
    return bench_table(models=("embedded",), precisions=("float32",), backends=("eager", "eager"), repeats=1,
                       warmup=0, chains=(4,), budgets=(4,), auto=False, n_contexts=2, progress=False)


def test_trained_model_has_a_named_fused_speculative_row(embedded_table):
    from rvqspec_lib.eval.bench_table import ROWS, format_bench_table

    rows = embedded_table["rows"]
    assert [r["row"] for r in rows] == list(ROWS) * 2 and all(r["weights"] == "trained" for r in rows)
    first, later = ({r["row"]: r for r in rows[i * len(ROWS):(i + 1) * len(ROWS)]} for i in (0, 1))
    fused = first["fused speculative"]
    assert fused["decoder"] in ("fused chain:4", "fused calibrated-point-mass:4")
    assert fused["ms_per_frame"] > 0 and fused["tokens_per_call"] >= 1.0 and fused["build_s"] >= 0
    assert fused["note"].startswith("fastest of 2 fused rounds timed; built in")
    assert not first["best speculative"]["decoder"].startswith("fused")  # the decode_frame decoders only
    # a later backend builds only the first backend's fastest fused round
    assert later["fused speculative"]["decoder"] == fused["decoder"]
    assert later["fused speculative"]["note"].startswith("the eager rows' fastest fused round; built in")
    assert embedded_table["meta"]["fused_build_s"].keys() == {"embedded float32 eager fused chain:4",
                                                              "embedded float32 eager fused calibrated-point-mass:4"}
    text = format_bench_table(embedded_table)
    assert "| x fused AR |" in text and f"| fused speculative | {fused['decoder']} |" in text


def test_the_floor_uses_the_faster_of_two_bandwidths(embedded_table):
    """The AR frame's floor: 15 calls' weight bytes at the faster of the bandwidths measured before and after the
    timing (a bandwidth read on a busy moment would put frames below their floor), x floor its ratio."""
    from rvqspec_lib.eval.floor import call_weight_bytes, floor_ms
    from rvqspec_lib.models.loader import load_model

    bw = embedded_table["meta"]["bandwidth"]
    assert bw["gb_per_s"] == max(bw["gb_per_s_before"], bw["gb_per_s_after"])
    cp = load_model("embedded").code_predictor
    want = floor_ms(15 * call_weight_bytes(cp, n_queries=1)["bytes"], bw["gb_per_s"])
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
        assert by["auto"]["x_fused_ar"] is None  # absent rows have no ratio


def test_native_backend_rows_are_one_c_call_a_frame():
    """The native backend: stepped calls through the C forward, its fused AR frame and fused chains one C call a
    frame (no fused trees), every decoder timed (not only the first backend's best)."""
    from rvqspec_lib.eval.bench_table import bench_table
    from rvqspec_lib.models.kernels import cpforward

    if not cpforward.available():
        pytest.fail(f"the native forward must build on the test machines: {cpforward.unavailable_reason()}")
    res = bench_table(models=("embedded",), precisions=("float32",), backends=("eager", "native"), repeats=1,
                      warmup=0, chains=(4,), budgets=(4,), auto=False, n_contexts=2, progress=False)
    native = {r["row"]: r for r in res["rows"] if r["backend"] == "native"}
    assert native["stepped AR"]["ms_per_frame"] > 0 and native["fused AR"]["ms_per_frame"] > 0
    assert native["fused speculative"]["decoder"] == "fused chain:4"  # the chain: the native frame has no tree
    assert native["best speculative"]["decoder"] in ("chain:4", "calibrated-sampled:4", "calibrated-point-mass:4")
    assert native["best speculative"]["note"] == "best of 2 timed"  # every decoder, as a first backend
    assert native["fused speculative"]["x_fused_ar"] == pytest.approx(
        native["fused speculative"]["ms_per_frame"] / native["fused AR"]["ms_per_frame"])


@pytest.mark.parametrize("argv, words", [
    (["--backend", "onnx", "--dtype", "bfloat16"],
     "--backend onnx times float32 frames (its graphs are float32): drop --dtype bfloat16, or use --backend eager "
     "or compile for bfloat16"),
    (["--backend", "onnx", "--dtype", "int8"], "use --backend eager or compile for int8"),
    (["--backend", "eager", "--dtype", "float32,int8"], "--backend times one precision: give --dtype one of"),
])
def test_backend_precision_errors_are_one_line_before_any_model_loads(capsys, no_load, argv, words):
    from rvqspec_lib.cli.main import main

    assert main(["bench", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_backend_eager_runs_a_precision_on_tiny_random(tmp_path, capsys):
    import json

    from rvqspec_lib.cli.main import main
    from rvqspec_lib.models.precision import ACTIVATION_DTYPE, native_precisions

    low = [p for p in native_precisions() if p != "float32"]
    if not low:
        pytest.skip("this CPU runs no precision but float32 natively")
    prec = "int8" if "int8" in low else low[0]
    out = tmp_path / "b.json"
    assert main(["bench", "--model", "tiny-random", "--backend", "eager", "--dtype", prec, "--decoders", "ar",
                 "--repeats", "1", "--warmup", "0", "--no-progress", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"cpu, {prec}" in text and "fused-chain4" in text and "fused-AR" in text
    saved = json.loads(out.read_text())
    assert saved["precision"] == prec and saved["meta"]["dtype"] == str(ACTIVATION_DTYPE[prec]).replace("torch.", "")


@pytest.mark.parametrize("argv, words", [
    (["--noise-target", "0"], "--noise-target 0 is not a relative standard error: give a fraction > 0"),
    (["--noise-target", "0.02", "--repeats", "1"], "--noise-target needs --repeats >= 2"),
    (["--noise-target", "0.02", "--table", "--repeats", "1"], "--noise-target needs --repeats >= 2"),
    (["--noise-target", "0.02", "--backend", "eager"], "drop it with --backend"),
])
def test_noise_target_errors_are_one_line_before_any_model_loads(capsys, no_load, argv, words):
    from rvqspec_lib.cli.main import main

    assert main(["bench", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert "noise_target" not in err and "repeats (" not in err  # the flags, never the library's argument names


def test_caption_says_how_many_frames_a_noise_target_made():
    from rvqspec_lib.eval.bench_table import _frames_words

    fixed = {"repeats": 5, "noise_target": None, "noise": []}
    assert _frames_words(fixed) == "5"
    runs = [{"repeats": 5, "max_repeats": 20, "rel_se_max": 0.012}, {"repeats": 11, "max_repeats": 20,
                                                                     "rel_se_max": 0.019}]
    assert _frames_words({**fixed, "noise_target": 0.02, "noise": runs}) == (
        "5-11 (noise target 2.0 %, at most 20, median's relative standard error <= 1.9 %)")
