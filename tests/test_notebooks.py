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
#: Notebooks whose outputs carry a longer prefix than their number (the rule by hand writes 02_rule_*).
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
    # build/embedded-smoke, written in under 3 minutes by recipes/embedded/build.py --scale smoke)
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
    _check_headline(metrics, out)
    if prefix == "00":
        _check_00(metrics, out)
    if prefix == "01":
        _check_01(metrics, out)
    if prefix == "02_rule":
        _check_02_rule(metrics, out)
    if prefix == "03":
        _check_03(metrics, out)
    if prefix == "04":
        _check_04_calibrating_the_tree(metrics, out)
    if prefix == "05":
        _check_05(metrics, out)
    if prefix == "06":
        _check_06(metrics, out)
    if prefix == "07":
        _check_07_device_engineering(metrics, out)


def _check_headline(metrics: dict, out: Path) -> None:
    """The notebook's headline numbers (docs/results.md and the README's results at a glance are laid out from them):
    a non-empty list of well-formed entries, each naming a file the run wrote."""
    from tests.test_results_doc import problems

    assert problems(metrics.get("headline")) == [], problems(metrics.get("headline"))
    assert 3 <= len(metrics["headline"]) <= 8, [h["text"] for h in metrics["headline"]]
    assert all((out / h["source"]).is_file() for h in metrics["headline"]), [h["source"] for h in metrics["headline"]]


def _check_00(metrics: dict, out: Path) -> None:
    import math

    from rvqspec_lib.data.voices import SPLITS, multilingual_sentences

    # smoke mode: 3 held-out sentences, the original, the inversion of unquantised features, k = 1, 4 and 16
    assert metrics["n_sentences"] == 3 and metrics["codebooks"] == [1, 4, 16] == metrics["listen_codebooks"]
    conditions = {"original", "unquantised", "k=1", "k=4", "k=16"}
    if metrics["codec"]["decoder"] == "neural":  # the table decoder measured beside the shipped neural one
        conditions |= {"table k=1", "table k=4", "table k=16"}
    for key in ("wer", "wer_without_outliers", "cer", "feature_lsd_db", "audio_lsd_db"):
        assert set(metrics[key]) == conditions, key
        assert all(v is not None and 0 <= v < math.inf for v in metrics[key].values()), (key, metrics[key])
    assert len(metrics["references"]) == 3 and all(len(h) == 3 for h in metrics["hypotheses"].values())
    # the recogniser is named from the recogniser object, in the metrics and in the table's record alike
    assert metrics["asr"] == "whisper-tiny.en"  # the default English recogniser
    assert json.loads((out / "00_codec_quality.provenance.json").read_text())["asr"] == metrics["asr"]
    lsd = metrics["feature_lsd_db"]
    assert lsd["original"] == lsd["unquantised"] == metrics["audio_lsd_db"]["original"] == 0
    assert lsd["k=16"] < lsd["k=4"] < lsd["k=1"] and metrics["audio_lsd_db"]["unquantised"] > 0
    # what each stage removes: every stage, the variance left falling, the structureless yardstick beside it
    rv = metrics["residual_variance"]
    assert [r["k"] for r in rv] == list(range(1, metrics["codec"]["n_codebooks"] + 1))
    assert all(b["variance_left"] < a["variance_left"] for a, b in zip(rv, rv[1:]))
    assert 0 < rv[0]["unstructured_factor"] < 1
    # listening: the original, the inversion and the codec with 1, 4 and 16 codebooks, each a WAV with its record
    assert [(x["condition"], x["k"]) for x in metrics["listening"]] == [
        ("original", None), ("inversion", None), ("codec", 1), ("codec", 4), ("codec", 16)]
    for x in metrics["listening"]:
        wav = out / x["file"]
        assert wav.suffix == ".wav" and wav.stat().st_size > 44, wav  # more than a WAV header
        assert wav.with_name(wav.stem + ".provenance.json").is_file()
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
    for stem in ("00_corpus", "00_codec_quality", "00_residual_variance"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("00_spectrograms", "00_wer_by_codebooks", "00_residual_variance"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    side = json.loads((out / "00_corpus.provenance.json").read_text())
    assert side["sources"]["build rows"]["file"].endswith("eval.json") and side["params"]["smoke"] is True


def _check_01(metrics: dict, out: Path) -> None:
    from bench.latency import call_budget
    from rvqspec_lib.models.backends import available
    from rvqspec_lib.models.configs import tiny_config_dict

    # smoke mode runs tiny-random: its code groups come from its config, its frame rate is the 12 Hz codec's
    assert metrics["model"] == "tiny-random" and metrics["random_weights"] is True
    groups = tiny_config_dict()["talker_config"]["num_code_groups"]
    assert metrics["n_code_groups"] == groups and metrics["frame_rate_hz"] == 12.5
    assert metrics["calls_per_s_realtime"] == metrics["frame_rate_hz"] * groups == 200.0
    assert metrics["calls_per_s_at_paper_tpc"] == pytest.approx(call_budget(12.5, groups, 2.47)["calls_per_s"])
    assert 0 < metrics["inner_share"] < 1 and metrics["t_talker_ms"] > 0 and metrics["t_inner_ms"] > 0
    assert metrics["verify_cost_ratio"]["1"] == 1.0
    # the native pair (talker step and code-predictor call through the C forward) beside the official one
    if available("native")[0]:
        nat = metrics["native"]
        assert nat["verify_cost_ratio"]["1"] == 1.0 and 0 < nat["inner_share_ar"] < 1 and nat["t_talker_ms"] > 0
        assert [r["forward"] for r in metrics["inner_share_rows"]] == ["official", "native", "bytes read (no timing)"]
    assert 0 < metrics["inner_share_from_bytes"]["inner_share"] < 1
    # the embedded model is timed beside it: same call budget, trained weights
    small = metrics["compared"][1]
    assert small["model"] == "embedded" and small["random_weights"] is False
    assert small["calls_per_s_realtime"] == metrics["calls_per_s_realtime"] and small["t_inner_ms"] > 0
    for stem in ("01_call_budget", "01_latency", "01_inner_share", "01_models_compared", "01_two_loops",
                 "01_calls_at_own_tpc"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("01_verify_cost", "01_two_loops", "01_calls_at_own_tpc"):  # Figure 1's analogue among them
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    assert not (out / "01_floor.csv").exists()  # the call against its floor is notebook 07's
    # the two loops of every shipped or buildable model, from their configs
    assert {r["model"] for r in metrics["two_loops"]} == {"tiny-random", "embedded", "qwen3-tts-0.6b-random",
                                                          "qwen3-tts-1.7b-random"}
    assert all(r["calls_per_s"] == r["frame_rate_hz"] * r["n_code_groups"] for r in metrics["two_loops"])
    # calls per second at this companion's own tokens per call, measured by named decoders (the paper's decoder
    # among them); the paper's value only in its labelled columns
    own = metrics["own_tokens_per_call"]
    assert [r["decoder"] for r in own] == ["chain:4", "chain:8", "tree:calibrated-point-mass:16",
                                           "tree:calibrated-point-mass:32", "tree:calibrated-sampled:16",
                                           "tree:calibrated-sampled:32", "paper:16", "paper:32"]
    assert all(r["tokens_per_call"] >= 1.0 and r["model"] == "embedded" for r in own)
    assert [r["drafter"] for r in own] == ["heads"] * 6 + ["offsets"] * 2
    assert all(r["calls_per_s"] == pytest.approx(call_budget(12.5, 16, r["tokens_per_call"])["calls_per_s"])
               for r in own)
    assert all(r["paper: calls per s"] == pytest.approx(call_budget(12.5, 16, 2.47)["calls_per_s"]) for r in own)
    assert set(metrics["timing"]) == {"attempts", "oversubscribed", "note"} and len(metrics["timing"]["attempts"]) == 1
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


def _check_03(metrics: dict, out: Path) -> None:
    """Drafters (Table 2): every drafter trained, measured with the same decoders and with its own calibrated tree;
    Table 2's measured columns copied from the results, the paper's only in its labelled columns; the margin, the
    headroom, the figures; the trained offsets load back; a smoke run deploys nothing."""
    import csv

    from paper.drafter_table import EVAL_DECODERS
    from rvqspec_lib.models.drafter_files import load_drafter
    from rvqspec_lib.models.loader import load_model

    labels = {"heads", "offsets-ce", "offsets-kl", "offsets-tv", "medusa", "medusa-tv"}
    assert metrics["provenance"]["params"]["notebook"] == "03_training_offsets"
    assert set(metrics["tokens_per_call"]) == labels and not metrics["random_weights"]
    for lab, tpc in metrics["tokens_per_call"].items():
        assert list(tpc) == list(EVAL_DECODERS), lab  # keyed by decoder labels: chain:2 .. chain:8, the small tree
        assert all(1.0 <= v <= 15.0 for v in tpc.values()), (lab, tpc)
        assert 2 <= metrics["saturation_window"][lab] <= 8
    hidden = metrics["model_info"]["code_predictor_hidden"]
    added = metrics["params_added"]
    assert added["heads"] == 0 and added["offsets-ce"] == added["offsets-kl"] == added["offsets-tv"] == 3 * hidden
    assert added["medusa"] == added["medusa-tv"] > 100 * added["offsets-ce"]
    assert 0 < metrics["n_train_frames"] <= 128 and 0 < metrics["n_val_frames"] <= 32
    assert 0 < metrics["n_eval_frames"] <= 16 and metrics["calibration_frames"] == 32
    for lab, tr in metrics["training"].items():  # epoch 0 is the untrained drafter: the reused heads
        assert len(tr["val_acceptance_by_offset_init"]) == 3, lab
    # Table 2: measured columns copied from the metrics; the paper's values only in their own columns
    with (out / "03_table2.csv").open() as f:
        rows = {r["label"]: r for r in csv.DictReader(f)}
    assert set(rows) == labels
    own = {r["drafter"]: r for r in metrics["own_trees"]}
    for lab, r in rows.items():
        assert float(r["small_tree_tokens_per_call"]) == metrics["tokens_per_call"][lab]["tree:0;1;0,0;0,0,0"]
        assert float(r["chain4_tokens_per_call"]) == metrics["tokens_per_call"][lab]["chain:4"]
        assert float(r["chain_best"]) == max(metrics["tokens_per_call"][lab][f"chain:{w}"] for w in range(2, 9))
        assert int(r["added_params"]) == added[lab]
        # each drafter's OWN calibrated point-mass tree of N 32, measured on the evaluation frames
        assert float(r["tree_N32_tokens_per_call"]) == own[lab]["tokens_per_call"] >= 1.0 and own[lab]["nodes"] == 32
        assert r["decoder"] == own[lab]["decoder"] and int(r["best_N"]) == 32  # smoke calibrates N 8 and 32
        cal = json.loads((out / "03_trees" / f"{lab}.json").read_text())
        assert cal["n_frames"] == 32 and float(r["tree_N32_predicted"]) == \
            cal["point-mass"]["predicted_tokens_per_call"]["32"]
        assert float(r["sampled_tree_N32_predicted"]) == cal["sampled"]["predicted_tokens_per_call"]["32"]
    assert {lab: r["paper: toks/step (N 32 tree)"] for lab, r in rows.items()} == \
        {"heads": "1.7", "medusa": "2.6", "offsets-ce": "2.47", "offsets-kl": "", "offsets-tv": "", "medusa-tv": ""}
    assert not any(r["decoder"].startswith("paper:") for r in rows.values())  # paper:N names the shipped offsets only
    dep = metrics["deployed_offsets"]
    assert metrics["deployed_decoder"]["decoder"] == f"tree:calibrated-point-mass:32@{dep}" == rows[dep]["decoder"]
    assert rows["heads"]["decoder"] == "tree:calibrated-point-mass:32"
    assert rows["offsets-kl"]["decoder"] == "tree:calibrated-point-mass:32@offsets-kl"
    # negative control: the drafters' own trees differ (a shared tree would give the heads' tree to everyone)
    assert len({json.dumps(json.loads((out / "03_trees" / f"{lab}.json").read_text())["point-mass"]["table"])
                for lab in rows}) > 1
    assert rows["heads"]["kept_epoch"] == "" and all(int(rows[lab]["kept_epoch"]) >= 0 for lab in labels - {"heads"})
    assert int(rows["offsets-ce"]["added_params_at_0.6B"]) == 3072
    # the paired margin: one row per trained drafter, an interval around its difference, from >= 2 utterances
    with (out / "03_margin.csv").open() as f:
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
    for stem in ("03_table2", "03_data", "03_training_curves", "03_acceptance_by_depth", "03_acceptance_by_offset",
                 "03_rank_acceptance", "03_chain_windows", "03_margin", "03_lr_selection", "03_own_trees",
                 "03_predicted_by_budget", "03_headroom"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    assert (out / "03_table2.md").read_text().startswith("*paper: ... columns quoted from the paper Table 2")
    for stem in ("03_training_curves", "03_acceptance_by_depth", "03_chain_windows", "03_offsets_effect",
                 "03_table2", "03_point_mass_vs_sampled"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    # the shipped offsets' loss is read from their file, not typed
    assert metrics["shipped_offsets"]["loss"] in ("ce", "kl", "tv")
    # the trained offsets are saved and load back; a smoke run writes nothing beside the model
    lm = load_model(metrics["run_model"])
    for lab in ("offsets-ce", "offsets-kl", "offsets-tv"):
        d = load_drafter(metrics["drafter_files"][lab], lm.code_predictor)
        assert d.name == "offsets" and d.provenance["loss"] == lab[-2:]
    assert metrics["deployed_offsets"] in ("offsets-ce", "offsets-kl", "offsets-tv")
    assert not any(k.startswith(("model_", "deployed")) for k in metrics["drafter_files"])
    assert "medusa" not in metrics["drafter_files"]


def _check_05(metrics: dict, out: Path) -> None:
    """WER parity (notebook 05_wer_parity): every table and figure, decoders keyed by their fields, the verdicts
    covering every language, the listening examples."""
    import csv
    import math

    from paper.wer_report import TRUE_CODES
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

    from rvqspec_lib.device.export_check import RELATIVE_TOLERANCE
    from bench.table import LAYOUTS, PUBLIC_PIPELINES, PIPELINE_ROWS as ROWS
    from paper.plots import PAPER_DEVICE_SPEEDUPS

    # export: tiny-random's stepped and verify graphs to ONNX (run here, within float32's tolerance) and a Core ML
    # package (built, declared interface written; run on macOS only); the paper's decoder's verify graph on embedded
    assert metrics["cost_model"] == "tiny-random" and metrics["cost_random_weights"] is True
    exported = metrics["exported"]
    assert {(r["graph"], r["format"]) for r in exported} == {("stepped", "onnx"), ("verify", "onnx"),
                                                             ("verify", "coreml")}
    assert all(r["interface_ok"] and r["bytes"] > 0 for r in exported)
    for r in exported:
        if r["format"] == "onnx":
            assert r["ran"] and r["within_tolerance"] and r["relative_diff"] <= RELATIVE_TOLERANCE["float32"], r
        else:
            assert not r["ran"] and "macOS" in r["note"]
    pap = metrics["paper_decoder"]
    assert pap["model"] == "embedded" and pap["label"].startswith("paper:") and pap["nodes"] >= 2
    assert all(r["interface_ok"] and r["ran"] and r["within_tolerance"] for r in pap["export"])
    # Figure 4's analogue: measured rows per backend and N, projected rows apart, the paper's numbers only quoted
    assert {r["nodes"] for r in metrics["speedup_vs_n"]} == {2, 4} and metrics["projected"]
    assert metrics["paper_devices"] == [dict(p) for p in PAPER_DEVICE_SPEEDUPS]
    with (out / "06_speedup_vs_n.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [int(r["N"]) for r in table] == [2, 4]
    assert any("PROJECTION" in c for c in table[0]) and any("measured" in c for c in table[0])
    assert all(r["paper (Core ML devices, point-mass trees, quoted)"] == "" for r in table)  # no N = 2, 4 in the paper
    assert "PROJECTION (not a measurement)" in (out / "06_speedup_vs_n.md").read_text().splitlines()[0]
    # the pipeline: tiny-random as a labelled timing replay and the embedded model, three rows each, parts adding up
    rows = metrics["pipeline"]["rows"]
    assert [(r["model"], r["row"]) for r in rows] == [(m, row) for m in ("tiny-random", "embedded") for row in ROWS]
    for r in rows:
        assert r["frame_1t_ms"] > 0 and r["rtf_1t"] == r["frame_1t_ms"] / 80
        assert (r["weights"] == "trained") == (r["model"] == "embedded")
        assert r["moves_frame"].startswith("one thread: ")
    assert next(r for r in rows if r["model"] == "embedded")["codec_floor_ms"] is None  # Griffin-Lim: no floor
    streams = metrics["streams"]
    assert {(s["model"], s["layout"]) for s in streams} == {(m, lay) for m in ("tiny-random", "embedded")
                                                            for lay in LAYOUTS}
    assert all(s["ttfa_ms"] > 0 and s["rtf"] > 0 for s in streams)
    assert all(r[f"stream_rtf_{t}"] is not None for r in rows for t in ("1t", "2c"))  # every row was streamed
    assert {c["batch"] for c in metrics["concurrency"]} == {1, 2} and metrics["pipeline"]["sustained"]
    assert metrics["pipeline"]["quoted"] == [dict(q) for q in PUBLIC_PIPELINES]
    with (out / "06_pipeline.csv").open() as f:
        quoted = [r for r in csv.DictReader(f) if r["weights"] == "QUOTED, not measured here"]
    assert len(quoted) == len(PUBLIC_PIPELINES) and all(r["frame_1t_ms"] == "" for r in quoted)
    # listening: the embedded model's stream, written with its sidecar
    listen = metrics["listen"]
    assert listen["frames"] > 0 and listen["ttfa_ms"] > 0 and (out / listen["path"]).stat().st_size > 44
    assert (out / "06_listen.provenance.json").is_file()
    for stem in ("06_backends", "06_exported_graphs", "06_paper_export", "06_speedup_vs_n", "06_frame_times",
                 "06_verify_cost", "06_paper_devices", "06_pipeline", "06_pipeline_streams",
                 "06_pipeline_concurrency"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in ("06_speedup_vs_n", "06_frame_parts", "06_audio_vs_wall_tiny-random", "06_audio_vs_wall_embedded"):
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext


def _files(out: Path, tables=(), figures=()) -> None:
    """Every table (CSV, Markdown, sidecar) and figure (PNG, PDF, sidecar) written, none empty."""
    for stem in tables:
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for stem in figures:
        for ext in (".png", ".pdf", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext


def _check_04_calibrating_the_tree(metrics: dict, out: Path) -> None:
    import csv

    from paper.plots import PAPER_DEVICE_SPEEDUPS
    from rvqspec_lib.models.backends import available
    from rvqspec_lib.models.tree_files import load_calibration

    # smoke: 48 calibration and 32 evaluation frames of the embedded model, trees of N 2, 4, 8, tiny-random's cost
    assert metrics["model"] == "embedded" and metrics["calibration_frames"] == 48 and metrics["eval_frames"] == 32
    cal = load_calibration(out / "04_trees_heads.json", n_codes=15, codebook_size=2048)
    assert cal["budgets"] == [2, 4, 8]
    # what a node is worth: the first sampled child above the top-ranked point-mass draft (the embedded model's p)
    acc = metrics["acceptance"]
    assert 0 < acc["top_rank_mass_offset1"] < acc["first_sampled_child_offset1"] <= 1 and acc["ratio_offset1"] > 1
    # predicted vs measured: both drafters with their own calibrations; the offsets' point-mass trees are `paper:N`
    # and their predictions the shipped file's
    rows = {r["decoder"]: r for r in metrics["predicted_vs_measured"]}
    heads = {f"tree:calibrated-{k}:{n}" for k in ("point-mass", "sampled") for n in (2, 4, 8)} | {"chain:2", "chain:4"}
    offsets = {f"paper:{n}" for n in (2, 4, 8)} | {f"tree:calibrated-sampled:{n}@offsets" for n in (2, 4, 8)} | \
        {"chain:2@offsets", "chain:4@offsets"}
    assert set(rows) == heads | offsets
    shipped = load_calibration(REPO / "data/embedded/model/trees/offsets.json", n_codes=15, codebook_size=2048)
    assert metrics["paper_decoder"]["calibration_frames"] == shipped["n_frames"]
    for n in (2, 4, 8):
        r = rows[f"paper:{n}"]
        assert r["kind"] == "paper" and r["drafter"] == "offsets" and r["nodes"] == n and not r["sampled"]
        assert r["predicted_tokens_per_call"] == shipped["point-mass"]["predicted_tokens_per_call"][str(n)]
        assert rows[f"tree:calibrated-point-mass:{n}"]["predicted_tokens_per_call"] == \
            cal["point-mass"]["predicted_tokens_per_call"][str(n)]
    for r in rows.values():
        assert r["measured_tokens_per_call"] >= 1.0 and r["frames"] == 32
        assert abs(r["relative_error"]) < 0.2, r  # E(N) within 20% of the held-out measurement, every tree and chain
    # the verify cost of both models through every backend present; the projection names its inputs
    backends = [b for b in ("official", "eager", "native") if available(b)[0]]
    cost = metrics["verify_cost"]
    assert {(r["model"], r["backend"]) for r in cost} == {(m, b) for m in ("embedded", "tiny-random") for b in backends}
    assert all(r["ratio_to_q1"] == 1.0 for r in cost if r["query_positions"] == 1)
    assert {(r["kind"], r["backend"], r["nodes"]) for r in metrics["projection"]} == {
        (k, b, n) for k in ("point-mass", "sampled") for b in backends for n in (2, 8)}
    for r in metrics["projection"]:  # E(N) per frame, what section 5 measures, over t(N)/t(1): never one round's codes
        assert r["expected_tokens"] == cal[r["kind"]]["predicted_tokens_per_call"][str(r["nodes"])]
    caption = (out / "04_projection_compare_model.md").read_text().splitlines()[0]
    assert caption.startswith("*PROJECTION, not a measurement") and "embedded" in caption and "tiny-random" in caption
    # Figure 4: every decoder stepped through every backend, the fused frames where a backend has them, AR each way
    speed = metrics["speed"]
    decoders = {"ar", "chain:4", "paper:2", "paper:8"} | {f"tree:calibrated-{k}:{n}" for k in ("point-mass", "sampled")
                                                           for n in (2, 8)}
    for b in backends:
        assert {r["decoder"] for r in speed if r["backend"] == b and not r["fused"]} == decoders, b
    fused = {(r["decoder"], r["backend"]) for r in speed if r["fused"]}
    assert fused == {(d, b) for d in ("ar", "chain:4") for b in backends if b != "official"}
    ar_rows = [r for r in speed if r["kind"] == "ar"]
    over = metrics["speedups_over_ar"]
    assert len(over) == len(ar_rows) and over[0]["fastest_ar"] and not any(r["fastest_ar"] for r in over[1:])
    assert over[0]["ar_ms"] == min(r["ms_per_frame"] for r in ar_rows)
    assert [r["ar_vs_fastest_ar"] for r in over] == sorted(r["ar_vs_fastest_ar"] for r in over)
    assert all(r["paper_decoder"].startswith("paper:") for r in over)
    # the paper's device numbers only in their own quoted columns, copied from the constants
    with (out / "04_paper_devices.csv").open() as f:
        dev = list(csv.DictReader(f))
    quoted = [r for r in dev if r["paper: device (quoted)"]]
    assert [(r["paper: device (quoted)"], int(r["paper: N (quoted)"]), float(r["paper: speedup (quoted)"]))
            for r in quoted] == [(p["device"], p["nodes"], p["speedup"]) for p in PAPER_DEVICE_SPEEDUPS]
    assert all(r["speedup_vs_ar (measured)"] == "" for r in quoted)
    assert {r["where"] for r in dev if not r["paper: device (quoted)"]} == {f"this CPU, {b} backend" for b in backends}
    # the temperature sweep and Figure 2's tree: the paper's decoder, from the offsets' own calibration file
    assert {(r["temperature"], r["kind"]) for r in metrics["temperature"]} == {
        (t, k) for t in (0.9, 0.3) for k in ("point-mass", "sampled")}
    side = json.loads((out / "04_tree_and_mask.provenance.json").read_text())
    assert side["decoder"] == "paper:32" and side["calibration_file"].endswith("trees/offsets.json")
    _files(out, tables=("04_rank_mass", "04_child_acceptance", "04_acceptance_by_start_depth",
                        "04_predicted_vs_measured", "04_verify_cost", "04_projection_compare_model", "04_speed",
                        "04_speedup_over_each_ar", "04_paper_devices", "04_temperature"),
           figures=("04_acceptance_heatmap", "04_trees", "04_tree_and_mask", "04_tokens_per_call_vs_N",
                    "04_verify_cost", "04_speedup_vs_N", "04_temperature"))


def _check_07_device_engineering(metrics: dict, out: Path) -> None:
    from rvqspec_lib.models.backends import available

    # smoke: tiny-random against its floor in float32, the embedded model's batches, auto and table
    assert metrics["model"] == "tiny-random" and metrics["random_weights"] is True
    assert metrics["precisions"] == ["float32"] and metrics["cpu"]
    floor_backends = [b for b in ("official", "native") if available(b)[0]]
    assert [(r["precision"], r["backend"]) for r in metrics["floor"]] == [("float32", b) for b in floor_backends]
    assert all(r["t1_ms"] > 0 and r["floor_ms"] > 0 and r["t1_over_floor"] > 0 for r in metrics["floor"])
    assert {(r["precision"], r["forward"], r["context"]) for r in metrics["talker"]} == {
        ("float32", f, 8) for f in ("official", "native")}
    # batches: AR and chain 4, stepped and fused, through eager and native, B 1 and 4
    b_backends = [b for b in ("eager", "native") if available(b)[0]]
    got = {(r["decoder"], r["backend"], r["fused"], r["batch"]) for r in metrics["batches"]}
    assert got == {(d, b, f, n) for d in ("ar", "chain:4") for b in b_backends for f in (False, True) for n in (1, 4)}
    assert all(r["speedup_vs_ar"] == 1.0 for r in metrics["batches"] if r["decoder"] == "ar" and not r["fused"])
    # auto: a decoder name the grammar reads, through one of the backends it was offered
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name

    parse_decoder_name(metrics["auto"]["decoder"])
    assert metrics["auto"]["backend"] in ("official", "eager", "native")
    # the table to act on, measured here: five rows per (model, backend); tiny-random a labelled timing replay whose
    # fused speculative row is absent; the public ports quoted under it
    tab = json.loads((out / "07_bench_table.json").read_text())
    t_backends = [b for b in ("eager", "native") if available(b)[0]]
    assert [(r["model"], r["backend"], r["row"]) for r in tab["rows"]] == [
        (m, b, row) for m in ("embedded", "tiny-random") for b in t_backends
        for row in ("stepped AR", "fused AR", "best speculative", "fused speculative", "auto")]
    for r in tab["rows"]:
        assert r["precision"] == "float32"
        if r["model"] == "tiny-random":
            assert r["weights"].startswith("timing replay: acceptance of")
            if r["row"] == "fused speculative":
                assert r["ms_per_frame"] is None and r["note"].startswith("absent: a timing replay")
        else:
            assert r["weights"] == "trained" and r["ms_per_frame"] > 0
    assert any("public C port" in f for f in tab["footer"])
    assert {f["model"] for f in metrics["fastest_by_model"]} == {"embedded", "tiny-random"}
    assert {r["model"] for r in metrics["round_costs"]} == {"embedded"}  # a replay has no fused speculative frame
    for r in metrics["round_costs"]:
        assert r["round_over_ar_call"] == pytest.approx(r["tokens_per_call"] * r["x_fused_ar"])
    assert metrics["gpu_json_present"] is False
    _files(out, tables=("07_machine", "07_floor", "07_talker", "07_batches", "07_auto", "07_bench_table",
                        "07_round_costs"),
           figures=("07_floor", "07_batches", "07_auto", "07_bench_table"))
