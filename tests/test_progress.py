"""Progress bars stay out of headless notebooks: under RVQSPEC_PROGRESS=console every tqdm bar (the library's helper
and tqdm called directly) writes to the process's console, not to ``sys.stderr`` as a kernel replaces it; without
the variable (the negative control) bars write to ``sys.stderr``, as they do live in JupyterLab."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import io, sys
from rvqspec_lib.common.progress import progress_bar
from tqdm import tqdm
kernel_stderr = io.StringIO()  # what a Jupyter kernel's sys.stderr would send into the notebook
sys.stderr = kernel_stderr
list(progress_bar(range(3), desc="helper-bar"))
list(tqdm(range(3), desc="direct-bar"))
print(repr(kernel_stderr.getvalue()))
"""


def _run(mode):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RVQSPEC_PROGRESS", None)
    if mode is not None:
        env["RVQSPEC_PROGRESS"] = mode
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=REPO)


def test_console_mode_keeps_bars_out_of_the_replaced_stderr():
    r = _run("console")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "''"  # nothing reached the stream a notebook would keep
    assert "helper-bar" in r.stderr and "direct-bar" in r.stderr  # both went to the console


def test_default_mode_writes_to_stderr():
    r = _run(None)
    assert "helper-bar" in r.stdout and "direct-bar" in r.stdout


@pytest.mark.parametrize("mode", ["notebook"])
def test_other_values_are_refused(mode):
    r = _run(mode)
    assert r.returncode != 0 and "RVQSPEC_PROGRESS='notebook'" in r.stderr
