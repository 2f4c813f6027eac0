"""Two runs at one seed write the same numbers everywhere but in timings.

docs/reproducibility.md#what-must-be-identical-between-two-runs-at-one-seed says what that means. The comparison is
:func:`tools.reproducibility.compare_runs`, which knows the timing columns from the one list in that
module; these tests check the comparison itself (a perturbed table is flagged, a perturbed timing is not: the
negative control), that the list names real columns and is the one the docs describe, and then run the deterministic
core of the notebooks that do not time, twice, each run into its own folder:

* notebook 00 as `make paper SMOKE=1` runs it (one held-out sentence instead of three), each run in its own kernel
  (a fresh process: another hash seed) rendering its own audio (flite, espeak-ng, sox) into its own work folder;
* notebook 05's core as the notebook calls it (evaluation data rendered and encoded, trees calibrated, every decoder
  on English and German, the recogniser on English, its tables written), at a smaller size than its smoke run, the
  global random generators moved between the two runs (the library must not read them).

A timing's tokens per call must not depend on how many rounds the machine's noise asked for either. Notebooks 02's
and 03's smoke runs are compared the same way by hand (docs/reproducibility.md): they take too long for the suite.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tools import reproducibility as R

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "figures"


def _rewrite_cell(path: Path, column: str, value: str, row: int = 0) -> None:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    rows[row + 1][rows[0].index(column)] = value
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)


# ------------------------------------------------------------------------------------------ the comparison itself
def test_compare_runs_flags_a_perturbed_table_and_ignores_timings(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    files = ["05_table3.csv", "03_training_curves.csv", "04_speed.csv", "00_metrics.json"]
    # a committed run from before the notebooks' renumbering holds these tables under their old numbers
    old = {"05_table3.csv": "04_table3.csv", "03_training_curves.csv": "02_training_curves.csv",
           "04_speed.csv": "03_speed.csv"}
    source = {new: was for new, was in old.items() if not (FIGURES / new).is_file()}
    for d in (a, b):
        d.mkdir()
        for name in files:
            shutil.copy(FIGURES / source.get(name, name), d / name)
        (d / "00_metrics.provenance.json").write_text("{}")  # sidecars are records of the run: never compared
    (b / "00_metrics.provenance.json").write_text('{"created_utc": "another time"}')
    assert R.compare_runs(a, b) == []

    # timings may differ: a timing column, a run time in a result JSON
    _rewrite_cell(b / "03_training_curves.csv", "wall_s", "12345.6")
    _rewrite_cell(b / "04_speed.csv", "ms_per_frame", "0.001")
    m = json.loads((b / "00_metrics.json").read_text())
    m["wall_s"] += 100.0
    (b / "00_metrics.json").write_text(json.dumps(m))
    assert R.compare_runs(a, b) == []

    # the negative control: one non-timing cell of a table, one value of a result JSON
    _rewrite_cell(b / "05_table3.csv", "tokens_per_call", "2.0000000000000004", row=3)
    _rewrite_cell(b / "04_speed.csv", "tokens_per_call", "9.99")  # a timing notebook's non-timing column
    m["wer"]["unquantised"] = 0.1681
    (b / "00_metrics.json").write_text(json.dumps(m))
    diffs = R.compare_runs(a, b)
    assert len(diffs) == 3, diffs
    assert any(d.startswith("05_table3.csv: column 'tokens_per_call' differs first in row 4") for d in diffs)
    assert any(d.startswith("04_speed.csv: column 'tokens_per_call'") for d in diffs)
    assert any(d.startswith("00_metrics.json.wer.unquantised: ") for d in diffs)

    # a missing table; a drafter's weights (its file embeds its provenance record: that may differ)
    from safetensors.torch import save_file

    (b / "03_training_curves.csv").unlink()
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    meta = {"format": "rvqspec-drafter", "config": {"K": 3}, "provenance": {"created_utc": "then"}}
    save_file({"offsets": w}, str(a / "x.safetensors"), metadata={"rvqspec": json.dumps(meta)})
    meta["provenance"] = {"created_utc": "later", "hardware": {"load_avg_1m": 3.5}}
    save_file({"offsets": w}, str(b / "x.safetensors"), metadata={"rvqspec": json.dumps(meta)})
    assert R.compare_safetensors(a / "x.safetensors", b / "x.safetensors") == []
    save_file({"offsets": w + 1e-6}, str(b / "x.safetensors"), metadata={"rvqspec": json.dumps(meta)})
    meta["config"]["K"] = 2
    save_file({"offsets": w}, str(a / "y.safetensors"), metadata={"rvqspec": json.dumps(meta)})
    save_file({"offsets": w}, str(b / "y.safetensors"), metadata={"rvqspec": json.dumps({**meta, "config": {"K": 3}})})
    diffs = R.compare_runs(a, b)
    assert any("03_training_curves.csv: only in" in d for d in diffs)
    assert "x.safetensors: the tensors' bytes differ" in diffs
    assert "y.safetensors.__metadata__.rvqspec.config.K: 2 vs 3" in diffs
    assert R.main([str(a), str(b)]) == 1 and R.main([str(a), str(a)]) == 0
    with pytest.raises(FileNotFoundError, match="no run folder"):
        R.compare_runs(a, tmp_path / "missing")


def test_a_table_of_timings_alone_may_have_other_rows(tmp_path):
    """06_pipeline_streams is all timings, and its rows are chosen by them (auto's row only where auto chose other than
    the fastest): another row count is no difference. Control: a table with non-timing columns still is."""
    for name, flagged in (("06_pipeline_streams.csv", False), ("03_margin.csv", True)):
        a, b = tmp_path / "a" / name, tmp_path / "b" / name
        for path, rows in ((a, 2), (b, 3)):
            path.parent.mkdir(exist_ok=True)
            path.write_text("decoder,rtf\n" + "ar,1.0\n" * rows)
        assert bool(R.compare_tables(a, b)) is flagged, name


def test_paths_inside_each_run_folder_compare_relative_to_it(tmp_path):
    a, b = tmp_path / "run_a", tmp_path / "run_b"
    for d in (a, b):
        d.mkdir()
        (d / "02_metrics.json").write_text(json.dumps({"drafter_files": {"offsets-ce": str(d / "02_drafters/x")},
                                                       "elsewhere": "/data/model"}))
    assert R.compare_runs(a, b) == []
    (b / "02_metrics.json").write_text(json.dumps({"drafter_files": {"offsets-ce": str(b / "02_drafters/y")},
                                                   "elsewhere": "/data/model"}))
    assert R.compare_runs(a, b) == [
        "02_metrics.json.drafter_files.offsets-ce: '<run>/02_drafters/x' vs '<run>/02_drafters/y'"]


def test_nan_cells_and_values_compare_equal(tmp_path):
    (tmp_path / "a.json").write_text('{"x": NaN, "y": [1.0, NaN]}')
    (tmp_path / "b.json").write_text('{"x": NaN, "y": [1.0, NaN]}')
    assert R.compare_json(tmp_path / "a.json", tmp_path / "b.json") == []
    (tmp_path / "b.json").write_text('{"x": NaN, "y": [1.0, 2.0]}')
    assert R.compare_json(tmp_path / "a.json", tmp_path / "b.json") == ["a.json.y[1]: nan vs 2.0"]


def test_timing_columns_name_columns_of_the_committed_tables():
    """A pattern that matches no column of its committed table is a renamed column the list no longer covers."""
    stale = []
    for stem, patterns in R.TIMING_COLUMNS.items():
        path = FIGURES / f"{stem}.csv"
        if patterns == R.ALL or not path.is_file():
            continue
        with path.open(newline="") as f:
            header = next(csv.reader(f))
        stale += [f"{stem}: {p}" for p in patterns if not any(fnmatch.fnmatchcase(c, p) for c in header)]
    assert stale == []
    # the notebooks that do not time have no timing column but their run times
    # the drafters notebook (03) does not time: its only timing column is its epochs' seconds
    assert R.TIMING_COLUMNS["03_training_curves"] == ("wall_s",)


def test_the_docs_describe_the_same_list():
    text = (REPO / "docs" / "reproducibility.md").read_text()
    section = text[text.index("## What must be identical"):]
    section = section[:section.index("\n## ", 4)]
    missing = [stem for stem in R.TIMING_COLUMNS if f"`{stem}`" not in section]
    missing += [f"{stem}: {p}" for stem, ps in R.TIMING_COLUMNS.items() if ps != R.ALL for p in ps
                if f"`{p}`" not in section]
    missing += [k for k in R.TIMING_JSON_KEYS if f"`{k}`" not in section]
    assert missing == [], f"docs/reproducibility.md (What must be identical ...) does not name {missing}"


@pytest.mark.parametrize("what", ["time_frames", "batch_throughput"])
def test_tokens_per_call_of_a_timing_do_not_depend_on_the_rounds_the_noise_made(monkeypatch, what):
    """With a noise target the rounds a timing makes depend on the machine's noise; the tokens per call and calls
    per frame beside the times come from the first ``repeats`` rounds, which every run makes."""
    from rvqspec_lib.decoding.decoders import AR, Chain
    from rvqspec_lib.eval import noise, speed
    from rvqspec_lib.models import backends as B
    from rvqspec_lib.models.loader import load_model

    cp = load_model("tiny-random").code_predictor.eval()
    ctx = speed.random_contexts(cp, 6, seed=0)
    runners = [B.frame_runner("official", cp, decoder) for decoder in (AR(), Chain(4))]
    from bench import frames

    timing = getattr(speed if what == "time_frames" else frames, what)
    kw = {"batch_sizes": (2,)} if what == "batch_throughput" else {"max_repeats": 8}
    rows = {}
    for stop_after in (3, 7):  # two runs whose timings were noisier or quieter: 3 and 7 rounds
        monkeypatch.setattr(noise, "should_stop",  # the harness's stopping rule (eval/timing.interleaved reads it)
                            lambda times, *a, n=stop_after: min(len(v) for v in times.values()) >= n)
        res = timing(runners, ctx, repeats=3, warmup=0, seed=0, progress=False, noise_target=0.05, **kw)
        assert res["meta"]["repeats"] == stop_after
        rows[stop_after] = [{k: r.get(k) for k in ("decoder", "tokens_per_call", "calls_per_frame")}
                            for r in res["rows"]]
    assert rows[3] == rows[7]
    assert any(r["tokens_per_call"] > 1 for r in rows[3])


# ------------------------------------------------------------------------------------------ two runs, compared
def _run_notebook(src: Path, out: Path, parameters: dict) -> None:
    jupytext = pytest.importorskip("jupytext")
    papermill = pytest.importorskip("papermill")
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out.mkdir(parents=True)
    ipynb = out.parent / f"{out.name}.{src.stem}.ipynb"
    jupytext.write(nb, ipynb, fmt="ipynb")
    papermill.execute_notebook(str(ipynb), str(ipynb.with_suffix(".executed.ipynb")),
                               parameters={"out_dir": str(out), **parameters}, kernel_name="python3",
                               language="python", cwd=str(REPO), progress_bar=False)


def _wav_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.wav"))}


@pytest.mark.slow
def test_notebook_00_twice_at_one_seed(tmp_path):
    pytest.importorskip("faster_whisper")
    for run in ("a", "b"):  # smoke, as `make paper SMOKE=1`, one held-out sentence
        _run_notebook(REPO / "notebooks" / "00_corpus_and_codec.py", tmp_path / run,
                      {"smoke": True, "seed": 0, "threads": 1, "n_sentences": 1})
    a, b = tmp_path / "a", tmp_path / "b"
    assert R.compare_runs(a, b, figures=True) == []
    assert (a / "00_codec_quality.csv").is_file() and (a / "00_spectrograms.png").is_file()
    # every rendering (flite for English, espeak-ng for the other languages, each through sox) is byte-identical
    wa, wb = _wav_bytes(a / "00_work"), _wav_bytes(b / "00_work")
    assert len(wa) >= 1 + 3 + 5 and wa == wb


def _wer_parity_core(out: Path, lm, seed: int = 0) -> None:
    """Notebook 04's calls, in its order, at a size below its smoke run: the tables it writes, into ``out``."""
    from rvqspec_lib.common.provenance import save_table
    from rvqspec_lib.decoding.decoder_names import check_decoder_names
    from rvqspec_lib.decoding.drafters import ReusedHeads
    from rvqspec_lib.eval.eval_sets import calibrate_decoders, calibration_data, evaluation_data
    from rvqspec_lib.eval import parity as S
    from rvqspec_lib.eval import wer_parity as W
    from paper import wer_report
    from rvqspec_lib.eval.asr_models import recogniser

    codec = lm.speech_tokenizer.codec
    audio_codec = codec.with_decoder(None)
    languages = ("en", "de")
    data = evaluation_data("embedded", languages, codec=codec, n_sentences=2, n_multilingual=1, seed=seed,
                           work_dir=out / "05_work")
    names = ["ar", "chain:best", "tree:calibrated-point-mass:4", "tree:calibrated-sampled:4", "ssd-lossy:0.4"]
    cal_utts, cal_meta, _ = calibration_data("embedded", codec=codec, seed=seed)
    cal = calibrate_decoders(lm, cal_utts, needs=check_decoder_names(names), max_frames=24, budgets=[4], seed=seed)
    decoders = wer_report.standard_decoders(calibration=cal["calibration"], best_chain=cal["best_chain"], budget=4, beta=0.4)
    results = {lang: W.evaluate_language(lm, data[lang]["utterances"], decoders, language=lang, codec=audio_codec,
                                         asr=recogniser("auto", lang, [u.text for u in data[lang]["utterances"]]),
                                         seed=seed, replicates=1 if lang == "en" else 2, drafter=ReusedHeads())
               for lang in languages}
    prov = {"params": {"seed": seed}}
    save_table(S.table1_rows(S.entries_used(cal_meta, cal["n_frames"])
                             + [m for lang in languages for m in data[lang]["meta"]]), out / "04_table1", prov)
    save_table(W.table3_rows(results), out / "04_table3", prov)
    save_table(wer_report.verdicts(results), out / "04_verdicts", prov)
    (out / "04_core.json").write_text(json.dumps(
        {lang: {k: results[lang][k] for k in ("tokens_per_call", "per_utterance", "hypotheses", "n_frames")}
         for lang in languages}))


@pytest.mark.slow
def test_wer_parity_core_twice_at_one_seed(tmp_path):
    pytest.importorskip("faster_whisper")
    from rvqspec_lib.models.loader import load_model

    lm = load_model("embedded")
    _wer_parity_core(tmp_path / "a", lm)
    # the library draws only from explicit generators: moving the global ones changes nothing
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)
    _wer_parity_core(tmp_path / "b", lm)
    a, b = tmp_path / "a", tmp_path / "b"
    assert R.compare_runs(a, b) == []
    table3 = list(csv.DictReader((a / "04_table3.csv").open()))
    assert {r["language"] for r in table3} == {"en", "de"}  # both paths ran: shipped English, rendered German
    assert _wav_bytes(a / "05_work") == _wav_bytes(b / "05_work") != {}


def test_paths_inside_two_checkouts_compare_equal_and_others_do_not(tmp_path):
    """Two clones in different folders: a result naming a file of its own checkout (the shipped utterances) is the
    same result; a path outside both checkouts still differs (the negative control)."""
    from tools.reproducibility import compare_json

    runs = []
    for name in ("clone_a", "clone_b"):
        (tmp_path / name / ".git").mkdir(parents=True)
        run = tmp_path / name / "build" / "smoke"
        run.mkdir(parents=True)
        runs.append(run)
    for run, other in ((runs[0], "/elsewhere/a"), (runs[1], "/elsewhere/b")):
        checkout = run.parent.parent
        (run / "same.json").write_text(json.dumps({"file": f"{checkout}/data/x.safetensors", "out": f"{run}/t.csv"}))
        (run / "differ.json").write_text(json.dumps({"file": other}))
    assert compare_json(runs[0] / "same.json", runs[1] / "same.json", roots=tuple(runs)) == []
    assert compare_json(runs[0] / "differ.json", runs[1] / "differ.json", roots=tuple(runs)) != []
