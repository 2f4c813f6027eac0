"""Layer 5, evaluation: acceptance statistics, calibration, ASR and WER parity, the one timing harness, ``auto``
and the timing replay. Imports only the layers below it (common, decoding, device, models, data). The benchmarks
live beside the library in ``bench/``, the notebooks' own experiments and plots in ``paper/``.
"""
