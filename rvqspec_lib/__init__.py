"""rvqspec: lossless speculative decoding of the RVQ inner loop of Qwen3-TTS.

Public API:
    decode_frame, AR, Chain, Tree, FrameResult  (the inner-loop decoders, rvqspec_lib.decode)
    Sampling                                    (transformers-identical warpers, rvqspec_lib.sampling)
    load_model, LoadedModel                     (checkpoints, tiny-random, real-size random, rvqspec_lib.models)
    DraftTree, parse_paths                      (trees as data, rvqspec_lib.trees)
"""

from rvqspec_lib.models.loader import LoadedModel, ModelNotFoundError, load_model
from rvqspec_lib.spec.decode import FrameResult, decode_frame
from rvqspec_lib.spec.decoders import AR, Chain, Tree
from rvqspec_lib.spec.sampling import Sampling
from rvqspec_lib.spec.trees import DraftTree, parse_paths

__all__ = ["AR", "Chain", "Tree", "FrameResult", "decode_frame", "Sampling", "load_model", "LoadedModel",
           "ModelNotFoundError", "DraftTree", "parse_paths"]
__version__ = "0.1.0"
