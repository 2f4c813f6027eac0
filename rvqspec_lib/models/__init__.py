"""Layer 2, model access: the official classes (import shim, configs, loader, tokenizers), codecs and speech
tokenizers, the frame loop, and the files that sit beside a model (drafters, calibrated trees).
Imports only rvqspec_lib.common and rvqspec_lib.decoding.
"""
