"""Repository tools run by the Makefile: the figure check, the paper run's record, the reproducibility comparison and
the results document. Imports rvqspec_lib; the library never imports this package.
"""
