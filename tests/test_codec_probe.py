"""recipes.embedded.codec_probe: issue 35's stage-1 gates, checked on fake codecs whose answers are known exactly
(an invariant codec, a hashing codec as the negative control, codes that are a function of their context)."""

import hashlib
import json

import numpy as np
import pytest

from recipes.embedded import codec_probe as cp

G = 16


class ConstantCodec:
    """Codes that depend only on the length: every perturbation leaves them unchanged."""

    def encode(self, wav):
        return np.zeros((-(-len(wav) // 1920), G), np.int64)


class HashCodec:
    """Codes that hash each frame's samples: any change of the samples changes them (the negative control)."""

    def encode(self, wav):
        frames = -(-len(wav) // 1920)
        out = np.zeros((frames, G), np.int64)
        for i in range(frames):
            h = hashlib.sha256(np.asarray(wav[i * 1920:(i + 1) * 1920], np.float32).tobytes()).digest()
            out[i] = np.frombuffer(h[:2 * G], np.uint16) % 2048
        return out


class EchoCodec:
    """decode(encode(wav)) is wav."""

    def encode(self, wav):
        return wav

    def decode(self, codes):
        return codes


def _wavs(n=3, seconds=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(24000 * seconds))).astype(np.float32) for _ in range(n)]


def test_perturbations_keep_length_and_have_their_levels():
    w = _wavs(1)[0]
    rng = np.random.default_rng(0)
    ys = {name: f(w, rng) for name, f in cp.PERTURBATIONS.items()}
    assert all(y.shape == w.shape and y.dtype == np.float32 for y in ys.values())
    assert 20 * np.log10(np.sum(ys["gain +0.1 dB"] ** 2) / np.sum(w ** 2)) / 2 == pytest.approx(0.1, abs=1e-4)
    assert np.array_equal(ys["delay 1 sample"][1:], w[:-1]) and ys["delay 1 sample"][0] == 0
    noise_db = 10 * np.log10(np.mean((ys["noise -70 dB"] - w).astype(np.float64) ** 2) / np.mean(w ** 2))
    assert noise_db == pytest.approx(-70, abs=0.5)  # 24,000 Gaussian samples: the power is within 2% (~0.1 dB)


def test_robustness_invariant_codec_scores_one_and_hashing_codec_scores_about_zero():
    wavs = _wavs()
    inv = cp.robustness(ConstantCodec(), wavs)
    assert set(inv) == set(cp.PERTURBATIONS)
    for r in inv.values():
        assert r["unchanged"] == [1.0] * G and r["all_unchanged"] == 1.0 and r["frames"] == 3 * 13
    neg = cp.robustness(HashCodec(), wavs)
    for r in neg.values():  # every frame's samples change: codes agree only by a collision (1 in 2048)
        assert max(r["unchanged"]) <= 1 / 39 and r["all_unchanged"] == 0.0
    assert cp.gates({"robustness": inv}) == {"robustness": True}
    assert cp.gates({"robustness": neg}) == {"robustness": False}


def test_robustness_masks_and_given_codes():
    wavs, codec = _wavs(2), HashCodec()
    masks = [np.arange(13) < 5, np.zeros(13, bool)]
    r = cp.robustness(codec, wavs, masks=masks, codes=[codec.encode(w) for w in wavs])
    assert all(x["frames"] == 5 and x["every_frame"]["frames"] == 26 for x in r.values())
    with pytest.raises(ValueError, match="masks select nothing"):
        cp.robustness(codec, wavs, masks=[np.zeros(13, bool)] * 2)
    with pytest.raises(ValueError, match="one bool per code frame"):
        cp.robustness(codec, wavs, masks=[np.ones(12, bool)] * 2)
    with pytest.raises(ValueError, match="1 masks for 2"):
        cp.robustness(codec, wavs, masks=[np.ones(13, bool)])


def test_parse_psdur_and_frame_phones():
    ph = cp.parse_psdur("pau:0.100 th:0.292 ih:0.300 ng:0.460 pau:0.500 \n")
    assert ph == [("pau", 0.1), ("th", 0.292), ("ih", 0.3), ("ng", 0.46), ("pau", 0.5)]
    # frame centres 0.04, 0.12, 0.20, 0.28, 0.36, 0.44, 0.52, 0.60, 0.68
    names, pos = cp.frame_phones(ph, 9)
    assert names == ["pau", "th", "th", "th", "ng", "ng", "pau", "pau", "pau"]
    assert pos.tolist() == [0, 0, 1, 2, 0, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="phone:seconds"):
        cp.parse_psdur("pau:0.1 hello")


def test_counting_predictor_distribution_sums_to_one_and_backs_off():
    p = cp.CountingPredictor(8).fit([(1, "a"), (1, "a"), (1, "b"), (2, "a")], [3, 3, 5, 7])
    for h in [(1, "a"), (1, "z"), (9, "z"), ()]:
        assert p.distribution(h).sum() == pytest.approx(1.0)
    assert np.array_equal(p.distribution((9, "z")), p.distribution(()))  # unseen: the shorter context's
    assert int(np.argmax(p.distribution((1, "a")))) == 3 and int(np.argmax(p.distribution((2, "q")))) == 7
    assert np.allclose(cp.CountingPredictor(8).fit([], []).distribution(()), 1 / 8)


def _synthetic(n_utts=60, frames=30, seed=0, deterministic=True):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 64, size=(4, 3, G))  # code k of (code 0, phone)
    codes, phones, positions = [], [], []
    for _ in range(n_utts):
        c0 = rng.integers(0, 4, frames)
        ph = rng.integers(0, 3, frames)
        c = table[c0, ph] if deterministic else rng.integers(0, 64, (frames, G))
        c[:, 0] = c0
        names = ["pau" if i == 0 else f"p{x}" for i, x in enumerate(ph)]  # one silence frame, not scored
        codes.append(c), phones.append(names), positions.append(rng.integers(0, 3, frames))
    return codes, phones, positions


def test_predictability_codes_that_are_a_function_of_context_are_predicted_exactly():
    codes, phones, positions = _synthetic()
    r = cp.predictability(codes, phones, positions, vocab=64)
    assert r["fit_utterances"] == 48 and r["scored_utterances"] == 12
    assert [x["depth"] for x in r["deep"]] == list(range(1, G))
    for x, none in zip(r["deep"], r["deep_none"]):
        assert x["n"] == 12 * 29 and x["accuracy"] == 1.0 and x["top1"] > 0.9 and x["p_true"] > 0.9
        assert none["accuracy"] < 0.5  # the negative control: without context the codes are mixed
    assert cp.gates({"predictability": r}) == {"predictability": True}


def test_predictability_counts_extra_fit_utterances_and_never_scores_them():
    """Few held-out utterances of a context-determined code: more counted utterances (the codec's training
    sentences) leave the scored frames the same and raise the probability of the true code; noise codes counted
    besides (the negative control) do not make them predictable."""
    all_codes, all_phones, all_positions = _synthetic(n_utts=65)  # one table of codes: 5 held out, 60 counted besides
    codes, phones, positions = all_codes[:5], all_phones[:5], all_positions[:5]
    alone = cp.predictability(codes, phones, positions, vocab=64)
    more = cp.predictability(codes, phones, positions, vocab=64,
                             fit_extra=(all_codes[5:], all_phones[5:], all_positions[5:]))
    assert more["fit_extra_utterances"] == 60 and more["fit_utterances"] == alone["fit_utterances"] + 60
    for a, m in zip(alone["deep"], more["deep"]):
        assert a["n"] == m["n"] and m["p_true"] >= a["p_true"] and m["accuracy"] == 1.0
    noise, nph, npos = _synthetic(n_utts=20, deterministic=False)
    r = cp.predictability(noise, nph, npos, vocab=64, fit_extra=_synthetic(n_utts=60, seed=1, deterministic=False))
    assert all(x["accuracy"] < 0.08 for x in r["deep"])
    with pytest.raises(ValueError, match="fit_extra"):
        cp.predictability(codes, phones, positions, vocab=64, fit_extra=(codes, phones[:-1], positions))


def test_entropy_bits_of_constant_uniform_and_empty_codes():
    assert cp.entropy_bits([3] * 10) == 0.0 and cp.entropy_bits([0, 1, 2, 3] * 5) == pytest.approx(2.0)
    assert np.isnan(cp.entropy_bits([]))


def test_predictability_of_noise_codes_is_low_and_calibrated():
    codes, phones, positions = _synthetic(deterministic=False)
    r = cp.predictability(codes, phones, positions, vocab=64)
    for x in r["deep"]:  # chance is 1/64; the top-1 probability keeps the bias of the largest of ~40 counts
        assert x["accuracy"] < 0.08 and x["top1"] < 0.15 and x["p_true"] < 0.025
    assert cp.gates({"predictability": r}) == {"predictability": False}
    with pytest.raises(ValueError, match="one of each per utterance"):
        cp.predictability(codes, phones[:-1], positions, vocab=64)


def test_intelligibility_of_a_lossless_codec_has_no_gap():
    wavs = _wavs(2)
    refs = ["one two three", "four five"]

    class LookupASR:
        name = "lookup"

        def transcribe(self, wav, sample_rate):
            return refs[0] if np.array_equal(wav, wavs[0]) else refs[1] if np.array_equal(wav, wavs[1]) else ""

    r = cp.intelligibility(EchoCodec(), wavs, refs, LookupASR())
    assert (r["wer_original"], r["wer_codec"], r["gap"], r["ref_words"], r["n"]) == (0.0, 0.0, 0.0, 5, 2)
    assert r["gap_ci_low"] == r["gap_ci_high"] == 0.0
    assert cp.gates({"intelligibility": r}) == {"intelligibility": True}
    with pytest.raises(ValueError, match="one reference text"):
        cp.intelligibility(EchoCodec(), wavs, refs[:1], LookupASR())
    by = cp.intelligibility(EchoCodec(), wavs, refs, LookupASR(), groups=["slt", "awb"])["by_group"]
    assert by == {"awb": {"wer_original": 0.0, "wer_codec": 0.0, "gap": 0.0, "ref_words": 2, "n": 1},
                  "slt": {"wer_original": 0.0, "wer_codec": 0.0, "gap": 0.0, "ref_words": 3, "n": 1}}

    class DeafToSecond(LookupASR):  # mishears the second utterance: its group alone carries the errors
        def transcribe(self, wav, sample_rate):
            return refs[0] if np.array_equal(wav, wavs[0]) else "nothing"

    by = cp.intelligibility(EchoCodec(), wavs, refs, DeafToSecond(), groups=["slt", "awb"])["by_group"]
    assert by["slt"]["wer_original"] == 0.0 and by["awb"]["wer_original"] == 1.0
    with pytest.raises(ValueError, match="one label per utterance"):
        cp.intelligibility(EchoCodec(), wavs, refs, LookupASR(), groups=["slt"])


def test_render_with_phones_matches_the_audio():
    wav, phones = cp.render_with_phones("Hello world, this is a test.", "slt")
    assert wav.dtype == np.float32 and phones[0][0] == phones[-1][0] == "pau"
    assert abs(phones[-1][1] - len(wav) / 24000) < 0.02
    assert [e for _, e in phones] == sorted(e for _, e in phones)
    with pytest.raises(ValueError, match="prints no phone timing"):
        cp.render_with_phones("Hallo.", "espeak-de")


def test_flat_pitch_keeps_the_phones_and_changes_the_voice():
    """--flat-pitch: the same phones at the same times and the same length; different samples (the negative control
    is the same call twice, which gives the same samples)."""
    text = "Hello world, this is a test."
    wav, phones = cp.render_with_phones(text, "slt")
    flat, flat_phones = cp.render_with_phones(text, "slt", flat_pitch=True)
    assert flat_phones == phones and flat.shape == wav.shape and not np.array_equal(flat, wav)
    assert np.array_equal(cp.render_with_phones(text, "slt", flat_pitch=True)[0], flat)


def test_main_on_the_shipped_codec(tmp_path, capsys):
    out = tmp_path / "probe.json"
    r = cp.main(["--sentences", "4", "--asr", "none", "--json", str(out)])
    text = capsys.readouterr().out
    assert "robustness" in text and "predictability" in text and "machine:" in text
    assert set(r["gates"]) == {"robustness", "predictability"}
    assert json.loads(out.read_text())["gates"] == r["gates"]
    two = cp.main(["--sentences", "4", "--asr", "none", "--voice", "slt,awb"])
    assert "voice slt,awb" in two["n"] and set(two["gates"]) == {"robustness", "predictability"}


def test_tuned_discount_is_small_for_deterministic_codes_and_large_for_noise():
    rng = np.random.default_rng(1)
    ctx = [(int(x),) for x in rng.integers(0, 5, 500)]
    det = cp.CountingPredictor.tuned(ctx, [h[0] * 3 for h in ctx], 64)
    noise = cp.CountingPredictor.tuned(ctx, rng.integers(0, 64, 500).tolist(), 64)
    assert det.fixed_discount == min(cp.DISCOUNTS) and noise.fixed_discount >= 0.9
    with pytest.raises(ValueError, match="discount in"):
        cp.CountingPredictor(8, discount=1.0)
