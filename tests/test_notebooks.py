"""Every paper notebook runs headless in smoke mode and records what it measured (STYLE.md: notebooks are tested).

Each ``notebooks/NN_*.py`` (jupytext percent format) is converted in memory, executed with papermill with
``smoke=True`` and ``out_dir=<tmp>`` (so ``figures/`` is never overwritten), and must write ``NN_metrics.json``.
Notebook-specific checks read that file back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))

pytestmark = pytest.mark.slow


def _execute(src: Path, out_dir: Path) -> Path:
    jupytext = pytest.importorskip("jupytext")
    papermill = pytest.importorskip("papermill")
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    ipynb = out_dir / (src.stem + ".ipynb")
    jupytext.write(nb, ipynb, fmt="ipynb")
    executed = out_dir / (src.stem + ".executed.ipynb")
    papermill.execute_notebook(str(ipynb), str(executed), parameters={"smoke": True, "out_dir": str(out_dir)},
                               kernel_name="python3", language="python", cwd=str(REPO), progress_bar=False)
    return executed


@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(src, tmp_path):
    _execute(src, tmp_path)
    prefix = src.stem.split("_", 1)[0]
    metrics = json.loads((tmp_path / f"{prefix}_metrics.json").read_text())
    assert "provenance" in metrics and metrics["provenance"]["params"]["smoke"] is True
    if prefix == "01":
        _check_01(metrics, tmp_path)


def _check_01(metrics: dict, out: Path) -> None:
    from rvqspec_lib.bench import call_budget
    from rvqspec_lib.models import tiny_config_dict

    # smoke mode runs tiny-random: its code groups come from its config, its frame rate is the 12 Hz codec's
    assert metrics["model"] == "tiny-random" and metrics["random_weights"] is True
    groups = tiny_config_dict()["talker_config"]["num_code_groups"]
    assert metrics["n_code_groups"] == groups and metrics["frame_rate_hz"] == 12.5
    assert metrics["calls_per_s_realtime"] == metrics["frame_rate_hz"] * groups == 200.0
    assert metrics["calls_per_s_at_paper_tpc"] == pytest.approx(call_budget(12.5, groups, 2.47)["calls_per_s"])
    assert 0 < metrics["inner_share"] < 1 and metrics["t_talker_ms"] > 0 and metrics["t_inner_ms"] > 0
    assert metrics["verify_cost_ratio"]["1"] == 1.0
    for stem in ("01_call_budget", "01_latency"):
        for ext in (".csv", ".md", ".provenance.json"):
            assert (out / (stem + ext)).stat().st_size > 0, stem + ext
    for ext in (".png", ".pdf", ".provenance.json"):
        assert (out / ("01_verify_cost" + ext)).stat().st_size > 0, ext
    side = json.loads((out / "01_verify_cost.provenance.json").read_text())
    assert side["params"]["model"] == "tiny-random" and "git" in side and "hardware" in side
