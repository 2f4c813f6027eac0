"""The offline RVQ codec: shapes, dtypes, determinism, files, and errors that name the fix."""

import json

import numpy as np
import pytest
import torch

from paper.notebook_measures import log_spectral_distance, unstack
from recipes.embedded.codec_fit import fit_codec, kmeans
from rvqspec_lib.models.audio import FRAME_SAMPLES, SAMPLE_RATE, n_frames
from rvqspec_lib.models.rvq_codec import CodecConfig, RVQCodec
from rvqspec_lib.models.speech_tokenizers import Qwen12HzCodec, load_codec

TINY = dict(n_codebooks=4, codebook_size=16, n_iter=4)


def synthetic_speechlike(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A gliding harmonic tone with syllable-rate amplitude modulation and a little noise: spectra that change."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = 120 + 60 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    wav = sum(np.sin(h * phase) / h for h in range(1, 12))
    wav *= 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    wav += 0.01 * rng.standard_normal(t.size)
    return (0.3 * wav / np.abs(wav).max()).astype(np.float32)


@pytest.fixture(scope="module")
def wav():
    return synthetic_speechlike()


@pytest.fixture(scope="module")
def codec(wav):
    return fit_codec([wav], seed=0, **TINY)


def test_roundtrip_shapes_and_dtypes(codec, wav):
    codes = codec.encode(wav)
    assert codes.dtype == np.int64
    assert codes.shape == (n_frames(wav.size), 4) == (-(-wav.size // 1920), 4)
    assert codes.min() >= 0 and codes.max() < 16
    out = codec.decode(codes)
    assert out.dtype == np.float32 and out.ndim == 1
    assert out.shape == (codes.shape[0] * FRAME_SAMPLES,)
    assert np.all(np.isfinite(out)) and np.abs(out).max() > 1e-3
    assert codec.decode(codec.encode(wav))[: wav.size].shape == wav.shape
    assert (codec.sample_rate, codec.frame_samples, codec.frame_rate_hz) == (24000, 1920, 12.5)


@pytest.mark.parametrize("frames", [1, 2, 7])
def test_decode_gives_1920_samples_per_frame(codec, frames):
    codes = np.arange(frames * 4).reshape(frames, 4) % 16
    for k in (1, 4):
        assert codec.decode(codes, n_codebooks=k).shape == (frames * 1920,)


def test_same_seed_same_codebooks_same_codes(codec, wav):
    again = fit_codec([wav], seed=0, **TINY)
    assert torch.equal(again.codebooks, codec.codebooks)
    np.testing.assert_array_equal(again.encode(wav), codec.encode(wav))
    np.testing.assert_array_equal(again.decode(again.encode(wav)), codec.decode(codec.encode(wav)))  # decode too
    other = fit_codec([wav], seed=1, **TINY)
    assert not torch.equal(other.codebooks, codec.codebooks)


def test_each_stage_reduces_training_error(wav):
    c = fit_codec([wav], seed=0, max_vectors=10**6, **TINY)
    x = c.features(wav)
    codes = c.quantize(x)
    errs = [float(((c.dequantize(codes, k) - x) ** 2).mean()) for k in range(1, 5)]
    assert all(b <= a + 1e-6 for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.5 * float(((x - x.mean(0)) ** 2).mean())


def test_kmeans_finds_separated_blobs():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([c + 0.1 * torch.randn(50, 2, generator=g) for c in centres])
    found = kmeans(x, 3, 5, torch.Generator().manual_seed(0))
    d = torch.cdist(centres, found).min(1).values
    assert float(d.max()) < 0.2


def test_save_load_roundtrip(codec, wav, tmp_path):
    p = codec.save(tmp_path / "tiny.safetensors")
    assert p.is_file() and p.with_suffix(".json").is_file()
    assert json.loads(p.with_suffix(".json").read_text())["codebook_size"] == 16
    back = RVQCodec.load(p)
    assert back.config == codec.config
    np.testing.assert_array_equal(back.encode(wav), codec.encode(wav))
    codec.save(tmp_path / "dir")  # a folder -> <folder>/codec.safetensors
    assert isinstance(load_codec(tmp_path / "dir"), RVQCodec)


def test_bad_audio_raises_with_the_fix(codec, wav):
    with pytest.raises(ValueError, match="empty"):
        codec.encode(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="resample"):
        codec.encode(wav, sample_rate=16000)
    with pytest.raises(ValueError, match="mono"):
        codec.encode(np.stack([wav, wav], 1))
    with pytest.raises(ValueError, match="float"):
        codec.encode((wav * 32767).astype(np.int16))
    with pytest.raises(ValueError, match="NaN"):
        codec.encode(np.full(2000, np.nan, np.float32))


def test_bad_codes_raise_with_the_fix(codec):
    ok = np.zeros((3, 4), np.int64)
    with pytest.raises(ValueError, match=r"shape \(frames, 4\)"):
        codec.decode(ok[:, :3])
    with pytest.raises(ValueError, match=r"shape \(frames, 4\)"):
        codec.decode(ok.reshape(-1))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        codec.decode(ok + 16)
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        codec.decode(ok - 1)
    with pytest.raises(ValueError, match="integers"):
        codec.decode(ok.astype(np.float32))
    with pytest.raises(ValueError, match="n_codebooks"):
        codec.decode(ok, n_codebooks=5)


def test_missing_files_and_too_little_audio(tmp_path, wav):
    with pytest.raises(FileNotFoundError, match="fit_codec"):
        RVQCodec.load(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="fit_codec"):
        load_codec(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="smaller codebook_size"):
        fit_codec([wav[:19200]], n_codebooks=2, codebook_size=64)
    with pytest.raises(ValueError, match="no audio"):
        fit_codec([], **TINY)
    with pytest.raises(ValueError, match="multiple of hop"):
        CodecConfig(hop_samples=500)


def test_qwen_codec_missing_path_names_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="huggingface-cli download Qwen/Qwen3-TTS-Tokenizer-12Hz"):
        Qwen12HzCodec(tmp_path / "no-tokenizer-here")
    with pytest.raises(FileNotFoundError, match="RVQCodec"):
        load_codec("./speech_tokenizer")


def test_qwen_codec_wraps_a_tiny_random_official_tokenizer(tmp_path, wav):
    """The wrapper's plumbing on the OFFICIAL 12 Hz tokenizer class, built from the shipped released config shrunk
    to 0.9M random parameters (no weights exist offline): shapes, dtypes and errors, not audio quality."""
    from rvqspec_lib.models.configs import CONFIG_DIR
    from rvqspec_lib.models.shim import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    cfg = json.loads((CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "speech_tokenizer" / "config.json").read_text())
    small = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=32, codebook_dim=32, vector_quantization_hidden_dimension=32)
    cfg["decoder_config"].update(small, latent_dim=64, decoder_dim=64)
    cfg["encoder_config"].update(small, num_filters=4, upsample_groups=64)
    torch.manual_seed(0)
    Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**cfg)).save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({  # the released tokenizer's, verbatim
        "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
        "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
        "sampling_rate": 24000}))
    q = load_codec(tmp_path)
    assert isinstance(q, Qwen12HzCodec)
    assert (q.sample_rate, q.frame_samples, q.n_codebooks, q.codebook_size) == (24000, 1920, 16, 2048)
    codes = q.encode(wav[:24000])
    assert codes.dtype == np.int64 and codes.shape == (13, 16)  # ceil(24000 / 1920)
    out = q.decode(codes)
    assert out.dtype == np.float32 and out.shape == (13 * 1920,)
    with pytest.raises(ValueError, match="all 16 codebooks"):
        q.decode(codes, n_codebooks=4)
    with pytest.raises(ValueError, match="resample"):
        q.encode(wav, sample_rate=16000)
    with pytest.raises(ValueError, match=r"\[0, 2048\)"):
        q.decode(codes + 2048)


def test_unstack_and_log_spectral_distance(codec, wav):
    x = codec.features(wav)
    mel = unstack(codec, x)
    assert mel.dtype == np.float32 and mel.shape == (80, x.shape[0] * 4)
    np.testing.assert_array_equal(mel[:, :4].T.reshape(-1), x[0])  # frame 0 = mel frames 0..3, stacked
    assert log_spectral_distance(codec, x, x) == 0.0
    # a uniform gain of g dB in power moves every band by g dB: the distance is exactly g
    g = 3.0
    assert log_spectral_distance(codec, x + g * np.log(10) / 10, x) == pytest.approx(g, rel=1e-5)
    assert log_spectral_distance(codec, x[:0], x[:0]) == 0.0
    with pytest.raises(ValueError, match="different shapes"):
        log_spectral_distance(codec, x, x[:-1])
    with pytest.raises(ValueError, match=r"\(frames, 320\)"):
        unstack(codec, x[:, :10])


def test_sweep_codebooks_conditions_and_errors(wav):
    from paper.codec_quality import sweep_codebooks

    c = fit_codec([wav], seed=0, max_vectors=10**6, **TINY)
    sweep = sweep_codebooks(c, [wav], (1, 2, 4), table_codec=c.with_decoder(None))
    labels = ["original", "unquantised", "k=1", "k=2", "k=4", "table k=1", "table k=2", "table k=4"]
    assert [r["label"] for r in sweep["conditions"]] == labels
    assert [r["k"] for r in sweep["conditions"]] == [None, None, 1, 2, 4, 1, 2, 4]
    rows = {lab: {key: sweep[key][lab][0] for key in ("audio", "feature_lsd_db", "audio_lsd_db")} for lab in labels}
    for r in rows.values():
        assert r["audio"].dtype == np.float32 and r["audio"].shape == wav.shape
        assert r["feature_lsd_db"] >= 0 and r["audio_lsd_db"] >= 0
    first = rows["original"]
    assert first["audio_lsd_db"] == first["feature_lsd_db"] == rows["unquantised"]["feature_lsd_db"] == 0.0
    assert rows["unquantised"]["audio_lsd_db"] > 0  # Griffin-Lim is not exact
    # on its own training audio, more stages quantise better; k = all decodes exactly as decode(encode(wav))
    assert rows["k=4"]["feature_lsd_db"] < rows["k=1"]["feature_lsd_db"]
    np.testing.assert_array_equal(rows["k=4"]["audio"], c.decode(c.encode(wav))[: wav.size])
    with pytest.raises(ValueError, match="n_codebooks"):
        sweep_codebooks(c, [wav], (5,))
    with pytest.raises(ValueError, match="float audio"):
        sweep_codebooks(c, [(wav * 32767).astype(np.int16)], (1,))
