"""Model access: real Qwen3-TTS checkpoints, tiny random models, real-size random architectures.

Every model here is the OFFICIAL ``qwen_tts`` class ``Qwen3TTSForConditionalGeneration``, unchanged:

* a hub id (``Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice``) or a local checkpoint directory: loaded with the
  official ``Qwen3TTSModel.from_pretrained`` (weights, processor and 12 Hz speech tokenizer);
* a directory written by ``rvqspec_lib.train.save_checkpoint`` (marker file ``rvqspec_model.json``): our own small
  model, built from its ``config.json`` with weights from ``model.safetensors`` and the text front end (bytes or
  espeak-ng phonemes, ``rvqspec_lib.frontend``) named in the marker; no processor, no speech tokenizer;
* ``tiny-random``: a tiny config of the same classes (2 talker layers, 2 code-predictor layers, 16 code groups,
  a projection between talker and code predictor), seeded random weights, a byte-level text tokenizer. For tests;
* ``qwen3-tts-0.6b-random`` / ``qwen3-tts-1.7b-random``: the real-size architectures built from the released
  ``config.json`` files shipped in ``data/configs/``, with RANDOM weights. Timing depends on the architecture, not on
  the weights, so these are for timing only: their acceptance rates and audio mean nothing.

The import shim: ``import qwen_tts`` imports its 25 Hz tokenizer, which imports ``torchaudio.compliance.kaldi``
at import time. No PyPI torchaudio wheel loads against the CPU ``torch==2.13.0`` this project pins, and the 12 Hz
path never calls torchaudio. :func:`install_import_shim` registers a stub ``torchaudio`` module ONLY when the real one
cannot be imported; calling anything on the stub raises a clear ``ImportError``. Nothing of qwen-tts is vendored.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CONFIG_DIR = DATA_DIR / "configs"

#: Names accepted by :func:`load_model` besides hub ids and local paths.
RANDOM_MODELS = {
    "qwen3-tts-0.6b-random": "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "qwen3-tts-1.7b-random": "Qwen3-TTS-12Hz-1.7B-CustomVoice",
}
TINY_MODELS = ("tiny-random",)


class ModelNotFoundError(ValueError):
    """Raised for a model name that is neither a known offline model, a local checkpoint nor a reachable hub id."""


def install_import_shim() -> bool:
    """Make ``import qwen_tts`` work without a loadable torchaudio.

    Returns:
        ``True`` if the stub was installed, ``False`` if a real torchaudio imported (nothing changed).
    """
    try:
        importlib.import_module("torchaudio.compliance.kaldi")
        return False
    except Exception:  # ImportError, or OSError from a wheel built for another torch
        pass

    def _missing(*_a, **_k):
        raise ImportError(
            "torchaudio is not usable with this torch build; rvqspec installed a stub so that qwen_tts imports. "
            "Only the 25 Hz tokenizer needs it (install a torchaudio matching your torch to use that path)."
        )

    import importlib.machinery

    def _stub_getattr(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _missing

    import transformers  # noqa: F401  (let transformers see that no torchaudio is installed, before the stub)

    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        stub = types.ModuleType(name)
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub.__getattr__ = _stub_getattr  # type: ignore[attr-defined]
        stub.__rvqspec_stub__ = True
        sys.modules[name] = stub
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]  # type: ignore
    return True


def import_qwen_tts():
    """Import ``qwen_tts`` quietly: the shim, the ``sox`` package's missing-binary warning and the 25 Hz
    tokenizer's flash-attn banner (neither concerns the 12 Hz path) are kept off the console."""
    if "qwen_tts" in sys.modules:
        return sys.modules["qwen_tts"]
    install_import_shim()
    import contextlib
    import io
    import logging

    logging.getLogger("sox").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module("qwen_tts")


def _qwen_classes():
    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    return Qwen3TTSConfig, Qwen3TTSForConditionalGeneration


# --------------------------------------------------------------------------------------------------------------------
# Text tokenizer for models without a downloaded processor
# --------------------------------------------------------------------------------------------------------------------
class ByteTokenizer:
    """Offline text tokenizer: UTF-8 bytes as ids 0..255 plus the config's special ids.

    Builds the same chat layout as the official ``_build_assistant_text``:
    ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.
    Used by ``tiny-random`` and the real-size random architectures (which have no processor offline).
    """

    def __init__(self, im_start: int, im_end: int, assistant: int):
        self.im_start, self.im_end, self.assistant = im_start, im_end, assistant
        self.newline = ord("\n")

    def __call__(self, text: str) -> torch.Tensor:
        """Encode one text. Returns ``(1, L)`` int64 ids. Raises ``ValueError`` on empty text."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty: pass the sentence to speak, e.g. --text 'Hello world.'")
        body = list(text.encode("utf-8"))
        ids = [self.im_start, self.assistant, self.newline, *body, self.im_end, self.newline,
               self.im_start, self.assistant, self.newline]
        return torch.tensor([ids], dtype=torch.long)


class ProcessorTokenizer:
    """Wraps the official processor of a real checkpoint (Qwen2 BPE) with the official chat layout."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, text: str) -> torch.Tensor:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty: pass the sentence to speak, e.g. --text 'Hello world.'")
        full = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
        ids = self.processor(text=full, return_tensors="pt", padding=True)["input_ids"]
        return ids if ids.dim() == 2 else ids.unsqueeze(0)


# --------------------------------------------------------------------------------------------------------------------
# Loaded model
# --------------------------------------------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    """A Qwen3-TTS model plus what the frame loop needs around it.

    Attributes:
        name: what the user asked for (hub id, path or offline name).
        kind: ``"checkpoint"`` (trained weights), ``"tiny-random"`` or ``"random-size"`` (timing only).
        model: the official ``Qwen3TTSForConditionalGeneration``.
        tokenizer: ``text -> (1, L) int64`` ids in the official chat layout.
        generation: the checkpoint's ``generation_config.json`` values (dict).
        speech_tokenizer: the official 12 Hz codec wrapper, a :class:`CodecSpeechTokenizer` over our RVQ codec (own
            models with ``codec.safetensors`` beside the weights), or ``None`` (random models: codes go to .npy).
        frame_rate_hz: codec frames per second (output sample rate / samples per frame), 12.5 for 12 Hz models.
        sample_rate_hz: audio sample rate.
    """

    name: str
    kind: str
    model: torch.nn.Module
    tokenizer: Callable[[str], torch.Tensor]
    generation: dict = field(default_factory=dict)
    speech_tokenizer: object | None = None
    frame_rate_hz: float = 12.5
    sample_rate_hz: int = 24000

    @property
    def talker(self):
        return self.model.talker

    @property
    def code_predictor(self):
        """The inner-loop module (``model.talker.code_predictor``, the "MultiCodeDecoder")."""
        return self.model.talker.code_predictor

    @property
    def n_code_groups(self) -> int:
        """Codebooks per frame (16 on released checkpoints): code 0 from the talker, the rest from the code predictor."""
        return int(self.model.config.talker_config.num_code_groups)

    @property
    def codebook_size(self) -> int:
        return int(self.model.config.talker_config.code_predictor_config.vocab_size)

    @property
    def is_random(self) -> bool:
        """True when weights are random: use for timing only, never for acceptance or audio."""
        return self.kind != "checkpoint"

    def describe(self) -> dict:
        """JSON-able summary: parameters per part, sizes, dtype."""
        m = self.model
        n = lambda mod: int(sum(p.numel() for p in mod.parameters()))  # noqa: E731
        cp = self.code_predictor
        return {
            "name": self.name,
            "kind": self.kind,
            "random_weights": self.is_random,
            "dtype": str(next(m.parameters()).dtype).replace("torch.", ""),
            "talker_layers": int(m.config.talker_config.num_hidden_layers),
            "talker_hidden": int(m.config.talker_config.hidden_size),
            "code_predictor_layers": int(cp.config.num_hidden_layers),
            "code_predictor_hidden": int(cp.config.hidden_size),
            "n_code_groups": self.n_code_groups,
            "codebook_size": self.codebook_size,
            "frame_rate_hz": self.frame_rate_hz,
            "params_talker_total": n(m.talker),
            "params_code_predictor": n(cp),
        }


class CodecSpeechTokenizer:
    """The official speech tokenizer's ``decode`` interface over an :class:`rvqspec_lib.codec.RVQCodec`, so the
    frame loop and ``rvqspec synth`` turn codes into audio the same way for our own models as for real checkpoints.

    ``decode([{"audio_codes": (frames, n_codebooks) int64}, ...]) -> ([float32 waveform at sample_rate], sample_rate)``.
    """

    def __init__(self, codec):
        self.codec = codec
        self.sample_rate = int(codec.config.sample_rate)

    def decode(self, items) -> tuple[list, int]:
        wavs = []
        for it in items:
            codes = it["audio_codes"] if isinstance(it, dict) else it
            codes = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else codes
            wavs.append(self.codec.decode(codes))
        return wavs, self.sample_rate


def _frame_rate_from_dir(cfg_dir: Path) -> tuple[float, int]:
    st = cfg_dir / "speech_tokenizer" / "config.json"
    if st.exists():
        c = json.loads(st.read_text())
        sr = int(c.get("output_sample_rate", 24000))
        return sr / float(c.get("decode_upsample_rate", 1920)), sr
    return 12.5, 24000


def tiny_config_dict(
    *,
    n_code_groups: int = 16,
    codebook_size: int = 2048,
    talker_hidden: int = 64,
    code_predictor_hidden: int = 48,
    talker_layers: int = 2,
    code_predictor_layers: int = 2,
) -> dict:
    """Config of a tiny model of the official classes (same structure as a release, small sizes).

    ``code_predictor_hidden != talker_hidden`` exercises ``small_to_mtp_projection`` (as the 1.7B model does).
    Special codec ids are those of the released checkpoints, so ``codebook_size`` must stay below 2048 + 1
    (code ids 0..codebook_size-1 never collide with specials at 2048+). Text special ids are remapped to 256..
    so that a byte tokenizer fits a 264-entry text vocabulary.
    """
    if not 2 <= n_code_groups <= 32:
        raise ValueError(f"n_code_groups must be in 2..32, got {n_code_groups}")
    if not 2 <= codebook_size <= 2048:
        raise ValueError(f"codebook_size must be in 2..2048, got {codebook_size}")
    head_dim = 16
    return {
        "tts_model_type": "custom_voice",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "tiny",
        "im_start_token_id": 256,
        "im_end_token_id": 257,
        "assistant_token_id": 258,
        "tts_pad_token_id": 259,
        "tts_bos_token_id": 260,
        "tts_eos_token_id": 261,
        "talker_config": {
            "vocab_size": 3072,
            "hidden_size": talker_hidden,
            "intermediate_size": 2 * talker_hidden,
            "num_hidden_layers": talker_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_code_groups": n_code_groups,
            "text_hidden_size": 32,
            "text_vocab_size": 264,
            "rope_theta": 1000000,
            "rope_scaling": {"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
            "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
            "codec_language_id": {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055,
                                  "japanese": 2058, "russian": 2069},
            "spk_id": {"tiny": 3000},
            "spk_is_dialect": {"tiny": False},
            "code_predictor_config": {
                "vocab_size": codebook_size,
                "hidden_size": code_predictor_hidden,
                "intermediate_size": 2 * code_predictor_hidden,
                "num_hidden_layers": code_predictor_layers,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": head_dim,
                "num_code_groups": n_code_groups,
                "rope_theta": 1000000,
                "layer_types": ["full_attention"] * code_predictor_layers,
            },
        },
    }


def build_from_config(config: dict, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                      attn_implementation: str = "sdpa") -> torch.nn.Module:
    """Instantiate the official ``Qwen3TTSForConditionalGeneration`` with seeded random weights.

    The global RNG is saved and restored around the initialisation, so the caller's random state is untouched.
    """
    Qwen3TTSConfig, Qwen3TTSForConditionalGeneration = _qwen_classes()
    cfg = Qwen3TTSConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    cfg._attn_implementation = attn_implementation
    cfg.talker_config._attn_implementation = attn_implementation
    cfg.talker_config.code_predictor_config._attn_implementation = attn_implementation
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3TTSForConditionalGeneration(cfg)
    finally:
        torch.random.set_rng_state(state)
    return model.to(dtype).eval()


def _default_generation(path: Path | None) -> dict:
    src = path / "generation_config.json" if path else CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "generation_config.json"
    return json.loads(src.read_text()) if src.exists() else {}


def load_model(name: str, *, dtype: torch.dtype | str = torch.float32, seed: int = 0, device: str = "cpu",
               attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a Qwen3-TTS model by name.

    Args:
        name: ``"embedded"`` (the small trained model shipped in ``data/embedded/model``, see its MODEL_CARD.md),
            ``"tiny-random"``, ``"qwen3-tts-0.6b-random"``, ``"qwen3-tts-1.7b-random"``, a local checkpoint
            directory, or a hub id such as ``"Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"`` (needs the network or the HF cache).
        dtype: ``torch.float32`` (default), ``torch.float64``, ``torch.bfloat16`` or their names.
        seed: seed of the random weights (random models only; the global RNG is left as it was).
        device: torch device string.

    Returns:
        :class:`LoadedModel`.

    Raises:
        ModelNotFoundError: unknown name, or a hub id that cannot be fetched (message names the offline choices).
    """
    if isinstance(dtype, str):
        try:
            dtype = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64,
                     "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16}[dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}: use float32, float64, bfloat16 or float16") from None
    if not isinstance(name, str) or not name:
        raise ModelNotFoundError("no model given: name one, e.g. 'embedded', 'tiny-random', "
                                 "'qwen3-tts-0.6b-random', a hub id or a checkpoint folder")
    if name in TINY_MODELS:
        cfg = tiny_config_dict()
        model = build_from_config(cfg, seed=seed, dtype=dtype, attn_implementation=attn_implementation).to(device)
        tok = ByteTokenizer(cfg["im_start_token_id"], cfg["im_end_token_id"], cfg["assistant_token_id"])
        return LoadedModel(name, "tiny-random", model, tok, _default_generation(None))
    if name == EMBEDDED_MODEL:
        d = EMBEDDED_DIR / "model"
        if not (d / OWN_MODEL_MARKER).is_file():
            raise ModelNotFoundError(
                f"the embedded model is missing ({d / OWN_MODEL_MARKER} not found): it ships with the repository "
                "(git checkout data/embedded) or is rebuilt by `make embedded` (scripts/build_embedded.py)")
        return _load_own_model(name, d, dtype, device, attn_implementation)
    if name in RANDOM_MODELS:
        d = CONFIG_DIR / RANDOM_MODELS[name]
        cfg = json.loads((d / "config.json").read_text())
        model = build_from_config(cfg, seed=seed, dtype=dtype, attn_implementation=attn_implementation).to(device)
        # a real-size text vocab: bytes are valid ids, special ids are the real ones
        tok = ByteTokenizer(cfg["im_start_token_id"], cfg["im_end_token_id"], cfg["assistant_token_id"])
        fr, sr = _frame_rate_from_dir(d)
        return LoadedModel(name, "random-size", model, tok, _default_generation(d), None, fr, sr)
    path = Path(name).expanduser()
    if path.exists():
        if (path / OWN_MODEL_MARKER).exists():  # a small model trained by rvqspec_lib.train
            return _load_own_model(name, path, dtype, device, attn_implementation)
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} has no config.json: point --model at a Qwen3-TTS checkpoint directory")
        return _load_checkpoint(str(path), path, dtype, device, attn_implementation)
    if "/" in name and not name.startswith((".", "/")):
        return _load_checkpoint(name, None, dtype, device, attn_implementation)
    raise ModelNotFoundError(
        f"unknown model {name!r}: use one of {', '.join((EMBEDDED_MODEL,) + TINY_MODELS + tuple(RANDOM_MODELS))}, "
        "a local checkpoint "
        "directory, or a hub id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    )


#: Name of the small trained model that ships with the repository (``load_model("embedded")``).
EMBEDDED_MODEL = "embedded"
#: Where it lives: ``model/`` (the checkpoint), ``codec.safetensors``, ``utterances.safetensors`` (+ ``.jsonl``),
#: ``eval.json`` and ``MODEL_CARD.md``, all written by ``make embedded``.
#: ``RVQSPEC_EMBEDDED_DIR`` points it at another build (e.g. ``build/embedded-smoke``).
EMBEDDED_DIR = Path(os.environ.get("RVQSPEC_EMBEDDED_DIR") or
                    Path(__file__).resolve().parent.parent / "data" / "embedded").expanduser()

#: Marker file of a checkpoint written by :func:`rvqspec_lib.train.save_checkpoint` (no processor, no codec):
#: ``{"format": "rvqspec-model", "version": 1, "tokenizer": {"kind": "bytes" | "phonemes", ...}, ...}``.
OWN_MODEL_MARKER = "rvqspec_model.json"


def _load_own_model(name: str, path: Path, dtype, device, attn_implementation) -> LoadedModel:
    """Our own small model: the official class built from ``config.json``, weights from ``model.safetensors``,
    the text front end named in ``rvqspec_model.json`` (bytes or espeak-ng phonemes, see rvqspec_lib.frontend)."""
    from safetensors.torch import load_model as load_weights

    from .frontend import tokenizer_from_spec

    marker = json.loads((path / OWN_MODEL_MARKER).read_text())
    cfg = json.loads((path / "config.json").read_text())
    weights = path / "model.safetensors"
    if not weights.exists():
        raise ModelNotFoundError(f"{path} has {OWN_MODEL_MARKER} but no model.safetensors")
    langs = marker.get("languages")  # the languages it was trained on: others are refused by the prompt builder
    if langs:
        ids = cfg["talker_config"].get("codec_language_id") or {}
        cfg["talker_config"]["codec_language_id"] = {k: v for k, v in ids.items() if k in langs}
    model = build_from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    load_weights(model, str(weights), strict=True)
    tok = tokenizer_from_spec(marker.get("tokenizer", {"kind": "bytes"}), cfg)
    fr, sr = float(marker.get("frame_rate_hz", 12.5)), int(marker.get("sample_rate_hz", 24000))
    speech = None
    codec_file = path / marker.get("codec", "codec.safetensors")  # the embedded model's is ../codec.safetensors
    if "codec" in marker and not codec_file.is_file():
        raise ModelNotFoundError(f"{path / OWN_MODEL_MARKER} names its codec {marker['codec']!r}, but {codec_file} is "
                                 "missing: restore it (git checkout data/embedded) or rebuild with `make embedded`")
    if codec_file.is_file():
        from .codec import RVQCodec

        speech = CodecSpeechTokenizer(RVQCodec.load(codec_file))
    return LoadedModel(name, "checkpoint", model.to(device).eval(), tok, _default_generation(path), speech, fr, sr)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick TCP connection to the hub endpoint (no retries), so an offline machine fails in seconds."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    u = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _check_hub_id(name: str) -> None:
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str) or constants.HF_HUB_OFFLINE:
        return  # in the local cache (or offline mode asked for: transformers reports what is missing)
    if not _hub_reachable():
        raise ModelNotFoundError(
            f"{name!r} is not in the local Hugging Face cache and the hub cannot be reached from this machine. "
            "Download it where there is a network (huggingface-cli download ...) and pass the local directory, or "
            "use --model tiny-random / qwen3-tts-0.6b-random for timing."
        )


def _load_checkpoint(name: str, path: Path | None, dtype, device, attn_implementation) -> LoadedModel:
    if path is None:
        _check_hub_id(name)
    import_qwen_tts()
    try:
        from qwen_tts import Qwen3TTSModel

        wrapper = Qwen3TTSModel.from_pretrained(name, torch_dtype=dtype, device_map=device,
                                                attn_implementation=attn_implementation)
    except OSError as e:  # hub unreachable, missing files
        raise ModelNotFoundError(
            f"could not load checkpoint {name!r} ({e.__class__.__name__}: {str(e).splitlines()[0][:200]}). "
            "Offline, download it first (huggingface-cli download ...) and pass the local directory, or use "
            "--model tiny-random / qwen3-tts-0.6b-random for timing."
        ) from e
    model = wrapper.model.eval()
    gen = dict(getattr(wrapper, "generate_defaults", None) or {})
    if path is not None and (path / "generation_config.json").exists():
        gen = json.loads((path / "generation_config.json").read_text())
    st = getattr(model, "speech_tokenizer", None)
    fr, sr = 12.5, 24000
    if path is not None:
        fr, sr = _frame_rate_from_dir(path)
    return LoadedModel(name, "checkpoint", model, ProcessorTokenizer(wrapper.processor), gen, st, fr, sr)
