"""The timing harness (rvqspec_lib.eval.timing): what it does, not how fast anything is. The stopping rule, the seeded
interleaving order, the warm-up indices, the reset outside the clock, the load monitor's fields and verdict, the
re-measurement of an oversubscribed run, and the bandwidth read before and after a timing with the faster kept."""

from __future__ import annotations

import pytest
import torch

from rvqspec_lib.eval import noise
from rvqspec_lib.eval import timing as T


def _recorder(keys):
    """Conditions that record ``(key, index)`` of every run, in order."""
    calls = []
    return calls, {k: (lambda i, k=k: calls.append((k, i)) or k) for k in keys}


def test_every_condition_runs_once_a_round_in_a_seeded_shuffled_order():
    calls, conds = _recorder("abcd")
    t = T.interleaved(conds, repeats=6, warmup=0, seed=3)
    rounds = [calls[4 * r: 4 * r + 4] for r in range(6)]
    assert all(sorted(k for k, _ in rd) == list("abcd") and {i for _, i in rd} == {r} for r, rd in enumerate(rounds))
    orders = [tuple(k for k, _ in rd) for rd in rounds]
    assert len(set(orders)) > 1  # shuffled each round
    again, conds = _recorder("abcd")
    T.interleaved(conds, repeats=6, warmup=0, seed=3)
    assert again == calls  # the same seed, the same order
    other, conds = _recorder("abcd")
    T.interleaved(conds, repeats=6, warmup=0, seed=4)
    assert other != calls  # negative control: another seed, another order
    assert {k: len(v) for k, v in t.ms.items()} == dict.fromkeys("abcd", 6) and t.out["a"] == ["a"] * 6
    assert t.meta["repeats"] == 6 and t.meta["seed"] == 3 and t.meta["warmup"] == 0


def test_warm_up_runs_have_their_own_indices_and_are_not_timed():
    calls, conds = _recorder("ab")
    t = T.interleaved(conds, repeats=2, warmup=2, seed=0)
    warm = calls[:4]
    assert warm == [("a", T.WARMUP_BASE), ("b", T.WARMUP_BASE), ("a", T.WARMUP_BASE + 1), ("b", T.WARMUP_BASE + 1)]
    assert sorted(i for _, i in calls[4:]) == [0, 0, 1, 1] and len(t.ms["a"]) == 2


def test_reset_runs_after_every_run_outside_the_clock(monkeypatch):
    clock, events = [0.0], []
    monkeypatch.setattr(T.time, "perf_counter", lambda: clock[0])

    def run(_i):
        events.append("run")
        clock[0] += 0.002  # the timed call: 2 ms

    def reset():
        events.append("reset")
        clock[0] += 1.0  # slow, and outside the clock: not in the times

    t = T.interleaved({"x": run}, repeats=3, warmup=1, reset={"x": reset})
    assert events == ["run", "reset"] * 4
    assert t.ms["x"] == pytest.approx([2.0, 2.0, 2.0])


def test_the_noise_target_stops_between_the_minimum_and_the_cap(monkeypatch):
    _, conds = _recorder("ab")
    assert T.interleaved(conds, repeats=3, warmup=0, noise_target=1e9).meta["repeats"] == 3  # met at once
    seen = []

    def at_five(samples, target, lo, hi):
        seen.append((min(map(len, samples.values())), max(map(len, samples.values())), target, lo, hi))
        return min(map(len, samples.values())) >= 5

    monkeypatch.setattr(noise, "should_stop", at_five)
    t = T.interleaved(conds, repeats=3, warmup=0, noise_target=0.02, max_repeats=9)
    assert t.meta["repeats"] == 5 and t.meta["max_repeats"] == 9 and t.meta["noise_target"] == 0.02
    assert seen == [(n, n, 0.02, 3, 9) for n in range(1, 6)]  # every condition each round
    assert set(t.meta["rel_se"]) == {"a", "b"}
    monkeypatch.setattr(noise, "should_stop", lambda s, t, lo, hi: min(map(len, s.values())) >= hi)  # never met
    assert T.interleaved(conds, repeats=2, warmup=0, noise_target=0.02).meta["repeats"] == 4 * 2
    for kw, word in ((dict(repeats=1, noise_target=0.02), ">= 2"), (dict(max_repeats=8), "needs a noise_target"),
                     (dict(repeats=0), "repeats >= 1"), (dict(warmup=-1), "warmup >= 0")):
        with pytest.raises(ValueError, match=word):
            T.interleaved(conds, **kw)
    with pytest.raises(ValueError, match="at least one condition"):
        T.interleaved({})


def test_tuple_keys_name_their_noise_by_parts():
    t = T.interleaved({("float32", "official", 1): lambda i: None}, repeats=2, warmup=0)
    assert set(t.meta["rel_se"]) == {"float32/official/1"}


def test_summary_and_percentile():
    s = T.summary([4.0, 1.0, 3.0, 2.0, 5.0])
    assert s == {"median_ms": 3.0, "p10_ms": pytest.approx(1.4), "p90_ms": pytest.approx(4.6), "min_ms": 1.0, "n": 5}
    assert T.summary([7.0])["p90_ms"] == 7.0
    with pytest.raises(ValueError):
        T.summary([])
    assert T.device_sync("cpu") is None


def test_the_load_monitor_reports_the_share_of_other_processes(monkeypatch):
    snaps = iter([(10.0, 40.0, 1.0), (13.0, 44.0, 2.0)])  # 4 CPU-s passed: 3 busy, 1 of them ours -> others 2 of 4
    monkeypatch.setattr(T, "_cpu_snapshot", lambda: next(snaps))
    with T.LoadMonitor() as load:
        pass
    d = load.describe()
    assert set(d) == {"load_avg_1min_before", "load_avg_1min_after", "other_cpu_frac"}
    assert d["other_cpu_frac"] == 0.5
    monkeypatch.setattr(T, "_cpu_snapshot", lambda: None)  # not Linux: unknown, not zero
    with T.LoadMonitor() as load:
        pass
    assert load.describe()["other_cpu_frac"] is None


def test_cpu_snapshot_reads_proc_stat():
    snap = T._cpu_snapshot()
    if snap is not None:  # Linux
        busy, total, own = snap
        assert 0 <= busy <= total and own >= 0


def test_oversubscribed_verdict_and_words():
    r = {"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": 0.5}
    assert T.cpu_oversubscribed(r) is True  # one busy core of two: above OTHER_CPU_LIMIT
    assert T.cpu_oversubscribed({**r, "other_cpu_frac": T.OTHER_CPU_LIMIT}) is False  # at the limit: quiet
    assert T.cpu_oversubscribed({**r, "other_cpu_frac": 0.1, "threads": 2}) is True  # threads wanting cores
    assert T.cpu_oversubscribed({**r, "other_cpu_frac": 0.02}) is False
    assert T.cpu_oversubscribed({**r, "device": "cuda"}) is None
    assert T.cpu_oversubscribed({**r, "other_cpu_frac": None}) is None
    assert T.oversubscribed_note({**r, "other_cpu_frac": 0.634}) == \
        "OVERSUBSCRIBED: other processes used 63% of the CPU"
    assert T.oversubscribed_note({**r, "other_cpu_frac": 0.05}) == ""


@pytest.mark.parametrize("shares, runs, note", [
    ([0.05], 1, ""),                      # quiet: measured once
    ([0.63, 0.04], 2, ""),                # oversubscribed, then quiet: re-measured once, the quiet run kept
    ([0.63, 0.45], 2, "OVERSUBSCRIBED: other processes used 45% of the CPU"),  # still: the quieter run, labelled
    ([0.45, 0.63], 2, "OVERSUBSCRIBED: other processes used 45% of the CPU"),
])
def test_measure_quietly_remeasures_once_with_the_cpu_share_faked(shares, runs, note):
    calls = []

    def measure():  # a timing whose CPU share is faked: the i-th run reports shares[i]
        calls.append(len(calls))
        return {"meta": {"device": "cpu", "cpu_count": 2, "threads": 1, "other_cpu_frac": shares[len(calls) - 1]}}

    result, info = T.measure_quietly(measure, meta=lambda r: r["meta"])
    assert len(calls) == runs and info["attempts"] == shares[:runs]
    assert result["meta"]["other_cpu_frac"] == min(shares[:runs]) and info["note"] == note
    assert info["oversubscribed"] is bool(note)


@pytest.mark.parametrize("reads", [(10.0, 12.0), (12.0, 10.0)])
def test_bandwidth_around_reads_before_and_after_and_keeps_the_faster(monkeypatch, reads):
    order, it = [], iter(reads)

    def read(**kw):
        order.append(("read", kw))
        return {"gb_per_s": next(it), "buffer_bytes": kw.get("buffer_bytes")}

    monkeypatch.setattr(T, "read_bandwidth", read)
    result, bw = T.bandwidth_around(lambda: order.append("measure") or 42, buffer_bytes=4096)
    assert result == 42 and [o if o == "measure" else o[0] for o in order] == ["read", "measure", "read"]
    assert bw["gb_per_s"] == 12.0 and (bw["gb_per_s_before"], bw["gb_per_s_after"]) == reads
    assert bw["buffer_bytes"] == 4096


def test_read_bandwidth_contract():
    bw = T.read_bandwidth(buffer_bytes=1 << 20, repeats=3)
    assert bw["gb_per_s"] > 0 and bw["gb_per_s_max"] >= bw["gb_per_s"] and bw["repeats"] == 3
    assert bw["buffer_bytes"] == 1 << 20 and bw["threads"] == torch.get_num_threads()
    with pytest.raises(ValueError):
        T.read_bandwidth(buffer_bytes=16)


def test_llc_bytes_reads_sysfs(tmp_path):
    for idx, size in ((0, "48K"), (2, "1024K"), (3, "32768K")):
        (tmp_path / f"index{idx}").mkdir()
        (tmp_path / f"index{idx}" / "size").write_text(size + "\n")
    assert T.llc_bytes(tmp_path) == 32 * 2 ** 20
    assert T.llc_bytes(tmp_path / "absent") is None


def test_machine_meta_names_threads_device_and_weights():
    m = T.machine_meta(torch.nn.Linear(2, 2).to(torch.bfloat16), random_weights=True)
    assert m["threads"] == torch.get_num_threads() and m["dtype"] == "bfloat16" and m["device"] == "cpu"
    assert m["random_weights"] is True and m["cpu_count"] and "cpu" in m
