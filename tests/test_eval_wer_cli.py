"""``rvqspec eval-wer`` (rvqspec_lib/cli/eval_wer.py): bad input gets a one-line error naming the fix before any work
(exit 2); a small run on the embedded model writes Tables 1 and 3 with the lossy control labelled, every decoder
under its canonical name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rvqspec_lib.cli.main import main


def _run(argv, capsys):
    rc = main(["eval-wer", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("argv,match", [
    (["--model", "embedded", "--decoders", "ar,beam:4"], "unknown decoder 'beam:4'"),
    (["--model", "embedded", "--decoders", "chain:12"], "window"),
    (["--model", "embedded", "--languages", "en,xx"], "unknown language 'xx'"),
    (["--model", "embedded", "--asr", "kaldi"], "unknown recogniser"),
    (["--model", "embedded", "--asr", "whisper:/no/such/whisper"], "no Whisper model folder at /no/such/whisper"),
    (["--model", "embedded", "--asr", "whisper:data"], "data is not a Whisper model"),  # a folder, no model in it
    (["--model", "embedded", "--codec", "c.safetensors"], "--codec is used only with --dataset"),
    (["--model", "embedded", "--json", "/no/such/dir/out.json"], "does not exist"),
    (["--model", "embedded", "--decoders", "ar,auto"], "auto is chosen by timing"),
    (["--model", "embedded", "--decoders", "chain:best@offsets"], "chain:best is chosen for the heads only"),
    (["--model", "tiny-random", "--languages", "de", "--decoders", "ar"], "no evaluation data for de"),
])
def test_bad_input_one_line_error(argv, match, capsys):
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and match in err and err.count("\n") == 1 and err.startswith("rvqspec: error:"), err


def test_dataset_without_the_expected_columns(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    sf = pytest.importorskip("soundfile")
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(1600, np.float32), 16000)
    ds = datasets.Dataset.from_dict({"audio": [str(wav)], "sentence": ["hallo"]})
    datasets.DatasetDict({"test": ds.cast_column("audio", datasets.Audio(sampling_rate=16000))}).save_to_disk(
        str(tmp_path / "fleurs" / "de_de"))
    capsys.readouterr()  # the save's progress bar
    rc, out, err = _run(["--model", "tiny-random", "--languages", "de", "--decoders", "ar", "--dataset",
                         str(tmp_path / "fleurs"), "--codec", "data/embedded/codec.safetensors"], capsys)
    assert rc == 2 and "no 'raw_transcription' column" in err and "sentence" in err and err.count("\n") == 1


@pytest.mark.slow
def test_small_run_on_the_embedded_model(tmp_path, capsys):
    out_json = tmp_path / "wer.json"
    rc, out, err = _run(["--model", "embedded", "--languages", "en", "--sentences", "2", "--decoders",
                         "ar,chain:4,ssd-lossy", "--work-dir", str(tmp_path / "work"), "--json", str(out_json)],
                        capsys)
    assert rc == 0, err
    res = json.loads(out_json.read_text())
    labels = {r["decoder"] for r in res["table3"]}
    assert labels == {"ar", "ar-seed2", "chain:4", "ssd-lossy:0.4"}
    assert [r["decoder"] for r in res["table3"] if r["lossy"]] == ["ssd-lossy:0.4"]  # keyed by fields
    assert "LOSSY control" in out and "tokens/call" in out
    assert res["table1"] == [{"split": "evaluation", "role": "WER parity, Table 3", "language": "en", "samples": 2,
                              "hours": res["table1"][0]["hours"], "frames": res["results"]["en"]["n_frames"]}]
    assert res["results"]["en"]["asr"] == "whisper-tiny.en"  # the default English recogniser
    assert set(res["results"]["en"]["wer"]) == {"ar", "ar-seed2", "chain:4", "ssd-lossy:0.4"}
    # CER beside WER, in the results and in Table 3
    assert all(0 <= w["cer"] < 10 for w in res["results"]["en"]["wer"].values())
    assert all("cer" in r and "wer" in r for r in res["table3"]) and " CER " in out


@pytest.mark.slow
def test_the_papers_decoder_beside_the_heads_tree(tmp_path, capsys):
    """eval-wer runs ``paper`` (offsets + their own tree) beside the heads' calibrated tree of the same budget."""
    out_json = tmp_path / "wer.json"
    rc, out, err = _run(["--model", "embedded", "--languages", "en", "--sentences", "1", "--asr", "none",
                         "--no-null-control", "--decoders", "ar,paper:8,tree:calibrated-point-mass:8",
                         "--work-dir", str(tmp_path / "work"), "--json", str(out_json)], capsys)
    assert rc == 0, err
    res = json.loads(out_json.read_text())
    assert set(res["decoders"]) == {"ar", "paper:8", "tree:calibrated-point-mass:8"}
    tpc = res["results"]["en"]["tokens_per_call"]
    assert tpc["paper:8"]["value"] > 1.0 and tpc["tree:calibrated-point-mass:8"]["value"] > 1.0
