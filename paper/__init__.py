"""What only the notebooks use: their plots and their experiments (the toy round, the drafter table, headroom, the
codec's quality, verify calls), each with tests. Imports rvqspec_lib and bench; the library never imports this package.
"""
