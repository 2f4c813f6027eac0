"""The decisions notebook 03 used to make inline, now library functions: the learning rate chosen on validation
(``train_drafters``), the offsets deployed beside the model (``select_deployed`` / ``deploy_drafters``) and the
share of the headroom each drafter captures (``captured_share`` / ``headroom_table``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_drafters import drift_model

from paper.headroom import captured_share, headroom_table
from rvqspec_lib.models.drafter_files import load_drafter, make_drafter
from rvqspec_lib.decoding.drafters import DEFAULT_K, MedusaHeads, PositionOffsets
from paper.drafter_training import deploy_drafters, select_deployed, train_drafters, validation_acceptance
from rvqspec_lib.training.drafters import DEFAULT_LR, train_drafter

TRAIN = dict(loss="ce", max_epochs=3, batch_size=64, patience=1, seed=0)
PLAN = {"offsets-ce": ("offsets", "ce")}


# ------------------------------------------------------------------------------------------------ learning rate
@pytest.fixture(scope="module")
def sweep():
    cp, train, held_out = drift_model()
    # 10.0 overshoots (Adam moves every offset coordinate by ~10 in the first step); 1e-2 learns; None = default
    kw = {k: v for k, v in TRAIN.items() if k != "loss"}
    run = train_drafters(cp, PLAN, train, held_out, K=DEFAULT_K, lrs={"offsets-ce": [10.0, 1e-2, None]}, **kw)
    return run.lr_rows, run.results["offsets-ce"]


def test_sweep_chooses_the_rate_with_the_highest_validation_acceptance(sweep):
    rows, chosen = sweep
    assert [r["lr"] for r in rows] == [10.0, 1e-2, DEFAULT_LR["offsets"]]  # None resolved to the default
    assert all(r["drafter"] == "offsets-ce" for r in rows)
    scores = [r["val_acceptance_mean"] for r in rows]
    best = int(np.argmax(scores))
    assert [r["chosen"] for r in rows] == [i == best for i in range(3)]
    assert chosen.drafter.provenance["lr"] == rows[best]["lr"]
    assert validation_acceptance(chosen.drafter) == scores[best]
    assert scores[best] > rows[best]["val_acceptance_init"] + 0.01  # the chosen run learned something
    # negative control: the overshooting rate keeps epoch 0, the untrained offsets, and is not chosen
    assert rows[0]["best_epoch"] == 0 and rows[0]["val_acceptance_mean"] == rows[0]["val_acceptance_init"]
    assert not rows[0]["chosen"]


def test_sweep_chosen_run_is_the_plain_training_at_that_rate(sweep):
    cp, train, held_out = drift_model()
    chosen = sweep[1]
    again = train_drafter(make_drafter("offsets", cp, fresh=True), cp, train, held_out,
                          lr=chosen.drafter.provenance["lr"], **TRAIN)
    assert torch.equal(again.drafter.offsets, chosen.drafter.offsets)
    assert again.curve == [{**c, "elapsed_s": a["elapsed_s"]} for c, a in zip(chosen.curve, again.curve)]


def test_sweep_ties_keep_the_first_rate_and_errors():
    cp, train, held_out = drift_model()
    small = train.subset(torch.arange(64))
    tie = train_drafters(cp, PLAN, small, held_out, K=DEFAULT_K, lrs={"offsets-ce": [1e-3, 1e-3]}, max_epochs=1,
                         batch_size=64).lr_rows
    assert tie[0]["val_acceptance_mean"] == tie[1]["val_acceptance_mean"]
    assert [r["chosen"] for r in tie] == [True, False]
    with pytest.raises(ValueError, match="must be > 0"):
        train_drafters(cp, PLAN, small, held_out, K=DEFAULT_K, lrs={"offsets-ce": [1e-2, 0.0]})
    with pytest.raises(ValueError, match="validation frames"):
        train_drafters(cp, PLAN, small, None, K=DEFAULT_K, lrs={"offsets-ce": [1e-2]})
    with pytest.raises(ValueError, match="lrs="):
        train_drafters(cp, PLAN, small, held_out, K=DEFAULT_K, lrs={"offsets-ce": [1e-2]}, lr=1e-3)


# ------------------------------------------------------------------------------------------------ deployment
def trained_offsets(value: float, acceptance: list[float], hidden: int = 8) -> PositionOffsets:
    d = PositionOffsets(3, hidden)
    with torch.no_grad():
        d.offsets.fill_(value)
    d.provenance = {"val_acceptance_by_offset": acceptance, "loss": "ce"}
    return d


def test_select_deployed_takes_the_best_validation_acceptance_of_its_kind():
    drafters = {"offsets-ce": trained_offsets(1.0, [0.5, 0.4, 0.3]),  # mean 0.4
                "offsets-kl": trained_offsets(2.0, [0.6, 0.4, 0.35]),  # mean 0.45: the best offsets
                "offsets-tv": trained_offsets(3.0, [0.45, 0.45, 0.45]),  # mean 0.45 too: a tie, later
                "medusa": MedusaHeads(3, n_codes=4, hidden_size=8, vocab_size=5)}
    drafters["medusa"].provenance = {"val_acceptance_by_offset": [0.9, 0.9, 0.9]}  # higher, but another kind
    assert select_deployed(drafters) == "offsets-kl"
    assert select_deployed(drafters, kind="medusa") == "medusa"
    # negative control: lower the winner and the choice moves
    drafters["offsets-kl"].provenance["val_acceptance_by_offset"] = [0.1, 0.1, 0.1]
    assert select_deployed(drafters) == "offsets-tv"
    with pytest.raises(ValueError, match="no 'offsets' drafter"):
        select_deployed({"medusa": drafters["medusa"]})
    with pytest.raises(ValueError, match="no validation acceptance"):
        select_deployed({"offsets-ce": PositionOffsets(3, 8)})


def test_deploy_writes_the_chosen_offsets_beside_the_model(tmp_path):
    cp = drift_model()[0]
    hidden = int(cp.config.hidden_size)
    drafters = {"offsets-ce": trained_offsets(1.0, [0.5] * 3, hidden), "offsets-kl": trained_offsets(2.0, [0.6] * 3,
                                                                                                     hidden)}
    files = deploy_drafters(drafters, "offsets-kl", tmp_path)
    assert set(files) == {"deployed_offsets", "model_offsets-ce", "model_offsets-kl"}
    assert files["deployed_offsets"] == tmp_path / "drafters" / "offsets.safetensors"
    deployed = load_drafter(files["deployed_offsets"], cp)
    assert torch.equal(deployed.offsets, drafters["offsets-kl"].offsets)
    assert not torch.equal(deployed.offsets, drafters["offsets-ce"].offsets)  # control: the other one differs
    assert torch.equal(load_drafter(files["model_offsets-ce"], cp).offsets, drafters["offsets-ce"].offsets)
    assert files["deployed_offsets"].with_suffix(".json").is_file()
    with pytest.raises(ValueError, match="not a 'offsets' drafter"):
        deploy_drafters(drafters, "medusa", tmp_path)


# ------------------------------------------------------------------------------------------------ headroom share
def test_captured_share_is_the_share_of_the_marginal_gain():
    share = captured_share([0.5, 0.7, 0.9, 0.6, 0.4], [0.5, 0.5, 0.5, 0.6, 0.5], [0.9, 0.9, 0.9, 0.6, 0.7])
    expect = [0.0, (0.7 - 0.5) / (0.9 - 0.5), 1.0, math.nan, (0.4 - 0.5) / (0.7 - 0.5)]
    np.testing.assert_array_equal(share, np.array(expect))  # NaN where there is no gain to capture
    assert share[4] < 0  # worse than the reused heads
    assert float(captured_share(0.55, 0.5, 0.6)) == (0.55 - 0.5) / (0.6 - 0.5)
    assert math.isnan(float(captured_share(0.55, 0.5, 0.4)))  # the marginal below the heads: nothing to capture
    with pytest.raises(ValueError, match="same length"):
        captured_share([0.5, 0.6], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9])


def test_headroom_table_rows_by_offset():
    hr = {"offsets": [1, 2], "ceiling": [0.95, 0.9], "marginal": [0.9, 0.8], "samples": 4, "n_frames": 3,
          "drafters": {"heads": [0.8, 0.6], "offsets": [0.82, 0.7], "medusa": [0.9, 0.5]}}
    rows = headroom_table(hr)
    assert [r["offset_t"] for r in rows] == [1, 2]
    assert list(rows[0]) == ["offset_t", "ceiling", "marginal", "heads", "offsets", "offsets_captured", "medusa",
                             "medusa_captured"]
    assert rows[0]["offsets_captured"] == (0.82 - 0.8) / (0.9 - 0.8) and rows[0]["medusa_captured"] == 1.0
    assert rows[1]["offsets_captured"] == (0.7 - 0.6) / (0.8 - 0.6)
    assert rows[1]["medusa_captured"] == (0.5 - 0.6) / (0.8 - 0.6) == pytest.approx(-0.5)
    assert rows[1]["heads"] == 0.6 and "heads_captured" not in rows[1]
    with pytest.raises(ValueError, match="baseline 'reused'"):
        headroom_table(hr, baseline="reused")
