"""The synthetic regime of notebook 03 (paper/regime.py): the model is what its docstring says, and the sweep shows
the paper's claims where p is peaked and not where it is flat.

Statistical assertions compare per-frame means with a one-sided z-test at z > 3 (tokens per call of 128 held-out
frames, seeded). At the most peaked setting the effects measured when the test was written are 15.5 (offsets over
heads) and 9.9 (point-mass over sampled) standard errors, so a false failure needs a fluctuation of 6.9 standard
errors (rate below 1e-11); the negative control asserts z < 3, which a true null fails with probability 0.00135
(measured there: z = -23 and -53, sampled children far ahead at uniform p).
"""

import numpy as np
import pytest
import torch

from paper import regime as R
from rvqspec_lib.data.teacher import teacher_forced_hidden, verifier_logits
from rvqspec_lib.decoding.decoders import Chain
from rvqspec_lib.decoding.drafters import ReusedHeads, draft_batch


def _z(rows, a: dict, b: dict, peak: float) -> float:
    def pick(sel):
        (r,) = [r for r in rows if r["peak"] == peak and all(r[k] == v for k, v in sel.items())]
        return r
    ra, rb = pick(a), pick(b)
    return (ra["tokens_per_call"] - rb["tokens_per_call"]) / float(np.hypot(ra["se"], rb["se"]))


def test_target_and_drafts_are_the_closed_form():
    cp = R.SyntheticPredictor(3.0, drift=1.5, foresight=0.5, n_codes=6, vocab=8)
    fr = cp.frames(5)
    x = fr.context[:, 0].reshape(5, 6, 8)
    hidden = teacher_forced_hidden(cp, fr.context, fr.codes)
    torch.testing.assert_close(verifier_logits(cp, hidden), 3.0 * x)  # p_d = softmax(peak * x_d)
    for drafter, shift in ((ReusedHeads(), 1.0), (R.exact_offsets(cp, K=2), 0.0)):
        logits, depth, valid = draft_batch(drafter, cp, hidden, 2)  # (5, 5, 2, 8) from start depths s = 1..5
        g = cp.lm_head[0].weight[:, -2] / 1.5
        for s in range(1, 6):
            for t in (1, 2):
                if s + t <= 6:
                    want = 3.0 * 0.5 ** t * x[:, s + t - 1] - shift * t * 1.5 * g
                    torch.testing.assert_close(logits[:, s - 1, t - 1], want)


def test_without_drift_offsets_and_heads_decode_the_same_codes():
    cp = R.SyntheticPredictor(4.0, drift=0.0, n_codes=8)
    fr = cp.frames(32)
    a = R.tokens_per_call(cp, Chain(4), fr, seed=3)
    b = R.tokens_per_call(cp, Chain(4, drafter=R.exact_offsets(cp)), fr, seed=3)
    np.testing.assert_array_equal(a, b)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="foresight"):
        R.SyntheticPredictor(1.0, foresight=0.0)
    with pytest.raises(ValueError, match="offsets"):
        R.regime_rows(offsets="learned")


@pytest.fixture(scope="module")
def sweep():
    return R.regime_rows(peaks=(0.0, 16.0), n_calibration=96, n_eval=128, nodes=16)


def test_peaked_p_offsets_beat_heads_and_point_mass_beats_sampled(sweep):
    assert _z(sweep, {"drafter": "offsets", "tree": "point-mass"}, {"drafter": "heads", "tree": "point-mass"}, 16.0) > 3
    assert _z(sweep, {"drafter": "offsets", "tree": "point-mass"}, {"drafter": "offsets", "tree": "sampled"}, 16.0) > 3


def test_flat_p_point_mass_does_not_beat_sampled(sweep):
    for drafter in ("heads", "offsets"):
        assert _z(sweep, {"drafter": drafter, "tree": "point-mass"}, {"drafter": drafter, "tree": "sampled"}, 0.0) < 3


def test_curve_lookup():
    rows = [{"peak": 0.0, "drafter": "offsets", "tree": "point-mass", "tokens_per_call": 1.5},
            {"peak": 2.0, "drafter": "offsets", "tree": "point-mass", "tokens_per_call": 2.5}]
    assert R.where_on_curve(rows, 2.0) == pytest.approx(1.0)
    assert R.where_on_curve(rows, 1.2) is None and R.where_on_curve(rows, 3.0) is None


def test_tree_verdicts_name_ties_within_twice_the_standard_error():
    def row(peak, tree, tpc, se=0.01):
        return {"peak": peak, "drafter": "heads", "tree": tree, "tokens_per_call": tpc, "se": se}
    rows = [row(0.0, "point-mass", 1.5), row(0.0, "sampled", 2.2), row(4.0, "point-mass", 2.27),
            row(4.0, "sampled", 2.26), row(8.0, "point-mass", 2.6), row(8.0, "sampled", 2.4)]
    v = R.tree_verdicts(rows, "heads")
    assert v == {0.0: "sampled", 4.0: "tie", 8.0: "point-mass"} and R.point_mass_from(v) == 8.0
    assert R.point_mass_from({0.0: "point-mass", 1.0: "tie"}) is None
    assert R.point_mass_from({0.0: "point-mass", 1.0: "point-mass"}) == 0.0
