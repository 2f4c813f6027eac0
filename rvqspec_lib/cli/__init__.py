"""Layer 6, the command line (`rvqspec ...`): one module per command over the library below.
"""
