"""Layer 3, model access: the official classes (import shim, configs, loader, tokenizers), codecs and speech
tokenizers, the frame loop, the registry of backends, and the files that sit beside a model (drafters, calibrated
trees). Imports only rvqspec_lib.common, rvqspec_lib.decoding and rvqspec_lib.device.
"""
