"""THE timing harness (docs/style.md#benchmarks): every millisecond the project reports is measured by
:func:`interleaved` (each round runs every condition once in a seeded shuffled order, so ratios within a run hold
when absolute times drift; ``repeats`` rounds, or until ``noise_target``), with the machine's load watched
(:class:`LoadMonitor`, OVERSUBSCRIBED timings measured again: :func:`measure_quietly`), the device synchronised
(:func:`device_sync`), the facts printed beside it (:func:`machine_meta`) and the read bandwidth of the floors
(:func:`read_bandwidth`, :func:`bandwidth_around`)."""

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


def summary(ms: Sequence[float]) -> dict:
    """``{"median_ms", "p10_ms", "p90_ms", "min_ms", "n"}`` of timings in milliseconds (percentiles linear between
    order statistics). Raises ValueError: no samples."""
    return {"median_ms": statistics.median(ms), "p10_ms": float(np.percentile(ms, 10)),
            "p90_ms": float(np.percentile(ms, 90)), "min_ms": min(ms), "n": len(ms)}


def device_sync(device) -> Callable[[], None] | None:
    """The synchronisation to call before reading the clock on ``device`` (CUDA, MPS); ``None`` on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    if dev.type == "mps":
        return torch.mps.synchronize
    return None


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """(busy CPU s of the machine, CPU s of all cores, CPU s of this process); ``None`` without ``/proc/stat``."""
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
    processes used while open (``other_cpu_frac``, 0..1; ``None`` where unknown)."""

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
    """Whether, during a CPU timing (``meta``: ``other_cpu_frac``, ``cpu_count``, ``threads``, ``device``), other
    processes used more than :data:`OTHER_CPU_LIMIT` of the CPU time or they and the timing's threads wanted more
    cores than exist. ``None`` when unknown or not a CPU timing."""
    other, n_cpu = meta.get("other_cpu_frac"), meta.get("cpu_count") or os.cpu_count()
    if str(meta.get("device", "cpu")) != "cpu" or other is None:
        return None
    crowded = bool(n_cpu) and other * n_cpu + int(meta.get("threads") or 1) > n_cpu + 0.1
    return bool(other > OTHER_CPU_LIMIT or crowded)


def oversubscribed_note(meta: Mapping) -> str:
    """``"OVERSUBSCRIBED: other processes used X% of the CPU"`` when :func:`cpu_oversubscribed`, else ``""``."""
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
    """Two header lines of a table against the floor: the CPU, its precision flags and native precisions; the read
    bandwidth and ``floor_words``."""
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
    """What every timing is printed beside: threads, CPU, flags, cores, torch and its CPU capability; the module's
    dtype and device; random weights."""
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
        cpu_ms: the same runs in the calling thread's CPU time (meaningful with one torch thread).
        out: ``{condition: [what the condition returned in each timed run]}``.
        meta: rounds, noise target and achieved noise, warm-up runs, seed, the load and the machine."""

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
            is the timed round (0, 1, ...) or ``WARMUP_BASE + w`` for warm-up run w, so every condition can draw the
            same inputs each round.
        repeats: timed rounds (with ``noise_target``: the minimum, >= 2). warmup: untimed runs of each condition
            first.
        noise_target, max_repeats: the stopping rule (:func:`rvqspec_lib.eval.noise.repeat_cap`).
        seed: the shuffling RNG's. sync: called around each clock (a GPU's :func:`device_sync`). reset: ``{key: g}``,
            ``g()`` after every run of that condition, outside the clock. progress: a progress bar. module,
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
    """Wall seconds per named phase of a long run (a run-time budget, not a timing): ``with phases("build"):`` adds
    to ``phases["build"]``; ``total_s()``: the seconds since it was made."""

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
    """Run ``measure()`` (a timing), and once more if the CPU was oversubscribed during it; keep the quieter run.

    Args:
        meta: picks from the result the dict :func:`cpu_oversubscribed` reads. attempts: timings at most.

    Returns:
        ``(result, info)``: ``info = {"attempts": [other_cpu_frac of each run], "oversubscribed", "note"}``.
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
    """Size of the largest CPU cache of cpu0 in bytes, from sysfs; ``None`` where sysfs does not say."""
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
    """Streaming read bandwidth with torch's current thread count: ``torch.sum`` over a float32 buffer much larger
    than the last-level cache (``buffer_bytes``, default :data:`DEFAULT_BUFFER_BYTES`), once untimed, then ``repeats``
    timed passes.

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
    """Run ``measure()`` between two :func:`read_bandwidth` reads and keep the faster (a busy moment must not set the
    floor).

    Returns:
        ``(measure's result, bandwidth)``: the faster read's dict plus ``gb_per_s_before`` and ``gb_per_s_after``.
    """
    before = read_bandwidth(**read_kw)
    result = measure()
    after = read_bandwidth(**read_kw)
    best = max(before, after, key=lambda b: b["gb_per_s"])
    cpu = [b["gb_per_s_cpu"] for b in (before, after) if b.get("gb_per_s_cpu")]
    return result, {**best, "gb_per_s_before": before["gb_per_s"], "gb_per_s_after": after["gb_per_s"],
                    "gb_per_s_cpu": max(cpu) if cpu else None}
