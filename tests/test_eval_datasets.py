"""The paper's data sets through ``datasets`` (rvqspec_lib.eval.datasets), each on a dataset of the SAME schema written
locally with ``save_to_disk`` (nothing can be downloaded here), the per-language front end, and the recognisers by
name with tiny random Whisper and Parakeet models of the real classes saved to disk (rvqspec_lib.eval.asr_models).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rvqspec_lib.eval import datasets as D

datasets = pytest.importorskip("datasets")
sf = pytest.importorskip("soundfile")


def _wav(tmp_path, name, secs, sr=16000, seed=0):
    p = tmp_path / f"{name}.wav"
    sf.write(p, (0.1 * np.random.default_rng(seed).standard_normal(int(sr * secs))).astype(np.float32), sr)
    return str(p)


def _save(rows: dict, path, split="test"):
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(sampling_rate=16000))
    datasets.DatasetDict({split: ds}).save_to_disk(str(path))
    return ds


def _fleurs_rows(tmp_path, lang, texts):
    """Fleurs' columns (google/fleurs): id, num_samples, path, audio, transcription, raw_transcription, gender,
    lang_id, language, lang_group_id."""
    rows = {k: [] for k in ("id", "num_samples", "path", "audio", "transcription", "raw_transcription", "gender",
                            "lang_id", "language", "lang_group_id")}
    for i, t in enumerate(texts):
        p = _wav(tmp_path, f"{lang}{i}", 0.25 + 0.25 * i, seed=i)
        for k, v in dict(id=i, num_samples=0, path=p, audio=p, transcription=t.lower().rstrip("."),
                         raw_transcription=t, gender=0, lang_id=3, language=D.LANGUAGES[lang].name.capitalize(),
                         lang_group_id=0).items():
            rows[k].append(v)
    return rows


def test_fleurs_per_language_config_folders(tmp_path):
    root = tmp_path / "fleurs"
    _save(_fleurs_rows(tmp_path, "de", ["Guten Tag.", "Wie geht es?"]), root / "de_de")
    _save(_fleurs_rows(tmp_path, "ja", ["こんにちは。"]), root / "ja_jp")
    de = D.load_speech_dataset(root, "fleurs", language="de")
    items = D.speech_items(de, "fleurs")
    assert [it["text"] for it in items] == ["Guten Tag.", "Wie geht es?"]  # raw_transcription first
    assert items[0]["sample_rate"] == 16000 and items[1]["seconds"] == pytest.approx(0.5)
    assert len(D.speech_items(D.load_speech_dataset(root, "fleurs", language="ja"), "fleurs")) == 1
    with pytest.raises(ValueError, match="no split 'train'"):
        D.load_speech_dataset(root, "fleurs", language="de", split="train")


def test_fleurs_root_filtered_by_language_column(tmp_path):
    rows = _fleurs_rows(tmp_path, "de", ["Guten Tag."])
    es = _fleurs_rows(tmp_path, "es", ["Hola.", "Buenos días."])
    for k in rows:
        rows[k] += es[k]
    _save(rows, tmp_path / "mixed")
    ds = D.load_speech_dataset(tmp_path / "mixed", "fleurs", language="es")
    assert [it["text"] for it in D.speech_items(ds, "fleurs")] == ["Hola.", "Buenos días."]
    with pytest.raises(ValueError, match="no row of language 'ru'"):
        D.load_speech_dataset(tmp_path / "mixed", "fleurs", language="ru")


def test_librispeech_and_voxpopuli_schemas(tmp_path):
    """LibriSpeech (openslr/librispeech_asr: file, audio, text, speaker_id, chapter_id, id) and VoxPopuli
    (facebook/voxpopuli: audio_id, language, audio, raw_text, normalized_text, gender, speaker_id,
    is_gold_transcript, accent; an empty raw_text falls back to normalized_text)."""
    p = _wav(tmp_path, "ls", 0.5)
    _save({"file": [p], "audio": [p], "text": ["HELLO WORLD"], "speaker_id": [1], "chapter_id": [2],
           "id": ["1-2-0"]}, tmp_path / "ls", split="validation")
    ls = D.speech_items(D.load_speech_dataset(tmp_path / "ls", "librispeech"), "librispeech")
    assert ls[0]["id"] == "1-2-0" and ls[0]["text"] == "HELLO WORLD"
    rows = {k: [] for k in ("audio_id", "language", "audio", "raw_text", "normalized_text", "gender", "speaker_id",
                            "is_gold_transcript", "accent")}
    for i, (raw, norm) in enumerate([("Hello there.", "hello there"), ("", "second one"), ("", "")]):
        q = _wav(tmp_path, f"vp{i}", 0.3, seed=i)
        for k, v in dict(audio_id=f"v{i}", language=0, audio=q, raw_text=raw, normalized_text=norm, gender="f",
                         speaker_id="s", is_gold_transcript=True, accent="None").items():
            rows[k].append(v)
    _save(rows, tmp_path / "vox", split="train")
    vp = D.speech_items(D.load_speech_dataset(tmp_path / "vox", "voxpopuli", split="train"), "voxpopuli")
    assert [(it["id"], it["text"]) for it in vp] == [("v0", "Hello there."), ("v1", "second one")]


def test_bad_datasets_get_one_line_errors(tmp_path, monkeypatch):
    p = _wav(tmp_path, "x", 0.2)
    _save({"audio": [p], "words": ["hi"]}, tmp_path / "bad")
    for kind, call in (("fleurs", lambda: D.load_speech_dataset(tmp_path / "bad", "fleurs")),
                       ("nofolder", lambda: D.load_speech_dataset(tmp_path / "nope", "fleurs")),
                       ("kind", lambda: D.load_speech_dataset(tmp_path / "bad", "commonvoice")),
                       ("lang", lambda: D.load_speech_dataset(tmp_path / "bad", "fleurs", language="xx"))):
        with pytest.raises(ValueError) as e:
            call()
        assert "\n" not in str(e.value), kind
    with pytest.raises(ValueError, match="no 'raw_transcription' column"):
        D.load_speech_dataset(tmp_path / "bad", "fleurs")
    (tmp_path / "notds").mkdir()
    with pytest.raises(ValueError, match="save_to_disk"):
        D.load_speech_dataset(tmp_path / "notds", "fleurs")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="network or the Hugging Face cache"):
        D.load_speech_dataset("google/fleurs-not-here", "fleurs", language="de")


def test_encode_items_resamples_and_counts_frames():
    class StubCodec:
        sample_rate = 24000
        seen: list = []

        def encode(self, wav):
            self.seen.append(len(wav))
            return np.zeros((int(np.ceil(len(wav) / 1920)), 16), dtype=np.int64)

    items = [{"id": "a", "text": "hi", "wav": np.zeros(16000, np.float32), "sample_rate": 16000},
             {"id": "b", "text": "empty", "wav": np.zeros(0, np.float32), "sample_rate": 16000}]
    utts, meta = D.encode_items(items, StubCodec(), n_code_groups=16, language="german")
    assert StubCodec.seen == [24000, 0] and len(utts) == 1 and utts[0].language == "german"
    assert meta == [{"id": "a", "seconds": 1.0, "frames": 13}]
    with pytest.raises(ValueError, match="own codec"):
        D.encode_items(items[:1], StubCodec(), n_code_groups=8)


def test_speaking_swaps_the_phoneme_voice_and_restores_it():
    pytest.importorskip("shutil").which("espeak-ng") or pytest.skip("espeak-ng missing")
    from rvqspec_lib.models.frontend import PhonemeTokenizer
    from rvqspec_lib.models.loader import load_model

    lm = load_model("tiny-random")
    byte_tok = lm.tokenizer
    with D.speaking(lm, "de") as prompt:  # a byte model keeps its tokenizer; tiny-random lists no German
        assert lm.tokenizer is byte_tok and prompt in ("auto", "german")
    en = PhonemeTokenizer(byte_tok.im_start, byte_tok.im_end, byte_tok.assistant, voice="en-us")
    lm.tokenizer = en
    with D.speaking(lm, "de"):
        assert lm.tokenizer.voice == "de" and lm.tokenizer.phonemize("Guten Tag.") != en.phonemize("Guten Tag.")
    assert lm.tokenizer is en
    with pytest.raises(RuntimeError):
        with D.speaking(lm, "zh"):
            assert lm.tokenizer.voice == "cmn"
            raise RuntimeError("boom")
    assert lm.tokenizer is en
    with D.speaking(lm, "en"):
        assert lm.tokenizer is en


# ----------------------------------------------------------------------------------------------------------------
# Whisper and Parakeet by name, on tiny random models of the real classes
# ----------------------------------------------------------------------------------------------------------------
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|es|>", "<|ru|>", "<|ja|>", "<|zh|>",
            "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
            "<|notimestamps|>"]


def write_tiny_whisper(d) -> None:
    """A WhisperForConditionalGeneration with 1 + 1 layers of width 16, a byte-level vocabulary and Whisper's special
    tokens, and a generation config that knows the languages (what ``openai/whisper-large-v3-turbo`` ships)."""
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(bytes_to_unicode().values())}))
    (d / "merges.txt").write_text("#version: 0.2\n")
    tok = WhisperTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), unk_token=SPECIALS[0], bos_token=SPECIALS[0],
                           eos_token=SPECIALS[0], pad_token=SPECIALS[0])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg = WhisperConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        num_mel_bins=80, max_target_positions=64, decoder_start_token_id=ids["<|startoftranscript|>"],
                        eos_token_id=ids[SPECIALS[0]], pad_token_id=ids[SPECIALS[0]], bos_token_id=ids[SPECIALS[0]])
    torch.manual_seed(0)
    m = WhisperForConditionalGeneration(cfg)
    gc = m.generation_config
    gc.lang_to_id = {t: ids[t] for t in SPECIALS[2:8]}
    gc.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    gc.no_timestamps_token_id, gc.is_multilingual, gc.max_length = ids["<|notimestamps|>"], True, 12
    gc.forced_decoder_ids, gc.suppress_tokens, gc.begin_suppress_tokens = None, [], []
    gc._from_model_config = False
    m.save_pretrained(d)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tok).save_pretrained(d)


def write_tiny_parakeet(d, *, say: str = "a") -> None:
    """A ParakeetForCTC (one conformer layer of width 16) over a character vocabulary, its CTC head biased so that
    every frame emits ``say`` (so the transcript is exactly ``say``: CTC collapses repeats)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        ParakeetCTCConfig,
        ParakeetEncoderConfig,
        ParakeetFeatureExtractor,
        ParakeetForCTC,
        ParakeetProcessor,
        ParakeetTokenizerFast,
    )

    d.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<unk>": 1, "▁": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz'")}}
    t = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix=""))
    t.pre_tokenizer, t.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    fe = ParakeetFeatureExtractor()
    enc = ParakeetEncoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                num_mel_bins=fe.feature_size, subsampling_conv_channels=8)
    torch.manual_seed(0)
    m = ParakeetForCTC(ParakeetCTCConfig(vocab_size=len(vocab), encoder_config=enc.to_dict(), pad_token_id=0))
    head = [mod for mod in m.modules() if isinstance(mod, torch.nn.Conv1d) or isinstance(mod, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.bias.zero_()
        head.bias[vocab[say]] = 100.0
    m.save_pretrained(d)
    ParakeetProcessor(feature_extractor=fe,
                      tokenizer=ParakeetTokenizerFast(tokenizer_object=t, pad_token="<pad>", unk_token="<unk>")
                      ).save_pretrained(d)


def test_whisper_by_name_forces_the_language(tmp_path):
    from rvqspec_lib.eval.asr_models import recogniser, whisper_asr

    write_tiny_whisper(tmp_path / "whisper")
    asr = whisper_asr(str(tmp_path / "whisper"), language="de")
    assert asr.language == "german" and asr.name.startswith("whisper:")
    seen = {}
    model = asr._pipe.model
    real = model.generate

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)

    model.generate = spy
    wav = (0.1 * np.random.default_rng(0).standard_normal(24000)).astype(np.float32)
    text = asr.transcribe(wav, 24000)
    assert isinstance(text, str) and text == asr.transcribe(wav, 24000)  # deterministic (greedy)
    assert seen.get("language") == "german"
    assert recogniser(f"whisper:{tmp_path / 'whisper'}", "ja").language == "japanese"


def test_parakeet_by_name_decodes_ctc(tmp_path):
    from rvqspec_lib.eval.asr_models import parakeet_asr, recogniser

    write_tiny_parakeet(tmp_path / "parakeet", say="a")
    asr = parakeet_asr(str(tmp_path / "parakeet"))
    wav = (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    assert asr.transcribe(wav, 16000) == "a"  # the biased head, collapsed by CTC decoding
    assert asr.transcribe(np.zeros(0, np.float32), 16000) == ""
    assert recogniser(f"parakeet:{tmp_path / 'parakeet'}", "de") is None  # English only
    with pytest.raises(ValueError, match="English only"):
        parakeet_asr(str(tmp_path / "parakeet"), language="de")


def test_recogniser_names():
    from rvqspec_lib.eval.asr import PocketSphinxASR
    from rvqspec_lib.eval.asr_models import recogniser

    assert recogniser("none", "en") is None and recogniser("auto", "de") is None
    assert isinstance(recogniser("pocketsphinx", "en"), PocketSphinxASR)
    assert "prompt-informed" in recogniser("pocketsphinx-prompt", "en", ["hello world"]).name
    assert recogniser("pocketsphinx-prompt", "de", ["hallo"]) is None
    with pytest.raises(ValueError, match="unknown recogniser"):
        recogniser("kaldi", "en")
    with pytest.raises(FileNotFoundError):
        recogniser("whisper:/no/such/folder", "en")
