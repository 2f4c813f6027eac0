"""The import shim: ``import qwen_tts`` imports its 25 Hz tokenizer, which imports ``torchaudio.compliance.kaldi``
at import time. No PyPI torchaudio wheel loads against the CPU ``torch==2.13.0`` this project pins, and the 12 Hz
path never calls torchaudio. :func:`install_import_shim` registers a stub ``torchaudio`` module ONLY when the real one
cannot be imported; calling anything on the stub raises a clear ``ImportError``. Nothing of qwen-tts is vendored.
"""

from __future__ import annotations

import importlib
import importlib.machinery
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


def _codec_decoder_classes():
    """The official 12 Hz speech tokenizer's decoder and its config class (``qwen_tts.core.tokenizer_12hz``)."""
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2DecoderConfig
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    return Qwen3TTSTokenizerV2DecoderConfig, Qwen3TTSTokenizerV2Decoder

