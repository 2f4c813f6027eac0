"""The release-size checkpoint's layout without its weights (tests/checkpoints.py, ``size="0.6b"``): the text
tokenizer puts every id the release's config names where the release has it, the special tokens at 151643.., and
the chat prompt the official processor builds tokenizes to those ids. Seconds: no weights are built (the weights'
own path is the tiny checkpoint's, tests/test_checkpoint_path.py; the real-size one is built by hand for timing,
docs/testing.md)."""

from __future__ import annotations

import json

import pytest

from checkpoints import (RELEASE_DIR, RELEASE_N_REGULAR, RELEASE_REGULAR_IDS, SPECIAL_TOKENS, _build_text_tokenizer,
                         _release_model_config, write_checkpoint)


@pytest.fixture(scope="module")
def release_tokenizer():
    return _build_text_tokenizer(n_regular=RELEASE_N_REGULAR, regular_ids=RELEASE_REGULAR_IDS)


def test_the_release_size_tokenizer_has_the_release_config_ids(release_tokenizer):
    tok, ids = release_tokenizer
    cfg = json.loads((RELEASE_DIR / "config.json").read_text())
    assert _release_model_config(ids, text_vocab_size=RELEASE_N_REGULAR + len(SPECIAL_TOKENS)) == cfg  # verbatim
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == \
        list(range(151643, 151643 + len(SPECIAL_TOKENS)))
    assert len(tok) == 151643 + len(SPECIAL_TOKENS) <= cfg["talker_config"]["text_vocab_size"]
    assert tok.convert_tokens_to_ids("assistant") == cfg["assistant_token_id"] == 77091
    prompt = "<|im_start|>assistant\nHello world.<|im_end|>\n<|im_start|>assistant\n"
    got = tok(prompt)["input_ids"]
    assert got[:2] == [cfg["im_start_token_id"], cfg["assistant_token_id"]] and cfg["im_end_token_id"] in got
    assert tok.decode(got) == prompt  # the padding entries never appear in real text
    assert max(got) < cfg["talker_config"]["text_vocab_size"]


def test_the_tiny_tokenizer_is_unchanged_and_ids_are_checked(release_tokenizer):
    tok, ids = _build_text_tokenizer()
    assert ids["n_regular"] < 1000 and ids["im_start_token_id"] == ids["n_regular"] + 1  # right after its vocabulary
    with pytest.raises(RuntimeError, match="differ from the release config"):
        _release_model_config(ids, text_vocab_size=ids["n_regular"] + len(SPECIAL_TOKENS))  # the negative control
    with pytest.raises(ValueError, match="below the trained vocabulary"):
        _build_text_tokenizer(n_regular=10)
    with pytest.raises(ValueError, match="pick one of tiny, 0.6b"):
        write_checkpoint("/nonexistent/never-written", size="1.7b")
