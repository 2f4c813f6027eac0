"""Check that the committed figures are one clean `make paper` run of the sources at HEAD (`make check-figures`).

    python scripts/check_figures.py [--figures figures]

One line per problem (results grouped by the revision that made them, the source files changed since), then a verdict;
exit 0 when every provenance record names one revision R, none is dirty and the sources are unchanged between R and
HEAD, 1 otherwise. Needs only the standard library and git. The rules: tools/figure_check.py and
docs/reproducibility.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.figure_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
