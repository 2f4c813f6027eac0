"""Layer 7, the command line (`rvqspec ...`): one module per command over the library below.
"""
