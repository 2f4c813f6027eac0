"""WER parity's pipeline (rvqspec_lib.eval.wer_parity) and its lossy control (rvqspec_lib.decoding.decoders.LossySSD).

* the lossy control is labelled lossy everywhere, and the SAME G-test that proves Chain and Tree lossless
  (tests/test_lossless.py) rejects it, while beta -> 0 gives back the chain draw for draw;
* the code-distribution tests on a model whose drafts are far from p: lossless decoders pass, the lossy control is
  caught (the test can fail), AR against itself under other seeds passes;
* decoder names, paired seeds, verifier ranks (exact on argmax codes), the WER pairing, and the whole per-language
  evaluation on tiny-random with a stub codec and recogniser (every decoder's audio goes through the recogniser; the
  tables carry the lossy label).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rvqspec_lib.eval import parity as S
from paper import wer_report as R
from rvqspec_lib.eval import wer_parity as W
from rvqspec_lib.decoding import decoder_names as N
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.models.named_decoders import resolve, resolve_all
from rvqspec_lib.data.teacher import Utterance
from rvqspec_lib.decoding import verify
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree, is_lossless
from rvqspec_lib.decoding.sampling import Sampling


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


# ----------------------------------------------------------------------------------------------------------------
# the lossy control
# ----------------------------------------------------------------------------------------------------------------
def test_lossy_control_is_labelled_lossy():
    d = LossySSD()
    name = N.name_of(d)  # a bare decoder's label and fields (a result row's)
    assert "Lossy" in repr(d) and name.label == "ssd-lossy:0.4" and name.fields()["lossy"] is True
    assert N.parse_decoder_name(name.label).decoder() == d  # the label reads back as the same lossy control
    assert not any(N.name_of(x).fields()["lossy"] for x in (AR(), Chain(4), Tree([(0,)]), Tree([(0,)], True)))
    assert d.window == 4 and d.beta == 0.4 and d.lossy_tolerance == 0.4
    assert not is_lossless(d) and all(is_lossless(x) for x in (AR(), Chain(4), Tree([(0,)]), Tree([(0,)], True)))
    for bad in (0, -0.1, 1.5, True, "0.4"):
        with pytest.raises(ValueError, match="beta"):
            LossySSD(beta=bad)
    with pytest.raises(ValueError, match="window"):
        LossySSD(window=9)


def test_lossy_control_is_rejected_by_the_losslessness_g_test():
    """The G-test of tests/test_lossless.py (exact joint pmf, 512 outcomes, power >= 0.9 at TV 0.03) on the model
    whose drafts are far from p: Chain(4) passes it (test_lossless.py), LossySSD (its chain with beta 0.4) fails."""
    import test_lossless as L

    pval, df, g, n, res = L.run_case("sharp", LossySSD(), L.DEFAULT)
    assert pval < L.ALPHA, f"the lossy control passed the losslessness test (G={g:.1f}, df={df}, p={pval:.2e})"
    assert float(res.tokens_per_call.mean()) > 1.0


def test_tolerance_zero_is_the_lossless_walk_and_point_mass_drafts_ignore_it():
    g = torch.Generator().manual_seed(0)
    b, v = 64, 6
    p = torch.softmax(torch.randn(b, 3, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, 3, v, generator=g), -1)
    codes = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, 3)
    children = torch.tensor([[1], [2], [-1]])
    valid = torch.ones(b, 3, dtype=torch.bool)
    has = torch.tensor([True, True, False]).expand(b, 3)
    runs = {}
    for name, kw in (("plain", {}), ("zero", {"tolerance": 0.0}), ("lossy", {"tolerance": 0.4})):
        runs[name] = verify.walk_tree(p, codes, children, valid, has, torch.Generator().manual_seed(1), q, **kw)
    assert torch.equal(runs["plain"].path, runs["zero"].path) and torch.equal(runs["plain"].next_code,
                                                                             runs["zero"].next_code)
    assert int(runs["lossy"].n_accepted.sum()) > int(runs["plain"].n_accepted.sum())  # it accepts more
    pm = [verify.walk_tree(p, codes, children, valid, has, torch.Generator().manual_seed(1), None, **kw)
          for kw in ({}, {"tolerance": 0.4})]
    assert torch.equal(pm[0].path, pm[1].path) and torch.equal(pm[0].next_code, pm[1].next_code)


def test_lossy_decoder_drafts_like_the_chain(tiny):
    """Same seed: the lossy control draws the chain's drafts and accepts at least as many of them (u < r + beta)."""
    ctx = torch.randn(32, 2, 64, generator=torch.Generator().manual_seed(0))
    cp = tiny.code_predictor
    a = decode_frame(cp, ctx, decoder=Chain(4), generator=torch.Generator().manual_seed(3))
    b = decode_frame(cp, ctx, decoder=LossySSD(), generator=torch.Generator().manual_seed(3))
    assert float(b.tokens_per_call.mean()) >= float(a.tokens_per_call.mean())
    assert torch.equal(a.codes[:, 0], b.codes[:, 0])  # code 1 comes from the prefill, before any draft


# ----------------------------------------------------------------------------------------------------------------
# names
# ----------------------------------------------------------------------------------------------------------------
def test_decoder_names():
    assert N.split_decoder_list("ar, chain:4,tree:0;1;0,0,tree-sampled:0;0,0,ssd-lossy:0.2") == \
        ["ar", "chain:4", "tree:0;1;0,0", "tree-sampled:0;0,0", "ssd-lossy:0.2"]
    cal = {"best_kind": {"4": "sampled"}, "budgets": [4], "point-mass": {"order": [[0], [1], [2]]},
           "sampled": {"order": [[0], [0, 0], [1]]}}
    got = resolve_all(["chain:3", "tree:0;1;0,0", "tree-sampled:0;0,0", "ssd-lossy:0.2", "tree:calibrated:4",
                       "tree:calibrated-point-mass:4", "chain:best"], None, calibrations={"heads": cal}, best_chain=6)
    assert {label: nd.decoder for label, nd in got.items()} == {
        "chain:3": Chain(3), "tree:0;1;0,0": Tree([(0,), (1,), (0, 0)]),
        "tree-sampled:0;0,0": Tree([(0,), (0, 0)], sampled=True), "ssd-lossy:0.2": LossySSD(beta=0.2),
        "tree:calibrated-sampled:4": Tree([(0,), (0, 0), (1,)], sampled=True),  # the better kind at N 4
        "tree:calibrated-point-mass:4": Tree([(0,), (1,), (2,)]), "chain:6": Chain(6)}  # chain:best's window
    for label, nd in got.items():  # a label is the canonical name: it reads back as the same decoder
        assert nd.label == label and N.parse_decoder_name(label).decoder(calibration=cal) == nd.decoder
        if nd.name.kind != "calibrated":
            assert N.name_of(nd.decoder).label == label  # and a bare decoder is named the same
    assert N.check_decoder_names(["ar", "tree:calibrated", "chain:best"]) == {"calibration", "best_chain"}
    assert N.calibration_budgets(["tree:calibrated", "tree:calibrated-sampled:8", "ar"]) == [8, 16]
    for bad, match in (("beam", "unknown decoder"), ("chain:9", "window"), ("tree:calibrated:99", "outside"),
                       ("ssd-lossy:2", "beta"), ("tree:0;;1", "empty path")):
        with pytest.raises(ValueError, match=match) as e:
            N.check_decoder_names([bad])
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="calibration"):
        resolve("tree:calibrated:16", None)
    with pytest.raises(ValueError, match="chain:N"):
        resolve("chain:best", None)
    with pytest.raises(ValueError, match="no decoder"):
        N.split_decoder_list(" ")


def test_standard_decoders_are_named_and_keyed_by_their_labels():
    """WER parity's decoder set comes from the one grammar (the grammar itself: tests/test_decoder_names.py): labels
    are the canonical names, the null control is AR under its own label, the lossy control is last."""
    cal = {"best_kind": {"4": "sampled"}, "budgets": [4], "n_frames": 10,
           "point-mass": {"order": [[0], [1], [2]], "predicted_tokens_per_call": {"4": 1.2}},
           "sampled": {"order": [[0], [0, 0], [1]], "predicted_tokens_per_call": {"4": 1.9}}}
    decs = R.standard_decoders(calibration=cal, best_chain=6, budget=4, beta=0.2)
    assert list(decs) == ["ar", W.NULL_CONTROL, "chain:6", "tree:calibrated-point-mass:4",
                          "tree:calibrated-sampled:4", "ssd-lossy:0.2"]
    assert decs["chain:6"].decoder == Chain(6) and decs["ssd-lossy:0.2"].decoder == LossySSD(beta=0.2)
    assert decs["tree:calibrated-sampled:4"].decoder == Tree([(0,), (0, 0), (1,)], sampled=True)
    info = W.decoder_info(decs)
    assert info[W.NULL_CONTROL] == {"repr": repr(AR()), "lossless": True, "decoder": W.NULL_CONTROL, "kind": "ar",
                                    "drafter": None, "nodes": 1, "lossy": False, "sampled": False,
                                    "null_control": True}
    assert [k for k, f in info.items() if f["lossy"]] == ["ssd-lossy:0.2"] and not info["ssd-lossy:0.2"]["lossless"]
    assert info["tree:calibrated-point-mass:4"]["kind"] == "calibrated" and info["chain:6"]["nodes"] == 6
    # a bare decoder object gets the fields of its name; the key it runs under is its decoder field
    assert W.decoder_fields("mine", Chain(3)) == {"decoder": "mine", "kind": "chain", "drafter": "heads", "nodes": 3,
                                                 "lossy": False, "sampled": True, "null_control": False}
    rows = R.calibration_rows(decs, chain_predicted={2: 1.5, 6: 2.5}, best_chain=6)
    assert [(r["decoder"], r["chosen"]) for r in rows[:2]] == [("chain:2", False), ("chain:6", True)]
    assert {r["decoder"]: r["predicted_tokens_per_call"] for r in rows[2:]} == {
        "tree:calibrated-point-mass:4": 1.2, "tree:calibrated-sampled:4": 1.9}
    assert rows[3]["paths"] == "0;0,0;1" and rows[3]["calibration_frames"] == 10
    assert list(R.standard_decoders(calibration=None, best_chain=None)) == ["ar", W.NULL_CONTROL, "chain:4",
                                                                          "ssd-lossy:0.4"]
    assert list(R.standard_decoders(calibration=cal, best_chain=6, budget=4, tree_kinds=("sampled",))) == [
        "ar", W.NULL_CONTROL, "chain:6", "tree:calibrated-sampled:4", "ssd-lossy:0.4"]
    with pytest.raises(ValueError, match="offsets"):
        R.standard_decoders(calibration=cal, best_chain=6, budget=4, paper_budget=32)


# ----------------------------------------------------------------------------------------------------------------
# decoding runs, ranks, the code-distribution tests
# ----------------------------------------------------------------------------------------------------------------
def test_decode_runs_are_paired_and_replicated(tiny):
    fr = Frames(torch.randn(10, 2, 64, generator=torch.Generator().manual_seed(0)),
                torch.zeros(10, 15, dtype=torch.long), torch.arange(10) // 5)
    runs = W.decode_runs(tiny.code_predictor, fr, {"ar": AR(), "same": AR(), "other": AR()}, seed=5, replicates=2,
                         seeds={"other": 6}, batch_size=4)
    assert runs["ar"].codes.shape == (2, 10, 15) and runs["ar"].calls.shape == (2, 10)
    assert torch.equal(runs["ar"].codes, runs["same"].codes)  # paired: same seeds, same draws
    assert not torch.equal(runs["ar"].codes, runs["other"].codes)  # the null control draws anew
    assert not torch.equal(runs["ar"].codes[0], runs["ar"].codes[1])  # replicates are independent draws
    assert (runs["ar"].calls == 15).all()
    c = W.per_utterance(runs["ar"], fr.utterance)  # tokens per call as evaluate_language computes it
    tpc = S.bootstrap_mean(c["codes"], c["calls"])
    assert tpc["value"] == tpc["ci_low"] == tpc["ci_high"] == 1.0 and tpc["n"] == 2


def test_verifier_ranks_of_argmax_codes_are_zero(tiny):
    cp = tiny.code_predictor
    ctx = torch.randn(6, 2, 64, generator=torch.Generator().manual_seed(1))
    greedy = decode_frame(cp, ctx, decoder=AR(), sampling=Sampling(greedy=True)).codes
    assert (W.verifier_ranks(cp, ctx, greedy) == 0).all()
    sampled = decode_frame(cp, ctx, decoder=AR(), generator=torch.Generator().manual_seed(0)).codes
    r = W.verifier_ranks(cp, ctx, sampled, batch_size=4)
    assert r.shape == (6, 15) and (r >= 0).all() and (r < 50).all() and (r > 0).any()  # top-k 50


def test_code_tests_catch_the_lossy_control_and_pass_lossless_decoders():
    """The model of tests/test_lossless.py whose drafts are far from p ("sharp": one-step acceptance ~0.45), 20,000
    frames of one context: Chain, a sampled tree and AR under other seeds are not flagged (family-wise level 1e-3
    each: false-failure rate 3e-3 for a random seed, the seeds are fixed); the lossy control is."""
    import test_lossless as L

    cp, context = L.variant("sharp")
    n = 20_000
    fr = Frames(context.expand(n, 2, context.shape[-1]).clone(), torch.zeros(n, 3, dtype=torch.long),
                torch.arange(n) // 100)
    decs = {"ar": AR(), W.NULL_CONTROL: AR(), "chain4": Chain(4), "tree": Tree([(0,), (1,), (0, 0)], sampled=True),
            "lossy": LossySSD()}
    runs = W.decode_runs(cp, fr, decs, seed=0, seeds={W.NULL_CONTROL: 1}, batch_size=n)
    res = W.code_distribution_tests(cp, fr.context, runs, batch_size=n)
    s = res["summary"]
    assert not s[W.NULL_CONTROL]["rejected"] and not s["chain4"]["rejected"] and not s["tree"]["rejected"]
    assert s["lossy"]["rejected"] and not s["lossy"]["lossless"]
    assert len(res["rows"]) == 4 * 2 * 3 and {r["statistic"] for r in res["rows"]} == {"rank", "code"}
    assert all(r["p_holm"] >= r["p_value"] for r in res["rows"])
    assert s["chain4"]["power_rank"] > 0.9  # at TV 0.05 with 20,000 samples a side
    # depth 1 comes from the prefill for every decoder: never flagged, lossy or not
    assert all(r["p_holm"] > 1e-3 for r in res["rows"] if r["depth"] == 1)
    with pytest.raises(ValueError, match="reference"):
        W.code_distribution_tests(cp, fr.context, {"x": runs["ar"]})


# ----------------------------------------------------------------------------------------------------------------
# WER pairing and the whole language evaluation
# ----------------------------------------------------------------------------------------------------------------
def test_wer_parity_pairs_against_the_reference():
    refs = ["the cat sat", "a dog ran far", "hello there world", "one two three four"]
    hyps = {"ar": ["the cat sat", "a dog ran", "hello world", "one two three four"],
            "same": ["the cat sat", "a dog ran", "hello world", "one two three four"],
            "loop": ["the cat sat", "a dog ran far", "hello there world", "one one one one one one one one"]}
    out = W.wer_parity(hyps, refs)
    assert out["ar"]["rate"] == pytest.approx(2 / 14) and "vs_reference" not in out["ar"]
    assert out["same"]["vs_reference"]["difference"] == 0
    assert out["loop"]["n_outliers"] == 1 and out["loop"]["outliers"][0]["index"] == 3
    assert out["loop"]["vs_reference"]["n_outliers_either"] == 1
    # CER beside WER: "far" and "there" deleted, 8 of 49 characters (spaces removed)
    assert out["ar"]["cer"] == pytest.approx(8 / 49) and out["same"]["cer"] == out["ar"]["cer"]
    assert W.wer_parity({"ar": ["ab"], "x": ["ab"]}, ["ab"], unit="char")["ar"]["unit"] == "char"
    assert "cer" not in W.wer_parity({"ar": ["ab"], "x": ["ab"]}, ["ab"], unit="char")["ar"]  # the rate is CER
    with pytest.raises(ValueError, match="reference"):
        W.wer_parity({"x": refs}, refs)


class _StubCodec:
    """Codes -> a deterministic waveform that depends on every code (what a table decoder does)."""

    sample_rate = 16000

    def encode(self, wav):  # the codec interface (codes_to_audio checks for it)
        raise NotImplementedError

    def decode(self, codes):
        c = np.asarray(codes, dtype=np.float64)
        return np.sin(np.arange(len(c) * 160)[:, None] * (1 + c.sum(1)) * 1e-4).sum(1).astype(np.float32)


class _StubASR:
    """Hears 'the cat' for most audio, and a word that depends on the audio's checksum otherwise."""

    name = "stub"

    def __init__(self):
        self.calls = 0

    def transcribe(self, wav, sample_rate):
        self.calls += 1
        return "the cat" if int(abs(wav).sum() * 10) % 3 else "the dog"


def test_evaluate_language_end_to_end_on_tiny_random(tiny):
    g = torch.Generator().manual_seed(0)
    utts = [Utterance(t, torch.randint(0, 2048, (f, 16), generator=g)) for t, f in
            (("the cat", 6), ("the cat sat", 8), ("a cat", 5))]
    decs = {"ar": AR(), W.NULL_CONTROL: AR(), "chain4": Chain(4), "lossy": LossySSD()}
    asr = _StubASR()
    res = W.evaluate_language(tiny, utts, decs, codec=_StubCodec(), asr=asr, replicates=2, batch_size=8)
    assert res["n_utterances"] == 3 and res["n_frames"] == 19 and asr.calls == 3 * 4
    assert set(res["tokens_per_call"]) == set(decs) and res["tokens_per_call"]["ar"]["value"] == 1.0
    assert res["tokens_per_call"]["chain4"]["value"] > 1.0
    assert set(res["wer"]) == set(decs) and "vs_reference" in res["wer"]["lossy"]
    assert res["decoders"]["lossy"]["lossless"] is False
    rows = W.table3_rows({"en": res, "de": res})
    assert [r["decoder"] for r in rows if r["lossy"]] == ["lossy", "lossy"]  # keyed by fields, the label untouched
    assert all(tuple(r)[1:7] == W.ROW_FIELDS for r in rows)
    de_rows = [r for r in rows if r["language"] == "de"]
    assert all(r["tpc_minus_english"] == 0 for r in de_rows)  # the same results: no difference, exactly
    v = R.verdicts({"en": res, "de": res})
    assert {(r["language"], r["decoder"]) for r in v} == {(lang, k) for lang in ("en", "de")
                                                          for k in (W.NULL_CONTROL, "chain4", "lossy")}
    assert all("flagged_by" in r and r["n_per_sample"] == 19 * 2 for r in v)
    text = R.verdict_text(v)
    assert text.count("the lossy control `lossy`") == 2 and "**en**" in text and "**de**" in text
    # the WER floor: the true codes through the same codec and recogniser
    asr_calls = asr.calls
    floor = R.true_codes_wer(utts, codec=_StubCodec(), asr=asr)
    assert asr.calls == asr_calls + 3 and floor["n_utterances"] == 3 and len(floor["hypotheses"]) == 3
    assert 0 <= floor["rate"] and "cer" in floor and floor["asr"] == "stub"
    table = R.wer_table(res["wer"], res["decoders"], tokens_per_call=res["tokens_per_call"], floor=floor)
    assert [r["decoder"] for r in table] == [*decs, R.TRUE_CODES] and table[-1]["wer"] == floor["rate"]
    assert table[0]["diff_vs_ar"] is None and table[-2]["lossy"] and table[-2]["tokens_per_call"] > 1
    no_asr = W.evaluate_language(tiny, utts, {"ar": AR()}, language="de")
    assert no_asr["wer"] is None and no_asr["unit"] == "word"
    with pytest.raises(ValueError, match="reference"):
        W.evaluate_language(tiny, utts, {"x": AR()})
    with pytest.raises(ValueError, match="unknown language"):
        W.evaluate_language(tiny, utts, decs, language="xx")


def test_free_running_parity_on_tiny_random(tiny):
    g = torch.Generator().manual_seed(0)
    utts = [Utterance(t, torch.randint(0, 2048, (4, 16), generator=g)) for t in ("the cat", "a dog", "hi")]
    out = W.free_running_parity(tiny, utts, {"ar": AR(), "lossy": LossySSD()}, codec=_StubCodec(), asr=_StubASR(),
                                max_frames=6)
    assert set(out["wer"]) == {"ar", "lossy"} and out["true_frames"] == [4, 4, 4]
    assert all(1 <= f <= 6 for f in out["frames"]["ar"])
    # the codes behind every transcript come back (a listening example), one (frames, 16) tensor per utterance
    assert [tuple(c.shape) for c in out["codes"]["ar"]] == [(f, 16) for f in out["frames"]["ar"]]
    assert out["decoders"]["lossy"]["lossy"] and not out["decoders"]["ar"]["lossy"]
    capped = [i for i, e in enumerate(out["ended"]["ar"]) if not e]
    assert all(any("cap" in o["why"] or "frames" in o["why"] or "WER" in o["why"]
                   for o in out["wer"]["ar"]["outliers"] if o["index"] == i) for i in capped)


def test_inner_loop_codes_keep_the_true_code_0_and_pair_the_seeds(tiny):
    """A listening example: every decoder speaks the utterance on its TRUE code 0 with the same seed, so two copies of
    AR give the same codes, a chain a draw of the same law, and only codes 1..15 differ."""
    g = torch.Generator().manual_seed(0)
    u = Utterance("the cat sat", torch.randint(0, 2048, (7, 16), generator=g))
    out = R.inner_loop_codes(tiny, u, {"ar": AR(), "again": AR(), "chain": Chain(4), "lossy": LossySSD()}, seed=3)
    assert set(out) == {"ar", "again", "chain", "lossy"}
    assert all(c.shape == (7, 16) and torch.equal(c[:, 0], u.codes[:, 0]) for c in out.values())
    assert torch.equal(out["ar"], out["again"])  # one seed for every decoder
    assert torch.equal(out["chain"][:, 1], out["ar"][:, 1])  # code 1 comes from the prefill, before any draft
    other = R.inner_loop_codes(tiny, u, {"ar": AR()}, seed=4)["ar"]
    assert not torch.equal(other, out["ar"])
