"""Every paper notebook runs headless in smoke mode and records what it measured (docs/style.md#notebooks: notebooks are tested).

Each ``notebooks/NN_*.py`` (jupytext percent format) is converted in memory, executed with papermill with
``smoke=True`` and ``out_dir=<tmp>`` (so ``figures/`` is never overwritten), and must write ``NN_metrics.json``.
Notebook-specific checks read that file back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))

pytestmark = pytest.mark.slow


def _execute(src: Path, out_dir: Path, parameters: dict | None = None) -> Path:
    jupytext = pytest.importorskip("jupytext")
    papermill = pytest.importorskip("papermill")
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    ipynb = out_dir / (src.stem + ".ipynb")
    jupytext.write(nb, ipynb, fmt="ipynb")
    executed = out_dir / (src.stem + ".executed.ipynb")
    params = {"smoke": True, "out_dir": str(out_dir), **(parameters or {})}
    papermill.execute_notebook(str(ipynb), str(executed), parameters=params,
                               kernel_name="python3", language="python", cwd=str(REPO), progress_bar=False)
    return executed


@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(src, tmp_path):
    prefix = src.stem.split("_", 1)[0]
    # notebooks on the embedded model use data/embedded, or the build RVQSPEC_EMBEDDED_DIR names (e.g.
    # build/embedded-smoke, written in under 3 minutes by scripts/build_embedded.py --scale smoke)
    _execute(src, tmp_path)
    metrics = json.loads((tmp_path / f"{prefix}_metrics.json").read_text())
    assert "provenance" in metrics and metrics["provenance"]["params"]["smoke"] is True
    if prefix == "00":
        _check_00(metrics, tmp_path)
    if prefix == "01":
        _check_01(metrics, tmp_path)
    if prefix == "02":
        _check_02(metrics, tmp_path)
    if prefix == "05":
        _check_05(metrics, tmp_path)


def _check_00(metrics: dict, out: Path) -> None:
    import math

    from rvqspec_lib.embedded.corpus import SPLITS, multilingual_sentences

    # smoke mode: 3 held-out sentences, the original, the inversion of unquantised features, k = 1 and 16
    assert metrics["n_sentences"] == 3 and metrics["codebooks"] == [1, 16]
    conditions = {"original", "unquantised", "k=1", "k=16"}
    if metrics["codec"]["decoder"] == "neural":  # the table decoder measured beside the shipped neural one
        conditions |= {"table k=1", "table k=16"}
    for key in ("wer", "wer_without_outliers", "cer", "feature_lsd_db", "audio_lsd_db"):
        assert set(metrics[key]) == conditions, key
        assert all(v is not None and 0 <= v < math.inf for v in metrics[key].values()), (key, metrics[key])
    assert len(metrics["references"]) == 3 and all(len(h) == 3 for h in metrics["hypotheses"].values())
    lsd = metrics["feature_lsd_db"]
    assert lsd["original"] == lsd["unquantised"] == metrics["audio_lsd_db"]["original"] == 0
    assert lsd["k=1"] > 0 and lsd["k=16"] > 0 and metrics["audio_lsd_db"]["unquantised"] > 0
    # the corpus table: every split, every multilingual language, measured (not empty) rows
    table = metrics["corpus_table"]
    assert {r["split"] for r in table} == set(SPLITS)
    langs = {s.language for s in multilingual_sentences()}
    assert {r["language"] for r in table if r["split"] == "evaluation"} == langs | {"en"}
    assert all(r["samples"] > 0 and r["hours"] > 0 and r["frames"] > 0 and r["role"] for r in table)
    # rows of the build are copied from its eval.json, not typed in
    root = Path(metrics["root"]) if Path(metrics["root"]).is_absolute() else REPO / metrics["root"]
    build = json.loads((root / "eval.json").read_text())["corpus"]["table"]
    copied = [{k: r[k] for k in ("split", "language", "samples", "hours", "frames")} for r in table
              if r["measured by"].startswith("build")]
    assert copied == [{k: r[k] for k in ("split", "language", "samples", "hours", "frames")} for r in build]
    for stem in ("00_corpus", "00_codec_quality"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("00_spectrograms", "00_wer_by_codebooks"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    side = json.loads((out / "00_corpus.provenance.json").read_text())
    assert side["sources"]["build rows"]["file"].endswith("eval.json") and side["params"]["smoke"] is True


def _check_01(metrics: dict, out: Path) -> None:
    from rvqspec_lib.eval.bench import call_budget
    from rvqspec_lib.models.configs import tiny_config_dict

    # smoke mode runs tiny-random: its code groups come from its config, its frame rate is the 12 Hz codec's
    assert metrics["model"] == "tiny-random" and metrics["random_weights"] is True
    groups = tiny_config_dict()["talker_config"]["num_code_groups"]
    assert metrics["n_code_groups"] == groups and metrics["frame_rate_hz"] == 12.5
    assert metrics["calls_per_s_realtime"] == metrics["frame_rate_hz"] * groups == 200.0
    assert metrics["calls_per_s_at_paper_tpc"] == pytest.approx(call_budget(12.5, groups, 2.47)["calls_per_s"])
    assert 0 < metrics["inner_share"] < 1 and metrics["t_talker_ms"] > 0 and metrics["t_inner_ms"] > 0
    assert metrics["verify_cost_ratio"]["1"] == 1.0
    # the embedded model is timed beside it: same call budget, trained weights
    small = metrics["compared"][1]
    assert small["model"] == "embedded" and small["random_weights"] is False
    assert small["calls_per_s_realtime"] == metrics["calls_per_s_realtime"] and small["t_inner_ms"] > 0
    for stem in ("01_call_budget", "01_latency", "01_models_compared"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for ext in (".png", ".pdf", ".provenance.json"):
        assert (out / ("01_verify_cost" + ext)).stat().st_size > 0, ext
    side = json.loads((out / "01_verify_cost.provenance.json").read_text())
    assert side["params"]["model"] == "tiny-random" and "git" in side and "hardware" in side


def _check_02(metrics: dict, out: Path) -> None:
    import csv

    from rvqspec_lib.models.drafter_files import load_drafter
    from rvqspec_lib.models.loader import load_model

    labels = {"heads", "offsets-ce", "offsets-kl", "offsets-tv", "medusa", "medusa-tv"}
    windows = {f"chain{w}" for w in range(2, 9)}
    assert set(metrics["tokens_per_call"]) == labels and not metrics["random_weights"]
    for lab, tpc in metrics["tokens_per_call"].items():
        assert set(tpc) == windows | {"tree"}, lab
        assert all(1.0 <= v <= 15.0 for v in tpc.values()), (lab, tpc)
        assert 2 <= metrics["saturation_window"][lab] <= 8
    hidden = metrics["model_info"]["code_predictor_hidden"]
    added = metrics["params_added"]
    assert added["heads"] == 0 and added["offsets-ce"] == added["offsets-kl"] == added["offsets-tv"] == 3 * hidden
    assert added["medusa"] == added["medusa-tv"] > 100 * added["offsets-ce"]
    assert 0 < metrics["n_train_frames"] <= 128 and 0 < metrics["n_val_frames"] <= 32
    assert 0 < metrics["n_eval_frames"] <= 16
    for lab, tr in metrics["training"].items():  # epoch 0 is the untrained drafter: the reused heads
        assert len(tr["val_acceptance_by_offset_init"]) == 3, lab
    # Table 2: measured columns copied from the metrics; the paper's values only in their own column
    with (out / "02_table2.csv").open() as f:
        rows = {r["label"]: r for r in csv.DictReader(f)}
    assert set(rows) == labels
    for lab, r in rows.items():
        assert float(r["tokens_per_call_tree"]) == metrics["tokens_per_call"][lab]["tree"]
        assert float(r["tokens_per_call_chain4"]) == metrics["tokens_per_call"][lab]["chain4"]
        assert int(r["added_params"]) == added[lab]
    assert {lab: r["paper_reported"] for lab, r in rows.items()} == \
        {"heads": "1.7", "medusa": "2.6", "offsets-ce": "2.47", "offsets-kl": "", "offsets-tv": "", "medusa-tv": ""}
    assert rows["heads"]["kept_epoch"] == "" and all(int(rows[lab]["kept_epoch"]) >= 0 for lab in labels - {"heads"})
    assert int(rows["offsets-ce"]["added_params_at_0.6B"]) == 3072
    # the paired margin: one row per trained drafter, an interval around its difference, from >= 2 utterances
    with (out / "02_margin.csv").open() as f:
        margin = {r["drafter"]: r for r in csv.DictReader(f)}
    assert set(margin) == labels - {"heads"}
    for lab, r in margin.items():
        assert float(r["ci95_low"]) <= float(r["difference"]) <= float(r["ci95_high"]), lab
        assert int(r["n_utterances"]) >= 2 and 0 <= float(r["p_value"]) <= 1
        assert metrics["margin_vs_heads"][lab]["difference"] == float(r["difference"])
    # headroom: every drafter scored on the same sampled continuations, under the exact ceiling
    hr = metrics["headroom"]
    assert set(hr["drafters"]) == labels and hr["offsets"] == [1, 2, 3] and hr["samples"] == 4
    for lab, acc in hr["drafters"].items():
        assert all(a <= c + 1e-9 for a, c in zip(acc, hr["ceiling"])), lab
    assert (out / "02_headroom.csv").stat().st_size > 0
    for stem in ("02_table2", "02_data", "02_training_curves", "02_acceptance_by_depth", "02_acceptance_by_offset",
                 "02_rank_acceptance", "02_chain_windows", "02_margin", "02_lr_selection"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("02_training_curves", "02_acceptance_by_depth", "02_chain_windows"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    # the trained offsets are saved and load back; a smoke run writes nothing beside the model
    lm = load_model(metrics["run_model"])
    for lab in ("offsets-ce", "offsets-kl", "offsets-tv"):
        d = load_drafter(metrics["drafter_files"][lab], lm.code_predictor)
        assert d.name == "offsets" and d.provenance["loss"] == lab[-2:]
    assert metrics["deployed_offsets"] in ("offsets-ce", "offsets-kl", "offsets-tv")
    assert not any(k.startswith(("model_", "deployed")) for k in metrics["drafter_files"])
    assert "medusa" not in metrics["drafter_files"]


def _check_05(metrics: dict, out: Path) -> None:
    import csv

    from rvqspec_lib.eval.export_timing import PAPER_DEVICE_SPEEDUPS, RELATIVE_TOLERANCE

    # smoke: tiny-random for acceptance and cost; compile skipped (said so), Core ML and CUDA absent with a reason
    assert metrics["model"] == metrics["cost_model"] == "tiny-random" and metrics["random_weights"] is True
    assert set(metrics["skipped"]) == {"compile"} and "smoke" in metrics["skipped"]["compile"]
    assert metrics["absent"]["cuda"] and "CUDA" in metrics["absent"]["cuda"]
    assert metrics["coreml_available"] is False and "macOS" in metrics["absent"]["coreml"]
    # exported graphs: declared interface == written; ONNX run here within the float32 tolerance; Core ML built only
    exported = metrics["exported"]
    assert {(r["graph"], r["format"]) for r in exported} == {(g, f) for g in ("stepped", "verify")
                                                             for f in ("onnx", "coreml")}
    assert all(r["interface_ok"] and r["bytes"] > 0 for r in exported)
    for r in exported:
        if r["format"] == "onnx":
            assert r["ran"] and r["runner"] == "onnxruntime-cpu" and r["within_tolerance"], r
            assert r["relative_diff"] <= RELATIVE_TOLERANCE["float32"]
        else:
            assert not r["ran"] and "macOS" in r["note"]
    # frame times: eager and onnx, each with AR, the fused frame and a tree of each budget; speedups over own AR
    rows = metrics["frame_rows"]
    assert {r["backend"] for r in rows} == {"eager", "onnx"}
    for b in ("eager", "onnx"):
        decs = {r["decoder"] for r in rows if r["backend"] == b}
        assert {"AR", "fused-AR", "chain2", "tree2", "tree4"} <= decs, decs
        ar = next(r for r in rows if r["backend"] == b and r["decoder"] == "AR")
        assert ar["speedup_vs_ar"] == 1.0 and ar["nodes"] == 1 and ar["ms_per_frame"] > 0
    assert {(r["backend"], r["nodes"]) for r in metrics["speedup_vs_n"]} == {(b, n) for b in ("eager", "onnx")
                                                                            for n in (2, 4)}
    assert metrics["onnx"]["ar_ms"] > 0 and metrics["onnx"]["fused_ms"] > 0 and metrics["onnx"]["best_ms"] > 0
    assert {r["backend"] for r in metrics["projected"]} == {"eager", "onnx"}
    # the paper's device numbers only in their own labelled column, copied from the constants
    assert metrics["paper_devices"] == [dict(p) for p in PAPER_DEVICE_SPEEDUPS]
    with (out / "05_speedup_vs_n.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [int(r["N"]) for r in table] == [2, 4]
    assert all(r["paper (Core ML devices, quoted)"] == "" for r in table)  # the paper has no N = 2 or 4 number
    assert metrics["gpu_json_present"] is False and metrics["gpu"] is None
    for stem in ("05_backends", "05_exported_graphs", "05_frame_times", "05_summary", "05_speedup_vs_n",
                 "05_verify_cost", "05_paper_devices"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for ext in (".png", ".pdf", ".provenance.json"):
        assert (out / ("05_speedup_vs_n" + ext)).stat().st_size > 0, ext
    cal = json.loads((out / "05_calibration.json").read_text())
    assert cal["budgets"] == [2, 4] and "provenance" in cal
