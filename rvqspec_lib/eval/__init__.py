"""Layer 3, evaluation: frames and their sources, acceptance statistics, headroom, ASR and WER, benchmarks, plots.
Imports only the layers below it (common, spec, models).
"""
