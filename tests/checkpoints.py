"""Qwen3-TTS checkpoints with RANDOM weights in exactly the official on-disk layout, so that the path a user with a
real checkpoint takes (``load_model(<folder>)`` -> the official ``from_pretrained``) runs without released weights
(README "Running on the released checkpoint"; tests/test_checkpoint_path.py). Two sizes:

- ``"tiny"`` (:func:`write_tiny_checkpoint`, the tests'): the release's files with tiny widths and depths, a small
  byte-level BPE with the release's special tokens right after its vocabulary, a tiny speech tokenizer, and a
  ``RANDOM_WEIGHTS`` marker; seconds to write, about 2 MB.
- ``"0.6b"`` (timing): the 0.6B CustomVoice release's ``config.json``, ``generation_config.json`` and
  ``speech_tokenizer/config.json`` verbatim, real-size talker, code predictor and 12 Hz speech tokenizer in the
  release's dtypes (bfloat16; the speech tokenizer float32), a text tokenizer with every id the config names at the
  release's id (``assistant`` 77091, the special tokens 151643..151675), and no marker, as a download has none (the
  loader calls it a ``"checkpoint"``); about 2.5 GB on disk, a minute and about 4.2 GB of memory to write.

By hand, from the repository root: ``python -m tests.checkpoints OUT_DIR [--size tiny|0.6b] [--seed S]``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AddedToken, EncodecFeatureExtractor, Qwen2TokenizerFast
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

from rvqspec_lib.common.files import json_text, usual_mode
from rvqspec_lib.models.configs import CONFIG_DIR, seeded
from rvqspec_lib.models.loader import RANDOM_WEIGHTS_MARKER
from rvqspec_lib.models.shim import import_qwen_tts

#: The release whose files the tiny checkpoint copies (config keys, generation config, speech tokenizer rates).
RELEASE_DIR = CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice"

#: The release's preprocessor_config.json (not shipped in data/configs: four keys).
PREPROCESSOR_CONFIG = {"padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
                       "return_attention_mask": True}

#: Qwen3 special tokens (151643..151668 in the release) then the Qwen3-TTS ones (151669..151675), in that order.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
#: Those Qwen3's tokenizer_config.json does not mark special (kept by ``decode(skip_special_tokens=True)``).
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
#: Qwen2's pre-tokenizer split pattern (transformers.convert_slow_tokenizer.Qwen2Converter).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

#: What the BPE is trained on (the chat words the official prompt slices must stay single tokens: added below).
_CORPUS = """\
Hello world. This is a tiny text-to-speech checkpoint with random weights, for tests only.
The quick brown fox jumps over the lazy dog. Speech is generated one frame at a time.
A talker predicts the first code of every frame; a code predictor fills in the other fifteen codes.
Numbers like 1, 2, 3 and 2048 are spelled digit by digit. She said: "It works!" and we laughed.
Good morning, good evening, thank you, please, yes, no, maybe, today, tomorrow, speaker, voice, audio.
"""

#: Tiny sizes (the release's key structure kept): talker, code predictor, speech tokenizer decoder and encoder.
TALKER_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "text_hidden_size": 32}
CODE_PREDICTOR_SIZES = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 16, "layer_types": ["full_attention"] * 2}
ST_DECODER_SIZES = {"latent_dim": 16, "codebook_dim": 16, "decoder_dim": 32, "hidden_size": 16, "intermediate_size": 32,
                    "head_dim": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 2,
                    "vector_quantization_hidden_dimension": 16}
ST_ENCODER_SIZES = {"codebook_dim": 8, "head_dim": 8, "hidden_size": 16, "intermediate_size": 32,
                    "num_attention_heads": 2, "num_filters": 2, "num_hidden_layers": 1, "num_key_value_heads": 2,
                    "upsample_groups": 16, "vector_quantization_hidden_dimension": 8}


#: The ids of the release's vocabulary that its config names: the regular tokens before :data:`SPECIAL_TOKENS`, and
#: the one regular token the config's ``assistant_token_id`` points at.
RELEASE_N_REGULAR = 151643
RELEASE_REGULAR_IDS = {"assistant": 77091}


def _filler(i: int) -> str:
    """The ``i``-th padding entry of a release-size vocabulary: two 0xFF bytes (never in UTF-8 text, so no merge of
    the corpus makes it) then ``i``'s digits, in the byte-level alphabet."""
    return "\u00ff\u00ff" + str(i)


def _build_text_tokenizer(n_merges: int = 256, *, n_regular: int | None = None, regular_ids: dict | None = None):
    """``(Qwen2TokenizerFast, its special ids and n_regular)``: a byte-level BPE with Qwen2's pipeline trained
    offline (the chat words single tokens, as the official prompt needs), then :data:`SPECIAL_TOKENS`.

    ``n_regular``: pad the vocabulary with unreachable entries to this many regular tokens (the release's 151643), so
    that the special tokens land at the release's ids; ``regular_ids``: ``{token: id}`` moved to those ids (the
    release's ``assistant``). Both ``None``: the trained vocabulary as it is (the tiny checkpoint's)."""
    def _pipeline(t):
        t.normalizer = normalizers.NFC()
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        t.decoder = decoders.ByteLevel()
        return t

    alphabet = list(bytes_to_unicode().values())  # GPT-2 / Qwen2 byte-level alphabet in id order
    trainer = trainers.BpeTrainer(vocab_size=256 + n_merges, min_frequency=2, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=[])
    trained = _pipeline(Tokenizer(models.BPE(unk_token=None)))
    trained.train_from_iterator([_CORPUS] * 4 + ["assistant\nuser\nsystem\n"] * 64, trainer=trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(trained.to_str())["model"]["merges"]]
    vocab = {ch: i for i, ch in enumerate(alphabet)}  # re-numbered: bytes in GPT-2 order, then merges in order
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if n_regular is not None:
        if n_regular < len(vocab):
            raise ValueError(f"n_regular={n_regular} is below the trained vocabulary's {len(vocab)} tokens")
        vocab.update({_filler(i): i for i in range(len(vocab), n_regular)})
    by_id = {i: t for t, i in vocab.items()}
    for token, want in (regular_ids or {}).items():  # swap ids: BPE ranks follow the merges, not the ids
        if token not in vocab or not 0 <= want < len(vocab):
            raise ValueError(f"cannot place {token!r} at id {want}: not in the vocabulary, or past its end")
        other, have = by_id[want], vocab[token]
        vocab[token], vocab[other], by_id[want], by_id[have] = want, have, token, other
    tok = _pipeline(Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                                         byte_fallback=False)))
    n_regular = tok.get_vocab_size()
    for word in ("assistant", "user", "system"):
        if len(tok.encode(word).ids) != 1:
            raise RuntimeError(f"the tiny BPE did not keep {word!r} whole: the tokenizers library changed")
    fast = Qwen2TokenizerFast(tokenizer_object=tok, unk_token=None, bos_token=None, eos_token=None, pad_token=None,
                              errors="replace", clean_up_tokenization_spaces=False, model_max_length=131072,
                              split_special_tokens=False)
    fast.add_tokens([AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for t in SPECIAL_TOKENS])
    fast.eos_token, fast.pad_token = "<|im_end|>", "<|endoftext|>"  # as Qwen3's tokenizer_config.json
    ids = {t: fast.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    if [ids[t] for t in SPECIAL_TOKENS] != list(range(n_regular, n_regular + len(SPECIAL_TOKENS))):
        raise RuntimeError(f"the special tokens did not land right after the vocabulary ({n_regular}): {ids}")
    return fast, {
        "im_start_token_id": ids["<|im_start|>"], "im_end_token_id": ids["<|im_end|>"],
        "assistant_token_id": fast.convert_tokens_to_ids("assistant"), "tts_pad_token_id": ids["<tts_pad>"],
        "tts_bos_token_id": ids["<tts_text_bos>"], "tts_eos_token_id": ids["<tts_text_eod>"],
        "n_regular": n_regular,
    }


def _release_model_config(text_ids: dict, *, text_vocab_size: int) -> dict:
    """The release's ``config.json`` verbatim; refused unless the tokenizer gives every id the config names."""
    cfg = json.loads((RELEASE_DIR / "config.json").read_text())
    wrong = {k: (cfg[k], text_ids[k]) for k in _CONFIG_TEXT_IDS if cfg[k] != text_ids[k]}
    if wrong or text_vocab_size > cfg["talker_config"]["text_vocab_size"]:
        raise RuntimeError(f"the release-size tokenizer's ids differ from the release config's: {wrong}")
    return cfg


#: The text ids ``config.json`` names (its top level).
_CONFIG_TEXT_IDS = ("assistant_token_id", "im_end_token_id", "im_start_token_id", "tts_bos_token_id",
                    "tts_eos_token_id", "tts_pad_token_id")


def _tiny_model_config(text_ids: dict, *, text_vocab_size: int) -> dict:
    """The release's ``config.json`` with the tiny sizes and the tiny tokenizer's text ids."""
    cfg = json.loads((RELEASE_DIR / "config.json").read_text())
    for k in _CONFIG_TEXT_IDS:
        cfg[k] = text_ids[k]
    talker = cfg["talker_config"]
    talker.update(TALKER_SIZES, text_vocab_size=text_vocab_size)
    talker["rope_scaling"] = {**talker["rope_scaling"], "mrope_section": [4, 2, 2]}  # 2 * (4 + 2 + 2) == head_dim
    talker["code_predictor_config"].update(CODE_PREDICTOR_SIZES)
    return cfg


def _tiny_speech_tokenizer_config() -> dict:
    """The release's ``speech_tokenizer/config.json`` with tiny widths and depths, its rates kept."""
    cfg = json.loads((RELEASE_DIR / "speech_tokenizer" / "config.json").read_text())
    cfg["decoder_config"].update(ST_DECODER_SIZES)
    cfg["encoder_config"].update(ST_ENCODER_SIZES)
    return cfg


#: The sizes :func:`write_checkpoint` writes.
SIZES = ("tiny", "0.6b")


def write_tiny_checkpoint(out_dir: str | os.PathLike, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """:func:`write_checkpoint` at size ``"tiny"`` (with the ``RANDOM_WEIGHTS`` marker): the tests' checkpoint."""
    return write_checkpoint(out_dir, size="tiny", seed=seed, dtype=dtype)


def write_checkpoint(out_dir: str | os.PathLike, *, size: str = "tiny", seed: int = 0,
                     dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a checkpoint with seeded RANDOM weights in the official layout into ``out_dir`` (new or empty), all or
    nothing, the model in ``dtype`` (the speech tokenizer float32); returns ``Path(out_dir)``.

    ``size``: ``"tiny"`` (tiny widths and depths, the ``RANDOM_WEIGHTS`` marker) or ``"0.6b"`` (the release's
    config files verbatim, real-size weights, the release's text ids, no marker: module docstring).

    Raises:
        ValueError: ``size`` is not one of :data:`SIZES`.
        FileExistsError: ``out_dir`` exists and is not empty (pick another folder, or remove it).
    """
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a checkpoint size here: pick one of {', '.join(SIZES)}")
    release = size != "tiny"
    core = import_qwen_tts().core  # the official classes (qwen_tts imported on first use: it takes seconds)
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder: write the checkpoint to a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # 1. the text tokenizer (its ids go into config.json)
        tokenizer, text_ids = (_build_text_tokenizer(n_regular=RELEASE_N_REGULAR, regular_ids=RELEASE_REGULAR_IDS)
                               if release else _build_text_tokenizer())
        n_text = text_ids["n_regular"] + len(SPECIAL_TOKENS)
        tokenizer.save_pretrained(tmp)

        # 2. the model: weights as save_pretrained writes them, config.json and generation_config.json the release's
        padded = -(-n_text // 64) * 64  # as the release's
        cfg_dict = (_release_model_config(text_ids, text_vocab_size=padded) if release
                    else _tiny_model_config(text_ids, text_vocab_size=padded))
        cfg = core.models.Qwen3TTSConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures",
                                                                                 "transformers_version")})
        model = seeded(seed, lambda: core.models.Qwen3TTSForConditionalGeneration(cfg)).to(dtype)
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        if release:
            shutil.copyfile(RELEASE_DIR / "config.json", tmp / "config.json")
        else:
            (tmp / "config.json").write_text(json_text(cfg_dict, indent=2) + "\n")
        shutil.copyfile(RELEASE_DIR / "generation_config.json", tmp / "generation_config.json")
        (tmp / "preprocessor_config.json").write_text(json_text(PREPROCESSOR_CONFIG, indent=2) + "\n")

        # 3. the speech tokenizer: the official 12 Hz classes
        st_cfg_dict = (json.loads((RELEASE_DIR / "speech_tokenizer" / "config.json").read_text()) if release
                       else _tiny_speech_tokenizer_config())
        st_cfg = core.Qwen3TTSTokenizerV2Config(**{k: v for k, v in st_cfg_dict.items()
                                              if k not in ("architectures", "transformers_version")})

        def _build_st():
            m = core.Qwen3TTSTokenizerV2Model(st_cfg)
            # HF's init of the decoder (std 0.02, LayerScale 0.01, ConvNeXt gamma 1e-6) gives |audio| ~ 1e-9: torch's
            # default init instead, so that the random waveform is audible (rms ~ 0.3)
            for mod in m.decoder.modules():
                if isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
                    mod.reset_parameters()
            # codebooks start as embedding_sum = 0 (every code would decode alike): random entries
            with torch.no_grad():
                for name, p in m.named_parameters():
                    if name.endswith("embedding_sum"):
                        p.normal_(0.0, 1.0)
                for name, b in m.named_buffers():  # the Mimi encoder's codebooks are buffers
                    if name.endswith("embed_sum"):
                        b.normal_(0.0, 1.0)
            return m

        st_dir = tmp / "speech_tokenizer"
        seeded(seed + 1, _build_st).save_pretrained(st_dir, safe_serialization=True)
        if release:
            shutil.copyfile(RELEASE_DIR / "speech_tokenizer" / "config.json", st_dir / "config.json")
        else:
            (st_dir / "config.json").write_text(json_text(st_cfg_dict, indent=2) + "\n")
        (st_dir / "generation_config.json").unlink(missing_ok=True)  # not in the release's folder
        EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0, chunk_length_s=None,
                                overlap=None, padding_side="right",
                                return_attention_mask=True).save_pretrained(st_dir)

        if not release:  # a download has no marker: the release-size checkpoint neither
            (tmp / RANDOM_WEIGHTS_MARKER).write_text(
                f"Seeded RANDOM weights (seed {seed}), written by tests/checkpoints.py (write_checkpoint) for "
                "tests: the audio and the acceptance rates of this checkpoint mean nothing.\n")
        for f in tmp.rglob("*"):
            if f.is_file():
                usual_mode(f)
        usual_mode(tmp, 0o777)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.checkpoints",
                                 description="Write a random-weight checkpoint in the release's layout.")
    ap.add_argument("out", help="a new (or empty) folder")
    ap.add_argument("--size", choices=SIZES, default="tiny", help="tiny (the tests') or 0.6b (real size, no marker)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(write_checkpoint(a.out, size=a.size, seed=a.seed))
