"""The own frame loop (talker -> inner loop -> sum of embeddings -> talker) against the official ``generate``.

Exact equalities on tiny-random: greedy with every decoder (the decoders are lossless, so greedy codes cannot
change), and sampled with AR under the same seed (the official loop draws from the global RNG, ours from an
explicit generator seeded alike; both consume random numbers in the same order).
"""

import json

import numpy as np
import pytest
import torch
from rvqspec_lib.cli.main import main

from rvqspec_lib.models.frame import build_prompt, default_speaker, synthesize
from rvqspec_lib.models.lean import LeanCodePredictor
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling

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


def _backend(lm, name):
    return None if name == "official" else LeanCodePredictor(lm.code_predictor, matmul=name.split("-")[1])


@pytest.mark.parametrize("backend", ["official", "lean-torch", "lean-mgemv"])
@pytest.mark.parametrize("decoder", [AR(), Chain(2), Chain(5), Tree(), Tree([(0,), (1,), (2,), (0, 0), (1, 0)])],
                         ids=repr)
def test_greedy_equals_official(lm, decoder, backend):
    """Greedy codes equal the official ``generate`` for every decoder, through the official module and through the
    lean forward (bit-identical with torch's matmul; the AVX2 kernel rounds differently, yet greedy codes agree)."""
    ref = official(lm, TEXTS, greedy=True)
    g = Sampling(greedy=True)
    res = synthesize(lm, TEXTS, decoder=decoder, sampling=g, talker_sampling=g, max_frames=FRAMES,
                     backend=_backend(lm, backend))
    assert [c.shape for c in res.codes] == [r.shape for r in ref]
    for mine, theirs in zip(res.codes, ref):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("backend", ["official", "lean-torch"])
@pytest.mark.parametrize("seed", [3, 11])
def test_sampled_ar_equals_official_same_seed(lm, seed, backend):
    ref = official(lm, TEXTS, greedy=False, seed=seed)
    res = synthesize(lm, TEXTS, decoder=AR(), generator=torch.Generator().manual_seed(seed), max_frames=FRAMES,
                     backend=_backend(lm, backend))
    for mine, theirs in zip(res.codes, ref):
        assert torch.equal(mine, theirs)


def test_negative_control_other_seed_differs(lm):
    """The sampled comparison above can fail: another seed gives other codes."""
    ref = official(lm, TEXTS[:1], greedy=False, seed=3)
    res = synthesize(lm, TEXTS[:1], decoder=AR(), generator=torch.Generator().manual_seed(4), max_frames=FRAMES)
    assert not torch.equal(res.codes[0], ref[0])


def test_speculative_frame_loop_is_seeded_and_counts_calls(lm):
    a = synthesize(lm, TEXTS[0], decoder=Tree(), generator=torch.Generator().manual_seed(1), max_frames=6)
    b = synthesize(lm, TEXTS[0], decoder=Tree(), generator=torch.Generator().manual_seed(1), max_frames=6)
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


def test_cli_synth_writes_codes_and_json(tmp_path):
    out = tmp_path / "x.wav"
    rc = main(["synth", "--model", "tiny-random", "--text", "Hello there.", "--out", str(out), "--decoder", "tree",
               "--tree", "0;1;0,0;0,0,0", "--seed", "5", "--json", str(tmp_path / "s.json"), "--max-frames", "4"])
    assert rc == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    for key in ("frames", "code_predictor_calls", "tokens_per_call", "wall_s", "codes"):
        assert key in stats
    codes = np.load(tmp_path / "x.npy")
    assert codes.shape == (stats["frames"], 16) == (4, 16)
    assert codes.tolist() == stats["codes"]
    assert stats["tokens_per_call"] == pytest.approx(4 * 15 / stats["code_predictor_calls"])


def test_cli_synth_greedy_decoders_agree(tmp_path):
    outs = []
    for dec in (["--decoder", "ar"], ["--decoder", "chain", "--window", "3"], ["--decoder", "tree"]):
        p = tmp_path / f"{dec[1]}.json"
        assert main(["synth", "--model", "tiny-random", "--text", "Same text.", "--out", str(tmp_path / "a.wav"),
                     "--greedy", "--max-frames", "3", "--json", str(p), *dec]) == 0
        outs.append(json.loads(p.read_text())["codes"])
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("argv,msg", [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny-random", "--decoder", "chain", "--window", "1"], "window"),
    (["--model", "tiny-random", "--decoder", "tree", "--tree", "0,0"], "gap"),
    (["--model", "tiny-random", "--language", "klingon"], "unsupported language"),
])
def test_cli_bad_input_is_a_clear_error(tmp_path, capsys, argv, msg):
    rc = main(["synth", "--text", "hi", "--out", str(tmp_path / "x.wav"), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_cli_missing_output_folder(tmp_path, capsys):
    rc = main(["synth", "--model", "tiny-random", "--text", "hi", "--out", str(tmp_path / "nope" / "x.wav")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("extra,msg", [
    (["--json", "/proc/rvqspec-test.json"], "not writable"),
    (["--json", ""], "empty path"),
    (["--decoder", "tree", "--tree", "0;;1"], "empty path in tree"),
    (["--window", "3"], "--window is for --decoder chain"),
    (["--decoder", "chain", "--tree", "0;1"], "--tree is for --decoder tree"),
    (["--out", "OUT/x.txt"], "must end in .wav, .flac, .ogg"),
    (["--out", "OUT/x"], "must end in .wav, .flac, .ogg"),
    (["--json", "OUT/x.wav"], "is an audio or codes file of --out"),
    (["--json", "OUT/x.npy"], "is an audio or codes file of --out"),
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
