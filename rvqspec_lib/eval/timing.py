"""THE timing harness (docs/style.md#benchmarks): every millisecond the project reports is measured by
:func:`interleaved`, with the machine's load watched (:class:`LoadMonitor`), the device synchronised where it is
asynchronous (:func:`device_sync`), and the facts printed beside it (:func:`machine_meta`).

* **Interleaved.** Each round runs every condition once, in an order shuffled by a seeded RNG, after ``warmup``
  untimed runs of each: a load change hits all conditions alike, so ratios within a run hold when absolute times
  drift.
* **Noise stop.** ``repeats`` rounds, or with ``noise_target`` round by round until every median's relative standard
  error is below it (:mod:`rvqspec_lib.eval.noise`).
* **Load.** The share of CPU time other processes took goes into ``meta``; above :data:`OTHER_CPU_LIMIT` a CPU
  timing is OVERSUBSCRIBED (:func:`oversubscribed_note`) and :func:`measure_quietly` measures it once more.
* **Bandwidth.** The weight-streaming floor needs the read bandwidth (:func:`read_bandwidth`); :func:`bandwidth_around`
  reads it before and after a timing and keeps the faster.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.common.machine import cpu_flags, cpu_model
from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.eval import noise

#: Index a condition is called with during warm-up run w: ``WARMUP_BASE + w`` (timed rounds are 0, 1, 2 ...), so a
#: condition that seeds its generator from the index never reuses a timed round's seed when warming up.
WARMUP_BASE = 10_000
#: Share of the machine's CPU time other processes may take during a CPU timing before it counts as oversubscribed.
#: Above it a committed run once timed t(2)/t(1) above t(4)/t(1): even a thread that keeps its core loses cache and
#: memory bandwidth to the others.
OTHER_CPU_LIMIT = 0.2
#: Bytes of the buffer :func:`read_bandwidth` streams over by default: 512 MiB, far past any CPU's last-level cache.
DEFAULT_BUFFER_BYTES = 512 * 2 ** 20
#: Timed passes of :func:`read_bandwidth` (the median is reported).
BANDWIDTH_REPEATS = 7


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``xs``, linear between order statistics.

    Raises:
        ValueError: no samples.
    """
    if not len(xs):
        raise ValueError("percentile of no samples")
    return float(np.percentile(xs, q))


def summary(ms: Sequence[float]) -> dict:
    """``{"median_ms", "p10_ms", "p90_ms", "min_ms", "n"}`` of timings in milliseconds."""
    return {"median_ms": statistics.median(ms), "p10_ms": percentile(ms, 10), "p90_ms": percentile(ms, 90),
            "min_ms": min(ms), "n": len(ms)}


def device_sync(device) -> Callable[[], None] | None:
    """The synchronisation to call before reading the clock on ``device`` (CUDA, MPS); ``None`` on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    if dev.type == "mps":
        return torch.mps.synchronize
    return None


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of all cores, CPU seconds of this process) from
    ``/proc/stat`` and ``os.times``; ``None`` where ``/proc/stat`` is missing (not Linux)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return (sum(v) - v[3] - v[4]) / tick, sum(v) / tick, t.user + t.system


class LoadMonitor:
    """A context manager: the 1-minute load average before and after, and the share of the machine's CPU time OTHER
    processes used while it was open (``other_cpu_frac``, 0..1; ``None`` where unknown)."""

    def __enter__(self) -> "LoadMonitor":
        self._before, self._load0 = _cpu_snapshot(), os.getloadavg()
        self.other_cpu_frac = None
        return self

    def __exit__(self, *exc) -> bool:
        after, load1 = _cpu_snapshot(), os.getloadavg()
        if self._before and after and after[1] > self._before[1]:
            busy, total, own = (a - b for a, b in zip(after, self._before))
            self.other_cpu_frac = max(0.0, min(1.0, (busy - own) / total))
        self._loads = (self._load0[0], load1[0])
        return False

    def describe(self) -> dict:
        """``{"load_avg_1min_before", "load_avg_1min_after", "other_cpu_frac"}`` (rounded)."""
        return {"load_avg_1min_before": round(self._loads[0], 2), "load_avg_1min_after": round(self._loads[1], 2),
                "other_cpu_frac": None if self.other_cpu_frac is None else round(self.other_cpu_frac, 3)}


def cpu_oversubscribed(meta: Mapping) -> bool | None:
    """Whether, during a CPU timing, other processes used more than :data:`OTHER_CPU_LIMIT` of the machine's CPU time
    or they and the timing's threads wanted more cores than exist (``other_cpu_frac * cpu_count + threads >
    cpu_count + 0.1``: the timing's threads were descheduled). ``None`` when unknown or not a CPU timing.

    Args:
        meta: a timing's ``meta`` (``other_cpu_frac``, ``cpu_count``, ``threads``, ``device``).
    """
    other, n_cpu = meta.get("other_cpu_frac"), meta.get("cpu_count") or os.cpu_count()
    if str(meta.get("device", "cpu")) != "cpu" or other is None:
        return None
    crowded = bool(n_cpu) and other * n_cpu + int(meta.get("threads") or 1) > n_cpu + 0.1
    return bool(other > OTHER_CPU_LIMIT or crowded)


def oversubscribed_note(meta: Mapping) -> str:
    """``"OVERSUBSCRIBED: other processes used X% of the CPU"`` when :func:`cpu_oversubscribed`, else ``""``: the
    words a timing figure's title and a timing table's caption carry."""
    if not cpu_oversubscribed(meta):
        return ""
    return f"OVERSUBSCRIBED: other processes used {100 * meta['other_cpu_frac']:.0f}% of the CPU"


def load_words(meta: Mapping) -> str:
    """A table header's words on the machine's load during a CPU timing (``""`` elsewhere or when unknown)."""
    other = meta.get("other_cpu_frac")
    if meta.get("device", "cpu") != "cpu" or other is None:
        return ""
    return (f" | load avg {meta['load_avg_1min_before']:.2f} before, {meta['load_avg_1min_after']:.2f} after | "
            f"other processes used {100 * other:.0f}% of {meta.get('cpu_count')} CPUs meanwhile"
            + (" (OVERSUBSCRIBED, TIMES ARE PESSIMISTIC: rerun idle or with fewer --threads)"
               if cpu_oversubscribed(meta) else ""))


def machine_lines(result: Mapping, flags: Mapping, floor_words: str) -> list[str]:
    """Two header lines of a table against the weight-streaming floor: the CPU (``result["device_name"]``), its
    precision flags (:func:`rvqspec_lib.models.precision.cpu_features`) and native precisions; the read bandwidth
    (``result["bandwidth"]``, :func:`bandwidth_around`'s) and ``floor_words``."""
    bw = result["bandwidth"]
    return [f"CPU {result['device_name']} | bf16 flags: {', '.join(flags['bf16']) or 'none'} | int8 dot-product "
            f"flags: {', '.join(flags['int8_dot']) or 'none'} | native precisions: "
            f"{', '.join(result['native_precisions'])}",
            f"read bandwidth {bw['gb_per_s']:.1f} GB/s (torch.sum over {bw['buffer_bytes'] / 2 ** 20:.0f} MiB, median "
            f"of {bw['repeats']}, {bw['threads']} thread(s)"
            + (f"; the faster of {bw['gb_per_s_before']:.1f} before and {bw['gb_per_s_after']:.1f} after the timing"
               if "gb_per_s_after" in bw else "")
            + (f"; {bw['gb_per_s_cpu']:.1f} GB/s in CPU time" if bw.get("gb_per_s_cpu") else "") + "); " + floor_words]


def machine_meta(module: torch.nn.Module | None = None, *, random_weights: bool | None = None) -> dict:
    """What every timing is printed beside: torch threads, CPU model, its precision flags, core count, torch
    version and its CPU capability; the module's dtype and device when given; whether the weights are random."""
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": cpu_model(),
            "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni", "avx2"))),
            "cpu_count": os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "random_weights": random_weights}
    if module is not None:
        p = next(module.parameters())
        meta.update(dtype=str(p.dtype).replace("torch.", ""), device=str(p.device))
    else:
        meta.update(device="cpu")
    return meta


@dataclass
class Timing:
    """What :func:`interleaved` measured.

    Attributes:
        ms: ``{condition: [milliseconds of each timed run]}``, in round order.
        cpu_ms: the same runs in the calling thread's CPU time (what other processes sharing the cores do not
            inflate, though their memory traffic still slows it; meaningful with one torch thread).
        out: ``{condition: [what the condition returned in each timed run]}``.
        meta: rounds made, noise target and achieved noise (:func:`rvqspec_lib.eval.noise.noise_meta`), warm-up
            runs, seed, the load during the timing (:class:`LoadMonitor`) and the machine (:func:`machine_meta`).
    """

    ms: dict
    out: dict
    meta: dict = field(default_factory=dict)
    cpu_ms: dict = field(default_factory=dict)

    def summary(self, key) -> dict:
        """:func:`summary` of one condition's timings."""
        return summary(self.ms[key])


def interleaved(conditions: Mapping[Hashable, Callable[[int], object]], *, repeats: int = 20, warmup: int = 1,
                noise_target: float | None = None, max_repeats: int | None = None, seed: int = 0,
                sync: Callable[[], None] | None = None, reset: Mapping[Hashable, Callable[[], None]] | None = None,
                progress: bool = False, desc: str = "timing", module: torch.nn.Module | None = None,
                random_weights: bool | None = None) -> Timing:
    """Time every condition, interleaved (module docstring).

    Args:
        conditions: ``{key: f}``; ``f(i)`` runs the condition once and may return anything (kept in ``out``): ``i``
            is the round (0, 1, ...) of a timed run, ``WARMUP_BASE + w`` of warm-up run w. A condition that decodes
            draws its input and seeds its generator from ``i``, so every condition sees the same inputs each round.
        repeats: timed rounds (with ``noise_target``: the minimum, >= 2). warmup: untimed runs of each condition
            first (compiled code compiles there).
        noise_target, max_repeats: the stopping rule (:func:`rvqspec_lib.eval.noise.repeat_cap`).
        seed: the shuffling RNG's seed. sync: called before starting and before stopping each clock (a GPU's
            :func:`device_sync`). reset: ``{key: g}``; ``g()`` runs after every run of that condition (warm-up
            too), outside the clock (e.g. crops a KV cache back). progress: a progress bar over the rounds. module,
            random_weights: for the meta.

    Returns:
        :class:`Timing`.

    Raises:
        ValueError: no condition, ``repeats < 1``, ``warmup < 0``, bad noise settings (one line each).
    """
    if not conditions:
        raise ValueError("nothing to time: give at least one condition")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    cap = noise.repeat_cap(noise_target, repeats, max_repeats)
    keys, reset = list(conditions), dict(reset or {})
    for w in range(warmup):
        for k in keys:
            conditions[k](WARMUP_BASE + w)
            if k in reset:
                reset[k]()
    ms = {k: [] for k in keys}
    cpu_ms = {k: [] for k in keys}
    out = {k: [] for k in keys}
    order = random.Random(seed)
    with LoadMonitor() as load:
        for r in progress_bar(range(cap), total=cap, desc=desc, enabled=progress, unit="round"):
            order.shuffle(keys)
            for k in keys:
                if sync is not None:
                    sync()
                c0, t0 = time.thread_time(), time.perf_counter()
                res = conditions[k](r)
                if sync is not None:
                    sync()
                ms[k].append((time.perf_counter() - t0) * 1e3)
                cpu_ms[k].append((time.thread_time() - c0) * 1e3)
                out[k].append(res)
                if k in reset:
                    reset[k]()
            if noise.should_stop(ms, noise_target, repeats, cap):
                break
    meta = {**machine_meta(module, random_weights=random_weights), "warmup": warmup, "seed": seed,
            **noise.noise_meta({_key_text(k): v for k, v in ms.items()}, noise_target, cap), **load.describe()}
    return Timing(ms, out, meta, cpu_ms)


def _key_text(key) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


class Phases(dict):
    """Wall seconds per named phase of a long run (its run-time budget, not a timing): ``with phases("build"):``
    adds that block's seconds to ``phases["build"]``; ``phases.total_s()`` is the seconds since it was made."""

    def __init__(self):
        super().__init__()
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - t0

    def total_s(self) -> float:
        return time.perf_counter() - self._t0


def measure_quietly(measure: Callable[[], object], *, meta: Callable[[object], Mapping] = lambda r: r,
                    attempts: int = 2):
    """Run a timing, and once more if the CPU was oversubscribed during it; keep the quieter run.

    Args:
        measure: times something and returns its result. meta: picks from that result the dict
            :func:`cpu_oversubscribed` reads (e.g. ``lambda r: r["meta"]``). attempts: timings at most.

    Returns:
        ``(result, info)``: the run with the lower ``other_cpu_frac`` and ``{"attempts": [other_cpu_frac of each
        run], "oversubscribed": bool | None, "note": oversubscribed_note}`` for it.
    """
    runs = []
    for _ in range(max(1, int(attempts))):
        r = measure()
        runs.append(r)
        if not cpu_oversubscribed(meta(r)):
            break
    best = min(runs, key=lambda r: (meta(r).get("other_cpu_frac") is None, meta(r).get("other_cpu_frac") or 0.0))
    return best, {"attempts": [meta(r).get("other_cpu_frac") for r in runs],
                  "oversubscribed": cpu_oversubscribed(meta(best)), "note": oversubscribed_note(meta(best))}


def llc_bytes(cache_dir: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of the largest CPU cache of cpu0 in bytes, from sysfs (``index*/size`` such as ``32768K``); ``None``
    where sysfs does not say (not Linux)."""
    sizes = []
    for f in Path(cache_dir).glob("index*/size"):
        try:
            s = f.read_text().strip().upper()
        except OSError:
            continue
        digits = s[:-1] if s[-1:] in ("K", "M", "G") else s
        if digits.isdigit():
            sizes.append(int(digits) * {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(s[-1:], 1))
    return max(sizes) if sizes else None


def read_bandwidth(*, buffer_bytes: int | None = None, repeats: int = BANDWIDTH_REPEATS) -> dict:
    """Streaming read bandwidth of this machine with torch's current thread count (the commands set 1):
    ``torch.sum`` over a float32 buffer much larger than the last-level cache (the sum reads every byte once and
    writes nothing), once untimed to fault the pages in, then ``repeats`` timed passes (:func:`interleaved`).

    Args:
        buffer_bytes: size of the buffer (default :data:`DEFAULT_BUFFER_BYTES`; keep it several times the LLC).
        repeats: timed passes (>= 1); the median is reported.

    Returns:
        ``{"gb_per_s": median (1e9 bytes per second), "gb_per_s_max", "buffer_bytes", "repeats", "threads",
        "llc_bytes", "buffer_exceeds_llc"}``.

    Raises:
        ValueError: ``buffer_bytes < 4096`` or ``repeats < 1``.
    """
    buffer_bytes = DEFAULT_BUFFER_BYTES if buffer_bytes is None else int(buffer_bytes)
    if buffer_bytes < 4096 or repeats < 1:
        raise ValueError(f"need buffer_bytes >= 4096 and repeats >= 1, got {buffer_bytes} and {repeats}")
    buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)  # pages faulted in here
    n_bytes = buf.numel() * 4
    with torch.inference_mode():
        t = interleaved({"sum": lambda _i: torch.sum(buf)}, repeats=repeats, warmup=1)
    rates = [n_bytes / (x / 1e3) / 1e9 for x in t.ms["sum"]]
    cpu = [n_bytes / (x / 1e3) / 1e9 for x in t.cpu_ms["sum"] if x > 0] if torch.get_num_threads() == 1 else []
    llc = llc_bytes()
    return {"gb_per_s": statistics.median(rates), "gb_per_s_max": max(rates),
            "gb_per_s_cpu": statistics.median(cpu) if cpu else None, "buffer_bytes": n_bytes,
            "repeats": repeats, "threads": torch.get_num_threads(), "llc_bytes": llc,
            "buffer_exceeds_llc": None if llc is None else n_bytes > 4 * llc}


def bandwidth_around(measure: Callable[[], object], **read_kw) -> tuple[object, dict]:
    """Run ``measure()`` between two reads of the machine's streaming read bandwidth (:func:`read_bandwidth`,
    ``read_kw`` its keywords) and keep the faster read: another process's load lowers a read, and the floor must not
    be set by a busy moment.

    Returns:
        ``(measure's result, bandwidth)``: ``read_bandwidth``'s dict of the faster read, plus ``gb_per_s_before`` and
        ``gb_per_s_after``.
    """
    before = read_bandwidth(**read_kw)
    result = measure()
    after = read_bandwidth(**read_kw)
    best = max(before, after, key=lambda b: b["gb_per_s"])
    cpu = [b["gb_per_s_cpu"] for b in (before, after) if b.get("gb_per_s_cpu")]
    return result, {**best, "gb_per_s_before": before["gb_per_s"], "gb_per_s_after": after["gb_per_s"],
                    "gb_per_s_cpu": max(cpu) if cpu else None}
