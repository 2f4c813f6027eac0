"""Layer 4, evaluation: acceptance statistics, calibration, headroom, ASR and WER, benchmarks, plots.
Imports only the layers below it (common, decoding, models, data).
"""
