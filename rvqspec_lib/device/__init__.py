"""Layer 2, the fast paths: the lean torch forward, fused and compiled frames, the native C forward and talker,
precisions, exported graphs (ONNX, Core ML) and the streaming codec decoders. Each is tested equal to the reference
path of ``rvqspec_lib.decoding`` (or within a stated tolerance); ``rvqspec_lib.models.backends`` is the one registry
that builds them. Imports only rvqspec_lib.common and rvqspec_lib.decoding.
"""
