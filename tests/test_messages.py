"""Messages that pointed the wrong way (a new user's trial, issue 18), each with the failing input and a control:

* a local checkpoint folder without ``speech_tokenizer/`` is named as such (it used to get hub download advice);
* Latin-script text in another language (German) gets the "trained on English only" note that Chinese or Russian
  text gets, and English text does not (:mod:`rvqspec_lib.models.text_language`, over the project's own English
  and multilingual sentences);
* ``rvqspec export`` into a folder where nothing can be written fails before the model loads, naming the folder;
* a dataset folder whose Arrow file was cut short names that file and the fix;
* ``rvqspec export --format coreml --dtype float32`` says that the KV-cache states stay float16, and importing
  coremltools through the library prints none of its Linux loader lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rvqspec_lib.cli.main import main
from rvqspec_lib.models import loader
from rvqspec_lib.models.text_language import english_only_note, non_english_evidence

REPO = Path(__file__).resolve().parent.parent


def _no_load(*a, **k):
    raise AssertionError("the model was loaded before the arguments were checked")


def _exit_status(argv) -> int:
    """``main``'s exit status; the parser's own errors (a flag the command lacks) exit 2 as argparse does."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rvqspec: error: ") and "Traceback" not in err, err
    return lines[0]


# ---- a checkpoint without speech_tokenizer/ -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from checkpoints import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "Qwen3-TTS-12Hz-tiny-CustomVoice", seed=0)


def test_checkpoint_without_speech_tokenizer_names_the_folder(ckpt, tmp_path, capsys, monkeypatch):
    assert loader.model_facts(str(ckpt)).kind == "checkpoint"  # control: the complete folder passes the check
    broken = tmp_path / "ckpt"
    shutil.copytree(ckpt, broken)
    shutil.rmtree(broken / "speech_tokenizer")
    for call in (loader.model_facts, loader.load_model):
        with pytest.raises(loader.ModelNotFoundError) as e:
            call(str(broken))
        msg = str(e.value)
        assert f"{broken / 'speech_tokenizer'}/ is missing" in msg and "copy the release's speech_tokenizer/" in msg
        assert "download" not in msg.lower() and "\n" not in msg
    (broken / "speech_tokenizer").mkdir()  # an empty folder: its config.json is what is missing
    with pytest.raises(loader.ModelNotFoundError, match="speech_tokenizer/ has no config.json"):
        loader.model_facts(str(broken))
    # the command line: one line, before any load
    monkeypatch.setattr(loader, "load_model", _no_load)  # synth reads loader.load_model when it runs
    assert main(["synth", "--model", str(broken), "--text", "Hello.", "--out", str(tmp_path / "x.wav")]) == 2
    assert "speech_tokenizer/ has no config.json" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "x.wav").exists()


# ---- the "English only" note ------------------------------------------------------------------------------------------
def _tsv_texts(name: str, column: int) -> list[tuple[str, ...]]:
    lines = (REPO / "data" / "eval_texts" / name).read_text(encoding="utf-8").splitlines()
    return [tuple(ln.split("\t")) for ln in lines if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("text, flagged", [
    ("Guten Morgen, wie geht es dir?", True),      # the user's German: no letter outside ASCII
    ("Können Sie mir bitte helfen?", True),
    ("¿Dónde está la estación?", True),
    ("Danke.", True),                               # one word, and it is German
    ("你好，世界", True), ("Привет, как дела?", True),  # outside the Latin script, as before
    ("Good morning, how are you?", False),          # the negative controls
    ("The weather is fine today.", False),
    ("We had coffee at the café on Main Street.", False),  # one accented loanword in an English sentence
    ("", False), ("123 456", False),
])
def test_non_english_text_is_noticed(text, flagged):
    assert (non_english_evidence(text) is not None) == flagged, non_english_evidence(text)
    note = english_only_note("embedded", text)
    assert (note is not None) == flagged
    if flagged:
        assert note.startswith("embedded was trained on English only")


def test_the_heuristic_on_the_projects_own_sentences():
    """Every German and Spanish sentence of data/eval_texts/multilingual.tsv is flagged; of the 1,609 English
    evaluation and calibration sentences exactly one is, the mock-German fortune (the module doc says so)."""
    multi = [(lang, text) for lang, text in _tsv_texts("multilingual.tsv", 1) if lang in ("de", "es")]
    assert len(multi) == 16 and all(non_english_evidence(t) for _, t in multi)
    english = [row[0] for name in ("en_evaluation.tsv", "en_calibration.tsv") for row in _tsv_texts(name, 0)[1:]]
    assert len(english) == 1609
    assert [t for t in english if non_english_evidence(t)] == [
        "Das machine is nicht fur gefingerpoken und mittengrabben."]


def test_synth_notes_german_and_not_english(tmp_path, capsys):
    for text, expected in (("Guten Morgen, wie geht es dir?", True), ("Good morning, how are you?", False)):
        rc = main(["synth", "--model", "embedded", "--text", text, "--out", str(tmp_path / "x.wav"), "--max-frames",
                   "2"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert ("trained on English only" in err) == expected, err
        if expected:
            assert "words such as 'guten', 'morgen', 'wie'" in err


# ---- export into a folder where nothing can be written ----------------------------------------------------------------
@pytest.mark.parametrize("out", ["/proc", "/proc/rvqspec-export"])
def test_export_into_an_unwritable_folder_fails_before_loading(out, capsys, no_load):
    """/proc takes no new files, whoever runs the test (root included): the existing folder, and a folder to be
    created in it."""
    if not Path("/proc").is_dir():
        pytest.skip("no /proc")
    assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--out", out]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--out {out}: no file can be written in /proc" in line and "choose a writable folder" in line, line
    assert ".part" not in line and "tmp" not in line  # no temporary file is named


def test_export_folder_check_passes_a_writable_folder(tmp_path):
    from rvqspec_lib.cli.common import check_output_folder

    assert check_output_folder(tmp_path) is None and check_output_folder(tmp_path / "new") is None
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing


def test_export_into_a_read_only_folder_fails_before_loading(tmp_path, capsys, monkeypatch, no_load):
    """A chmod 555 folder. Root ignores mode bits, so as root the probe's refusal is what the kernel would answer a
    user (EACCES), raised by the probe itself; as a user the real mode bits refuse it."""
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    if os.geteuid() == 0:
        import errno

        from rvqspec_lib.common import files

        real = files.temp_beside

        def refuse(path, *a, **k):
            if Path(path).parent == ro:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, *a, **k)

        monkeypatch.setattr(files, "temp_beside", refuse)
    assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--out", str(ro)]) == 2
    assert f"chmod u+w {ro}" in _one_error_line(capsys.readouterr().err)


# ---- a truncated dataset file ------------------------------------------------------------------------------------------
def test_truncated_arrow_file_is_named_with_the_fix(tmp_path):
    datasets = pytest.importorskip("datasets")
    from rvqspec_lib.eval.datasets import damaged_arrow_file, load_speech_dataset

    rows = {"id": list(range(40)), "audio": ["x.wav"] * 40, "text": ["some words here " * 20] * 40}
    folder = tmp_path / "librispeech"
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    assert len(load_speech_dataset(folder, "librispeech")) == 40 and damaged_arrow_file(folder) is None  # control
    (arrow,) = sorted(folder.rglob("*.arrow"))
    size = arrow.stat().st_size
    for cut in (size // 2, 100, 0):  # message body, metadata and schema cut short: pyarrow's three errors
        with open(arrow, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(ValueError) as e:
            load_speech_dataset(folder, "librispeech")
        msg = str(e.value)
        assert msg.startswith(f"{arrow} is cut short or damaged (") and "\n" not in msg, msg
        assert "copy that file again" in msg and "save_to_disk" in msg


# ---- Core ML: float16 states said, loader noise silenced ----------------------------------------------------------------
def _fake_export(states):
    def export_graph(cp, graph, fmt, path, **kw):
        Path(path).mkdir()
        written = {"inputs": [["inputs_embeds", [1, 4, 8], "float32"]], "outputs": [["verify_logits", [1], "float32"]],
                   "states": states}
        return {"path": Path(path), "format": fmt, "graph": graph, "dtype": kw.get("dtype"), "nodes": kw.get("nodes"),
                "bytes": 1, "export_s": 0.0, "declared": written, "written": written}
    return export_graph


@pytest.mark.parametrize("dtype, said", [("float32", True), ("float16", False)])
def test_coreml_float32_export_says_the_states_stay_float16(tmp_path, capsys, monkeypatch, dtype, said):
    """The command's output for a Core ML package (the conversion itself is tests/test_export_coreml.py's: here it is
    replaced by its result, the states the package declares)."""
    from rvqspec_lib.device import export_check as X
    from rvqspec_lib.device import export_formats as F

    states = [["k_cache", [2, 1, 2, 32, 8], "float16"], ["v_cache", [2, 1, 2, 32, 8], "float16"]]
    monkeypatch.setattr(F, "export_graph", _fake_export(states))
    monkeypatch.setattr(X, "check_file", lambda *a, **k: [])
    assert main(["export", "--model", "tiny-random", "--format", "coreml", "--graph", "verify", "--dtype", dtype,
                 "--out", str(tmp_path / "ex")]) == 0
    cap = capsys.readouterr()
    line = [ln for ln in cap.err.splitlines() if "stay float16" in ln]
    assert len(line) == (1 if said else 0), cap.err
    if said:
        assert line[0].startswith("note: --dtype float32") and "KV-cache states (k_cache, v_cache)" in line[0]


def test_importing_coremltools_through_the_library_prints_no_loader_lines():
    pytest.importorskip("coremltools")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ours = subprocess.run([sys.executable, "-c", "from rvqspec_lib.device.export_formats import import_coremltools; "
                           "ct = import_coremltools(); import logging; "
                           "logging.getLogger('coremltools').warning('a real warning still shows')"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert ours.returncode == 0, ours.stderr
    assert ours.stderr.strip().splitlines() == ["a real warning still shows"], ours.stderr
    plain = subprocess.run([sys.executable, "-c", "import coremltools"], capture_output=True, text=True, timeout=120,
                           env=env)
    if sys.platform != "darwin":  # the negative control: a plain import prints them here
        assert "Failed to load _MLModelProxy" in plain.stderr, plain.stderr


# ---- --text-file given a folder, --model given a path that does not exist ----------------------------------------
@pytest.mark.parametrize("what, needle", [("folder", "is a folder: give a UTF-8 text file"),
                                          ("missing", "does not exist")])  # missing: the other message stays
def test_text_file_that_is_a_folder_says_so(tmp_path, capsys, what, needle, no_load):
    arg = tmp_path if what == "folder" else tmp_path / "nosuch.txt"
    rc = main(["synth", "--model", "tiny-random", "--text-file", str(arg), "--out", str(tmp_path / "a.wav")])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and needle in line and ("is a folder" in line) is (what == "folder"), line


@pytest.mark.parametrize("model", ["./no/such/folder", "/no/such/folder"])
def test_model_path_that_does_not_exist_says_so(tmp_path, capsys, model, no_load):
    rc = main(["synth", "--model", model, "--text", "Hi.", "--out", str(tmp_path / "a.wav")])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and f"--model folder {Path(model)} does not exist" in line and "unknown model" not in line, line


def test_a_mistyped_relative_path_is_a_path_not_a_hub_id(tmp_path, capsys, monkeypatch, no_load):
    """``build/tiny-ckp`` (one slash, no ``./``) whose first part is a folder here is a path that does not exist; the
    control: ``owner/name`` whose first part is no folder here is still taken for a hub id."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build").mkdir()
    assert loader._resolve("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")[0] == "hub"
    rc = main(["synth", "--model", "build/tiny-ckp", "--text", "Hi.", "--out", str(tmp_path / "a.wav")])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "--model folder build/tiny-ckp does not exist" in line and "hub" not in line.split(":")[0], line


def test_paper_without_offsets_suggests_a_decoder_that_drafts_with_the_heads(ckpt, tmp_path, capsys):
    """``--decoder paper`` on a model without the offsets: the fix it names is a decoder the grammar takes and that
    runs there (``paper@heads`` is refused; the heads' own tree needs calibrated trees, which this fresh checkpoint
    lacks, so the message names the heads' chain, and that chain runs)."""
    rc = main(["synth", "--model", str(ckpt), "--text", "Hi.", "--decoder", "paper", "--out", str(tmp_path / "a.wav")])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "or use chain:4 (the reused heads" in line and "use @heads" not in line, line
    assert "tree:calibrated-point-mass:32@heads" not in line  # its trees are not there: it would fail in turn
    assert main(["synth", "--model", str(ckpt), "--text", "Hi.", "--decoder", "chain:4", "--max-frames", "2",
                 "--out", str(tmp_path / "b.wav")]) == 0
    capsys.readouterr()
    rc = main(["synth", "--model", str(ckpt), "--text", "Hi.", "--decoder", "chain:4@offsets", "--out",
               str(tmp_path / "a.wav")])
    assert rc == 2 and "use @heads" in _one_error_line(capsys.readouterr().err)  # control: a chain takes @heads


def test_unknown_model_name_is_still_unknown(tmp_path, capsys, no_load):
    """Control: a bare name that is no model keeps the 'unknown model' list."""
    rc = main(["synth", "--model", "no-such-model", "--text", "Hi.", "--out", str(tmp_path / "a.wav")])
    assert rc == 2 and "unknown model 'no-such-model'" in _one_error_line(capsys.readouterr().err)


# ---- bench: float16 on the CPU, --noise-target named as a flag -----------------------------------------------------
def test_bench_refuses_float16_on_the_cpu_before_loading(capsys, no_load):
    for argv in (["latency", "--model", "tiny-random", "--dtype", "float16"],
                 ["frames", "--model", "tiny-random", "--dtype", "float16", "--device", "cpu"],
                 ["precisions", "--model", "tiny-random", "--dtype", "float32,float16"],
                 ["table", "--dtype", "float32,float16"]):
        rc = main(["bench", *argv])
        err = capsys.readouterr().err
        line = _one_error_line(err)
        assert rc == 2 and "usage" not in err, err
        assert line.startswith("rvqspec: error: --dtype float16 is a GPU precision here (a CPU emulates it): on the "
                               "CPU use float32, or bfloat16 where the CPU has AVX512-BF16 or AMX-BF16 (this one does")
        assert line.endswith("float16 on a GPU: --device cuda"), line


def test_bench_float16_on_a_gpu_device_passes_the_cpu_check(capsys, monkeypatch, no_load):
    """Negative control: on --device cuda float16 is a precision to time; here (no CUDA) the next check speaks."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["bench", "latency", "--model", "tiny-random", "--dtype", "float16", "--device", "cuda"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "GPU precision" not in line and "this torch has no CUDA device" in line, line


@pytest.mark.parametrize("argv, words", [
    (["--noise-target", "-1"], "--noise-target -1 is not a relative standard error: give a fraction > 0 (e.g. "
                               "--noise-target 0.02 for 2%), or drop it for exactly --repeats rounds"),
    (["--noise-target", "nan"], "--noise-target nan is not a relative standard error"),
    (["--noise-target", "0.02", "--repeats", "1"], "--noise-target needs --repeats >= 2"),
])
@pytest.mark.parametrize("job", [["latency", "--model", "tiny-random"], ["frames", "--model", "tiny-random"],
                                 ["table"]])
def test_bench_noise_target_is_named_as_the_flag(capsys, argv, words, job, no_load):
    rc = main(["bench", *job, *argv])
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert rc == 2 and words in line and "usage" not in err, line
    assert "noise_target" not in line and "repeats (" not in line, line  # never the library's argument names


# ---- train-drafter-parallel: frames that are not there name the command that makes them ---------------------------
def _parallel(tmp_path, frames, *extra):
    return main(["train-drafter-parallel", "--model", "embedded", "--drafter", "offsets", "--frames", str(frames),
                 "--out", str(tmp_path / "d.safetensors"), *extra])


@pytest.mark.parametrize("case", ["missing", "no-index", "missing-shard", "missing-val"])
def test_train_drafter_parallel_names_extract_frames(tmp_path, capsys, case, no_load):
    import json

    frames = tmp_path / "frames"
    if case != "missing":
        frames.mkdir()
    if case in ("missing-shard", "missing-val"):
        shard = "frames-00000-of-00001.safetensors"
        (frames / "index.json").write_text(json.dumps({"shards": [shard], "world": 1, "n_utterances": 1}))
        if case == "missing-val":
            (frames / shard).write_bytes(b"")  # present: the check reaches --val-frames
    extra = ["--val-frames", str(tmp_path / "val")] if case == "missing-val" else []
    rc = _parallel(tmp_path, frames, *extra)
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert rc == 2 and "usage" not in err and not (tmp_path / "d.safetensors").exists(), line
    split, path, flag = ("validation", tmp_path / "val", "--val-frames") if case == "missing-val" else \
        ("training", frames, "--frames")
    assert line.startswith(f"rvqspec: error: {flag} {path} "), line
    assert f"`rvqspec extract-frames --model embedded --split {split} --out {path}`" in line, line
    assert {"missing": "does not exist", "no-index": "holds no index.json", "missing-val": "does not exist",
            "missing-shard": "misses shard frames-00000-of-00001.safetensors of its index.json"}[case] in line
    for library_name in ("frames_from_model", "Frames.save", "rvqspec_lib", "extract_frames"):
        assert library_name not in line, line


# ---- a new user's trial of the native backend (this session's review): one line naming the fix ----------------------
@pytest.mark.parametrize("argv, needle", [
    (["bench", "frames", "--model", "embedded", "--backends", "native", "--device", "cuda"],
     "--backends native runs on the CPU: drop --device cuda"),
    (["bench", "latency", "--model", "embedded", "--backend", "native", "--device", "cuda"],
     "--backend native runs on the CPU: drop --device cuda"),
    (["bench", "frames", "--model", "embedded", "--backends", "native", "--decoders", "ssd-lossy"],
     "ssd-lossy is a LOSSY control for synth and eval-wer"),
    (["bench", "table", "--forwards", "native"], "rvqspec bench table has no argument --forwards"),  # gone: --backends
    (["bench", "table", "--queries", "1,2"], "--queries is a flag of rvqspec bench latency, precisions and frames, "
                                             "not of bench table: drop it, or run rvqspec bench latency with it"),
    (["bench", "frames", "--backends", "native", "--prefix-len", "4"], "not of bench frames: drop it"),
    (["bench", "table", "--table-out", "/tmp"], "--table-out /tmp is a folder; it takes a STEM"),
    (["bench", "frames", "--model", "qwen3-tts-0.6b-random", "--backends", "native", "--acceptance", "/tmp"],
     "--acceptance /tmp is a folder"),
    (["synth", "--model", "embedded", "--text", "Hi.", "--out", "{tmp}/x.wav", "--batch-size", "4"],
     "--batch-size is for --text-file"),
    (["synth", "--model", "embedded", "--text", "Hi.", "--out", "{tmp}/x.wav", "--decoder", "chain:4",
      "--frame", "fused"], "the official module has no fused frame (use eager, compile or native)"),
    (["synth", "--model", "embedded", "--text", "Hi.", "--out", "{tmp}/x.wav", "--decoder", "paper",
      "--frame", "fused", "--backend", "native"], "a fused frame runs AR or a chain, not Tree; or use --frame stepped"),
])
def test_native_backend_bad_input_is_one_line_before_loading(tmp_path, capsys, monkeypatch, argv, needle, no_load):
    if "cuda" in argv:  # a machine with a GPU: the backend's device is what is wrong (without one, --device is)
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _exit_status([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert needle in _one_error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_acceptance_is_refused_for_a_trained_model(capsys):
    """A timing replay swaps in another model's acceptance: on trained weights that would hide the real one."""
    argv = ["bench", "frames", "--model", "embedded", "--backends", "native", "--decoders", "chain:4", "--repeats", "1",
            "--acceptance", str(REPO / "data/embedded/model/trees/heads.json")]
    assert main(argv) == 2
    assert "has trained weights, whose own acceptance is measured: drop --acceptance" in \
        _one_error_line(capsys.readouterr().err)
