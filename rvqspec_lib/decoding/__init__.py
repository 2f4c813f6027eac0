"""Layer 1, the lossless core: sampling, draft trees, the accept/reject rules, the code-predictor call, the
decoders (AR, Chain, Tree) and the drafters. torch and transformers only: no file paths, no I/O, no global RNG.
Imports nothing else from rvqspec_lib (docs/architecture.md).
"""
