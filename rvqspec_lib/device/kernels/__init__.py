"""Small native kernels of the lean code-predictor forward (:mod:`rvqspec_lib.device.lean`): C sources shipped in
this folder, compiled on first use with the system C compiler into a cache folder, loaded with ctypes."""
