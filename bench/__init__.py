"""The benchmarks, beside the library: timed calls and frames of every part, precision and backend against their
floors, the table to act on and the whole frame streamed. ``rvqspec bench`` runs them (registered as a command
plug-in, so the library never imports this package).
"""

#: The jobs' defaults, here so that the parser (bench.cli) imports no torch; bench.latency and bench.table import them
#: too (tests/test_bench.py checks QUERY_SIZES and BACKENDS against rvqspec_lib.eval.speed and models.backends).
QUERY_SIZES = (1, 2, 4, 8, 16, 32, 64)
PRECISION_QUERY_SIZES = (1, 2, 4, 8, 16)
BACKENDS = ("official", "eager", "compile", "onnx", "native")
#: Largest --queries value: a verify call over more nodes is not a draft tree.
MAX_QUERIES = 1024
#: The table's: timed rounds, models (the trained embedded model and the real-size 0.6B architecture, random weights,
#: replayed) and backends.
TABLE_REPEATS = 5
TABLE_MODELS = ("embedded", "qwen3-tts-0.6b-random")
TABLE_BACKENDS = ("eager", "native")
#: The pipeline table's: models, frames a chunk holds (2: the codec's per-frame cost falls with the chunk, the first
#: audio waits for one more frame), frame cap of a measured stream (3.2 s of audio; the embedded model ends its
#: sentence before), streams batched in the concurrency measurement.
PIPELINE_MODELS = TABLE_MODELS[::-1]
PIPELINE_CHUNK_FRAMES = 2
PIPELINE_FRAMES = 40
PIPELINE_BATCHES = (1, 2, 4)
