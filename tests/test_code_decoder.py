"""The neural code decoder (rvqspec_lib.code_decoder) and the codec's decoder switch; batched inner-loop codes."""

import numpy as np
import pytest
import torch

from recipes.embedded.code_decoder_training import (
    DecoderPairs,
    decoder_loss,
    train_code_decoder,
)
from rvqspec_lib.models.code_decoder import CodeDecoder, CodeDecoderConfig
from rvqspec_lib.models.rvq_codec import CodecConfig, RVQCodec, decoder_file

SMALL = CodeDecoderConfig(hidden=32, n_blocks=2, kernel=3, dilations=(1, 2))


def _codec(seed=0, g=4, v=8):
    cfg = CodecConfig(n_codebooks=g, codebook_size=v, n_mels=8, griffin_lim_iters=2)
    books = torch.randn(g, v, cfg.dim, generator=torch.Generator().manual_seed(seed))
    books[1:] *= 0.5
    return RVQCodec(cfg, books)


def _pairs(codec, n, seed, frames=12):
    """Features = code 0's centroid only (the deep codes carry nothing); 'generated' deep codes are random: a decoder
    should learn to ignore them, the table decoder adds their centroids as noise."""
    g = torch.Generator().manual_seed(seed)
    k, v = codec.config.n_codebooks, codec.config.codebook_size
    true, gen, feats = [], [], []
    for _ in range(n):
        t = torch.randint(0, v, (frames, k), generator=g)
        r = t.clone()
        r[:, 1:] = torch.randint(0, v, (frames, k - 1), generator=g)
        true.append(t)
        gen.append(r)
        feats.append(codec.codebooks[0][t[:, 0]].clone())
    return DecoderPairs([f"u{i}" for i in range(n)], true, gen, feats)


def test_untrained_decoder_is_the_table_decoder_exactly():
    codec = _codec()
    dec = CodeDecoder(codec.codebooks, SMALL)
    codes = torch.randint(0, 8, (9, 4), generator=torch.Generator().manual_seed(1)).numpy()
    for k in (None, 1, 2, 4):
        assert np.array_equal(dec.vectors(codes, k), codec.dequantize(codes, k))
    neural = codec.with_decoder(dec)
    assert neural.decoder_kind == "neural" and codec.decoder_kind == "table"
    assert np.array_equal(neural.decode_vectors(codes), codec.decode_vectors(codes))
    assert neural.decode_vectors(codes[:0]).shape == (0, codec.config.dim)
    with pytest.raises(ValueError, match="n_codebooks must be in"):
        neural.decode_vectors(codes, 5)
    with pytest.raises(ValueError, match="code ids must lie"):
        neural.decode_vectors(codes + 8)


def test_training_learns_to_ignore_uninformative_codes_and_the_control_does_not():
    # 40 steps on a problem with a clear answer: the validation L1 of generated codes must fall well below the table
    # decoder's. Negative control: zero learning rate leaves the decoder equal to the table decoder.
    torch.manual_seed(0)
    codec = _codec()
    tr, va = _pairs(codec, 48, 0), _pairs(codec, 16, 1)
    dec, log = train_code_decoder(codec.codebooks, tr, va, config=SMALL, steps=60, minutes=None, batch=16,
                                  chunk=8, lr=1e-2, eval_every=20, progress=False)
    first, best = log["curve"][0], min(log["curve"], key=lambda r: r["val_true_l1"] + r["val_generated_l1"])
    assert first["val_true_l1"] == pytest.approx(first["val_table_l1"], rel=1e-6)  # step 0: the table decoder
    assert decoder_loss(dec, va, source="generated") < 0.6 * first["val_generated_l1"]
    assert log["meta"]["steps"] == 60 and log["meta"]["best_step"] == log["curve"].index(best) * 20
    control, _ = train_code_decoder(codec.codebooks, tr, va, config=SMALL, steps=20, minutes=None, batch=16,
                                    chunk=8, lr=0.0, eval_every=10, progress=False)
    assert decoder_loss(control, va, source="generated") == pytest.approx(first["val_generated_l1"], rel=1e-5)


def test_save_load_and_codec_attaches_the_decoder_beside_it(tmp_path):
    codec = _codec()
    dec, _ = train_code_decoder(codec.codebooks, _pairs(codec, 8, 0), _pairs(codec, 4, 1), config=SMALL, steps=3,
                                minutes=None, batch=4, chunk=8, eval_every=10, progress=False)
    p = codec.save(tmp_path / "codec.safetensors")
    assert RVQCodec.load(p).decoder_kind == "table"  # nothing beside it yet
    dec.save(decoder_file(p), meta={"steps": 3})
    assert decoder_file(p).name == "codec.decoder.safetensors"
    auto, table = RVQCodec.load(p), RVQCodec.load(p, decoder="table")
    assert auto.decoder_kind == "neural" and table.decoder_kind == "table"
    codes = torch.randint(0, 8, (6, 4), generator=torch.Generator().manual_seed(2)).numpy()
    assert np.allclose(auto.decode_vectors(codes), dec.vectors(codes), atol=1e-6)
    assert auto.code_decoder.meta == {"steps": 3}
    assert RVQCodec.load(p, decoder="neural").decoder_kind == "neural"
    assert RVQCodec.load(p, decoder=None).decoder_kind == "table"
    with pytest.raises(FileNotFoundError, match="no code decoder"):
        RVQCodec.load(p, decoder=tmp_path / "missing.safetensors")
    for word in ("Table", "nerual", 3):
        with pytest.raises(ValueError, match="decoder must be 'auto', 'neural', 'table'"):
            RVQCodec.load(p, decoder=word)
    (tmp_path / "junk.safetensors").write_text("not a safetensors file")
    with pytest.raises(ValueError, match="not a code-decoder file"):
        RVQCodec.load(p, decoder=tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="trained for codebooks"):
        CodeDecoder.load(decoder_file(p), torch.zeros(3, 8, codec.config.dim))
    with pytest.raises(ValueError, match="not a code-decoder file"):
        CodeDecoder.load(p, codec.codebooks)
    with pytest.raises(FileNotFoundError, match="make embedded"):
        CodeDecoder.load(tmp_path / "nope.safetensors", codec.codebooks)
    decoder_file(p).unlink()
    with pytest.raises(FileNotFoundError, match="no code decoder"):
        RVQCodec.load(p, decoder="neural")
    assert RVQCodec.load(p).decoder_kind == "table"


def test_pairs_round_trip(tmp_path):
    pairs = _pairs(_codec(), 3, 0)
    back = DecoderPairs.load(pairs.save(tmp_path / "p.safetensors"))
    assert back.ids == pairs.ids
    for a, b in zip(pairs.true + pairs.generated + pairs.features, back.true + back.generated + back.features):
        assert torch.equal(a, b)


def test_batched_inner_loop_matches_per_utterance_by_argmax():
    # greedy codes depend only on the contexts, which agree to float rounding: batched == one at a time, exactly
    from recipes.embedded.codes import inner_loop_codes, inner_loop_codes_batch
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.data.teacher import Utterance
    from rvqspec_lib.decoding.sampling import Sampling

    lm = load_model("tiny-random")
    g = torch.Generator().manual_seed(0)
    utts = [Utterance(t, torch.randint(0, lm.codebook_size, (n, lm.n_code_groups), generator=g), None, "auto")
            for t, n in (("Hello there.", 5), ("A longer sentence than that.", 9), ("Short.", 3))]
    greedy = Sampling(greedy=True)
    batched = inner_loop_codes_batch(lm, utts, batch_size=2, sampling=greedy)
    for u, b in zip(utts, batched):
        assert torch.equal(b, inner_loop_codes(lm, u, sampling=greedy))
        assert torch.equal(b[:, 0], u.codes[:, 0])
    sampled = inner_loop_codes_batch(lm, utts, generator=torch.Generator().manual_seed(3))
    again = inner_loop_codes_batch(lm, utts, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(sampled, again))
    with pytest.raises(ValueError, match="no utterances"):
        inner_loop_codes_batch(lm, [])


def test_training_is_seeded_and_leaves_the_global_rng_alone():
    codec = _codec()
    tr, va = _pairs(codec, 8, 0), _pairs(codec, 4, 1)
    state = torch.get_rng_state()
    runs = [train_code_decoder(codec.codebooks, tr, va, config=SMALL, steps=3, minutes=None, batch=4, chunk=8,
                               eval_every=2, seed=s, progress=False)[0].state_dict() for s in (0, 0, 1)]
    assert torch.equal(torch.get_rng_state(), state)  # the seeded initialisation ran inside fork_rng
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not all(torch.equal(runs[0][k], runs[2][k]) for k in runs[0])  # control: the seed matters
