"""The import shim: ``import qwen_tts`` imports its 25 Hz tokenizer, which imports ``torchaudio.compliance.kaldi``
at import time. No PyPI torchaudio wheel loads against the CPU ``torch==2.13.0`` this project pins, and the 12 Hz
path never calls torchaudio. :func:`install_import_shim` registers a stub ``torchaudio`` module ONLY when the real one
cannot be imported; calling anything on the stub raises a clear ``ImportError``. Nothing of qwen-tts is vendored.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import io
import logging
import sys
import types


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

    def _stub_getattr(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _missing

    # transformers must see that no torchaudio is installed before the stub is; imported here, not above, since it
    # takes 3 s and the loader's model_facts (the command line's checks) needs no transformers (measured)
    importlib.import_module("transformers")

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
    logging.getLogger("sox").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module("qwen_tts")


def _qwen_classes():
    """``(Qwen3TTSConfig, Qwen3TTSForConditionalGeneration)``, the official classes (qwen_tts imported on first use:
    it takes seconds)."""
    models = import_qwen_tts().core.models
    return models.Qwen3TTSConfig, models.Qwen3TTSForConditionalGeneration


def _codec_decoder_classes():
    """``(Qwen3TTSTokenizerV2DecoderConfig, Qwen3TTSTokenizerV2Decoder)``: the official 12 Hz speech tokenizer's
    decoder and its config class (``qwen_tts.core.tokenizer_12hz``)."""
    tok = import_qwen_tts().core.tokenizer_12hz
    return (tok.configuration_qwen3_tts_tokenizer_v2.Qwen3TTSTokenizerV2DecoderConfig,
            tok.modeling_qwen3_tts_tokenizer_v2.Qwen3TTSTokenizerV2Decoder)
