"""The benchmarks, beside the library: timed calls and frames of every part, precision and backend against their
floors, the table to act on and the whole frame streamed. ``rvqspec bench`` runs them (registered as a command
plug-in, so the library never imports this package).
"""
