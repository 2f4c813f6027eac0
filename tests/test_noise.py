"""The noise stopping rule (rvqspec_lib.eval.noise) on constructed samples, and the timing loops that use it."""

from __future__ import annotations

import math
import random

import pytest

from rvqspec_lib.eval import noise as N

K = N.MEDIAN_SE_FACTOR * N.MAD_TO_SIGMA  # 1.2533 * 1.4826


def test_relative_standard_error_exact():
    # median 10, |x - 10| = 1, 0, 1, 0, 2 -> MAD 1; n = 5
    assert N.relative_standard_error([9.0, 10.0, 11.0, 10.0, 12.0]) == pytest.approx(K * 1 / math.sqrt(5) / 10,
                                                                                     rel=1e-12)
    assert N.relative_standard_error([3.0, 3.0, 3.0]) == 0.0  # MAD 0
    assert N.relative_standard_error([1.0]) == math.inf  # nothing known yet
    # unitless: seconds or milliseconds give the same fraction
    xs = [0.011, 0.012, 0.010, 0.013]
    assert N.relative_standard_error(xs) == pytest.approx(N.relative_standard_error([1e3 * x for x in xs]))


def test_should_stop_respects_target_min_and_max():
    quiet = {"a": [10.0, 10.0, 10.1, 9.9], "b": [5.0, 5.0, 5.0, 5.0]}  # a: MAD 0.05 -> 1.2533*1.4826*0.05/2/10
    assert N.relative_standard_error(quiet["a"]) == pytest.approx(K * 0.05 / 2 / 10)  # 0.00464...
    assert N.should_stop(quiet, 0.005, min_repeats=4, max_repeats=10)
    assert not N.should_stop(quiet, 0.004, min_repeats=4, max_repeats=10)  # a misses it
    assert not N.should_stop(quiet, 0.005, min_repeats=5, max_repeats=10)  # below the minimum: never
    assert N.should_stop(quiet, 0.004, min_repeats=2, max_repeats=4)  # at the cap: always
    # the shortest condition counts the rounds
    assert not N.should_stop({"a": [1.0] * 6, "b": [1.0] * 3}, 0.5, min_repeats=4, max_repeats=6)
    # no target: exactly min_repeats
    assert not N.should_stop({"a": [1.0, 9.0]}, None, min_repeats=3, max_repeats=3)
    assert N.should_stop({"a": [1.0, 9.0, 5.0]}, None, min_repeats=3, max_repeats=3)


def test_noisy_samples_never_stop_before_max():
    """Negative control: log-uniform timings spread over x10 have a relative SE far above 1 % at any n <= 200."""
    rng = random.Random(0)
    xs: list[float] = []
    for n in range(1, 200):
        xs.append(10 ** rng.uniform(0, 1))
        assert N.should_stop({"noisy": xs, "quiet": [1.0] * n}, 0.01, 3, 200) is False
    xs.append(1.0)
    assert N.should_stop({"noisy": xs, "quiet": [1.0] * 200}, 0.01, 3, 200) is True  # the cap


@pytest.mark.parametrize("kw, word", [(dict(noise_target=0.0), "> 0"), (dict(noise_target=-1.0), "> 0"),
                                      (dict(noise_target=0.02, repeats=1), ">= 2"),
                                      (dict(noise_target=0.02, max_repeats=3), "max_repeats must be >= repeats"),
                                      (dict(max_repeats=8), "needs a noise_target")])
def test_bad_settings_one_line(kw, word):
    kw = {"noise_target": None, "repeats": 5, "max_repeats": None, **kw}
    with pytest.raises(ValueError, match=word) as e:
        N.repeat_cap(kw["noise_target"], kw["repeats"], kw["max_repeats"])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError):
        N.should_stop({"a": [1.0, 2.0]}, 0.02, 5, 3)


def test_repeat_cap_defaults():
    assert N.repeat_cap(None, 7, None) == 7
    assert N.repeat_cap(0.02, 5, None) == N.DEFAULT_MAX_FACTOR * 5
    assert N.repeat_cap(0.02, 5, 5) == 5


def test_noise_meta_and_words():
    m = N.noise_meta({"a": [9.0, 10.0, 11.0, 10.0, 12.0], "b": [1.0]}, 0.02, 20)
    assert m["repeats"] == 1 and m["max_repeats"] == 20 and m["noise_target"] == 0.02
    assert m["rel_se"]["b"] is None and m["rel_se_max"] is None
    m = N.noise_meta({"a": [9.0, 10.0, 11.0, 10.0, 12.0]}, 0.02, 20)
    assert m["rel_se_max"] == round(K / math.sqrt(5) / 10, 4)
    assert N.noise_words(m).startswith("5 repeats (noise target 2.0 %, at most 20)")
    assert N.noise_words({**m, "noise_target": None}).startswith("5 repeats, median's")
