"""THE registry of what runs the code predictor, by name: verify backends (:data:`BACKENDS`, one model call at a
time) and frame runners (a whole frame, stepped through a backend or fused). Every caller builds them here; what each
is and who needs it: docs/architecture.md#the-registry. Each runner draws its own uniforms from the
``torch.Generator`` it is given (one seed gives other codes through another runner, with the same distribution).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from typing import Protocol, runtime_checkable

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import FrameResult, decode_frame
from rvqspec_lib.decoding.decoder_names import DecoderName, name_of
from rvqspec_lib.decoding.decoders import AR, Chain
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling, or_fresh_generator
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.device.fused_spec import FusedChainFrame
from rvqspec_lib.device.kernels import cpforward
from rvqspec_lib.device.kernels.build import note_slower
from rvqspec_lib.device.lean import LeanCodePredictor
from rvqspec_lib.device.native import NativeCodePredictor
from rvqspec_lib.device.native_frame import NativeChainFrame
from rvqspec_lib.device.precision import precision_of

#: Verify backends by name, in the order tables list them.
BACKENDS = ("official", "eager", "compile", "onnx", "native")
#: Precisions a backend runs (``official``, ``eager`` and ``native`` run all four of models/precision.py).
_PRECISIONS = {"compile": ("float32", "bfloat16"), "onnx": ("float32",)}


def available(name: str, precision: str = "float32", device: str = "cpu") -> tuple[bool, str]:
    """``(available, why not)`` for a backend on this machine, for a module in ``precision`` on ``device``.

    Raises:
        ValueError: an unknown backend (one line listing :data:`BACKENDS`).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    if precision not in _PRECISIONS.get(name, (precision,)):
        return False, (f"the {name} backend runs {' and '.join(_PRECISIONS[name])} modules, not {precision}: load "
                       f"the model in {_PRECISIONS[name][0]} (--dtype {_PRECISIONS[name][0]}) or use another backend")
    dev = torch.device(device).type
    if name == "compile" and dev == "cpu" and not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        return False, "torch.compile on the CPU needs a C/C++ compiler (none on PATH)"
    if name == "compile" and dev == "cuda" and importlib.util.find_spec("triton") is None:
        return False, "torch.compile on CUDA needs triton (pip install triton)"
    if name == "onnx":
        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:
            return False, f"missing Python packages: {', '.join(missing)} (pip install -r requirements.txt)"
        if dev != "cpu":
            return False, "the ONNX backend runs on the CPU"
    if name == "native":
        if dev != "cpu":
            return False, "the native forward runs on the CPU"
        if not cpforward.available():
            return False, f"the native forward cannot be built here: {cpforward.unavailable_reason()}"
    return True, ""


def available_or_note(name: str, precision: str = "float32", device: str = "cpu", *, instead: str) -> bool:
    """:func:`available`'s verdict for a caller that goes on without the backend, running ``instead``: then one line
    on stderr, once per process, naming the cause and the fix (:func:`~rvqspec_lib.device.kernels.build.note_slower`).
    """
    ok, why = available(name, precision, device)
    if not ok:
        note_slower(f"the {name} backend", f"{why}; {instead}")
    return ok


def check_available(name: str, precision: str = "float32", device: str = "cpu") -> None:
    """:func:`available`, raising ``ValueError`` (one line with the reason) when the backend is absent."""
    ok, why = available(name, precision, device)
    if not ok:
        raise ValueError(f"backend {name} is not available here: {why}")


def _device_of(cp) -> torch.device:
    return next(cp.parameters()).device


def verify_backend(name: str, code_predictor):
    """The :class:`~rvqspec_lib.decoding.predictor.VerifyBackend` ``name`` (of :data:`BACKENDS`) over the official
    ``code_predictor`` in its precision and on its device (``onnx``: its graph in a temporary folder, ONNX Runtime on
    torch's threads). ValueError (one line): an unknown or absent backend."""
    dev = _device_of(code_predictor)
    check_available(name, precision_of(code_predictor), dev.type)
    if name == "official":
        b = P.OfficialBackend(code_predictor)
    elif name == "eager":
        b = LeanCodePredictor(code_predictor)
    elif name == "compile":
        b = LeanCodePredictor(code_predictor, compile=True,
                              compile_mode="reduce-overhead" if dev.type == "cuda" else None)
    elif name == "onnx":
        b = F.ExportedBackend(code_predictor)
    else:
        b = NativeCodePredictor(code_predictor)
    b.name = name
    return b


# ----------------------------------------------------------------------------------------------------------------
# Frame runners
# ----------------------------------------------------------------------------------------------------------------
@runtime_checkable
class FrameRunner(Protocol):
    """Decodes whole frames: ``runner(context, generator) -> FrameResult``; ``name`` is the decoder's
    :class:`~rvqspec_lib.decoding.decoder_names.DecoderName` (the label and fields of its rows)."""

    backend: str
    fused: bool
    decoder: object
    name: DecoderName
    precision: str
    n_codes: int

    def __call__(self, context: torch.Tensor, generator: torch.Generator | None = None) -> FrameResult: ...

    def prepare(self, batch: int = 1) -> float: ...


class SteppedRunner:
    """Any decoder run by :func:`~rvqspec_lib.decoding.decode.decode_frame` through a verify backend, one call a
    round (arguments: :func:`frame_runner`'s; ``acceptance``: a timing replay's oracle; ``backend``: the name for
    tables, default ``verify.name``)."""

    fused = False

    def __init__(self, code_predictor, decoder, verify, *, sampling: Sampling | None = None, drafter=None,
                 acceptance=None, backend: str | None = None):
        self.code_predictor, self.decoder, self.verify = code_predictor, decoder, verify
        self.sampling = Sampling() if sampling is None else sampling
        self.drafter, self.acceptance = drafter, acceptance
        self.backend = backend or getattr(verify, "name", type(verify).__name__)
        self.n_codes = P.n_codes(code_predictor)
        self.name, self.precision = name_of(decoder), precision_of(code_predictor)

    def __call__(self, context: torch.Tensor, generator: torch.Generator | None = None) -> FrameResult:
        """``decode_frame`` of ``context`` ``(B, 2, talker_hidden)`` with ``generator``."""
        return decode_frame(self.code_predictor, context, decoder=self.decoder, sampling=self.sampling,
                            generator=generator, drafter=self.drafter, backend=self.verify,
                            acceptance=self.acceptance)

    def prepare(self, batch: int = 1) -> float:
        """Nothing is built ahead (a compiled backend compiles on its first call of a shape): 0.0 seconds."""
        return 0.0

    def __repr__(self) -> str:
        return f"SteppedRunner({self.decoder!r}, backend={self.backend!r})"


class FusedRunner:
    """A fused frame (``decode(context, generator) -> codes``, ``last_calls`` when speculative) of ``decoder``
    (``AR()`` or ``Chain(window)``) behind the :class:`FrameRunner` interface."""

    fused = True

    def __init__(self, frame, decoder, backend: str):
        self.frame, self.decoder, self.backend = frame, decoder, backend
        self.code_predictor = frame.code_predictor
        self.n_codes = int(frame.n_codes)
        self.name, self.precision = name_of(decoder), precision_of(frame.code_predictor)
        self.device = getattr(getattr(frame, "lean", None), "device", torch.device("cpu"))

    def __call__(self, context: torch.Tensor, generator: torch.Generator | None = None) -> FrameResult:
        """Codes of ``B`` frames; ``calls`` from the frame's ``last_calls`` (AR: one call per code)."""
        generator = or_fresh_generator(generator, context.device)
        codes = self.frame.decode(context, generator)
        b = codes.shape[0]
        calls = getattr(self.frame, "last_calls", None) if isinstance(self.decoder, Chain) else None
        calls = torch.tensor(calls, dtype=torch.int64) if calls else torch.full((b,), self.n_codes, dtype=torch.int64)
        return FrameResult(codes, calls)

    def prepare(self, batch: int = 1) -> float:
        """Build every graph of a frame for ``batch`` rows now (a benchmark must not compile inside a timed frame);
        returns the seconds taken."""
        build = getattr(self.frame, "compile_all", None)
        if build is not None:
            return float(build(batch))
        t0 = time.perf_counter()
        ctx = torch.zeros(batch, 2, P.talker_hidden_size(self.frame.code_predictor), device=self.device)
        self.frame.decode(ctx, torch.Generator(device=self.device).manual_seed(0))
        return time.perf_counter() - t0

    def __repr__(self) -> str:
        return f"FusedRunner({self.decoder!r}, backend={self.backend!r}, frame={type(self.frame).__name__})"


def fused_support(name: str, decoder, sampling: Sampling | None = None, drafter=None) -> str | None:
    """Why ``decoder`` has no fused runner on backend ``name`` (one line), or ``None`` when it has one."""
    sampling = Sampling() if sampling is None else sampling
    if name == "official":
        return "the official module has no fused frame (use eager, compile or native)"
    if type(decoder) not in (AR, Chain):  # exactly: LossySSD (a subclass of nothing here) and trees are stepped
        return f"a fused frame runs AR or a chain, not {type(decoder).__name__}"
    if getattr(decoder, "drafter", None) is not None or not (drafter is None or isinstance(drafter, ReusedHeads)):
        return "a fused frame drafts with the reused heads only"
    if not sampling.greedy and sampling.top_p < 1.0:
        return "a fused frame samples with temperature and top-k only (top_p < 1)"
    if name == "onnx" and type(decoder) is Chain:
        return "the ONNX backend exports the AR frame only (fused chains: eager, compile or native)"
    return None


def frame_runner(name: str, code_predictor, decoder, *, fused: bool = False, sampling: Sampling | None = None,
                 drafter=None, acceptance=None, verify=None):
    """The :class:`FrameRunner` of ``decoder`` through backend ``name``.

    Args:
        name: one of :data:`BACKENDS`. code_predictor: the official module (precision and device as wanted).
        decoder: a :class:`~rvqspec_lib.models.named_decoders.NamedDecoder` (its label and fields go with the runner)
            or a bare AR, Chain, Tree or LossySSD.
        fused: the whole-frame runner (:func:`fused_support` says when there is none) instead of stepped calls.
        sampling, drafter: as ``decode_frame``. acceptance: a timing replay's acceptance hook (stepped only).
        verify: a verify backend already built for ``name`` (default :func:`verify_backend`'s).

    Raises:
        ValueError: an unknown or absent backend; ``fused`` where there is no fused runner, or with ``acceptance``
            (a fused frame computes its own acceptance); one line each.
    """
    sampling = Sampling() if sampling is None else sampling
    named = getattr(decoder, "name", None) if hasattr(decoder, "decoder") else None
    decoder = decoder.decoder if named is not None else decoder
    if not fused:
        verify = verify if verify is not None else verify_backend(name, code_predictor)
        runner = SteppedRunner(code_predictor, decoder, verify, sampling=sampling, drafter=drafter,
                               acceptance=acceptance, backend=name)
    else:
        runner = FusedRunner(_fused_frame(name, code_predictor, decoder, sampling, drafter, acceptance, verify),
                             decoder, name)
    if named is not None:
        runner.name = named
    return runner


def _fused_frame(name, code_predictor, decoder, sampling, drafter, acceptance, verify):
    check_available(name, precision_of(code_predictor), _device_of(code_predictor).type)
    why = fused_support(name, decoder, sampling, drafter)
    if why:
        raise ValueError(f"no fused {name} frame for this decoder: {why}")
    if acceptance is not None:
        raise ValueError("a timing replay replaces the accept step of decode_frame: a fused frame computes its own "
                         "acceptance (use fused=False)")
    window = 1 if type(decoder) is AR else int(decoder.window)
    if name == "native":
        nat = verify if isinstance(verify, NativeCodePredictor) else verify_backend("native", code_predictor)
        if nat.code_predictor is not code_predictor:
            raise ValueError("verify must be a native backend built over this code_predictor")
        return NativeChainFrame(nat, window, sampling)
    if name == "onnx":
        return F.ExportedFrame(code_predictor, sampling=sampling)
    compiled = name == "compile"
    mode = "reduce-overhead" if compiled and _device_of(code_predictor).type == "cuda" else None
    if window == 1:
        return FusedARFrame(code_predictor, sampling, compile=compiled, compile_mode=mode)
    return FusedChainFrame(code_predictor, window, sampling, compile=compiled, compile_mode=mode)


def runner_fields(runner) -> dict:
    """The structured fields of a runner's result rows: the decoder's (:meth:`DecoderName.fields`: ``decoder``,
    ``kind``, ``drafter``, ``nodes``, ``lossy``), ``backend``, ``fused``, ``precision``."""
    return {**runner.name.fields(), "backend": runner.backend, "fused": bool(runner.fused),
            "precision": runner.precision}


def runner_label(fields: dict) -> str:
    """THE label of a runner's rows in figures and legends, from its fields: ``chain:4 (native, fused)``."""
    return f"{fields['decoder']} ({fields['backend']}{', fused' if fields.get('fused') else ''})"


def backend_table() -> list[dict]:
    """A row per backend: ``backend``, ``available``, ``reason`` (why it is absent here, float32 on the CPU)."""
    return [dict(zip(("backend", "available", "reason"), (n, *available(n)))) for n in BACKENDS]
