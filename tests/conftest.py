"""Test-wide settings.

Tiny models run fastest on one thread, and two threads on a loaded 2-core machine can be 100x slower
(spin-waiting); the suite pins one intra-op thread so its run time does not depend on what else runs.
"""

import torch

torch.set_num_threads(1)

import os  # noqa: E402

import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (``CI=true``) a skipped test is a failure: .ci/run installs every dependency, so a skip there means a
    missing install step, not an optional feature."""
    outcome = yield
    rep = outcome.get_result()
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI (a dependency is missing from .ci/run / make env): {rep.longrepr}"


# ---- no model may load: bad input is refused first ------------------------------------------------------------------
def _refuse_load(*a, **k):
    raise AssertionError("a model was loaded before the bad input was refused")


@pytest.fixture
def no_load(monkeypatch):
    """``load_model`` refuses, in the loader and in every project module that holds it by name
    (``bench.jobs`` imports it by name). The command modules are imported lazily, when their command
    first runs: a module imported for the first time while the loader held a stand-in would keep that stand-in for
    the rest of the test process, so every command module is imported here first, before anything is replaced."""
    import importlib
    import sys

    from rvqspec_lib.cli.main import COMMANDS
    from rvqspec_lib.models import loader

    for module in ["bench.jobs", *(f"rvqspec_lib.cli.{name.replace('-', '_')}" for name in COMMANDS)]:
        importlib.import_module(module)
    monkeypatch.setattr(loader, "load_model", _refuse_load)
    for name, mod in list(sys.modules.items()):
        if name.startswith(("rvqspec_lib", "bench")) and callable(getattr(mod, "load_model", None)):
            monkeypatch.setattr(mod, "load_model", _refuse_load)


# ---- code predictors shared by the export tests ------------------------------------------------------------------
@pytest.fixture(scope="module")
def cp():
    """The tiny-random model's code predictor (official classes, seeded random weights), in eval mode."""
    from rvqspec_lib.models.loader import load_model

    return load_model("tiny-random").code_predictor.eval()


@pytest.fixture(scope="module")
def small():
    """A code predictor of 4 code groups and 8 codes: the frame graph unrolls every code, so its export stays short."""
    from rvqspec_lib.models.configs import build_from_config, tiny_config_dict

    return build_from_config(tiny_config_dict(n_code_groups=4, codebook_size=8), seed=0).talker.code_predictor.eval()


class _SineTokenizer:
    """A speech tokenizer stand-in (tiny-random has no codec): a quiet sine, 1920 samples a frame at 24 kHz."""

    def decode(self, items):
        import numpy as np

        n = items[0]["audio_codes"].shape[0] * 1920
        return [0.1 * np.sin(np.arange(n, dtype=np.float32) / 10)], 24000


@pytest.fixture
def tiny_with_audio(monkeypatch):
    """``load_model`` as usual, but the model gets :class:`_SineTokenizer` as its speech tokenizer, so ``synth``
    writes audio for tiny-random."""
    import rvqspec_lib.models.loader as loader

    real = loader.load_model

    def load(name, **kw):
        lm = real(name, **kw)
        lm.speech_tokenizer = _SineTokenizer()
        return lm

    monkeypatch.setattr(loader, "load_model", load)


def makefile_repo(tmp_path):
    """A stand-in checkout for running the real Makefile: ``tmp_path/repo`` with the Makefile, the apt script,
    ``notebooks/`` and ``scripts/``, and the real ``.venv`` linked. Returns ``(repo, make)``; skips without make or
    papermill in ``.venv`` (tests/test_smoke_outputs.py, tests/test_paper_run.py)."""
    import shutil
    from pathlib import Path

    repo_root = Path(__file__).resolve().parent.parent
    make = shutil.which("make")
    if make is None or not (repo_root / ".venv" / "bin" / "papermill").exists():
        pytest.skip("needs make and .venv with papermill")
    r = tmp_path / "repo"
    (r / "notebooks").mkdir(parents=True)
    (r / "scripts").mkdir()
    shutil.copy(repo_root / "Makefile", r / "Makefile")
    shutil.copy(repo_root / "scripts" / "apt-voices.sh", r / "scripts" / "apt-voices.sh")
    (r / ".venv").symlink_to((repo_root / ".venv").resolve(), target_is_directory=True)
    return r, make
