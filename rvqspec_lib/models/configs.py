"""Model configs: the released real-size configs shipped in ``data/configs/``, tiny configs of the official classes
(a small one to train from scratch: recipes/embedded/train.py), and building the official
``Qwen3TTSForConditionalGeneration`` with seeded random weights from a config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.models.shim import _codec_decoder_classes, _qwen_classes

CONFIG_DIR = DATA_DIR / "configs"


#: Names accepted by :func:`load_model` besides hub ids and local paths.
RANDOM_MODELS = {
    "qwen3-tts-0.6b-random": "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "qwen3-tts-1.7b-random": "Qwen3-TTS-12Hz-1.7B-CustomVoice",
}


TINY_MODELS = ("tiny-random",)

#: The released 12 Hz speech tokenizer's ``config.json`` (the same file as each checkpoint's
#: ``speech_tokenizer/config.json``), shipped so its decoder builds at real size with random weights.
CODEC_CONFIG = "Qwen3-TTS-Tokenizer-12Hz"


#: The tiny config at its default sizes (:func:`tiny_config_dict`).
TINY_CONFIG = "tiny"


def tiny_config_dict(
    *,
    n_code_groups: int = 16,
    codebook_size: int = 2048,
    talker_hidden: int = 64,
    code_predictor_hidden: int = 48,
    talker_layers: int = 2,
    code_predictor_layers: int = 2,
) -> dict:
    """Config of a tiny model of the official classes (``data/configs/tiny/config.json``: a release's structure and
    codec special ids, small sizes, 16-wide attention heads; text special ids 256..261, after the bytes) at the sizes
    given (MLPs twice as wide as the hidden state).

    Raises:
        ValueError: ``n_code_groups`` outside 2..32, ``codebook_size`` outside 2..2048.
    """
    if not 2 <= n_code_groups <= 32:
        raise ValueError(f"n_code_groups must be in 2..32, got {n_code_groups}")
    if not 2 <= codebook_size <= 2048:
        raise ValueError(f"codebook_size must be in 2..2048, got {codebook_size}")
    cfg = json.loads((CONFIG_DIR / TINY_CONFIG / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(hidden_size=talker_hidden, intermediate_size=2 * talker_hidden, num_hidden_layers=talker_layers,
                  num_code_groups=n_code_groups)
    talker["code_predictor_config"].update(
        vocab_size=codebook_size, hidden_size=code_predictor_hidden, intermediate_size=2 * code_predictor_hidden,
        num_hidden_layers=code_predictor_layers, num_code_groups=n_code_groups,
        layer_types=["full_attention"] * code_predictor_layers)
    return cfg


def build_from_config(config: dict, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                      attn_implementation: str = "sdpa") -> torch.nn.Module:
    """The official ``Qwen3TTSForConditionalGeneration`` with seeded random weights (:func:`seeded`), in eval mode."""
    Qwen3TTSConfig, Qwen3TTSForConditionalGeneration = _qwen_classes()
    cfg = Qwen3TTSConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    cfg._attn_implementation = attn_implementation
    cfg.talker_config._attn_implementation = attn_implementation
    cfg.talker_config.code_predictor_config._attn_implementation = attn_implementation
    return seeded(seed, lambda: Qwen3TTSForConditionalGeneration(cfg)).to(dtype).eval()


def seeded(seed: int, build):
    """``build()`` with torch's global generator seeded (the official classes initialise from it), the caller's
    random state restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _default_generation(path: Path | None) -> dict:
    src = (path or CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice") / "generation_config.json"
    return json.loads(src.read_text()) if src.exists() else {}


def frame_rate_from_dir(cfg_dir: Path) -> tuple[float, int]:
    """``(frames per second, sample rate)`` of a model folder's ``speech_tokenizer/`` (12.5 Hz, 24 kHz without one)."""
    st = cfg_dir / "speech_tokenizer" / "config.json"
    if st.exists():
        c = json.loads(st.read_text())
        sr = int(c.get("output_sample_rate", 24000))
        return sr / float(c.get("decode_upsample_rate", 1920)), sr
    return 12.5, 24000


def config_dict(model) -> dict:
    """A ``config.json`` dict :func:`build_from_config` rebuilds the model from (``to_diff_dict`` alone does not
    round-trip: the speaker-encoder sub-config's ``model_type`` is refused by its own constructor)."""
    d = model.config.to_diff_dict()
    if isinstance(d.get("speaker_encoder_config"), dict):
        d["speaker_encoder_config"].pop("model_type", None)
    d.pop("_attn_implementation_autoset", None)
    return d


def codec_decoder_config_dict(name: str = "released") -> dict:
    """The ``decoder_config`` of the 12 Hz speech tokenizer, ``"released"`` (shipped in ``data/configs``) or
    ``"tiny"`` (:func:`tiny_codec_decoder_config_dict`); ValueError for another name."""
    if name == "tiny":
        return tiny_codec_decoder_config_dict()
    if name != "released":
        raise ValueError(f"unknown codec decoder config {name!r}: use 'released' or 'tiny'")
    return dict(json.loads((CONFIG_DIR / CODEC_CONFIG / "config.json").read_text())["decoder_config"])


def tiny_codec_decoder_config_dict(*, sliding_window: int = 6) -> dict:
    """A tiny ``decoder_config`` of the official 12 Hz decoder: the released structure and upsampling with small
    widths, 2 layers and a ``sliding_window`` of a few frames (tests stream past it in milliseconds). Layer scale 1
    (released 0.01) so the KV cache visibly changes random-weight audio; initializer range 0.1 (0.02 leaves the output
    near 1e-8, 0.2 saturates the final clamp)."""
    cfg = codec_decoder_config_dict("released")
    cfg.update(latent_dim=32, codebook_dim=16, decoder_dim=64, hidden_size=32, intermediate_size=64,
               head_dim=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2,
               sliding_window=sliding_window, vector_quantization_hidden_dimension=16,
               layer_scale_initial_scale=1.0, initializer_range=0.1)
    return cfg


def build_codec_decoder(config: dict | str = "released", *, seed: int = 0,
                        dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The official 12 Hz speech tokenizer decoder with seeded random weights, in eval mode, for timing and tests
    only (the codebooks, zeros from the official init, filled with normal entries from ``seed``); ``config``: a
    ``decoder_config`` dict or a name of :func:`codec_decoder_config_dict`; ``dtype`` float32 or bfloat16; sdpa
    attention."""
    Config, Decoder = _codec_decoder_classes()
    raw = codec_decoder_config_dict(config) if isinstance(config, str) else dict(config)
    cfg = Config(**raw)
    cfg._attn_implementation = "sdpa"
    decoder = seeded(seed, lambda: Decoder(cfg))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if name.endswith("_codebook.embedding_sum"):
                p.copy_(torch.randn(p.shape, generator=gen))
    return decoder.to(dtype).eval()
