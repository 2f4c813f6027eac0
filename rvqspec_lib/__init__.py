"""rvqspec: lossless speculative decoding of the RVQ inner loop of Qwen3-TTS.

Public API:
    decode_frame, AR, Chain, Tree, FrameResult  (the inner-loop decoders, rvqspec_lib.decoding.decode / .decoders)
    Sampling                                    (transformers-identical warpers, rvqspec_lib.decoding.sampling)
    load_model, LoadedModel, ModelNotFoundError (checkpoints, tiny-random, real-size random, rvqspec_lib.models.loader)
    DraftTree, parse_paths                      (trees as data, rvqspec_lib.decoding.trees)
    parse_decoder_name                          (the one grammar of decoder names, rvqspec_lib.decoding.decoder_names)

The names are resolved lazily (PEP 562 module ``__getattr__``): ``import rvqspec_lib`` (and so the ``rvqspec``
command's ``--help``) does not import torch or transformers; the first use of a name imports its module.
"""

from __future__ import annotations

import importlib

#: public name -> module that defines it
_API = {
    "AR": "rvqspec_lib.decoding.decoders",
    "Chain": "rvqspec_lib.decoding.decoders",
    "Tree": "rvqspec_lib.decoding.decoders",
    "FrameResult": "rvqspec_lib.decoding.decode",
    "decode_frame": "rvqspec_lib.decoding.decode",
    "Sampling": "rvqspec_lib.decoding.sampling",
    "load_model": "rvqspec_lib.models.loader",
    "LoadedModel": "rvqspec_lib.models.loader",
    "ModelNotFoundError": "rvqspec_lib.models.loader",
    "DraftTree": "rvqspec_lib.decoding.trees",
    "parse_paths": "rvqspec_lib.decoding.trees",
    "parse_decoder_name": "rvqspec_lib.decoding.decoder_names",
}

__all__ = list(_API)
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'rvqspec_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
