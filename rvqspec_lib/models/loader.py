"""Model access: every model is the OFFICIAL ``qwen_tts`` class ``Qwen3TTSForConditionalGeneration``, unchanged,
loaded from a hub id or checkpoint folder (``from_pretrained``), from one of our own folders (:func:`save_checkpoint`,
the embedded model), or built with seeded random weights: ``tiny-random`` for tests, the real-size architectures
for timing only (docs/offline.md#real-size-architectures-for-timing).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError
from safetensors.torch import load_model as load_weights
from safetensors.torch import save_model

from rvqspec_lib.common.files import json_text, usual_mode
from rvqspec_lib.common.machine import load_dtype, on_cpu, resolve_device
from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.models.configs import (
    CONFIG_DIR,
    RANDOM_MODELS,
    TINY_MODELS,
    _default_generation,
    frame_rate_from_dir,
    build_from_config,
    config_dict,
    tiny_config_dict,
)
from rvqspec_lib.models.frontend import ByteTokenizer, ProcessorTokenizer, tokenizer_from_spec, tokenizer_spec
from rvqspec_lib.models.rvq_codec import RVQCodec
from rvqspec_lib.models.shim import import_qwen_tts
from rvqspec_lib.models.speech_tokenizers import CodecSpeechTokenizer


class ModelNotFoundError(ValueError):
    """Raised for a model name that is neither a known offline model, a local checkpoint nor a reachable hub id."""


@dataclass
class LoadedModel:
    """A Qwen3-TTS model plus what the frame loop needs around it.

    Attributes:
        name: as asked for. kind: ``"checkpoint"``, ``"tiny-random"``, ``"random-size"`` (timing only) or
            ``"random-checkpoint"`` (a folder marked ``RANDOM_WEIGHTS``). model: the official
            ``Qwen3TTSForConditionalGeneration``. tokenizer: ``text -> (1, L) int64`` ids.
        generation: ``generation_config.json``'s values. speech_tokenizer: the codec, ``None`` for random models.
        folder: the model's own folder (``None``: random models, hub ids); its ``drafters/``, ``trees/`` and spoken
            utterances: :func:`rvqspec_lib.models.drafter_files.model_drafter_dir`.
        device: where it runs (``cpu``, ``cuda``, ``cuda:N``, ``mps``). dtype: its weights' dtype (``float32``,
            ``bfloat16`` ...), by the rule of :func:`rvqspec_lib.common.machine.load_dtype` unless asked for.
    """

    name: str
    kind: str
    model: torch.nn.Module
    tokenizer: Callable[[str], torch.Tensor]
    generation: dict = field(default_factory=dict)
    speech_tokenizer: object | None = None
    frame_rate_hz: float = 12.5
    sample_rate_hz: int = 24000
    folder: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def talker(self):
        return self.model.talker

    @property
    def code_predictor(self):
        """The inner-loop module (``model.talker.code_predictor``, the "MultiCodeDecoder")."""
        return self.model.talker.code_predictor

    @property
    def n_code_groups(self) -> int:
        """Codebooks per frame (16 on released checkpoints)."""
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
            "device": self.device,
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


#: ``dtype=`` names :func:`load_model` takes besides torch dtypes (``auto``: :func:`~rvqspec_lib.common.machine.load_dtype`).
DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def load_model(name: str, *, dtype: torch.dtype | str = "auto", seed: int = 0, device: str = "auto",
               attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a Qwen3-TTS model by name, on a device and in a dtype (docs/model.md#device-and-dtype).

    Args:
        name: ``"embedded"`` (the small trained model shipped in ``data/embedded/model``), ``"tiny-random"``,
            ``"qwen3-tts-0.6b-random"``, ``"qwen3-tts-1.7b-random"``, a local checkpoint folder, or a hub id such as
            ``"Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"`` (needs the network or the HF cache).
        dtype: a torch float dtype or its name, or ``"auto"``: the dtype the weights are stored in (bfloat16 for the
            released checkpoints; float32 for the embedded model and the models built with random weights) where
            the device runs it well, else float32 (:func:`~rvqspec_lib.common.machine.load_dtype`); our own models
            (trained in float32, stored in float16 to keep the repository small) are float32.
        seed: of random weights (the global RNG is left as it was).
        device: ``"auto"`` (CUDA, then Apple's MPS, then the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``.

    Returns:
        :class:`LoadedModel`, its ``device`` and ``dtype`` recorded.

    Raises:
        ModelNotFoundError: an unknown name, a hub id that cannot be fetched, a config :func:`_check_config` refuses
            (one line). ValueError: an unknown dtype name, a device not present, damaged weights.
    """
    if isinstance(dtype, str) and dtype != "auto":
        try:
            dtype = DTYPE_NAMES[dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}: use auto, float32, float64, bfloat16 or float16") from None
    device = resolve_device(device)
    kind, path = _resolve(name)
    name = str(name)  # a path given as a Path is named by its text, as a str path would be
    if dtype == "auto":  # the rule, from the weights' header ("auto" left: a hub id not in the cache)
        dtype = DTYPE_NAMES.get(auto_dtype(name, device), "auto")
    if kind in ("tiny", "random"):
        cfg = tiny_config_dict() if kind == "tiny" else json.loads((path / "config.json").read_text())
        model = build_from_config(cfg, seed=seed, dtype=dtype, attn_implementation=attn_implementation)
        # bytes are valid ids of any text vocabulary; the special ids are the real ones
        tok = ByteTokenizer(cfg["im_start_token_id"], cfg["im_end_token_id"], cfg["assistant_token_id"])
        fr, sr = (12.5, 24000) if path is None else frame_rate_from_dir(path)
        return _placed(LoadedModel(name, "tiny-random" if kind == "tiny" else "random-size", model, tok,
                                   _default_generation(path), None, fr, sr), device)
    if kind == "own":  # the embedded model or one by recipes.embedded: float32, stored in float16 only to be small
        return _placed(_load_own_model(name, path, dtype, device, attn_implementation), device, path)
    if kind == "checkpoint":
        _read_config(path / "config.json")  # a folder that is not a Qwen3-TTS checkpoint: one line, before loading
        _check_speech_tokenizer(path)
    lm = _check_loaded(_load_checkpoint(str(path or name), path, dtype, device, attn_implementation))
    if dtype == "auto":  # a hub id not cached: the dtype stored, as transformers reads it, then the rule
        lm.model.to(load_dtype(next(lm.model.parameters()).dtype, device))
    return _placed(lm, device, path)


def auto_dtype(name: str, device: str) -> str | None:
    """The name of the dtype ``load_model(name, dtype="auto", device=device)`` loads in (``float32``, ``bfloat16``,
    ...), from the weights' header alone (:func:`stored_dtype`; nothing loaded). ``device``: resolved (``cpu``,
    ``cuda[:N]``, ``mps``). ``None``: a hub id whose weights are not in the local cache (known once loaded).

    Raises:
        ModelNotFoundError: as :func:`load_model`.
    """
    kind, path = _resolve(name)
    stored = stored_dtype(path if kind == "checkpoint" else name) if kind in ("checkpoint", "hub") else None
    if kind == "hub" and stored is None:
        return None
    return str(load_dtype(stored, device)).replace("torch.", "")


def _placed(lm: LoadedModel, device: str, folder: Path | None = None) -> LoadedModel:
    """``lm`` on ``device`` (a no-op where it was loaded there), its device, dtype and ``folder`` recorded."""
    lm.folder = folder
    if next(lm.model.parameters()).device != torch.device(device):
        lm.model.to(device)
    lm.device, lm.dtype = device, str(next(lm.model.parameters()).dtype).replace("torch.", "")
    return lm


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def checkpoint_on_cpu(model, device: str = "auto") -> bool:
    """Whether ``model`` is a released checkpoint (:func:`is_checkpoint`) that would run on the CPU (``device``
    resolved as :func:`load_model` does: ``auto`` is the CPU on a machine with neither CUDA nor Apple's GPU): where a
    full ``make paper`` on it takes the notebooks' CPU sizes (paper.checkpoint.takes_cpu_sizes, tools.paper_run's
    projection). Raises ValueError: a device that is not present (one line)."""
    return is_checkpoint(model) and on_cpu(device)


def stored_dtype(model: str | os.PathLike) -> torch.dtype | None:
    """The float dtype a model's weights are stored in, from the header of its ``model.safetensors`` (or the first
    shard a ``model.safetensors.index.json`` names): a folder, or a hub id in the local Hugging Face cache; the
    most common float dtype among its tensors. ``None``: no such file here, or no float tensor."""
    p = Path(model).expanduser()
    if p.is_dir():
        file, index = p / "model.safetensors", p / "model.safetensors.index.json"
    else:
        cached = try_to_load_from_cache(str(model), "model.safetensors")
        file = Path(cached) if isinstance(cached, str) else None
        cached = try_to_load_from_cache(str(model), "model.safetensors.index.json")
        index = Path(cached) if isinstance(cached, str) else None
    if (file is None or not file.is_file()) and index is not None and index.is_file():
        try:
            shard = sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
        except (ValueError, KeyError, IndexError):
            return None
        file = index.parent / shard
    if file is None or not file.is_file():
        return None
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n < 1 << 28 else {}
    except (OSError, ValueError):
        return None
    counts: dict = {}
    for k, v in header.items():
        d = _SAFETENSORS_DTYPES.get(v.get("dtype")) if k != "__metadata__" and isinstance(v, dict) else None
        if d is not None:
            counts[d] = counts.get(d, 0) + 1
    return max(counts, key=counts.get) if counts else None


def is_checkpoint(model) -> bool:
    """A released-layout checkpoint folder or a hub id (not the embedded model, our own builds, nor the random-weight
    timing models built in memory); never raises."""
    try:
        kind, _ = _resolve(str(model))
    except ModelNotFoundError:
        return False
    return kind in ("checkpoint", "hub")


def _resolve(name) -> tuple[str, Path | None]:
    """``(kind, folder)``: ``tiny``, ``own`` (embedded or :func:`save_checkpoint`'s), ``random``, ``checkpoint`` or
    ``hub``; ModelNotFoundError (one line) for a name that is none of them."""
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise ModelNotFoundError("no model given: name one, e.g. 'embedded', 'tiny-random', "
                                 "'qwen3-tts-0.6b-random', a hub id or a checkpoint folder")
    name = str(name)
    if name in TINY_MODELS:
        return "tiny", None
    if name == EMBEDDED_MODEL:
        d = EMBEDDED_DIR / "model"
        if not (d / OWN_MODEL_MARKER).is_file():
            raise ModelNotFoundError(
                f"the embedded model is missing ({d / OWN_MODEL_MARKER} not found): it ships with the repository "
                "(git checkout data/embedded) or is rebuilt by `make embedded` (recipes/embedded/build.py)")
        return "own", d
    if name in RANDOM_MODELS:
        return "random", CONFIG_DIR / RANDOM_MODELS[name]
    path = Path(name).expanduser()
    if path.exists():
        if (path / OWN_MODEL_MARKER).exists():  # a small model trained by recipes.embedded
            return "own", path
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} has no config.json: point --model at a Qwen3-TTS checkpoint directory")
        return "checkpoint", path
    if "/" in name and not name.startswith((".", "/", "~")) and not (
            Path(name.split("/")[0]).is_dir() and not isinstance(try_to_load_from_cache(name, "config.json"), str)):
        return "hub", None  # owner/name, unless its first part is a folder here and the hub cache has no such id
    if name.startswith((".", "/", "~")) or os.sep in name:
        raise ModelNotFoundError(f"--model folder {path} does not exist: check the path, or use {EMBEDDED_MODEL} or "
                                 "a hub id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    raise ModelNotFoundError(
        f"unknown model {name!r}: use one of {', '.join((EMBEDDED_MODEL,) + TINY_MODELS + tuple(RANDOM_MODELS))}, "
        "a local checkpoint "
        "directory, or a hub id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    )


#: ``model_type`` of a Qwen3-TTS ``config.json`` (what ``from_pretrained`` dispatches on).
QWEN3_TTS_MODEL_TYPE = "qwen3_tts"


def _check_config(cfg, where: str, *, own: bool = False) -> dict:
    """Return a ``config.json`` dict once checked to be a Qwen3-TTS config this library runs (``model_type``, absent
    allowed for ``own`` models; a ``code_predictor_config``; at least 2 code groups); else ModelNotFoundError."""
    expected = f"expected a Qwen3-TTS config (model_type {QWEN3_TTS_MODEL_TYPE!r} with a talker_config)"
    if not isinstance(cfg, dict):
        raise ModelNotFoundError(f"{where} is not a JSON object: {expected}")
    mt = cfg.get("model_type")
    if mt is None and not own:
        raise ModelNotFoundError(f"{where} has no model_type: {expected}; point --model at a Qwen3-TTS checkpoint")
    if mt is not None and mt != QWEN3_TTS_MODEL_TYPE:
        raise ModelNotFoundError(f"{where} is a {mt!r} config, not Qwen3-TTS: {expected}; point --model at a "
                                 "Qwen3-TTS checkpoint")
    talker = cfg.get("talker_config")
    cp = talker.get("code_predictor_config") if isinstance(talker, dict) else None
    if not isinstance(cp, dict):
        raise ModelNotFoundError(f"{where} has no talker_config.code_predictor_config: {expected}")
    groups = talker.get("num_code_groups", cp.get("num_code_groups"))
    if groups is not None and int(groups) < 2:
        raise ModelNotFoundError(_one_group_message(where, int(groups)))
    return cfg


def _one_group_message(where: str, groups: int) -> str:
    return (f"{where} has num_code_groups {groups}: the talker emits every code of a frame and the inner loop has "
            "nothing to decode (rvqspec needs num_code_groups >= 2)")


def _read_config(file: Path, *, own: bool = False) -> dict:
    """``config.json`` read and checked (:func:`_check_config`); a file that is not JSON is a one-line error."""
    try:
        cfg = json.loads(Path(file).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelNotFoundError(f"{file} is not valid JSON ({e}): expected a Qwen3-TTS config.json") from None
    return _check_config(cfg, str(file), own=own)


#: The folder of a Qwen3-TTS checkpoint that holds its 12 Hz speech tokenizer (the codec that turns codes into audio),
#: and the file the official ``from_pretrained`` looks for first.
SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def _check_speech_tokenizer(path: str | os.PathLike) -> None:
    """A ModelNotFoundError naming the fix when a checkpoint folder lacks ``speech_tokenizer/config.json``."""
    st = Path(path) / SPEECH_TOKENIZER_DIR
    if not (st / "config.json").is_file():
        what = "has no config.json" if st.is_dir() else "is missing"
        raise ModelNotFoundError(
            f"{st}/ {what}: a Qwen3-TTS checkpoint folder keeps its 12 Hz speech tokenizer there (config.json, "
            f"model.safetensors, preprocessor_config.json); copy the release's {SPEECH_TOKENIZER_DIR}/ folder into "
            f"{Path(path)} (a complete copy of the checkpoint has it)")


def _check_loaded(lm: LoadedModel) -> LoadedModel:
    """The config checks of :func:`_check_config` that only a loaded model can answer (hub ids not in the cache)."""
    if lm.n_code_groups < 2:
        raise ModelNotFoundError(_one_group_message(str(lm.name), lm.n_code_groups))
    return lm


@dataclass(frozen=True)
class ModelFacts:
    """What a model's config says, read WITHOUT loading weights, to check the command line's flags first
    (``languages``: what ``language=`` accepts besides ``"auto"``; ``speakers``: CustomVoice's; both lower case,
    sorted; ``offline_codec``: an RVQ codec file lies beside it)."""

    name: str
    kind: str
    n_code_groups: int
    codebook_size: int
    languages: tuple[str, ...]
    speakers: tuple[str, ...]
    offline_codec: bool = False


def model_facts(name: str) -> ModelFacts | None:
    """:class:`ModelFacts` from the ``config.json`` (no weights, no network); ``None`` for a hub id not in the local
    cache.

    Raises:
        ModelNotFoundError: as :func:`load_model`.
    """
    kind, path = _resolve(name)
    codec = False
    if kind == "tiny":
        cfg, lm_kind = tiny_config_dict(), "tiny-random"
    elif kind == "random":
        cfg, lm_kind = _read_config(path / "config.json"), "random-size"
    elif kind == "own":
        (cfg, marker), lm_kind = _own_config(path), "checkpoint"
        codec = (path / marker.get("codec", "codec.safetensors")).is_file()
    elif kind == "checkpoint":
        cfg, lm_kind = _read_config(path / "config.json"), "checkpoint"
        _check_speech_tokenizer(path)
    else:
        cached = try_to_load_from_cache(str(name), "config.json")
        if not isinstance(cached, str):
            return None
        cfg, lm_kind = _read_config(Path(cached)), "checkpoint"
    talker = cfg["talker_config"]
    cp = talker["code_predictor_config"]
    return ModelFacts(
        name=str(name), kind=lm_kind,
        n_code_groups=int(talker.get("num_code_groups", cp.get("num_code_groups", 16))),
        codebook_size=int(cp.get("vocab_size", 2048)),
        languages=tuple(sorted(k.lower() for k in (talker.get("codec_language_id") or {}))),
        speakers=tuple(sorted(k.lower() for k in (talker.get("spk_id") or {}))),
        offline_codec=codec,
    )


#: Name of the small trained model that ships with the repository (``load_model("embedded")``).
EMBEDDED_MODEL = "embedded"
#: Where it lives (``model/``, ``codec.safetensors``, the shipped utterances, ``eval.json``, ``MODEL_CARD.md``: written
#: by ``make embedded``); ``RVQSPEC_EMBEDDED_DIR`` points it at another build.
EMBEDDED_DIR = Path(os.environ.get("RVQSPEC_EMBEDDED_DIR") or DATA_DIR / "embedded").expanduser()
#: Marker file of a checkpoint folder with random weights (the tiny test checkpoint): kind ``"random-checkpoint"``.
RANDOM_WEIGHTS_MARKER = "RANDOM_WEIGHTS"
#: Marker file of a checkpoint written by :func:`save_checkpoint`: ``{"format": "rvqspec-model", "version": 1,
#: "tokenizer": {"kind": "bytes" | "phonemes", ...}, ...}``.
OWN_MODEL_MARKER = "rvqspec_model.json"


def _own_config(path: Path) -> tuple[dict, dict]:
    """``(config, marker)`` of our own model's folder, the config's languages cut to those it was trained on."""
    marker = json.loads((path / OWN_MODEL_MARKER).read_text())
    cfg = _read_config(path / "config.json", own=True)
    if marker.get("languages"):
        ids = cfg["talker_config"].get("codec_language_id") or {}
        cfg["talker_config"]["codec_language_id"] = {k: v for k, v in ids.items() if k in marker["languages"]}
    return cfg, marker


def _load_own_model(name: str, path: Path, dtype, device, attn_implementation) -> LoadedModel:
    """Our own small model: the official class from ``config.json``, ``model.safetensors``, the marker's text front
    end and codec."""
    cfg, marker = _own_config(path)
    weights = path / "model.safetensors"
    if not weights.exists():
        raise ModelNotFoundError(f"{path} has {OWN_MODEL_MARKER} but no model.safetensors")
    model = build_from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    try:
        load_weights(model, str(weights), strict=True)
    except SafetensorError as e:
        raise ValueError(f"model weights {weights} are damaged ({e}): copy the file again (git checkout "
                         "data/embedded) or rebuild it (`make embedded`)") from None
    tok = tokenizer_from_spec(marker.get("tokenizer", {"kind": "bytes"}), cfg)
    fr, sr = float(marker.get("frame_rate_hz", 12.5)), int(marker.get("sample_rate_hz", 24000))
    speech = None
    codec_file = path / marker.get("codec", "codec.safetensors")  # the embedded model's is ../codec.safetensors
    if "codec" in marker and not codec_file.is_file():
        raise ModelNotFoundError(f"{path / OWN_MODEL_MARKER} names its codec {marker['codec']!r}, but {codec_file} is "
                                 "missing: restore it (git checkout data/embedded) or rebuild with `make embedded`")
    if codec_file.is_file():
        speech = CodecSpeechTokenizer(RVQCodec.load(codec_file))
    return LoadedModel(name, "checkpoint", model.to(device).eval(), tok, _default_generation(path), speech, fr, sr)


def _check_hub_id(name: str) -> None:
    """A hub id not in the local cache needs the hub: a one-line error in seconds when one quick TCP connection to
    the hub endpoint (no retries) fails."""
    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str) or hub_constants.HF_HUB_OFFLINE:
        return  # in the local cache (or offline mode asked for: transformers reports what is missing)
    u = urlparse(hub_constants.ENDPOINT)
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=3.0).close()
    except OSError:
        raise ModelNotFoundError(
            f"{name!r} is not in the local Hugging Face cache and the hub cannot be reached from this machine. "
            "Download it where there is a network (huggingface-cli download ...) and pass the local directory, or "
            "use --model tiny-random / qwen3-tts-0.6b-random for timing."
        ) from None


def _load_checkpoint(name: str, path: Path | None, dtype, device, attn_implementation) -> LoadedModel:
    """A released checkpoint through the official ``Qwen3TTSModel.from_pretrained``."""
    if path is None:
        _check_hub_id(name)
    try:
        wrapper = import_qwen_tts().Qwen3TTSModel.from_pretrained(name, dtype=dtype, device_map=device,
                                                attn_implementation=attn_implementation)
    except OSError as e:  # hub unreachable, missing files
        raise ModelNotFoundError(
            f"could not load checkpoint {name!r} ({e.__class__.__name__}: {str(e).splitlines()[0][:200]}). "
            "Offline, download it first (huggingface-cli download ...) and pass the local directory, or use "
            "--model tiny-random / qwen3-tts-0.6b-random for timing."
        ) from e
    model = wrapper.model.eval()
    _speech_tokenizer_in_its_dtype(model, path / SPEECH_TOKENIZER_DIR if path is not None else None, name, device)
    gen = dict(getattr(wrapper, "generate_defaults", None) or {})
    if path is not None and (path / "generation_config.json").exists():
        gen = json.loads((path / "generation_config.json").read_text())
    st = getattr(model, "speech_tokenizer", None)
    fr, sr = 12.5, 24000
    if path is not None:
        fr, sr = frame_rate_from_dir(path)
    kind = "random-checkpoint" if path is not None and (path / RANDOM_WEIGHTS_MARKER).is_file() else "checkpoint"
    return LoadedModel(name, kind, model, ProcessorTokenizer(wrapper.processor), gen, st, fr, sr)


def _speech_tokenizer_in_its_dtype(model, folder: Path | None, name: str, device: str) -> None:
    """The official ``from_pretrained`` loads the speech tokenizer in the model's dtype; the rule gives it its own
    (float32 in the release: a bfloat16 codec rounds every sample to 8 bits of mantissa, audible): loaded again from
    its folder (or the hub cache) where they differ. Nothing happens where its folder cannot be found here."""
    st = getattr(model, "speech_tokenizer", None)
    if st is None or getattr(st, "model", None) is None:
        return
    if folder is None:
        cached = try_to_load_from_cache(name, f"{SPEECH_TOKENIZER_DIR}/config.json")
        folder = Path(cached).parent if isinstance(cached, str) else None
    if folder is None:
        return
    want = load_dtype(stored_dtype(folder), device)
    if next(st.model.parameters()).dtype == want:
        return
    st.model = None  # the copy in the model's dtype freed before its replacement loads
    model.load_speech_tokenizer(import_qwen_tts().Qwen3TTSTokenizer.from_pretrained(str(folder), dtype=want,
                                                                                     device_map=device))


def save_checkpoint(lm: LoadedModel, out_dir: str | Path, *, extra: dict | None = None) -> Path:
    """Write a folder :func:`load_model` loads: ``model.safetensors``, ``config.json``, ``generation_config.json`` and
    the marker (text front end, frame rate, ``extra`` training metadata). Returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    marker = {"format": "rvqspec-model", "version": 1, "tokenizer": tokenizer_spec(lm.tokenizer),
              "frame_rate_hz": lm.frame_rate_hz, "sample_rate_hz": lm.sample_rate_hz, "training": extra or {}}
    gen = lm.generation or _default_generation(None)
    save_model(lm.model, str(out / "model.safetensors"))
    usual_mode(out / "model.safetensors")
    (out / "config.json").write_text(json_text(config_dict(lm.model), indent=2))
    (out / "generation_config.json").write_text(json_text(gen, indent=2))
    (out / OWN_MODEL_MARKER).write_text(json_text(marker, indent=2))
    return out
