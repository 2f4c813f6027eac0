"""The strongest AR baseline: a whole frame of AR decoding as ONE (compiled) call over the lean layer stack, the
warpers (temperature, then top-k) inside and the code drawn by Gumbel-max with the noise an input: the same
distribution as :class:`rvqspec_lib.decoding.decoders.AR` (G-test of tests/test_lossless.py), not the same draws
(docs/methods.md#reporting-speed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.sampling import Sampling, or_fresh_generator
from rvqspec_lib.device.lean import LeanCodePredictor, timed_call


def warp_scores(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Warped float32 scores ``(..., V)``, as :meth:`Sampling.probs` before its softmax (temperature, then top-k keeping
    ties with the k-th; unchanged when greedy; ``top_p`` not applied), as traceable tensor code."""
    s = logits.to(torch.float32)
    if sampling.greedy:
        return s
    if sampling.temperature != 1.0:
        s = s / sampling.temperature
    if sampling.top_k != 0:
        kth = torch.topk(s, min(sampling.top_k, s.shape[-1]))[0][..., -1:]
        s = s.masked_fill(s < kth, float("-inf"))
    return s


def warped_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Warped float32 probabilities ``(..., V)``, equal to :meth:`Sampling.probs` without top-p, traceable."""
    if sampling.greedy:
        return F.one_hot(logits.to(torch.float32).argmax(-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(warp_scores(logits, sampling), -1)


def fused_sampling(sampling: Sampling | None, what: str, fix: str) -> Sampling:
    """The sampling of a whole-frame decoder (``None``: the default): temperature and top-k only.

    Raises:
        ValueError: ``top_p < 1`` (one line: ``what`` cannot, ``fix`` can).
    """
    sampling = Sampling() if sampling is None else sampling
    if not sampling.greedy and sampling.top_p < 1.0:
        raise ValueError(f"the {what} samples with temperature and top-k only; top_p={sampling.top_p} needs {fix}")
    return sampling


class FusedARFrame:
    """One frame of AR decoding as one call (module docstring).

    Args:
        code_predictor: the official module (read in place). sampling: default the checkpoints'.
        compile: compile the whole frame, one graph per batch size (minutes on the real-size model).
        compile_mode: ``mode=`` for ``torch.compile`` (``"reduce-overhead"``: a CUDA graph on a GPU).

    Raises:
        ValueError: ``top_p < 1``; what ``LeanCodePredictor`` refuses.
    """

    def __init__(self, code_predictor, sampling: Sampling | None = None, *, compile: bool = True,
                 compile_mode: str | None = None):
        self.sampling = fused_sampling(sampling, "fused AR frame", "decode_frame(decoder=AR())")
        self.code_predictor = code_predictor
        self.lean = LeanCodePredictor(code_predictor)
        self.n_codes = P.n_codes(code_predictor)
        self.vocab = int(code_predictor.config.vocab_size)
        self.slots = self.n_codes + 1  # positions 0..n_codes (the last code is never fed)
        self.compiled = bool(compile)
        self.compile_s: dict[int, float] = {}
        self._run = torch.compile(self.frame, dynamic=False, fullgraph=True, mode=compile_mode) \
            if compile else self.frame

    def noise(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Standard Gumbel noise for ``batch`` frames: ``(B, n_codes, V)`` float32, ``-log(-log(U))`` with U drawn in
        float64 (a float32 U is exactly 0 with probability 2^-24 per draw, which would forbid that code)."""
        u = torch.rand(batch, self.n_codes, self.vocab, generator=generator, dtype=torch.float64,
                       device=self.lean.device)
        return (-torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))).to(torch.float32)

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`warp_scores` with this frame's sampling."""
        return warp_scores(logits, self.sampling)

    def frame(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The frame as a pure function (what is compiled): ``context`` ``(B, 2, talker_hidden)``, ``noise``
        ``(B, n_codes, V)`` (ignored when greedy) -> ``(B, n_codes)`` int64 codes 1..n_codes."""
        cp, lean = self.code_predictor, self.lean
        b, dev = context.shape[0], context.device
        cache = lean.new_cache(b, self.slots)
        slot = torch.arange(self.slots, device=dev)
        causal = slot[None, :] <= slot[:, None]  # (S, S): position i sees slots 0..i
        x = cp.small_to_mtp_projection(context.to(lean.dtype))
        pos = slot[:2].expand(b, 2)
        h = lean.forward(x, pos, causal[None, :2].expand(b, 2, self.slots), cache, pos)[:, 1]
        codes = []
        for j in range(self.n_codes):
            scores = self.warp(lean.apply(cp.lm_head[j], h))
            code = scores.argmax(-1) if self.sampling.greedy else (scores + noise[:, j]).argmax(-1)  # (B,)
            codes.append(code)
            if j == self.n_codes - 1:
                break
            e = cp.small_to_mtp_projection(F.embedding(code[:, None], cp.model.codec_embedding[j].weight))
            p = slot[j + 2: j + 3].expand(b, 1)  # code j+1 sits at position j+2
            h = lean.forward(e, p, causal[None, j + 2: j + 3].expand(b, 1, self.slots), cache, p)[:, 0]
        return torch.stack(codes, 1)

    def __call__(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Codes ``(B, n_codes)`` int64 for given noise (the first call of a batch size compiles: :attr:`compile_s`)."""
        with torch.inference_mode():
            if not self.compiled:
                return self._run(context, noise)
            return timed_call(self._run, context.shape[0], self.compile_s, context, noise)

    def decode(self, context: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise from ``generator`` (``None``: fresh, never the global RNG), then the frame: ``(B, n_codes)`` int64."""
        generator = or_fresh_generator(generator, context.device)
        return self(context, self.noise(context.shape[0], generator))
