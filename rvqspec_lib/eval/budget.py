"""A decoder and how to run it, per device: ``--decoder auto`` (docs/methods.md#choosing-the-node-budget).
:func:`choose_decoder` times the verify call of every candidate's shape, then whole frames of AR and the most
promising candidates, stepped and fused, through backends of the registry; the least time per committed code wins.
:func:`auto_decoder` caches the choice (``$RVQSPEC_CACHE`` or ``~/.cache/rvqspec``), so it is timed once per machine."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch

from rvqspec_lib.common.files import write_json_atomic
from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.eval.calibration import KINDS, predicted, tables_from_calibration
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.speed import time_frames, verify_cost_curve
from rvqspec_lib.eval.timing import oversubscribed_note
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.models import backends as B
from rvqspec_lib.models.backends import frame_runner, fused_support, verify_backend
from rvqspec_lib.models.drafter_files import cache_root, prepare_command, shipped_drafter
from rvqspec_lib.models.named_decoders import NamedDecoder, drafter_calibration, resolve, resolve_all
from rvqspec_lib.device.precision import PRECISIONS, precision_of

#: Node budgets N (root included) considered for calibrated trees.
AUTO_BUDGETS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def auto_backends(precision: str, device: str = "cpu", *, note: bool = False) -> list[str]:
    """The backends ``--decoder auto`` chooses among for a code predictor in ``precision`` on ``device``; the cache
    key names them, so ``rvqspec prepare`` (which times the choice) and ``synth`` (which reads it) take them from
    here. The official module everywhere; on a CPU the native forward where it runs that precision; on CUDA the
    compiled lean forward (``torch.compile``, CUDA graphs) where triton is installed. ``note``: say once on stderr
    why the native forward is left out on a CPU (:func:`~rvqspec_lib.models.backends.available_or_note`)."""
    dev = torch.device(device).type
    if dev == "cpu" and precision in PRECISIONS:
        ok = (B.available_or_note("native", precision, dev, instead="--decoder auto chooses among the official "
                                  "module's decoders alone") if note else B.available("native", precision, dev)[0])
        return ["official"] + ["native"] * bool(ok)
    if dev == "cuda":
        return ["official"] + ["compile"] * bool(B.available("compile", precision, dev)[0])
    return ["official"]
#: Version of a cached choice (part of its key: entries of another version are never read as choices).
CACHE_VERSION = 2


@dataclass
class AutoChoice:
    """What :func:`choose_decoder` chose, how it runs, and why.

    Attributes:
        named: the chosen :class:`~rvqspec_lib.models.named_decoders.NamedDecoder`. backend: the backend it runs
            through. fused: as its fused frame. reason: one line saying why.
        table: a row per (candidate, backend, fused): the decoder's fields, ``backend``, ``fused``,
            ``predicted_tokens_per_call``, ``verify_ms``, ``verify_ratio`` t(N)/t(1), ``predicted_speedup`` (stepped
            rows), and where timed ``ms_per_code``, ``measured_tokens_per_call``, ``speedup`` (over stepped AR through
            the first backend).
        key: the cache key. oversubscribed: ``OVERSUBSCRIBED: ...`` or ``""`` (such a choice is not cached)."""

    named: NamedDecoder
    backend: str
    fused: bool
    reason: str
    table: list = field(default_factory=list)
    key: dict = field(default_factory=dict)
    oversubscribed: str = ""

    @property
    def label(self) -> str:
        """The chosen decoder's label (``chain:4`` ...), a name the grammar reads."""
        return self.named.label

    @property
    def decoder(self):
        """The chosen decoder object."""
        return self.named.decoder

    def runner(self, code_predictor, **kwargs):
        """The choice as a :func:`~rvqspec_lib.models.backends.frame_runner` (``kwargs``: ``sampling`` ...)."""
        return frame_runner(self.backend, code_predictor, self.named, fused=self.fused, **kwargs)


def device_name(device: torch.device) -> str:
    """A stable name of the device being timed: the GPU's name, or the CPU model and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model() or platform.processor() or 'cpu'} ({os.cpu_count()} cores)"


def _check_device(device: torch.device) -> None:
    if device.type == "meta":
        raise ValueError("auto cannot time a model on the meta device: load it on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"auto cannot time on {device}: CUDA is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"auto does not know how to time on {device.type}: use cpu or cuda, or pick a decoder")


def _drafter_name(drafter, drafter_name: str | None) -> str:
    if drafter_name:
        return drafter_name
    return "heads" if drafter is None or isinstance(drafter, ReusedHeads) else str(drafter.name)


def candidates(calibration: dict, budgets: Sequence[int] = AUTO_BUDGETS, *, drafter=None,
               drafter_name: str | None = None) -> list[tuple[NamedDecoder, float]]:
    """``(NamedDecoder, predicted tokens per call E)`` for AR, every chain window the calibration reaches and both
    kinds of calibrated tree at ``budgets``, drafting with ``drafter`` (default the reused heads).

    Raises:
        ValueError: a drafter other than the heads named but not given.
    """
    dn = _drafter_name(drafter, drafter_name)
    at = "" if dn == "heads" else f"@{dn}"
    tables = tables_from_calibration(calibration)
    have = {int(b) for b in calibration["budgets"]}
    names = (["ar"] + [f"chain:{w}{at}" for w in CHAIN_WINDOWS if w - 1 <= tables["alpha"].shape[1]]
             + [f"tree:calibrated-{kind}:{b}{at}" for kind in KINDS for b in budgets if int(b) in have])
    named = resolve_all(names, None, calibrations={dn: calibration}, drafters={dn: drafter} if at else {})
    return [(nd, predicted(calibration, nd.name, nd.decoder)) for nd in named.values()]


def choose_decoder(code_predictor, calibration: dict, contexts: torch.Tensor, *,
                   backends: Sequence[str] | Mapping[str, object] = ("official",), drafter=None,
                   drafter_name: str | None = None, budgets: Sequence[int] = AUTO_BUDGETS, shortlist: int = 5,
                   frames: int = 16, repeats: int = 3, cost_repeats: int = 5, fused: bool = True, acceptance=None,
                   seed: int = 0, progress: bool = False, noise_target: float | None = None) -> AutoChoice:
    """The decoder, backend and fusion with the least measured time per committed code here.

    Args:
        code_predictor: the official module, on the device and in the precision to be used (never changed).
            calibration: trees for this model and drafter. contexts: ``(N, 2, talker_hidden)``; the first ``frames``
            decoded, ``repeats`` passes.
        backends: names (speedups over stepped AR through the first), or ``{name: verify backend}`` already built.
            drafter, drafter_name: as deployed. budgets: tree budgets considered. shortlist: candidates decoded per
            backend. cost_repeats: repeats of each verify-call timing. fused: also the fused frames.
        acceptance: a TIMING REPLAY's hook (stepped frames replayed, no fused frame; never cached). noise_target: as
            :func:`rvqspec_lib.eval.timing.interleaved`.

    Raises:
        ValueError: a device that cannot be timed, a calibration for another model, no contexts, no backend, an
            absent backend (one line each).
    """
    cp = code_predictor
    _check_device(next(cp.parameters()).device)
    n = P.n_codes(cp)
    if int(calibration.get("n_codes", -1)) != n or \
            int(calibration.get("codebook_size", -1)) != int(cp.config.vocab_size):
        raise ValueError("the calibration was made for another model (codes or codebook size differ): recalibrate")
    if contexts.shape[0] < 1:
        raise ValueError("no contexts to time the decoders on")
    pool = dict(backends) if isinstance(backends, Mapping) else {b: verify_backend(b, cp) for b in backends}
    if not pool:
        raise ValueError("no backend to choose among: give at least one of the registry's (e.g. official)")
    cands = candidates(calibration, budgets, drafter=drafter, drafter_name=drafter_name)
    nodes = {nd.label: nd.fields()["nodes"] for nd, _ in cands}
    curve = verify_cost_curve(cp, pool, query_sizes=sorted(set(nodes.values())), repeats=cost_repeats, warmup=2,
                              seed=seed, progress=progress, noise_target=noise_target)
    cost = {(r["backend"], r["query_positions"]): r["median_ms"] for r in curve["rows"]}
    rows, picked = {}, {"ar"}
    for b in pool:
        t1 = cost[(b, 1)]
        for nd, e in cands:
            t = cost[(b, nodes[nd.label])]
            rows[(nd.label, b, False)] = {**nd.fields(), "backend": b, "fused": False, "predicted_tokens_per_call": e,
                                          "verify_ms": t, "verify_ratio": t / t1, "predicted_speedup": e * t1 / t}
            if fused and acceptance is None and nd.name.kind in ("ar", "chain") and \
                    fused_support(b, nd.decoder) is None:
                rows[(nd.label, b, True)] = {**nd.fields(), "backend": b, "fused": True,
                                             "predicted_tokens_per_call": e}
        ranked = sorted((r for (lab, bk, fz), r in rows.items() if bk == b and lab != "ar" and not fz),
                        key=lambda r: -r["predicted_speedup"])
        picked |= {r["decoder"] for r in ranked[:shortlist]}
    named = {nd.label: nd for nd, _ in cands}
    runners = [frame_runner(b, cp, named[lab], fused=fz, acceptance=None if fz else acceptance,
                            verify=pool[b]) for lab, b, fz in rows if fz or lab in picked]
    n_fused = sum(fz for _, _, fz in rows)
    k = min(frames, contexts.shape[0])
    timed = time_frames(runners, contexts[:k], repeats=repeats * k, warmup=1, seed=seed, progress=progress,
                        noise_target=noise_target)
    measured = {(r["decoder"], r["backend"], r["fused"]): r for r in timed["rows"]}
    ref = next(iter(pool))
    ar_ms = measured[("ar", ref, False)]["ms_per_frame"] / n
    for key, r in rows.items():
        m = measured.get(key)
        r.update(ms_per_code=m["ms_per_frame"] / n if m else None,
                 measured_tokens_per_call=m["tokens_per_call"] if m else None,
                 speedup=ar_ms * n / m["ms_per_frame"] if m else None)
    best = min(measured, key=lambda x: measured[x]["ms_per_frame"])
    label, backend, is_fused = best
    b = rows[best]
    how = f" through {backend}" + (", fused (the whole frame as one graph or C call)" if is_fused else "")
    vs = f"AR's {ar_ms:.3f} through {ref}"
    ars = {x: m["ms_per_frame"] / n for x, m in measured.items() if x[0] == "ar"}
    fast = min(ars, key=ars.get)
    if len(ars) > 1:  # AR run several ways: the gain over the fastest AR too (what speculation adds)
        vs += (f"; {ars[fast] / b['ms_per_code']:.2f}x the fastest AR, through {fast[1]}"
               f"{', fused' if fast[2] else ''}, {ars[fast]:.3f}")
    verify = "" if is_fused else (f", verify call t({b['nodes']})/t(1) = {b['verify_ratio']:.2f}, predicted speedup "
                                  f"E(N) t(1)/t(N) = {b['predicted_speedup']:.2f}x")
    reason = (f"{label}{how}: {b['ms_per_code']:.3f} ms per code measured ({b['speedup']:.2f}x {vs}), "
              f"{b['measured_tokens_per_call']:.2f} tokens per call{verify}; {len(picked)} of {len(cands)} candidates "
              f"decoded through {', '.join(pool)}" + (f", {n_fused} fused frames (AR and chains)" if n_fused else "")
              + f" ({k} frames x {repeats} repeats)")
    if noise_target is not None:
        reason += f"; frames timed: {noise_words(timed['meta'])}"
    crowded = oversubscribed_note(curve["meta"]) or oversubscribed_note(timed["meta"])
    return AutoChoice(dataclasses.replace(named[label], note=reason), backend, is_fused, reason, list(rows.values()),
                      oversubscribed=crowded)


def cache_file() -> Path:
    """Where choices are cached: ``auto.json`` in :func:`~rvqspec_lib.models.drafter_files.cache_root`."""
    return cache_root() / "auto.json"


def cache_key(model: str, code_predictor, calibration: dict, drafter_name: str = "heads",
              backends: Sequence[str] = ()) -> dict:
    """The facts a choice depends on: :data:`CACHE_VERSION`, device, model, dtype (or ``int8`` / ``int8-dynamic``:
    never across precisions), drafter, threads, the calibration's digest, the backends."""
    digest = hashlib.sha1(json.dumps({k: calibration.get(k) for k in KINDS}, sort_keys=True).encode()).hexdigest()[:12]
    prec = precision_of(code_predictor)
    return {"version": CACHE_VERSION, "device": device_name(next(code_predictor.parameters()).device),
            "model": str(model), "dtype": prec if prec.startswith("int8") else str(P.param_dtype(code_predictor)),
            "drafter": drafter_name, "threads": torch.get_num_threads(), "calibration": digest,
            "backends": sorted(backends)}


def _warn(msg: str) -> None:
    """One line on stderr: the cache is a convenience, never a reason to fail."""
    print(f"warning: {msg}", file=sys.stderr)


def read_cache(path: Path) -> dict:
    """The cached choices in ``path`` (``{key: {"decoder", "backend", "fused", "reason", ...}}``); ``{}`` silently
    without a file, ``{}`` with a one-line warning naming ``RVQSPEC_CACHE`` for a damaged one."""
    if not path.exists():
        return {}
    try:
        store = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _warn(f"the --decoder auto cache {path} cannot be read ({type(e).__name__}): timing again (delete it, or set "
              "RVQSPEC_CACHE to another folder)")
        return {}
    ok = isinstance(store, dict) and all(
        isinstance(v, dict) and isinstance(v.get("decoder", v.get("label")), str)
        and isinstance(v.get("reason", ""), str) for v in store.values())
    if not ok:
        _warn(f"the --decoder auto cache {path} is not a cache of choices (JSON of another shape): timing again "
              "(delete it, or set RVQSPEC_CACHE to another folder)")
        return {}
    return store


def auto_decoder(model: str, code_predictor, calibration: dict, contexts: torch.Tensor, *,
                 backends: Sequence[str] | Mapping[str, object] = ("official",), drafter=None,
                 drafter_name: str | None = None, refresh: bool = False, cache: str | os.PathLike | None = None,
                 timed: bool = True, **kwargs) -> AutoChoice | None:
    """:func:`choose_decoder` (the same keywords), cached per :func:`cache_key` unless ``refresh`` (a choice timed
    while oversubscribed is not written; a damaged cache or unwritable folder is a one-line warning): what
    ``--decoder auto`` runs. ``timed=False``: the cached choice or ``None``, never timing (synth's default).

    Raises:
        ValueError: as :func:`choose_decoder`.
    """
    path = Path(cache) if cache is not None else cache_file()
    dn = _drafter_name(drafter, drafter_name)
    key = cache_key(model, code_predictor, calibration, dn, list(backends))
    kid = json.dumps(key, sort_keys=True)
    store = read_cache(path)
    hit = None if refresh else store.get(kid)
    if hit is not None and hit.get("backend") in key["backends"] and isinstance(hit.get("fused"), bool):
        try:
            named = resolve(hit["decoder"], None, calibrations={dn: calibration},
                            drafters={dn: drafter} if dn != "heads" else {})
        except (KeyError, ValueError):  # an entry this calibration no longer makes: time again
            named = None
        if named is not None:
            reason = (f"{hit.get('reason') or named.label} (a cached choice, {path}: delete it or set RVQSPEC_CACHE "
                      "to time again)")
            table = hit.get("table") if isinstance(hit.get("table"), list) else []
            return AutoChoice(dataclasses.replace(named, note=reason), hit["backend"], hit["fused"], reason, table,
                              key)
    if not timed:
        return None
    choice = choose_decoder(code_predictor, calibration, contexts, backends=backends, drafter=drafter,
                            drafter_name=dn, **kwargs)
    choice.key = key
    if choice.oversubscribed:  # a noisy choice is used once, never kept
        choice.reason += f"; {choice.oversubscribed} while timing, so this choice is not cached"
        choice.named = dataclasses.replace(choice.named, note=choice.reason)
        return choice
    store[kid] = {"decoder": choice.label, "backend": choice.backend, "fused": choice.fused, "reason": choice.reason,
                  "table": choice.table, "key": key, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:  # written atomically; an unwritable folder is a one-line warning naming RVQSPEC_CACHE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, store)
    except OSError as e:
        _warn(f"the --decoder auto choice is used but not cached: {path} is not writable ({e.strerror}); set "
              "RVQSPEC_CACHE to a writable folder to keep it")
    return choice


#: Calibration frames ``--decoder auto`` times its candidates on (once; the choice is cached).
AUTO_CONTEXTS = 64


def auto_for_model(lm, *, backends: Sequence[str] = ("official",), drafter_name: str = "heads",
                   progress: bool = False, timed: bool = True, **kwargs) -> AutoChoice | None:
    """``--decoder auto`` for a loaded model: its drafter, calibration and first :data:`AUTO_CONTEXTS` calibration
    frames from its folder, then :func:`auto_decoder`. ``timed=False``: the cached choice or ``None`` (no calibration,
    or nothing cached for this machine), never timing nor raising.

    Raises:
        ValueError: the model ships no calibration or no calibration frames (one line naming the fix); as
            :func:`choose_decoder`.
    """
    cp = lm.code_predictor
    drafter = None if drafter_name == "heads" else shipped_drafter(lm, drafter_name, cp)
    calibration = drafter_calibration(lm, drafter_name)
    if not timed:
        return None if calibration is None else auto_decoder(lm.name, cp, calibration, None, backends=backends,
                                                             drafter=drafter, drafter_name=drafter_name, timed=False)
    if calibration is None:
        raise ValueError(f"--decoder auto needs calibrated trees beside {lm.name} for the {drafter_name} drafter "
                         f"(trees/{drafter_name}.json): make them with `{prepare_command(lm)}`, or choose a decoder")
    try:
        contexts = frames_from_shipped(lm, "calibration", max_frames=AUTO_CONTEXTS).context
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"--decoder auto times decoders on the model's calibration frames, and there are none "
                         f"({str(e).splitlines()[0]}): make them with `{prepare_command(lm)}`, or choose a "
                         "decoder") from None
    return auto_decoder(lm.name, cp, calibration, contexts, backends=backends, drafter=drafter,
                        drafter_name=drafter_name, progress=progress, **kwargs)
