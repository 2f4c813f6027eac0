"""Layer 0, shared helpers with no model knowledge: provenance sidecars, result files, progress bars.
"""
