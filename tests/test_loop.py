"""The one training loop (rvqspec_lib.training.loop.fit): budgets (steps, minutes on a fake clock, epochs), the
schedule, records and their running means, early stopping, the best state restored exactly, and negative controls.

The model is a linear regression trained with plain SGD (deterministic, no random numbers in the loop): every
expected value below is exact, not statistical.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from recipes.embedded.schedule import MIN_LR_RATIO, WarmupCosine, decay_groups, lr_at, one_budget
from rvqspec_lib.training.loop import Budget, fit

torch.set_num_threads(1)


class FakeClock:
    """Seconds that advance only when told (the step function advances it): the minutes budget without sleeping."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def regression(n=32, dim=4, seed=0, flip=False):
    """A linear model and data ``y = x w*`` (``flip``: ``y = -x w*``, data that training on the other set hurts)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w_true = torch.randn(dim, 1, generator=g)
    y = x @ w_true
    model = torch.nn.Linear(dim, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    return model, x, (-y if flip else y)


def mse(model, x, y) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def val_mse(model, x, y) -> float:
    with torch.no_grad():
        return float(mse(model, x, y))


def batches_of(x, y, size):
    """epoch -> list of (x, y) batches in order (no randomness)."""
    return lambda epoch: [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------------- budgets
def test_budget_by_steps_draws_one_batch_per_step():
    model, x, y = regression()
    drawn = []

    def endless(epoch):
        i = 0
        while True:
            drawn.append(i)
            yield x[i % 32: i % 32 + 4], y[i % 32: i % 32 + 4]
            i += 4

    res = fit(lambda b: mse(model, *b), endless, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
              budget=Budget(steps=7))
    assert res.steps == 7 and res.stopped_by == "steps" and res.epochs == 0
    assert len(drawn) == 7  # lazily, one per step: no batch drawn after the budget is spent
    assert [r["step"] for r in res.curve] == [7]  # no evaluation asked for: one record at the end


def test_budget_by_minutes_on_a_fake_clock_and_the_schedule_follows_time():
    model, x, y = regression()
    clock = FakeClock()
    seen = []

    def step(b):
        clock.t += 20.0  # each step takes 20 s
        return mse(model, *b)

    def schedule(step_i, frac):
        seen.append((step_i, frac))
        return 0.01

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    res = fit(step, batches_of(x, y, 4), optimizer=opt, budget=Budget(minutes=1.0), schedule=schedule, clock=clock)
    assert res.steps == 3 and res.stopped_by == "minutes"  # 0, 20, 40 s start a step; at 60 s the budget is spent
    assert seen == [(0, 0.0), (1, 20 / 60), (2, 40 / 60)]
    assert res.train_s == 60.0 and res.wall_s == 60.0
    assert opt.param_groups[0]["lr"] == 0.01


def test_budget_by_epochs_records_per_epoch_and_the_first_budget_spent_stops():
    model, x, y = regression(n=12)
    res = fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
              budget=Budget(epochs=3), evaluate=lambda: {"val": val_mse(model, x, y)}, eval_every="epoch",
              eval_at_start=True)
    assert res.stopped_by == "epochs" and res.epochs == 3 and res.steps == 9
    assert [(r["epoch"], r["step"]) for r in res.curve] == [(0, 0), (1, 3), (2, 6), (3, 9)]
    # steps and epochs together: whichever is spent first
    model, x, y = regression(n=12)
    res = fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
              budget=Budget(steps=5, epochs=3))
    assert res.stopped_by == "steps" and res.steps == 5 and res.epochs == 1


def test_budget_errors():
    with pytest.raises(ValueError, match="give a training budget"):
        Budget()
    for bad in (dict(steps=0), dict(epochs=-1), dict(minutes=0.0), dict(steps=2.5), dict(steps=True)):
        with pytest.raises(ValueError, match="must be positive"):
            Budget(**bad)
    for steps, minutes in ((None, None), (3, 1.0)):
        with pytest.raises(ValueError, match="exactly one budget"):
            one_budget(steps, minutes)
    assert one_budget(3, None) == Budget(steps=3)
    model, x, y = regression()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = lambda b: mse(model, *b)
    with pytest.raises(ValueError, match="select must be"):
        fit(step, batches_of(x, y, 4), optimizer=opt, budget=Budget(steps=1), select="best")
    with pytest.raises(ValueError, match="eval_every"):
        fit(step, batches_of(x, y, 4), optimizer=opt, budget=Budget(steps=1), eval_every=-1)
    with pytest.raises(ValueError, match="patience"):
        fit(step, batches_of(x, y, 4), optimizer=opt, budget=Budget(steps=1), patience=-1)
    with pytest.raises(ValueError, match="no batches"):
        fit(step, lambda e: [], optimizer=opt, budget=Budget(steps=1))
    with pytest.raises(ValueError, match="no batches"):
        fit(step, lambda e: iter(()), optimizer=opt, budget=Budget(steps=1))
    with pytest.raises(ValueError, match="returned no"):
        fit(step, batches_of(x, y, 4), optimizer=opt, budget=Budget(steps=1), running=("l1",))


# ------------------------------------------------------------------------------------------------------- schedule
def test_warmup_cosine_is_lr_at_and_is_applied_to_every_group():
    s = WarmupCosine(1.0, warmup_steps=10)
    assert s(0, 0.0) == lr_at(0, 0.0, lr=1.0, warmup_steps=10) == pytest.approx(0.1)
    assert s(10, 0.0) == 1.0 and s(50, 1.0) == pytest.approx(MIN_LR_RATIO) and s(50, 0.5) == pytest.approx(0.55)
    assert s(50, 7.0) == s(50, 1.0)  # the fraction is clipped
    model, x, y = regression()
    opt = torch.optim.AdamW(decay_groups(model.parameters()), lr=123.0)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]  # the weight matrix decays, the bias does not
    lrs = []
    res = fit(lambda b: (mse(model, *b), {"loss": 0.0, "lr": opt.param_groups[1]["lr"]}), batches_of(x, y, 4),
              optimizer=opt, budget=Budget(steps=6), schedule=WarmupCosine(0.5, warmup_steps=2),
              eval_every=1, running=("lr",), on_record=lambda r, imp: lrs.append(r["lr"]))
    expect = [lr_at(i, i / 6, lr=0.5, warmup_steps=2) for i in range(6)]
    assert lrs == expect and [r["train_lr"] for r in res.curve] == expect


# ------------------------------------------------------------------------------------------------------- records
def test_curve_contents_running_means_and_the_curve_file(tmp_path):
    model, x, y = regression(n=16)
    losses = iter([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    weights = iter([1, 3, 1, 1, 2, 2, 5])
    calls = []

    def step(b):
        return mse(model, *b), {"loss": next(losses), "w": next(weights)}

    res = fit(step, batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
              budget=Budget(steps=7), eval_every=3, eval_at_start=True, running=("loss", "w"),
              batch_weight=lambda b: len(b[0]), evaluate=lambda: {"val_x": 1.5},
              on_record=lambda r, imp: calls.append((r["step"], imp)), curve_path=tmp_path / "c.json",
              curve_meta={"what": "test"})
    assert [r["step"] for r in res.curve] == [0, 3, 6, 7]
    assert [r["epoch"] for r in res.curve] == [0, 0, 1, 1]  # 4 batches an epoch
    assert res.curve[0]["train_loss"] is None and res.curve[0]["train_w"] is None  # no step yet
    assert res.curve[1]["train_loss"] == (1 + 2 + 4) / 3 and res.curve[2]["train_loss"] == (8 + 16 + 32) / 3
    assert res.curve[3]["train_loss"] == 64.0 and res.curve[1]["train_w"] == 5 / 3
    assert all(r["val_x"] == 1.5 and r["lr"] == 0.01 for r in res.curve)
    assert set(res.curve[0]) == {"step", "epoch", "elapsed_s", "lr", "train_loss", "train_w", "val_x"}
    assert calls == [(0, False), (3, False), (6, False), (7, False)]  # no metric: nothing improves
    assert res.best_index is None and not res.restored
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved == {"meta": {"what": "test"}, "curve": res.curve}
    assert not list(tmp_path.glob("*.tmp"))
    # weighted means: the same run with unequal batches
    model, x, y = regression(n=10)
    vals = iter([2.0, 4.0, 8.0])
    res = fit(lambda b: (mse(model, *b), {"loss": next(vals)}), batches_of(x, y, 4),
              optimizer=torch.optim.SGD(model.parameters(), lr=0.01), budget=Budget(epochs=1),
              eval_every="epoch", batch_weight=lambda b: len(b[0]))
    assert res.curve[-1]["train_loss"] == (4 * 2.0 + 4 * 4.0 + 2 * 8.0) / 10 and res.steps == 3


# ------------------------------------------------------------------------------------------------------- selection
def scripted(values):
    it = iter(values)
    return lambda: {"val": next(it)}


@pytest.mark.parametrize("select,values,patience,min_delta,best,n_records,stopped", [
    ("min", [5.0, 4.0, 4.5, 4.2, 4.1, 3.0, 2.0], 3, 0.0, 1, 5, "patience"),
    ("min", [5.0, 4.0, 4.5, 4.2, 3.9, 3.0, 2.0], 3, 0.0, 6, 7, "steps"),  # improvement resets the count
    ("min", [5.0, 4.0, 3.95, 3.92, 3.9, 3.0, 2.0], 3, 0.15, 1, 5, "patience"),  # gains below min_delta don't count
    ("max", [0.1, 0.3, 0.3, 0.2, 0.5, 0.4, 0.4], 3, 0.0, 4, 7, "steps"),  # ties keep the earlier record
    ("max", [0.1, 0.3, 0.3, 0.2, 0.5, 0.4, 0.4], 1, 0.0, 1, 3, "patience"),
    ("max", [0.5, 0.3, 0.3, 0.2, 0.5, 0.4, 0.4], 0, 0.0, 0, 2, "patience"),  # 0 acts as 1
    ("min", [float("nan"), 2.0, float("nan"), 3.0, 1.0, 1.0, 1.0], None, 0.0, 4, 7, "steps"),  # NaN never improves
])
def test_early_stopping_and_selection(select, values, patience, min_delta, best, n_records, stopped):
    model, x, y = regression()
    res = fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
              budget=Budget(steps=6), evaluate=scripted(values), eval_every=1, eval_at_start=True, metric="val",
              select=select, patience=patience, min_delta=min_delta)
    assert len(res.curve) == n_records and res.stopped_by == stopped
    assert res.best_index == best and res.best_step == best and res.best_record is res.curve[best]
    assert res.best_record["val"] == values[best]


def test_patience_running_out_with_the_budget_is_the_budget():
    model, x, y = regression(n=8)
    res = fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
              budget=Budget(epochs=2), evaluate=scripted([1.0, 2.0, 3.0]), eval_every="epoch", eval_at_start=True,
              metric="val", patience=2)
    assert res.stopped_by == "epochs" and len(res.curve) == 3 and res.best_index == 0


# ------------------------------------------------------------------------------------------------------- best state
def test_best_state_is_restored_exactly():
    """The metric is scripted so that the best record is the second of five; after fit the parameters equal those
    at that record bit for bit, and differ from the last step's (so the restore did something)."""
    model, x, y = regression()
    states = []
    res = fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
              budget=Budget(steps=8), evaluate=scripted([9.0, 3.0, 1.0, 2.0, 1.5]), eval_every=2,
              eval_at_start=True, metric="val", keep_best=dict(model.named_parameters()),
              on_record=lambda r, imp: states.append(snapshot(model)))
    assert res.best_index == 2 and res.best_step == 4 and res.restored
    assert same(snapshot(model), states[2])
    assert not same(states[-1], states[2]) and not same(states[2], states[0])


def test_negative_control_a_metric_that_gets_worse_keeps_the_initial_state():
    """Training on y = x w* while validating on y = -x w*: every step makes the validation loss worse, so the loop
    must hand back the initial (step 0) parameters exactly. Control: without keep_best the parameters moved."""
    results = {}
    for keep in (True, False):
        model, x, y = regression(seed=1)
        _, xv, yv = regression(seed=1, flip=True)
        init = snapshot(model)
        res = fit(lambda b: mse(model, *b), batches_of(x, y, 8), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  budget=Budget(epochs=4), evaluate=lambda: {"val_loss": val_mse(model, xv, yv)},
                  eval_every="epoch", eval_at_start=True, metric="val_loss", select="min",
                  keep_best=model.state_dict() if keep else None)
        vals = [r["val_loss"] for r in res.curve]
        assert all(b > a for a, b in zip(vals, vals[1:])), vals  # it really gets worse
        assert res.best_index == 0 and res.best_epoch == 0
        results[keep] = (same(snapshot(model), init), res.restored)
    assert results[True] == (True, True)
    assert results[False] == (False, False)


def test_the_loop_draws_no_random_numbers():
    model, x, y = regression()
    state = torch.get_rng_state()
    fit(lambda b: mse(model, *b), batches_of(x, y, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        budget=Budget(steps=5), evaluate=lambda: {"v": 1.0}, eval_every=2, metric="v",
        keep_best=model.state_dict(), progress=False)
    assert torch.equal(torch.get_rng_state(), state)


def test_gradient_clipping_bounds_the_step():
    """One SGD step with lr 1 moves the parameters by exactly the clipped gradient (norm <= grad_clip)."""
    for clip, expect_norm in ((None, None), (0.5, 0.5)):
        model, x, y = regression()
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        fit(lambda b: 100.0 * mse(model, *b), batches_of(x, y, 32),
            optimizer=torch.optim.SGD(model.parameters(), lr=1.0), budget=Budget(steps=1), clip_parameters=list(model.parameters()), grad_clip=clip)
        moved = float((torch.cat([p.detach().flatten() for p in model.parameters()]) - before).norm())
        if expect_norm is None:
            assert moved > 10  # negative control: the unclipped gradient is large
        else:
            assert math.isclose(moved, expect_norm, rel_tol=1e-5)


def test_fit_reproduces_a_hand_written_loop_bit_for_bit():
    """One generator feeds both the batch order (a permutation per epoch, drawn when the epoch starts) and noise in
    the step: fit must draw them in the same order as the plain loop below, so the weights agree exactly."""

    def run(use_fit: bool):
        model, x, y = regression(n=20, seed=3)
        gen = torch.Generator().manual_seed(7)
        opt = torch.optim.AdamW(decay_groups(model.parameters()), lr=0.05, betas=(0.9, 0.95))
        sched = WarmupCosine(0.05, warmup_steps=3)

        def loss_of(idx):
            noise = 0.1 * torch.randn(len(idx), 1, generator=gen)
            return mse(model, x[idx], y[idx] + noise)

        def epoch_batches(epoch):
            order = torch.randperm(20, generator=gen)
            return [order[i:i + 6] for i in range(0, 20, 6)]

        if use_fit:
            fit(loss_of, epoch_batches, optimizer=opt, budget=Budget(steps=11), schedule=sched,
                clip_parameters=list(model.parameters()), grad_clip=0.5)
        else:
            step, batches = 0, []
            while step < 11:
                if not batches:
                    batches = epoch_batches(0)[::-1]
                idx = batches.pop()
                for g in opt.param_groups:
                    g["lr"] = sched(step, step / 11)
                loss = loss_of(idx)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5)
                opt.step()
                step += 1
        return snapshot(model), torch.randn(1, generator=gen)

    (a, ga), (b, gb) = run(True), run(False)
    assert same(a, b) and torch.equal(ga, gb)  # same weights, and the generator is left in the same state
