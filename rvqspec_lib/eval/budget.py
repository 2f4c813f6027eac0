"""A node budget per device: ``--decoder auto`` (the paper chose N by hand per device and left automatic choice as
future work; Sequoia and EAGLE-2 choose from measured verify costs; docs/methods.md#choosing-the-node-budget).

:func:`choose_decoder` times, on the running device and dtype,

1. the real verify call (the backend's forward with the shapes of each candidate tree,
   :func:`rvqspec_lib.eval.speed.verify_cost_curve`) for every node budget N, giving the cost curve t(N)/t(1) and the predicted speedup ``E(N) t(1) / t(N)`` from the
   calibrated tokens per call E(N) (the check the paper's per-device tables imply);
2. then, for the most promising candidates and AR, whole frames decoded one at a time (the streaming case),
   interleaved (:func:`rvqspec_lib.eval.speed.time_frames`), and picks the decoder with the least measured time per
   committed code.

:func:`auto_decoder` caches the choice per device, model, dtype, drafter, thread count and calibration in a small
JSON file (``$RVQSPEC_CACHE`` or ``~/.cache/rvqspec``), so the timing runs once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rvqspec_lib.eval.acceptance import predicted_tokens_per_call
from rvqspec_lib.eval.speed import time_frames, verify_cost_curve
from rvqspec_lib.models.tree_files import tree_from_calibration
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoders import AR, CHAIN_WINDOWS, Chain
from rvqspec_lib.decoding.predictor import OfficialBackend
from rvqspec_lib.decoding.sampling import Sampling

#: The backend name of a choice run as the whole frame in one C call (:mod:`rvqspec_lib.models.native_frame`).
NATIVE_FRAME = "native-frame"
#: Node budgets N (root included) considered for calibrated trees.
AUTO_BUDGETS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class AutoChoice:
    """What :func:`choose_decoder` chose and why.

    Attributes:
        label: the decoder's name (``ar``, ``chain:4``, ``calibrated-sampled:16`` ...), usable on the command line.
        decoder: the decoder object. reason: one line saying why (measured time per code against AR and the rest).
        table: one row per candidate: ``label``, ``nodes`` (N), ``predicted_tokens_per_call``, ``verify_ms``,
            ``verify_ratio`` t(N)/t(1), ``predicted_speedup`` E(N) t(1)/t(N), and for the measured candidates
            ``ms_per_code`` and ``speedup`` (vs AR's measured time per code).
        key: the cache key (device, model, dtype, drafter, threads, calibration digest).
        oversubscribed: the ``OVERSUBSCRIBED: ...`` words (:func:`rvqspec_lib.eval.timing.oversubscribed_note`) when
            other processes crowded the CPU while the verify calls were timed, else ``""`` (such a choice is not
            cached).
        backend: the chosen backend's name when :func:`choose_decoder` chose among ``backends`` (``native-frame``:
            the whole frame in one C call, :data:`NATIVE_FRAME`), else ``None``.
    """

    label: str
    decoder: object
    reason: str
    table: list = field(default_factory=list)
    key: dict = field(default_factory=dict)
    oversubscribed: str = ""
    backend: str | None = None


def device_name(device: torch.device) -> str:
    """A stable name of the device being timed: the GPU's name, or the CPU model and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from rvqspec_lib.common.provenance import cpu_model

    return f"{cpu_model() or platform.processor() or 'cpu'} ({os.cpu_count()} cores)"


def _check_device(device: torch.device) -> None:
    if device.type == "meta":
        raise ValueError("auto cannot time a model on the meta device: load it on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"auto cannot time on {device}: CUDA is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"auto does not know how to time on {device.type}: use cpu or cuda, or pick a decoder")


def tables_from_calibration(calibration: dict) -> dict:
    """The per-start-depth tables :func:`~rvqspec_lib.eval.acceptance.predicted_tokens_per_call` needs, from a
    calibration file: ``alpha`` (the first sampled child = a chain's draft), ``rank_mass``, ``child_accept``."""
    nan = lambda x: np.array([[np.nan if v is None else v for v in r] for r in x], dtype=np.float64)  # noqa: E731
    pm = np.stack([nan(r) for r in calibration["point-mass"]["by_start_depth"]])
    ch = np.stack([nan(r) for r in calibration["sampled"]["by_start_depth"]])
    return {"alpha": ch[..., 0], "rank_mass": pm, "child_accept": ch}


def candidates(calibration: dict, budgets: Sequence[int] = AUTO_BUDGETS) -> list[tuple[str, object, int, float]]:
    """``(label, decoder, N, predicted tokens per call)`` for AR, every chain window and every calibrated tree."""
    n = int(calibration["n_codes"])
    tables = tables_from_calibration(calibration)
    out = [("ar", AR(), 1, 1.0)]
    k_tab = tables["alpha"].shape[1]
    for w in CHAIN_WINDOWS:
        if w - 1 <= k_tab:
            out.append((f"chain:{w}", Chain(w), w, predicted_tokens_per_call(tables, Chain(w), n)))
    have = {int(b) for b in calibration["budgets"]}
    for kind in ("point-mass", "sampled"):
        for b in budgets:
            if b in have:
                tree = tree_from_calibration(calibration, kind, b)
                out.append((f"calibrated-{kind}:{b}", tree, b, float(calibration[kind]["predicted_tokens_per_call"][str(b)])))
    return out






def choose_decoder(code_predictor, calibration: dict, contexts: torch.Tensor, *, drafter=None,
                   sampling: Sampling | None = None, budgets: Sequence[int] = AUTO_BUDGETS, shortlist: int = 5,
                   frames: int = 16, repeats: int = 3, cost_repeats: int = 5, backend=None, backends=None,
                   seed: int = 0, progress: bool = False, acceptance=None,
                   noise_target: float | None = None, native_frames: bool = True) -> AutoChoice:
    """Choose the decoder (and, given several, the backend) with the least measured time per committed code on this
    device (module docstring).

    Args:
        code_predictor: the official module, on the device and in the dtype to be used.
        calibration: a calibration of trees for this model and drafter (:mod:`rvqspec_lib.models.tree_files`).
        contexts: ``(N, 2, talker_hidden)`` inner-loop contexts (e.g. the calibration split's); the first ``frames``
            are decoded. drafter, sampling: as deployed. budgets: node budgets of calibrated trees considered.
        shortlist: candidates (besides AR) decoded per backend, the best by predicted speedup ``E(N) t(1)/t(N)``.
        repeats: passes over the ``frames`` contexts, every candidate interleaved
            (:func:`rvqspec_lib.eval.speed.time_frames`). cost_repeats: repeats of each verify-call timing
            (:func:`rvqspec_lib.eval.speed.verify_cost_curve`). backend: the verify backend to time and use
            (default the official module; e.g. :class:`rvqspec_lib.models.lean.LeanCodePredictor`).
        backends: instead of ``backend``, ``{name: verify backend}`` to choose among (e.g. ``{"official": ...,
            "native": NativeCodePredictor(cp)}``): each gets its own cost curve and shortlist, all shortlisted
            (decoder, backend) pairs are timed in one interleaved run, and the fastest pair wins
            (:attr:`AutoChoice.backend`). The precision is never changed: every backend runs ``code_predictor`` as
            converted.
        native_frames: when a backend is the native forward (:class:`rvqspec_lib.models.native.NativeCodePredictor`),
            also time AR and every chain window as the WHOLE frame in one C call
            (:func:`rvqspec_lib.models.native_frame.native_frame_for`; rows of backend ``native-frame``), which
            ``synth`` runs when they win. Not in a timing replay (the C frame computes its own acceptance).
        acceptance: a TIMING REPLAY's oracle (:class:`~rvqspec_lib.decoding.replay.AcceptanceOracle`): the frames
            are decoded with it (a random-weight architecture with a trained model's acceptance); such a choice
            is for a timing table, never cached (:func:`auto_decoder` does not pass one).
        noise_target: None (the fixed counts above), or both timings go on past their counts (the minimum) until
            every median's relative standard error is <= it, or 4 x the counts (:mod:`rvqspec_lib.eval.noise`).

    Returns:
        :class:`AutoChoice`; its ``table`` has one row per (candidate, backend), ``speedup`` against AR through the
        FIRST backend (the reference: the official module unless given otherwise).

    Raises:
        ValueError: a device that cannot be timed, a calibration for another model, no contexts, both ``backend``
            and ``backends``.
    """
    cp = code_predictor
    dev = next(cp.parameters()).device
    _check_device(dev)
    n = P.n_codes(cp)
    if int(calibration.get("n_codes", -1)) != n or int(calibration.get("codebook_size", -1)) != int(cp.config.vocab_size):
        raise ValueError("the calibration was made for another model (codes or codebook size differ): recalibrate")
    if contexts.shape[0] < 1:
        raise ValueError("no contexts to time the decoders on")
    if backend is not None and backends:
        raise ValueError("give backend or backends, not both")
    pool = dict(backends) if backends else {"official" if backend is None else getattr(backend, "name", "b"):
                                            OfficialBackend(cp) if backend is None else backend}
    cands = candidates(calibration, budgets)
    from rvqspec_lib.eval.timing import oversubscribed_note

    rows, crowded, chosen = [], "", {"ar"}
    for bname, bk in pool.items():
        curve = verify_cost_curve(cp, {bname: bk}, query_sizes=sorted({c[2] for c in cands}), repeats=cost_repeats,
                                  warmup=2, seed=seed, progress=progress, noise_target=noise_target)
        costs = {r["query_positions"]: r["median_ms"] for r in curve["rows"]}
        crowded = crowded or oversubscribed_note({**curve["meta"],
                                                  "cpu_count": curve["meta"].get("cpu_count") or os.cpu_count()})
        t1 = costs[1]
        mine = [{"label": label, "backend": bname, "nodes": nodes, "predicted_tokens_per_call": e,
                 "verify_ms": costs[nodes], "verify_ratio": costs[nodes] / t1, "predicted_speedup": e * t1 / costs[nodes]}
                for label, dec, nodes, e in cands]
        rows += mine
        ranked = sorted((r for r in mine if r["label"] != "ar"), key=lambda r: -r["predicted_speedup"])
        chosen |= {r["label"] for r in ranked[:shortlist]}
    by_label = {c[0]: c[1] for c in cands}
    chosen = ["ar"] + sorted(chosen - {"ar"})
    whole = []  # AR and every chain window as one C call a frame, where a backend is the native forward
    if native_frames and acceptance is None:
        from rvqspec_lib.models.native_frame import native_frame_for

        for bk in pool.values():
            for label in ("ar", *(c[0] for c in cands if c[0].startswith("chain:"))):
                f = native_frame_for(cp, by_label[label], sampling, drafter=drafter, backend=bk)
                if f is not None:
                    whole.append(f)
            if whole:
                break
    timed = time_frames(cp, contexts[:frames], {k: by_label[k] for k in chosen}, pool, sampling=sampling,
                        drafter=drafter, repeats=repeats * min(frames, contexts.shape[0]), warmup=1, seed=seed,
                        progress=progress, acceptance=acceptance, noise_target=noise_target,
                        fused_spec={NATIVE_FRAME: whole} if whole else None)
    measured = {}
    for r in timed["rows"]:
        if r["backend"] == NATIVE_FRAME:  # fused-chain<w>: the C frame of window w (1: AR)
            w = int(r["decoder"].rsplit("chain", 1)[1])
            label = "ar" if w == 1 else f"chain:{w}"
            measured[(label, NATIVE_FRAME)] = r
            rows.append({"label": label, "backend": NATIVE_FRAME, "nodes": w, "predicted_tokens_per_call": None,
                         "verify_ms": None, "verify_ratio": None, "predicted_speedup": None})
        else:
            measured[(r["decoder"], r["backend"])] = r
    ref = next(iter(pool))
    ar_ms = measured[("ar", ref)]["ms_per_frame"] / n
    for r in rows:
        m = measured.get((r["label"], r["backend"]))
        r["ms_per_code"] = m["ms_per_frame"] / n if m else None
        r["measured_tokens_per_call"] = m["tokens_per_call"] if m else None
        r["speedup"] = ar_ms / r["ms_per_code"] if m else None
    best_label, best_backend = min(measured, key=lambda k: measured[k]["ms_per_frame"])
    b = next(r for r in rows if r["label"] == best_label and r["backend"] == best_backend)
    where = (" as the whole frame in one C call (native forward)" if best_backend == NATIVE_FRAME
             else f" through the {best_backend} forward" if len(pool) > 1 else "")
    vs = f"AR's {ar_ms:.3f}" + (f" through the {ref} forward" if len(pool) > 1 else "")
    ars = {bk: m["ms_per_frame"] / n for (lab, bk), m in measured.items() if lab == "ar"}
    if len(ars) > 1:  # AR through several forwards: the gain over the fastest AR too (what speculation adds)
        fast_bk = min(ars, key=ars.get)
        how = "as the native whole frame" if fast_bk == NATIVE_FRAME else f"through the {fast_bk} forward"
        vs += f"; {ars[fast_bk] / b['ms_per_code']:.2f}x the fastest AR, {how}, {ars[fast_bk]:.3f}"
    verify = (f", verify call t({b['nodes']})/t(1) = {b['verify_ratio']:.2f}, predicted speedup E(N) t(1)/t(N) = "
              f"{b['predicted_speedup']:.2f}x" if b["verify_ratio"] is not None else "")
    reason = (f"{best_label}{where}: {b['ms_per_code']:.3f} ms per code measured ({b['speedup']:.2f}x {vs}), "
              f"{b['measured_tokens_per_call']:.2f} tokens per call{verify}; "
              f"{len(chosen)} of {len(cands)} candidates decoded"
              + (f" through each of {len(pool)} forwards ({', '.join(pool)})" if len(pool) > 1 else "")
              + (f", AR and {len(whole) - 1} chain windows as native whole frames" if whole else "")
              + f" ({min(frames, contexts.shape[0])} frames x {repeats} repeats)")
    if noise_target is not None:
        from rvqspec_lib.eval.noise import noise_words

        reason += f"; frames timed: {noise_words(timed['meta'])}"
    return AutoChoice(best_label, by_label[best_label], reason, rows, oversubscribed=crowded,
                      backend=best_backend if len(pool) > 1 or backends or best_backend == NATIVE_FRAME else None)


def cache_file() -> Path:
    """Where choices are cached: ``$RVQSPEC_CACHE/auto.json`` or ``~/.cache/rvqspec/auto.json``."""
    root = os.environ.get("RVQSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rvqspec")
    return Path(root) / "auto.json"


def cache_key(model: str, code_predictor, calibration: dict, drafter_name: str) -> dict:
    """The facts a choice depends on: device, model, dtype, drafter, torch threads and the calibration's digest.
    ``dtype`` is the parameters' dtype (``torch.float32``, ...), or ``int8`` / ``int8-dynamic`` for int8 weights
    (:func:`rvqspec_lib.models.precision.precision_of`): a choice is made for the precision given, never across."""
    from rvqspec_lib.models.precision import precision_of

    dev = next(code_predictor.parameters()).device
    digest = hashlib.sha1(json.dumps({k: calibration.get(k) for k in ("point-mass", "sampled")},
                                     sort_keys=True).encode()).hexdigest()[:12]
    prec = precision_of(code_predictor)
    dtype = prec if prec.startswith("int8") else str(P.param_dtype(code_predictor))
    return {"device": device_name(dev), "model": str(model), "dtype": dtype,
            "drafter": drafter_name, "threads": torch.get_num_threads(), "calibration": digest}


def _warn(msg: str) -> None:
    """One line on stderr: the cache is a convenience, never a reason to fail."""
    import sys

    print(f"warning: {msg}", file=sys.stderr)


def read_cache(path: Path) -> dict:
    """The cached choices in ``path``: ``{key: {"label", "reason", ...}}``; ``{}`` (with a one-line warning naming
    the file and ``RVQSPEC_CACHE``) for a file that cannot be read, is not UTF-8 JSON, or has another shape; ``{}``
    silently when there is no file."""
    if not path.exists():
        return {}
    try:
        store = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _warn(f"the --decoder auto cache {path} cannot be read ({type(e).__name__}): timing again (delete it, or set "
              "RVQSPEC_CACHE to another folder)")
        return {}
    ok = isinstance(store, dict) and all(isinstance(v, dict) and isinstance(v.get("label"), str)
                                         and isinstance(v.get("reason", ""), str) for v in store.values())
    if not ok:
        _warn(f"the --decoder auto cache {path} is not a cache of choices (JSON of another shape): timing again "
              "(delete it, or set RVQSPEC_CACHE to another folder)")
        return {}
    return store


def write_cache(path: Path, store: dict) -> bool:
    """Write the cache atomically; on failure (an unwritable folder, a full disk) warn in one line naming
    ``RVQSPEC_CACHE`` and return ``False`` (the choice is still used)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(store, indent=1))
        os.replace(tmp, path)
        return True
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        _warn(f"the --decoder auto choice is used but not cached: {path} is not writable ({e.strerror}); set "
              "RVQSPEC_CACHE to a writable folder to keep it")
        return False


def auto_decoder(model: str, code_predictor, calibration: dict, contexts: torch.Tensor, *, drafter=None,
                 drafter_name: str = "heads", refresh: bool = False, cache: str | os.PathLike | None = None,
                 **kwargs) -> AutoChoice:
    """:func:`choose_decoder`, cached per device, model, dtype, drafter, threads and calibration (and the backends
    chosen among, when ``backends=`` is passed: the cached entry keeps the chosen backend's name).

    A cached choice is reused (``reason`` says so) unless ``refresh``; a new one is written atomically, unless its
    verify-cost timing was oversubscribed (:attr:`AutoChoice.oversubscribed`: ``reason`` says so). A damaged
    cache (binary garbage, JSON of another shape) is a one-line warning and the decoders are timed again; an
    unwritable cache folder is a one-line warning naming ``RVQSPEC_CACHE`` and the choice is still returned.
    """
    path = Path(cache) if cache is not None else cache_file()
    key = cache_key(model, code_predictor, calibration, drafter_name)
    if kwargs.get("backends"):  # a choice among backends is its own entry
        key["backends"] = sorted(kwargs["backends"])
    kid = json.dumps(key, sort_keys=True)
    store = read_cache(path)
    if not refresh and kid in store:
        hit = store[kid]
        label = hit["label"]
        dec = {c[0]: c[1] for c in candidates(calibration)}.get(label)
        if dec is not None:
            table = hit.get("table", [])
            backend = hit.get("backend") if isinstance(hit.get("backend"), str) else None
            known = set(kwargs.get("backends") or {})
            if backend is None or backend in known or (backend == NATIVE_FRAME and "native" in known):
                return AutoChoice(label, dec, f"{hit.get('reason', '') or label} (a cached choice, {path}: delete it "
                                  "or set RVQSPEC_CACHE to time again)", table if isinstance(table, list) else [], key,
                                  backend=backend)
    choice = choose_decoder(code_predictor, calibration, contexts, drafter=drafter, **kwargs)
    choice.key = key
    if choice.oversubscribed:  # a noisy choice is used once, never kept
        choice.reason += f"; {choice.oversubscribed} while timing, so this choice is not cached"
        return choice
    store[kid] = {"label": choice.label, "reason": choice.reason, "table": choice.table, "key": key,
                  "backend": choice.backend, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_cache(path, store)
    return choice
