"""ASR and WER: normalisation, hand-computed error rates, outliers, the bigram LM, and PocketSphinx on flite."""

import re
from collections import defaultdict

import numpy as np
import pytest

from rvqspec_lib.data.voices import render_one
from rvqspec_lib.eval.asr import (
    PocketSphinxASR,
    TransformersASR,
    bigram_arpa,
    cer,
    find_repetition,
    normalize_text,
    wer,
)
from rvqspec_lib.models.audio import load_wav


@pytest.mark.parametrize("raw, norm", [
    ("Hello, World!", "hello world"),
    ("Don't stop -- it's \u2018fine\u2019.", "don't stop it's fine"),
    ("well-known  spaces\tand/slashes", "well known spaces and slashes"),
    ("\u00bfPuede decirme c\u00f3mo llegar?", "puede decirme c\u00f3mo llegar"),
    ("\u8bf7\u95ee\u53bb\u706b\u8f66\u7ad9\u600e\u4e48\u8d70\uff1f", "\u8bf7\u95ee\u53bb\u706b\u8f66\u7ad9\u600e\u4e48\u8d70"),
])
def test_normalize_text(raw, norm):
    assert normalize_text(raw) == norm


def test_identical_strings_have_zero_wer():
    refs = ["The cat sat on the mat.", "Hello world!"]
    r = wer(refs, ["the cat sat on the mat", "HELLO, WORLD"])
    assert r.rate == 0 and r.errors == 0 and r.ref_units == 8 and r.outliers == []
    assert cer(refs, refs).rate == 0


def test_wer_matches_hand_computation():
    # utt 1: "sat" -> "sit" (1 substitution), "the" deleted (1 deletion): 2 errors / 6 words
    # utt 2: one insertion ("big"): 1 error / 3 words. Corpus: 3 / 9 (not the mean of 1/3 and 1/3 by accident)
    # utt 3: empty hypothesis: 4 deletions / 4 words. Corpus: 7 / 13
    r = wer(["the cat sat on the mat", "a red dog", "one two three four"],
            ["the cat sit on mat", "a big red dog", ""])
    u = r.utterances
    assert (u[0]["substitutions"], u[0]["deletions"], u[0]["insertions"]) == (1, 1, 0)
    assert u[0]["rate"] == pytest.approx(2 / 6) and u[1]["rate"] == pytest.approx(1 / 3) and u[2]["rate"] == 1
    assert (r.errors, r.ref_units) == (7, 13) and r.rate == pytest.approx(7 / 13)
    assert r.summary()["wer"] == pytest.approx(7 / 13)


def test_cer_matches_hand_computation():
    # "kitten" -> "sitting": k->s, e->i, +g = 3 edits over 6 characters (spaces ignored)
    assert cer(["kit ten"], ["sitting"]).rate == pytest.approx(3 / 6)
    # Mandarin: one character dropped of six
    assert cer(["\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002"], ["\u4eca\u5929\u5929\u5f88\u597d"]).rate == \
        pytest.approx(1 / 6)


def test_repetitions_are_flagged_apart():
    r = wer(["the cat sat on the mat", "a b c", "go go go now"], ["the cat sat on the mat", "the the the the the",
                                                                  "go go go now"])
    assert r.outliers == [1]  # the third repeats, but so does its reference
    assert "repetition" in r.utterances[1]["why"]
    assert r.rate == pytest.approx(5 / 13) and r.rate_without_outliers == 0
    long = wer(["short one"], ["short one and then a great many more words"])
    assert long.outliers == [0] and "hypothesis 9 words" in long.utterances[0]["why"]
    assert find_repetition("a b a b a b".split()) == ("a b", 3)
    assert find_repetition("a b c".split()) is None
    with pytest.raises(ValueError, match="2 references but 1"):
        wer(["a", "b"], ["a"])


def _parse_arpa(text):
    uni, bi = {}, {}
    section = None
    for line in text.splitlines():
        if line.startswith("\\"):
            section = line
            continue
        parts = line.split("\t")
        if section == "\\1-grams:" and len(parts) >= 2:
            uni[parts[1]] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
        elif section == "\\2-grams:" and len(parts) == 2:
            bi[tuple(parts[1].split())] = float(parts[0])
    return uni, bi


def test_bigram_arpa_is_a_distribution():
    text = bigram_arpa(["The cat sat.", "The dog sat down.", "A cat ran!"])
    assert re.search(r"ngram 1=9\nngram 2=12", text)
    uni, bi = _parse_arpa(text)
    seen = defaultdict(dict)
    for (h, w), lp in bi.items():
        seen[h][w] = 10 ** lp
    for h in uni:
        if h == "</s>":
            continue
        total = sum(10 ** uni[w][0] * 10 ** uni[h][1] if w not in seen[h] else seen[h][w]
                    for w in uni if w != "<s>")
        assert total == pytest.approx(1.0, abs=1e-4), h
    assert "zebra" not in bigram_arpa(["The zebra ran."], vocabulary={"the", "ran"})


@pytest.fixture(scope="module")
def flite_wav(tmp_path_factory):
    p = tmp_path_factory.mktemp("asr") / "a.wav"
    render_one("The quick brown fox jumps over the lazy dog.", "slt", p)
    return load_wav(p)


@pytest.fixture(scope="module")
def sphinx():
    return PocketSphinxASR()


def test_pocketsphinx_transcribes_flite(sphinx, flite_wav):
    # measured: 0/9 word errors with the default LM (at 24 kHz input, resampled inside)
    hyp = sphinx.transcribe(flite_wav, 24000)
    assert wer(["The quick brown fox jumps over the lazy dog."], [hyp]).rate < 0.5, hyp
    assert sphinx.transcribe(np.zeros(0, np.float32), 24000) == ""
    assert sphinx.name == "pocketsphinx"


def test_pocketsphinx_prompt_bigram(flite_wav, tmp_path):
    asr = PocketSphinxASR.from_texts(["The quick brown fox jumps over the lazy dog.", "Hello world, this is a test."],
                                     workdir=tmp_path)
    assert asr.name == "pocketsphinx+prompt-informed-bigram" and (tmp_path / "prompt-bigram.arpa").is_file()
    assert wer(["The quick brown fox jumps over the lazy dog."], [asr.transcribe(flite_wav, 24000)]).rate == 0


def test_missing_models_raise_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="whisper-tiny.en"):
        TransformersASR(str(tmp_path / "whisper-not-here"))
    with pytest.raises(FileNotFoundError, match="no language model"):
        PocketSphinxASR(lm=tmp_path / "none.arpa")
