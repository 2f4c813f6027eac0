"""The own frame loop (talker -> inner loop -> sum of embeddings -> talker) against the official ``generate``.

Exact equalities on tiny-random: greedy with every decoder through every kind of frame runner (the decoders are
lossless, so greedy codes cannot change), and sampled with AR stepped through the official module and the lean forward
under the same seed (the official loop draws from the global RNG, ours from an explicit generator seeded alike; both
consume random numbers in the same order).
"""

import json

import numpy as np
import pytest
import torch

from rvqspec_lib.cli.main import main
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models import backends as B
from rvqspec_lib.models.frame import build_prompt, default_speaker, frames, inner_sampling, synthesize
from rvqspec_lib.models.loader import load_model

TEXTS = ["Hello world.", "A somewhat longer sentence, to pad the batch."]
FRAMES = 10


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-random")


def official(lm, texts, *, greedy, seed=None, frames=FRAMES):
    """Codes from the official ``generate`` (max_new_tokens = frames + 1 gives ``frames`` frames with codes)."""
    if seed is not None:
        torch.manual_seed(seed)
    kw = dict(do_sample=False, subtalker_dosample=False) if greedy else {}
    with torch.inference_mode():
        codes, _ = lm.model.generate(input_ids=[lm.tokenizer(t) for t in texts], languages=["auto"] * len(texts),
                                     speakers=[default_speaker(lm)] * len(texts), non_streaming_mode=True,
                                     max_new_tokens=frames + 1, **kw)
    return codes


def _runner(lm, decoder, how: str, sampling: Sampling):
    """``official``, ``eager`` (stepped) or ``<backend>-fused`` (the whole frame), skipped where it does not run."""
    backend, _, fused = how.partition("-")
    if not B.available(backend)[0]:
        pytest.skip(B.available(backend)[1])
    return B.frame_runner(backend, lm.code_predictor, decoder, fused=bool(fused), sampling=sampling)


DECODERS = [AR(), Chain(2), Chain(5), Tree(), Tree([(0,), (1,), (2,), (0, 0), (1, 0)])]
RUNS = [(d, how) for how in ("official", "eager", "eager-fused", "native-fused") for d in DECODERS
        if not (how.endswith("fused") and isinstance(d, Tree))]  # a fused frame runs AR and chains


@pytest.mark.parametrize("decoder, how", RUNS, ids=[f"{d!r}-{h}" for d, h in RUNS])
def test_greedy_equals_official(lm, decoder, how):
    """Greedy codes equal the official ``generate`` for every decoder, stepped through the official module and the
    lean forward (bit-identical in float32), and as the fused whole frame (AR and chains; the native forward rounds
    differently, yet greedy codes agree); the result names the runner that ran."""
    ref = official(lm, TEXTS, greedy=True)
    g = Sampling(greedy=True)
    res = synthesize(lm, TEXTS, runner=_runner(lm, decoder, how, g), talker_sampling=g, max_frames=FRAMES)
    assert [c.shape for c in res.codes] == [r.shape for r in ref]
    for mine, theirs in zip(res.codes, ref):
        assert torch.equal(mine, theirs)
    assert (res.runner["backend"], res.runner["fused"]) == (how.split("-")[0], how.endswith("fused"))


@pytest.mark.parametrize("backend", ["official", "eager"])
@pytest.mark.parametrize("seed", [3, 11])
def test_sampled_ar_equals_official_same_seed(lm, seed, backend):
    ref = official(lm, TEXTS, greedy=False, seed=seed)
    runner = B.frame_runner(backend, lm.code_predictor, AR(), sampling=inner_sampling(lm))
    res = synthesize(lm, TEXTS, runner=runner, generator=torch.Generator().manual_seed(seed), max_frames=FRAMES)
    for mine, theirs in zip(res.codes, ref):
        assert torch.equal(mine, theirs)


def test_frames_yields_each_frame_and_synthesize_collects_them(lm):
    """The generator behind synthesize: one Frame per step, its codes, its active rows and its calls; the same seed
    gives synthesize's codes. A row's frames stop at its end of speech (here: the cap)."""
    kw = dict(max_frames=5, generator=torch.Generator().manual_seed(2))
    got = list(frames(lm, TEXTS, **kw))
    res = synthesize(lm, TEXTS, max_frames=5, generator=torch.Generator().manual_seed(2))
    assert [f.index for f in got] == list(range(5)) and all(f.codes.shape == (2, 16) for f in got)
    assert all(bool(f.active.all()) and torch.equal(f.calls, torch.full((2,), 15)) for f in got)  # AR: 15 calls
    for i in range(2):
        assert torch.equal(torch.stack([f.codes[i] for f in got]), res.codes[i])
    assert res.runner == {"decoder": "ar", "kind": "ar", "drafter": None, "nodes": 1, "lossy": False,
                          "sampled": False, "backend": "official", "fused": False, "precision": "float32"}
    assert res.talker_calls == 5 and not bool(res.ended.any())
    with pytest.raises(ValueError, match="sampling= is for the default runner"):
        synthesize(lm, TEXTS, runner=B.frame_runner("official", lm.code_predictor, AR()), sampling=Sampling())


def test_negative_control_other_seed_differs(lm):
    """The sampled comparison above can fail: another seed gives other codes."""
    ref = official(lm, TEXTS[:1], greedy=False, seed=3)
    res = synthesize(lm, TEXTS[:1], generator=torch.Generator().manual_seed(4), max_frames=FRAMES)
    assert not torch.equal(res.codes[0], ref[0])


def test_speculative_frame_loop_is_seeded_and_counts_calls(lm):
    tree = B.frame_runner("official", lm.code_predictor, Tree(), sampling=inner_sampling(lm))
    a = synthesize(lm, TEXTS[0], runner=tree, generator=torch.Generator().manual_seed(1), max_frames=6)
    b = synthesize(lm, TEXTS[0], runner=tree, generator=torch.Generator().manual_seed(1), max_frames=6)
    assert torch.equal(a.codes[0], b.codes[0])
    assert int(a.frames[0]) == 6 and a.codes[0].shape == (6, 16)
    assert 6 <= int(a.code_predictor_calls[0]) <= 6 * 15
    assert sum(a.per_frame_calls[0]) == int(a.code_predictor_calls[0])
    assert float(a.tokens_per_call[0]) == pytest.approx(6 * 15 / int(a.code_predictor_calls[0]))


def test_bad_input(lm):
    with pytest.raises(ValueError, match="empty"):
        synthesize(lm, "   ", max_frames=2)
    with pytest.raises(ValueError, match="unsupported language"):
        build_prompt(lm, ["hi"], language="klingon")
    with pytest.raises(ValueError, match="unknown speaker"):
        build_prompt(lm, ["hi"], speaker="nobody")
    with pytest.raises(ValueError, match="max_frames"):
        synthesize(lm, "hi", max_frames=0)
    with pytest.raises(ValueError, match="unsupported language"):  # when called, not when the first frame is asked
        frames(lm, "hi", language="klingon")


def test_cli_synth_writes_codes_and_json(tmp_path):
    out = tmp_path / "x.wav"
    rc = main(["synth", "--model", "tiny-random", "--text", "Hello there.", "--out", str(out), "--decoder",
               "tree:0;1;0,0;0,0,0", "--seed", "5", "--json", str(tmp_path / "s.json"), "--max-frames", "4"])
    assert rc == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    for key in ("frames", "code_predictor_calls", "tokens_per_call", "total_s", "codes"):
        assert key in stats
    codes = np.load(tmp_path / "x.npy")
    assert codes.shape == (stats["frames"], 16) == (4, 16)
    assert codes.tolist() == stats["codes"]
    assert stats["tokens_per_call"] == pytest.approx(4 * 15 / stats["code_predictor_calls"])


def test_cli_synth_greedy_decoders_agree(tmp_path):
    """Greedy codes through the command line: AR, a chain, a tree, and the chain as the native whole frame (where the
    native forward builds); the JSON names the runner of each."""
    outs, runs = [], [["--decoder", "ar"], ["--decoder", "chain:3"], ["--decoder", "tree"]]
    if B.available("native")[0]:
        runs.append(["--decoder", "chain:3", "--backend", "native"])
    for i, dec in enumerate(runs):
        p = tmp_path / f"{i}.json"
        assert main(["synth", "--model", "tiny-random", "--text", "Same text.", "--out", str(tmp_path / "a.wav"),
                     "--greedy", "--max-frames", "3", "--json", str(p), *dec]) == 0
        stats = json.loads(p.read_text())
        outs.append(stats["codes"])
        label = {"tree": "tree:0;1;0,0;0,0,0"}.get(dec[1], dec[1])  # the label is the canonical name
        assert stats["decoder"] == label and stats["decoder_name"] == dec[1] and stats["fused"] is ("native" in dec)
    assert all(o == outs[0] for o in outs)


@pytest.mark.parametrize("argv,msg", [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny-random", "--decoder", "chain:1"], "window"),
    (["--model", "tiny-random", "--decoder", "tree:0,0"], "gap"),
    (["--model", "tiny-random", "--language", "klingon"], "unsupported language"),
    (["--model", "tiny-random", "--decoder", "tree", "--frame", "fused", "--backend", "eager"], "not Tree"),
    (["--model", "tiny-random", "--decoder", "ar", "--frame", "fused"], "the official module has no fused frame"),
])
def test_cli_bad_input_is_a_clear_error(tmp_path, capsys, argv, msg):
    rc = main(["synth", "--text", "hi", "--out", str(tmp_path / "x.wav"), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


@pytest.mark.parametrize("extra,msg", [
    (["--json", "/proc/rvqspec-test.json"], "not writable"),
    (["--json", ""], "empty path"),
    (["--decoder", "tree:0;;1"], "empty path in tree"),
    (["--out", "OUT/x.txt"], "must end in .wav, .flac, .ogg"),
    (["--out", "OUT/x"], "must end in .wav, .flac, .ogg"),
    (["--json", "OUT/x.wav"], "is also written as --out"),
    (["--json", "OUT/x.npy"], "is also written as --out"),
])
def test_cli_output_and_flag_checks_happen_before_any_work(tmp_path, capsys, extra, msg):
    extra = [a.replace("OUT", str(tmp_path)) for a in extra]
    rc = main(["synth", "--model", "tiny-random", "--text", "hi", "--out", str(tmp_path / "x.wav"), *extra])
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
    assert not (tmp_path / "x.npy").exists()  # nothing ran


def test_cli_out_is_a_folder(tmp_path, capsys):
    assert main(["synth", "--model", "tiny-random", "--text", "hi", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_decode_frame_names_the_module_to_pass(lm):
    from rvqspec_lib.decoding.decode import decode_frame

    with pytest.raises(ValueError, match="lm.code_predictor"):
        decode_frame(lm.model, torch.zeros(1, 2, 64))


def test_decode_frame_rejects_nan_context_and_a_non_generator(lm):
    from rvqspec_lib.decoding.decode import decode_frame

    h = lm.model.config.talker_config.hidden_size
    ctx = torch.zeros(1, 2, h)
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        decode_frame(lm.code_predictor, ctx, generator=0)
    ctx[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        decode_frame(lm.code_predictor, ctx)
