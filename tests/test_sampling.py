"""Sampling: the warped probabilities are exactly those of transformers' ``generate`` (temperature -> top-k -> top-p)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rvqspec_lib.models.configs import CONFIG_DIR
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.sampling import Sampling, sample

SETTINGS = [
    Sampling(),  # checkpoints' defaults: temperature 0.9, top-k 50, top-p 1.0
    Sampling(temperature=1.3, top_k=3),
    Sampling(temperature=1.0, top_k=0, top_p=0.8),
    Sampling(temperature=0.7, top_k=20, top_p=0.5),
    Sampling(temperature=2.0, top_k=0, top_p=1.0),
    Sampling(temperature=0.5, top_k=1),
]


@pytest.fixture(scope="module")
def cp():
    return load_model("tiny-random").code_predictor


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_probs_equal_generate_own_warped_scores(cp, s):
    """``generate(output_scores=True, output_logits=True)`` hands back the raw logits and the scores after its own
    logits processors at every step: ``Sampling.probs(raw)`` must equal ``softmax(processed)``."""
    h = cp.model.codec_embedding[0].embedding_dim
    ctx = torch.randn(3, 2, h, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    out = cp.generate(inputs_embeds=ctx, max_new_tokens=int(cp.config.num_code_groups) - 1, do_sample=True,
                      temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, output_scores=True,
                      output_logits=True, return_dict_in_generate=True)
    assert len(out.scores) == len(out.logits) == int(cp.config.num_code_groups) - 1
    for raw, processed in zip(out.logits, out.scores):
        ours = s.probs(raw)
        theirs = torch.softmax(processed.float(), -1)
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
        assert torch.equal(ours > 0, theirs > 0)  # the same codes are cut
    if s.top_k:
        assert int((ours > 0).sum(-1).max()) <= s.top_k


def test_probs_shape_and_dtype_follow_input():
    logits = torch.randn(2, 3, 11, dtype=torch.bfloat16)
    p = Sampling(top_k=4).probs(logits)
    assert p.shape == (2, 3, 11) and p.dtype == torch.float32
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3))
    assert bool(((p > 0).sum(-1) == 4).all())


def test_probs_do_not_modify_input():
    logits = torch.randn(4, 9)
    before = logits.clone()
    Sampling(temperature=0.5, top_k=3, top_p=0.7).probs(logits)
    assert torch.equal(logits, before)


def test_greedy_is_one_hot_argmax():
    logits = torch.randn(5, 4, 13)
    p = Sampling(greedy=True).probs(logits)
    assert torch.equal(p, torch.nn.functional.one_hot(logits.argmax(-1), 13).float())
    assert len(Sampling(greedy=True).warpers()) == 0
    # greedy ignores the sampling knobs, even invalid ones
    assert torch.equal(Sampling(temperature=0.0, top_k=-1, top_p=5.0, greedy=True).probs(logits), p)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample(p.reshape(-1, 13), g), logits.argmax(-1).reshape(-1))


def test_warpers_are_built_like_generate():
    """Temperature 1.0, top-k 0 and top-p 1.0 are no-ops and are not added (as in _get_logits_processor)."""
    names = lambda s: [type(w).__name__ for w in s.warpers()]  # noqa: E731
    assert names(Sampling()) == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    assert names(Sampling(temperature=1.0, top_k=0, top_p=1.0)) == []
    assert names(Sampling(temperature=0.8, top_k=5, top_p=0.9)) == ["TemperatureLogitsWarper", "TopKLogitsWarper",
                                                                    "TopPLogitsWarper"]


@pytest.mark.parametrize("kwargs,word", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.1}, "top_p"),
])
def test_invalid_knobs_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Sampling(**kwargs)


def test_from_generation_config_reads_the_shipped_subtalker_keys():
    path = CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "generation_config.json"
    assert path.exists(), path
    gen = json.loads(Path(path).read_text())
    s = Sampling.from_generation_config(gen)
    assert (s.temperature, s.top_k, s.top_p, s.greedy) == (0.9, 50, 1.0, False)
    assert s == Sampling()
    talker = Sampling.from_generation_config(gen, loop="talker")
    assert (talker.temperature, talker.top_k, talker.top_p, talker.greedy) == (0.9, 50, 1.0, False)


def test_from_generation_config_subtalker_keys_win_and_dosample_false_is_greedy():
    gen = {"temperature": 0.5, "top_k": 7, "subtalker_temperature": 1.1, "subtalker_top_k": 3, "subtalker_top_p": 0.6,
           "subtalker_dosample": False}
    s = Sampling.from_generation_config(gen)
    assert (s.temperature, s.top_k, s.top_p, s.greedy) == (1.1, 3, 0.6, True)
    assert Sampling.from_generation_config({}).greedy is False
    assert Sampling.from_generation_config(gen, greedy=True).greedy is True
