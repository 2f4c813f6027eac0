"""Test-wide settings.

Tiny models run fastest on one thread, and two threads on a loaded 2-core machine can be 100x slower
(spin-waiting); the suite pins one intra-op thread so its run time does not depend on what else runs.
"""

import torch

torch.set_num_threads(1)
