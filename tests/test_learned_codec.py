"""The learned stand-in codec (recipes.embedded.learned_codec): its interface, its files, the entropy-constrained
choice against nearest-neighbour quantisation, invariance to a gain change, and a short resumable training run."""

import numpy as np
import pytest
import torch

from recipes.embedded import learned_codec as LC
from rvqspec_lib.models.rvq_codec import CodecConfig, RVQCodec

TINY = LC.LearnedCodecConfig(codebook_size=16, latent_dim=8, hidden=32)


def _tone(seconds=1.0, f0=150.0, seed=0):
    t = np.arange(int(24000 * seconds)) / 24000
    rng = np.random.default_rng(seed)
    gate = np.sin(2 * np.pi * 3 * t) > 0
    return (0.3 * np.sin(2 * np.pi * f0 * t) * gate + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _data(folder, n=8):
    frames = CodecConfig()
    d = {"texts": [], "feats": [], "delayed": [], "phones": [], "positions": [], "rms": []}
    for i in range(n):
        w = _tone(2.0, 120 + 15 * i, i)
        x = RVQCodec.features_for(LC.unit_loudness(w), frames)
        y = RVQCodec.features_for(LC.unit_loudness(LC._delayed(w, 1)), frames)
        d["texts"].append(str(i)), d["phones"].append(["a"] * x.shape[0]), d["rms"].append(float(np.std(w)))
        d["feats"].append(torch.from_numpy(x).half())
        d["delayed"].append(torch.from_numpy(y).half())
        d["positions"].append(torch.zeros(x.shape[0], dtype=torch.long))
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(d, folder / "data.pt")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = _data(tmp_path_factory.mktemp("lc"))
    path = LC.train(work, TINY, max_steps=20, batch=4, window=8, progress=False)
    return work, path


def test_interface_shapes_and_file_round_trip(trained):
    work, path = trained
    assert LC.is_learned_codec(path) and not LC.is_learned_codec(work / "data.pt")
    codec = LC.LearnedCodec.load(path)
    wav = _tone(1.0)
    codes = codec.encode(wav)
    assert codes.shape == (-(-wav.shape[0] // 1920), 16) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < TINY.codebook_size
    audio = codec.decode(codes)
    assert audio.shape == (codes.shape[0] * 1920,) and audio.dtype == np.float32 and np.isfinite(audio).all()
    again = LC.LearnedCodec.load(path)  # the same weights give the same codes and the same frames
    assert np.array_equal(again.encode(wav), codes)
    assert np.array_equal(again.decode_vectors(codes), codec.decode_vectors(codes))
    with pytest.raises(ValueError, match="empty audio"):
        codec.encode(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match=r"codes must be \(frames, 16\)"):
        codec.decode(codes[:, :3])
    with pytest.raises(ValueError, match=r"n_codebooks must be in \[1, 16\]"):
        codec.decode(codes, n_codebooks=0)
    assert codec.decode(codes, n_codebooks=1).shape == audio.shape  # code 0 alone: coarser audio, same length


def test_a_gain_change_leaves_the_codes_unchanged(trained):
    """The encoder hears the utterance at unit loudness: a gain change gives the same codes; a different sound (the
    negative control) does not."""
    codec = LC.LearnedCodec.load(trained[1])
    wav = _tone(1.0)
    codes = codec.encode(wav)
    assert np.array_equal(codec.encode(wav * 10 ** (0.1 / 20)), codes)
    assert not np.array_equal(codec.encode(_tone(1.0, 310.0, 5)), codes)


def test_entropy_constrained_choice():
    """rate_weight 0 is the nearest entry; a large rate weight picks the most used entry whatever the residual."""
    q = LC.ResidualQuantizer(LC.LearnedCodecConfig(codebook_size=4, latent_dim=2, n_codebooks=1, rate_weight=0.0))
    q.codebooks[0] = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    q.usage[0] = torch.tensor([100.0, 1.0, 1.0, 1.0])
    r = torch.tensor([[0.9, 0.1], [0.1, 0.8], [-0.6, 0.0]])
    assert q.choose(r, 0).tolist() == [1, 2, 3]
    q.cfg = LC.LearnedCodecConfig(codebook_size=4, latent_dim=2, n_codebooks=1, rate_weight=10.0)
    assert q.choose(r, 0).tolist() == [0, 0, 0]
    bits = q.code_lengths(0)
    assert bits.argmin() == 0 and torch.isclose(torch.exp2(-bits).sum(), torch.tensor(1.0))


def test_training_resumes_where_it_stopped(tmp_path):
    """Two runs of 10 steps from a checkpoint equal one run of 20 (the same batches, the same weights)."""
    a, b = _data(tmp_path / "a", 4), _data(tmp_path / "b", 4)
    LC.train(a, TINY, max_steps=20, batch=4, window=8, progress=False)
    LC.train(b, TINY, max_steps=10, batch=4, window=8, progress=False)
    LC.train(b, TINY, max_steps=20, batch=4, window=8, progress=False)
    sa, sb = LC.LearnedCodec.load(a / "codec.safetensors"), LC.LearnedCodec.load(b / "codec.safetensors")
    for (k, va), vb in zip(sa.state_dict().items(), sb.state_dict().values()):
        assert torch.allclose(va, vb, atol=1e-5), k
    with pytest.raises(ValueError, match="another config"):
        LC.train(b, LC.LearnedCodecConfig(codebook_size=8, latent_dim=8, hidden=32), max_steps=21, batch=4,
                 window=8, progress=False)


def test_a_codec_without_transform_quantises_the_features_themselves(tmp_path):
    """transform "none": no weights to learn (the codebooks only), the decoder is the identity, so decoding all 16
    stages returns the features up to the quantiser's error; a latent size other than the feature size is refused."""
    cfg = LC.LearnedCodecConfig(codebook_size=16, latent_dim=320, transform="none")
    path = LC.train(_data(tmp_path, 4), cfg, max_steps=5, batch=4, window=8, progress=False)
    codec = LC.LearnedCodec.load(path)
    assert not list(codec.parameters())
    wav = _tone(1.0)
    x = torch.from_numpy(codec.features(wav))
    z = (x - codec.mean) / codec.std
    codes = codec.codes_of_features(x)
    back = (torch.from_numpy(codec.decode_vectors(codes.numpy())) - codec.mean) / codec.std
    assert torch.allclose(back, codec.quantizer.decode(codes), atol=1e-4)  # identity decoder
    assert float((back - z).pow(2).mean()) < float(z.pow(2).mean())  # the quantiser explains part of the frames
    with pytest.raises(ValueError, match="pass latent_dim=320"):
        LC.LearnedCodec(LC.LearnedCodecConfig(latent_dim=32, transform="none"))
    with pytest.raises(ValueError, match="transform must be"):
        LC.LearnedCodecConfig(transform="mlp")


def test_deep_stages_choose_from_their_first_entries(tmp_path):
    """deep_codebook_size: stage 0 chooses from every entry, the later stages only from their first ones (in
    training, restarts included, and at encoding); the vocabulary stays codebook_size; 1 or more than codebook_size
    is refused."""
    cfg = LC.LearnedCodecConfig(codebook_size=16, latent_dim=320, transform="none", deep_codebook_size=4)
    path = LC.train(_data(tmp_path, 4), cfg, max_steps=5, batch=4, window=8, progress=False)
    codec = LC.LearnedCodec.load(path)
    codes = np.concatenate([codec.encode(_tone(1.0, f0, f0)) for f0 in (110, 150, 190, 230)])
    assert codes[:, 0].max() >= 4 and codes[:, 1:].max() < 4
    assert codec.codebook_size == 16 and float(codec.quantizer.codebooks[1:, 4:].abs().max()) == 0.0
    for bad in (1, 17):
        with pytest.raises(ValueError, match="deep_codebook_size must be"):
            LC.LearnedCodecConfig(codebook_size=16, deep_codebook_size=bad)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="learned_codec train"):
        LC.LearnedCodec.load(tmp_path / "none.safetensors")
    with pytest.raises(ValueError, match="need rate_weight"):
        LC.LearnedCodecConfig(rate_weight=-1)


def test_prepare_data_speaks_each_sentence_once(tmp_path):
    """The data stage: one feature array per sentence at unit loudness, its delayed twin of the same length, one
    phone and position per frame; a second call finds the finished file and speaks nothing."""
    texts = ["Hello world, this is a test.", "A second and shorter one."]
    path = LC.prepare_data(texts, tmp_path, progress=False)
    d = torch.load(path)
    assert d["texts"] == texts and len(d["rms"]) == 2 and d["flat_pitch"] is False and not (tmp_path / "data.partial.pt").exists()
    for f, g, ph, pos in zip(d["feats"], d["delayed"], d["phones"], d["positions"]):
        assert f.shape == g.shape and f.shape[1] == 320 and len(ph) == len(pos) == f.shape[0]
        assert "pau" in ph and any(p != "pau" for p in ph)
    stamp = path.stat().st_mtime_ns
    assert LC.prepare_data(texts, tmp_path, progress=False) == path and path.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="flat_pitch=False"):  # finished with intonation: not silently reused
        LC.prepare_data(texts, tmp_path, progress=False, flat_pitch=True)
    with pytest.raises(ValueError, match="voices slt"):  # finished with one voice: not reused for others
        LC.prepare_data(texts, tmp_path, "slt,awb", progress=False)


def test_prepare_data_with_several_voices(tmp_path):
    """Several voices: each sentence spoken by the one the embedded corpus would give it (voices.voice_of), recorded
    per utterance and as the file's voice set; no voice is refused before anything is spoken."""
    from rvqspec_lib.data.voices import voice_of

    texts = ["Hello world, this is a test.", "A second and shorter one.", "The third sentence is here."]
    d = torch.load(LC.prepare_data(texts, tmp_path, "slt,awb", progress=False))
    assert d["voice_set"] == ["slt", "awb"] == LC.voice_set(d)
    assert d["voices"] == [voice_of(t, ["slt", "awb"]) for t in texts]
    with pytest.raises(ValueError, match="no voice given"):
        LC.prepare_data(texts, tmp_path / "none", ",", progress=False)


def test_beam_search_encoding():
    """encode_beam: beam 1 is the greedy choice exactly; a wider beam lowers the total cost (squared error plus rate
    terms) of random frames under random codebooks (seeded: deterministic), never raises it on average, and keeps the
    deep stages within their entries; the config and the probe refuse a beam under 1."""
    cfg = LC.LearnedCodecConfig(codebook_size=32, latent_dim=6, n_codebooks=5, deep_codebook_size=8, rate_weight=0.02)
    q = LC.ResidualQuantizer(cfg)
    g = torch.Generator().manual_seed(0)
    q.codebooks.copy_(torch.randn(q.codebooks.shape, generator=g) * torch.tensor([1.0, .5, .3, .2, .1])[:, None, None])
    q.usage.copy_(torch.rand(q.usage.shape, generator=g) * 10)
    z = torch.randn(500, 6, generator=g)

    def cost(codes):
        rate = sum(cfg.rate_weight * q.code_lengths(s)[codes[:, s]] for s in range(cfg.n_codebooks))
        return (z - q.decode(codes)).pow(2).sum(1) + rate

    greedy = q.encode(z)
    assert torch.equal(q.encode(z, beam=1), greedy)
    wide = q.encode(z, beam=8)
    assert wide.shape == (500, 5) and int(wide[:, 1:].max()) < 8
    assert float(cost(wide).mean()) < 0.95 * float(cost(greedy).mean())
    with pytest.raises(ValueError, match="encode_beam must be >= 1"):
        LC.LearnedCodecConfig(encode_beam=0)
    with pytest.raises(ValueError, match="beam must be >= 1"):
        q.encode(z, beam=0)
    codec = LC.LearnedCodec(LC.LearnedCodecConfig(codebook_size=16, latent_dim=8, hidden=32)).with_encode_beam(4)
    assert codec.config.encode_beam == codec.quantizer.cfg.encode_beam == 4
