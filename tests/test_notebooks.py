"""Every paper notebook runs headless in smoke mode and records what it measured (docs/style.md#notebooks: notebooks are tested).

Each ``notebooks/NN_*.py`` (jupytext percent format) is converted in memory and executed with papermill with
``smoke=True`` and ``out_dir="figures"``, as a user opening it in JupyterLab and ticking ``smoke`` would, but in a
temporary view of the repository (a copy of ``rvqspec_lib``, ``data/`` linked, a ``figures/`` holding sentinel
files), so that the library's ``REPO_ROOT`` is that view: the run must leave ``figures/`` exactly as it was and
write ``NN_metrics.json`` under ``build/smoke_figures/`` instead (docs/style.md#results-and-provenance: smoke runs
never write to ``figures/``). Notebook-specific checks read that file back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))
#: Notebooks whose outputs carry a longer prefix than their number (two notebooks share the number 02: the rule by
#: hand writes 02_rule_*, so its files never meet 02_training_offsets' 02_*).
OUTPUT_PREFIX = {"02_the_lossless_rule": "02_rule"}


def output_prefix(src: Path) -> str:
    """The prefix of a notebook's output files: ``NN``, or its entry in :data:`OUTPUT_PREFIX`."""
    return OUTPUT_PREFIX.get(src.stem, src.stem.split("_", 1)[0])


pytestmark = pytest.mark.slow


def _execute(src: Path, out_dir: Path | str, parameters: dict | None = None, *, cwd: Path = REPO) -> Path:
    """Run one notebook with papermill (smoke, ``out_dir``), the kernel in ``cwd``; returns the executed notebook,
    written to ``out_dir`` when it is a folder given as a path, else beside ``cwd``."""
    jupytext = pytest.importorskip("jupytext")
    papermill = pytest.importorskip("papermill")
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    work = Path(out_dir) if isinstance(out_dir, Path) else cwd / "build" / "notebooks"
    work.mkdir(parents=True, exist_ok=True)
    ipynb = work / (src.stem + ".ipynb")
    jupytext.write(nb, ipynb, fmt="ipynb")
    executed = work / (src.stem + ".executed.ipynb")
    params = {"smoke": True, "out_dir": str(out_dir), **(parameters or {})}
    papermill.execute_notebook(str(ipynb), str(executed), parameters=params,
                               kernel_name="python3", language="python", cwd=str(cwd), progress_bar=False)
    return executed


#: Files planted in the temporary ``figures/``: a smoke run must leave them (and the folder) exactly as they are.
SENTINELS = {f"{output_prefix(p)}_metrics.json": '{"committed": true}\n' for p in NOTEBOOKS}


def repo_view(tmp: Path) -> Path:
    """A temporary stand-in for the repository: a copy of ``rvqspec_lib`` (so its ``REPO_ROOT`` is ``tmp/repo``),
    ``data/`` linked (read only by smoke runs), ``figures/`` with :data:`SENTINELS`."""
    root = tmp / "repo"
    shutil.copytree(REPO / "rvqspec_lib", root / "rvqspec_lib", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "data").symlink_to(REPO / "data", target_is_directory=True)
    (root / "figures").mkdir()
    for name, text in SENTINELS.items():
        (root / "figures" / name).write_text(text)
    return root


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(src, tmp_path, monkeypatch):
    prefix = output_prefix(src)
    # notebooks on the embedded model use data/embedded, or the build RVQSPEC_EMBEDDED_DIR names (e.g.
    # build/embedded-smoke, written in under 3 minutes by scripts/build_embedded.py --scale smoke)
    root = repo_view(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(root))  # the kernel imports the copy, never the checkout's rvqspec_lib
    before = _snapshot(root / "figures")
    executed = _execute(src, "figures", cwd=root)
    assert _snapshot(root / "figures") == before  # nothing written, nothing replaced under figures/
    out = root / "build" / "smoke_figures"
    metrics = json.loads((out / f"{prefix}_metrics.json").read_text())
    assert "provenance" in metrics and metrics["provenance"]["params"]["smoke"] is True
    assert Path(metrics["provenance"]["params"]["out_dir"]) == out.resolve()
    # a notebook started without a threads parameter (JupyterLab) runs on one thread, as `make paper`
    assert metrics["provenance"]["params"]["threads"] == 1 == metrics["provenance"]["hardware"]["torch_threads"]
    assert "smoke run: not writing into the committed" in executed.read_text()  # and it says so
    if prefix == "00":
        _check_00(metrics, out)
    if prefix == "01":
        _check_01(metrics, out)
    if prefix == "02":
        _check_02(metrics, out)
    if prefix == "02_rule":
        _check_02_rule(metrics, out)
    if prefix == "03":
        _check_03(metrics, out)
    if prefix == "05":
        _check_05(metrics, out)
    if prefix == "06":
        _check_06(metrics, out)


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
    assert metrics["asr"] == "whisper-tiny.en"  # the default English recogniser
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
    from rvqspec_lib.eval.latency import call_budget
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
    for stem in ("01_call_budget", "01_latency", "01_models_compared", "01_two_loops", "01_calls_at_own_tpc"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("01_verify_cost", "01_two_loops"):  # Figure 1's analogue beside the verify cost curve
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    # the two loops of every shipped or buildable model, from their configs
    assert {r["model"] for r in metrics["two_loops"]} == {"tiny-random", "embedded", "qwen3-tts-0.6b-random",
                                                          "qwen3-tts-1.7b-random"}
    assert all(r["calls_per_s"] == r["frame_rate_hz"] * r["n_code_groups"] for r in metrics["two_loops"])
    # calls per second at this companion's own tokens per call, measured; the paper's only in its labelled columns
    own = metrics["own_tokens_per_call"]
    assert len(own) == 6 and all(r["tokens_per_call"] >= 1.0 and r["model"] == "embedded" for r in own)
    assert all(r["calls_per_s"] == pytest.approx(call_budget(12.5, 16, r["tokens_per_call"])["calls_per_s"])
               for r in own)
    assert all(r["paper: calls per s"] == pytest.approx(call_budget(12.5, 16, 2.47)["calls_per_s"]) for r in own)
    assert set(metrics["timing"]) == {"attempts", "oversubscribed", "note"} and 1 <= len(metrics["timing"]["attempts"]) <= 2
    side = json.loads((out / "01_verify_cost.provenance.json").read_text())
    assert side["params"]["model"] == "tiny-random" and "git" in side and "hardware" in side


def _check_02_rule(metrics: dict, out: Path) -> None:
    """The lossless rule by hand: every figure and table written, the library's rule passes its G-tests and the lossy
    rules fail them, the exact tokens per call agree with the Monte Carlo ones, a round then AR is the exact joint."""
    params = metrics["provenance"]["params"]
    level, n = params["level"], params["n_draws"]
    assert n > 0 and params["notebook"] == "02_the_lossless_rule"
    for stem in ("02_rule_toy", "02_rule_monte_carlo", "02_rule_point_mass", "02_rule_round", "02_rule_tree_mask",
                 "02_rule_tokens_per_call"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("02_rule_toy", "02_rule_monte_carlo", "02_rule_seeds", "02_rule_point_mass", "02_rule_round_steps",
                 "02_rule_tree_buffers", "02_rule_tokens_per_call", "02_rule_node_acceptance"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    toy = metrics["toy"]
    assert toy["accepted_mass"] == pytest.approx(1 - toy["tv"]) and toy["max_abs_output_minus_p"] < 1e-9
    lossless, *lossy = metrics["monte_carlo"]
    assert lossless["lossless"] and not lossless["rejected_at_level"] and lossless["draws"] == n
    assert len(lossy) == 2 and all(r["rejected_at_level"] and r["p_value"] < level for r in lossy)
    assert metrics["point_mass"]["g_test"]["p_value"] >= level
    assert all(r["exact_P_kept"] == pytest.approx(r["p_x"]) for r in metrics["point_mass"]["rows"])
    ar, *spec = metrics["tokens_per_call"]
    assert ar["decoder"] == "AR" and ar["exact"] == ar["monte_carlo"] == 1.0
    for r in spec:
        assert r["exact"] == pytest.approx(r["closed_form"], abs=1e-9)
        assert abs(r["monte_carlo"] - r["exact"]) <= 4 * r["monte_carlo_se"], r
    gaps = metrics["round_then_ar_joint_gap"]
    assert all(v < 1e-12 for k, v in gaps.items() if "lossy" not in k)
    assert all(v > 0.05 for k, v in gaps.items() if "lossy" in k)
    assert [b["attends_to"] for b in metrics["tree_buffers"]] == ["0", "0 1", "0 2", "0 1 3", "0 1 4", "0 2 5"]
    assert all(len(r["committed"]) >= 1 for r in metrics["round"].values())


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
    assert {lab: r["paper: toks/step (N 32 tree)"] for lab, r in rows.items()} == \
        {"heads": "1.7", "medusa": "2.6", "offsets-ce": "2.47", "offsets-kl": "", "offsets-tv": "", "medusa-tv": ""}
    # the paper's setting: every drafter with ITS OWN calibrated point-mass tree at N 32 and at its best N (by
    # predicted E(N)), measured on the evaluation frames; the deployed offsets' row is the paper's decoder
    assert metrics["calibration_frames"] == 32
    for lab, r in rows.items():
        own = metrics["own_tree"][lab]
        assert float(r["tree_N32_tokens_per_call"]) == own["N32"]["measured"] >= 1.0 and own["N32"]["N"] == 32
        assert float(r["tree_bestN_tokens_per_call"]) == own["best"]["measured"] >= 1.0
        assert int(r["best_N"]) == own["best_N"] == own["best"]["N"] == 32 and r["best_N_by"] == "predicted E(N)"
        assert float(r["chain_best"]) == max(metrics["tokens_per_call"][lab][f"chain{w}"] for w in range(2, 9))
        cal = json.loads((out / "02_trees" / f"{lab}.json").read_text())
        assert cal["n_frames"] == 32 and float(r["tree_N32_predicted"]) == \
            cal["point-mass"]["predicted_tokens_per_call"]["32"]
    paper_rows = [lab for lab, r in rows.items() if r["decoder"].startswith("paper")]
    assert paper_rows == [metrics["deployed_offsets"]] == [metrics["paper_decoder"]["drafter"]]
    assert rows["heads"]["decoder"] == "tree:calibrated-point-mass:32"
    # negative control: the drafters' own trees differ (a shared tree would give the heads' tree to everyone)
    assert len({json.dumps(json.loads((out / "02_trees" / f"{lab}.json").read_text())["point-mass"]["table"])
                for lab in rows}) > 1
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
    for stem in ("02_training_curves", "02_acceptance_by_depth", "02_chain_windows", "02_offsets_effect"):
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


def _check_03(metrics: dict, out: Path) -> None:
    import csv

    from rvqspec_lib.models.tree_files import load_calibration, tree_from_calibration

    # the calibration is written under the smoke run's out_dir (never beside the shipped model) and loads back
    cal = load_calibration(out / "03_trees_heads.json", n_codes=15, codebook_size=2048)
    assert cal["n_frames"] == metrics["calibration_frames"] == 48 and cal["budgets"] == [2, 4, 8]
    assert tree_from_calibration(cal, "sampled", 8).sampled
    kinds = {r["kind"] for r in metrics["predicted_vs_measured"]}
    assert kinds == {"point-mass", "sampled", "chain"}
    for r in metrics["predicted_vs_measured"]:
        assert r["measured_tokens_per_call"] >= 1.0
        if r["kind"] != "chain":  # 48 calibration frames and 32 evaluation frames: a loose check in smoke mode
            assert abs(r["relative_error"]) < 0.25
    # every decoder timed through both backends, AR at exactly 1.0x of itself, the fused frame beside them
    speed = metrics["speed"]
    assert {r["backend"] for r in speed} >= {"official", "lean-mgemv"}
    assert all(r["speedup_vs_ar"] == 1.0 for r in speed if r["decoder"] == "ar")
    assert any(r["decoder"] == "fused-AR" for r in speed)
    assert metrics["auto"]["label"] in {r["label"] for r in csv.DictReader((out / "03_auto.csv").open())}
    # the paper's numbers only in a labelled column; the 0.6B stand-in's speedups only as a labelled projection
    paper = list(csv.DictReader((out / "03_paper_devices.csv").open()))
    assert [r["source"].startswith("paper") for r in paper] == [True, True, True, False, False]
    assert paper[-1]["device"].endswith("the paper's decoder") and "offsets + own tree" in paper[-1]["source"]
    # E(N) per drafter: the heads calibrated here, the shipped offsets with THEIR OWN calibration (trees/offsets.json)
    pvm = metrics["predicted_vs_measured"]
    assert {r["drafter"] for r in pvm} == {"heads", "offsets"}
    for dname in ("heads", "offsets"):
        assert {(r["kind"], r["nodes"]) for r in pvm if r["drafter"] == dname and r["kind"] != "chain"} == \
            {(k, n) for k in ("point-mass", "sampled") for n in (2, 4, 8)}
    shipped = load_calibration(REPO / "data/embedded/model/trees/offsets.json", n_codes=15, codebook_size=2048)
    assert metrics["paper_decoder"]["available"] and metrics["paper_decoder"]["calibration_frames"] == \
        shipped["n_frames"]
    for r in pvm:
        if r["drafter"] == "offsets" and r["kind"] != "chain":
            assert r["predicted_tokens_per_call"] == shipped[r["kind"]]["predicted_tokens_per_call"][str(r["nodes"])]
            assert r["paper_decoder"] == (r["kind"] == "point-mass")
    # the paper's decoder timed beside the heads' calibrated trees and the chains, through both backends
    for backend in ("official", "lean-mgemv"):
        decs = {r["decoder"] for r in speed if r["backend"] == backend}
        assert {"paper-N2", "paper-N8", "paper-N32", "calibrated-point-mass:8", "chain:4"} <= decs, decs
    assert {r["decoder"] for r in metrics["paper_decoder"]["speed"]} == {"paper-N2", "paper-N8", "paper-N32"}
    assert all(r["tokens_per_call"] >= 1.0 for r in metrics["paper_decoder"]["speed"])
    assert all(r["label"] == "PROJECTION" for r in metrics["projection"])
    assert {r["temperature"] for r in metrics["temperature"]} == {0.9, 0.3}
    # Figure 2's analogue: the shipped calibration's tree beside the mask its verify call passed to the model
    side = json.loads((out / "03_tree_and_mask.provenance.json").read_text())
    assert side["calibration_file"].endswith("trees/heads.json")
    # the 0.6B stand-in's random-weight frames show no speedup; its projection says what it is made of
    with (out / "03_loop_share_compare_model.csv").open() as f:
        assert "speedup_vs_ar" not in next(csv.reader(f))
    assert "PROJECTION" in (out / "03_projection_compare_model.md").read_text().splitlines()[0]
    # the table to act on (rvqspec bench --table's function), the embedded model only: its trained weights (no
    # replay), smoke: float32 through eager and native, five rows each all timed, the fused speculative round one of
    # the fused ones
    tab = json.loads((out / "03_bench_table.json").read_text())
    assert [r["row"] for r in tab["rows"]] == ["stepped AR", "fused AR", "best speculative", "fused speculative",
                                               "auto"] * 2
    assert {(r["model"], r["weights"], r["precision"], r["backend"]) for r in tab["rows"]} == \
        {("embedded", "trained", "float32", b) for b in ("eager", "native")}
    assert all(r["ms_per_frame"] > 0 and r["x_fused_ar"] > 0 for r in tab["rows"])
    assert next(r for r in tab["rows"] if r["row"] == "fused AR")["x_fused_ar"] == 1.0
    assert next(r for r in tab["rows"] if r["row"] == "fused speculative")["decoder"].startswith("fused ")
    assert tab["meta"]["repeats"] == 1 and tab["meta"]["models"] == ["embedded"]
    for ext in (".csv", ".md", ".json", ".provenance.json"):
        assert (out / ("03_bench_table" + ext)).stat().st_size > 0, ext
    for stem in ("03_acceptance_heatmap", "03_trees", "03_tokens_per_call_vs_N", "03_speedup_vs_N", "03_temperature",
                 "03_tree_and_mask"):
        assert (out / f"{stem}.png").is_file() and (out / f"{stem}.pdf").is_file()
        assert (out / f"{stem}.provenance.json").is_file()


def _check_05(metrics: dict, out: Path) -> None:
    """WER parity (notebook 05_wer_parity): every table and figure, decoders keyed by their fields, the verdicts
    covering every language, the listening examples."""
    import csv
    import math

    from rvqspec_lib.eval.parity import TRUE_CODES
    from rvqspec_lib.models.tree_files import load_calibration

    # smoke: English (3 shipped evaluation utterances) and German (1 sentence rendered with espeak-ng), trees of N 4
    params = metrics["provenance"]["params"]
    assert metrics["languages"] == ["en", "de"] and metrics["n_utterances"] == {"en": 3, "de": 1}
    assert Path(params["work_dir"]).is_relative_to(out)  # a smoke run writes only under its out_dir
    decs = metrics["decoders"]
    assert list(decs)[:2] == ["ar", "ar-seed2"] and decs["ar-seed2"]["null_control"]
    assert decs["ar-seed2"]["kind"] == "ar"
    lossy = [k for k, d in decs.items() if d["lossy"]]
    assert lossy == ["ssd-lossy:0.4"] == [k for k, d in decs.items() if not d["lossless"]]
    assert "Lossy" in decs[lossy[0]]["repr"]
    assert list(decs)[3:-1] == ["tree:calibrated-sampled:4", "tree:calibrated-point-mass:32", "paper:32"]
    assert decs["paper:32"]["kind"] == "paper" and decs["paper:32"]["drafter"] == "offsets"
    paper = metrics["paper_decoder"]
    assert paper["label"] == "paper:32" and paper["baseline"] == "tree:calibrated-point-mass:32"
    assert paper["loss"] == "tv" and paper["calibration_frames"] == 1500  # read from the shipped files
    chain = next(k for k, d in decs.items() if d["kind"] == "chain")
    assert metrics["best_chain"] == decs[chain]["nodes"] and chain == f"chain:{metrics['best_chain']}"
    for lang, tpc in metrics["tokens_per_call"].items():
        assert tpc["ar"] == tpc["ar-seed2"] == 1.0 and all(v > 1.0 for k, v in tpc.items() if not k.startswith("ar"))
    # Table 3: one row per language and decoder, keyed by the decoder's fields, values copied from the metrics
    with (out / "05_table3.csv").open() as f:
        t3 = list(csv.DictReader(f))
    assert len(t3) == 2 * len(decs)
    for r in t3:
        assert float(r["tokens_per_call"]) == metrics["tokens_per_call"][r["language"]][r["decoder"]]
        assert r["lossy"] == str(r["decoder"] in lossy) and r["kind"] == decs[r["decoder"]]["kind"]
        assert r["language"] == "en" or r["wer_note"] == "no offline recogniser"
    # the paper's decoder (English-trained offsets) in EVERY language of Table 3, and the transfer question answered
    assert {r["language"] for r in t3 if r["decoder"] == "paper:32"} == set(metrics["languages"])
    transfer = {r["language"]: r for r in metrics["transfer"]}
    assert set(transfer) == set(metrics["languages"])
    for lang, r in transfer.items():
        assert r["decoder"] == "paper:32" and r["baseline"] == "tree:calibrated-point-mass:32"
        assert r["tokens_per_call"] == metrics["tokens_per_call"][lang]["paper:32"]
        tpc = metrics["tokens_per_call"][lang]
        assert r["gain_over_baseline"] == pytest.approx(tpc["paper:32"] - tpc["tree:calibrated-point-mass:32"])
        assert r["gain_ci_low"] <= r["gain_over_baseline"] <= r["gain_ci_high"]
        if lang != "en":
            assert r["minus_english"] == pytest.approx(r["tokens_per_call"] - transfer["en"]["tokens_per_call"])
            assert r["minus_english_ci_low"] <= r["minus_english"] <= r["minus_english_ci_high"]
    # Table 1: the calibration frames used and every evaluation utterance, counted
    t1 = {(r["split"], r["language"]): r for r in metrics["table1"]}
    assert set(t1) == {("calibration", "en"), ("evaluation", "en"), ("evaluation", "de")}
    assert t1[("calibration", "en")]["frames"] == metrics["calibration_frames"] == 48
    assert t1[("evaluation", "en")]["samples"] == 3 and t1[("evaluation", "en")]["frames"] == metrics["n_frames"]["en"]
    assert t1[("evaluation", "de")]["frames"] == metrics["n_frames"]["de"] and all(r["hours"] > 0 for r in t1.values())
    # tests: every non-reference decoder of EVERY language has a verdict and a stated power
    for lang in metrics["languages"]:
        summ = metrics["code_tests"][lang]
        assert set(summ) == set(decs) - {"ar"}
        assert all(0 <= s["power_rank"] <= 1 and 0 <= s["min_p_holm"] <= 1 for s in summ.values())
    assert {(v["language"], v["decoder"]) for v in metrics["verdicts"]} == {
        (lang, k) for lang in metrics["languages"] for k in decs if k != "ar"}
    assert set(metrics["lossy_caught_in"]) <= set(metrics["languages"])
    assert metrics["asr"]["en"] == "whisper-tiny.en" and metrics["asr"]["de"] is None
    # CER beside WER, inner loop and free running, and the true codes (the floor) as the last row
    assert all(0 <= w["cer"] < math.inf for w in [*metrics["wer"].values(), *metrics["free_running"].values()])
    assert 0 <= metrics["true_codes"]["wer"] < math.inf and 0 <= metrics["true_codes"]["cer"] < math.inf
    with (out / "05_wer_parity.csv").open() as f:
        wer_table = list(csv.DictReader(f))
    assert [r["decoder"] for r in wer_table] == [*decs, TRUE_CODES] and all(r["cer"] for r in wer_table)
    assert set(metrics["wer"]) == set(decs) and "vs_reference" in metrics["wer"][lossy[0]]
    # free running (smoke): AR, its null control, the paper's decoder and the lossy control
    assert set(metrics["free_running"]) == {"ar", "ar-seed2", "paper:32", lossy[0]}
    assert len(metrics["hypotheses"]["ar"]) == len(metrics["references"]) == 3
    cal = load_calibration(out / "05_trees_heads.json", n_codes=15, codebook_size=2048)
    assert cal["budgets"] == [4, 32]
    for stem in ("05_table1", "05_table3", "05_calibration", "05_wer_parity", "05_free_running", "05_outliers",
                 "05_verdicts", "05_transfer"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("05_code_tests", "05_wer_difference", "05_tokens_per_call_by_language"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    # listening: one held-out sentence through the true codes, AR, the best chain, the paper's decoder and the lossy
    # control, and one free-running sample, each a WAV with its provenance
    files = metrics["listening"]["files"]
    assert {role: f["decoder"] for role, f in files.items() if role != "true_codes"} == {
        "ar": "ar", "chain": chain, "paper": "paper:32", "lossy": lossy[0], "free_running_ar": "ar"}
    for f in files.values():
        assert (out / f["file"]).stat().st_size > 1000 and (out / f["file"].replace(".wav", ".provenance.json")).is_file()


def _check_06(metrics: dict, out: Path) -> None:
    import csv

    from rvqspec_lib.eval.export_check import RELATIVE_TOLERANCE
    from rvqspec_lib.eval.plots import PAPER_DEVICE_SPEEDUPS

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
    # frame times: eager, onnx and native, each with AR, the fused frame and a tree of each budget; speedups over
    # own AR
    rows = metrics["frame_rows"]
    assert {r["backend"] for r in rows} == {"eager", "onnx", "native"}
    for b in ("eager", "onnx", "native"):
        decs = {r["decoder"] for r in rows if r["backend"] == b}
        assert {"AR", "fused-AR", "chain2", "tree2", "tree4"} <= decs, decs
        ar = next(r for r in rows if r["backend"] == b and r["decoder"] == "AR")
        assert ar["speedup_vs_ar"] == 1.0 and ar["nodes"] == 1 and ar["ms_per_frame"] > 0
    assert {(r["backend"], r["nodes"]) for r in metrics["speedup_vs_n"]} == {(b, n) for b in ("eager", "onnx", "native")
                                                                            for n in (2, 4)}
    assert metrics["onnx"]["ar_ms"] > 0 and metrics["onnx"]["fused_ms"] > 0 and metrics["onnx"]["best_ms"] > 0
    assert {r["backend"] for r in metrics["projected"]} == {"eager", "onnx", "native"}
    # the paper's device numbers only in their own labelled column, copied from the constants
    assert metrics["paper_devices"] == [dict(p) for p in PAPER_DEVICE_SPEEDUPS]
    with (out / "05_speedup_vs_n.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [int(r["N"]) for r in table] == [2, 4]
    assert any(c.startswith("onnx PROJECTION (E(N) of tiny-random, cost of tiny-random)") for c in table[0])
    caption = (out / "05_speedup_vs_n.md").read_text().splitlines()[0]
    assert "PROJECTION" in caption and "leave out the prefill" in caption
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
    # the paper's decoder: tiny-random ships no offsets, so it runs on the embedded model (trained offsets + their own
    # calibrated point-mass tree), its verify graph exported with the paper's tree and run here within tolerance
    pap = metrics["paper_decoder"]
    assert pap["model"] == "embedded" and pap["label"] == "paper-N4" and pap["nodes"] == 4
    assert [(r["graph"], r["format"], r["runner"]) for r in pap["export"]] == [("verify", "onnx", "onnxruntime-cpu")]
    assert all(r["interface_ok"] and r["ran"] and r["within_tolerance"] for r in pap["export"])
    for b in ("eager", "onnx"):  # frame times: the paper's decoder beside AR, the fused frame, a chain, the heads' tree
        decs = {r["decoder"]: r for r in pap["frame_rows"] if r["backend"] == b}
        assert {"AR", "fused-AR", "chain4", "tree-pm-N4", "paper-N4"} <= set(decs), decs
        assert decs["AR"]["speedup_vs_ar"] == 1.0 and decs["paper-N4"]["tokens_per_call"] >= 1.0
        assert decs["paper-N4"]["nodes"] == decs["tree-pm-N4"]["nodes"] == 4
    with (out / "05_paper_frame_times.csv").open() as f:
        assert {r["decoder"] for r in csv.DictReader(f)} >= {"paper-N4", "tree-pm-N4"}
    assert "paper's decoder" in (out / "05_paper_frame_times.md").read_text().splitlines()[0]
    # the table to act on (rvqspec bench --table's function): tiny-random as a labelled timing replay, five rows per
    # backend (eager, and native where a C compiler runs), the fused speculative one absent (a replay cannot drive a
    # fused round)
    tab = metrics["bench_table"]
    table_backends = list(dict.fromkeys(r["backend"] for r in tab["rows"]))
    assert table_backends[0] == "eager" and set(table_backends) <= {"eager", "native"}, table_backends
    for b in table_backends:
        rows_b = [r for r in tab["rows"] if r["backend"] == b]
        assert [r["row"] for r in rows_b] == ["stepped AR", "fused AR", "best speculative", "fused speculative",
                                              "auto"], b
        assert all(r["ms_per_frame"] > 0 for r in rows_b if r["row"] != "fused speculative"), b
        assert next(r for r in rows_b if r["row"] == "fused speculative")["note"].startswith(
            "absent: a timing replay"), b
    assert all(r["weights"].startswith("timing replay: acceptance of") for r in tab["rows"])
    assert any("public C port" in f for f in tab["footer"])
    for ext in (".csv", ".md", ".json", ".provenance.json"):
        assert (out / ("05_bench_table" + ext)).stat().st_size > 0, ext
