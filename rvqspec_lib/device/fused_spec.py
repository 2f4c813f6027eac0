"""The fused speculative frame: Chain(window) with the reused heads, each round of draft -> verify -> accept -> commit
as ONE compiled graph per start depth, all uniforms drawn up front (docs/methods.md#the-fused-speculative-round: the
graphs, the uniform order, the inverse CDF, how it is tested).
"""

from __future__ import annotations

import time
import types

import torch
import torch.nn.functional as F

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding import verify as verify_rules
from rvqspec_lib.decoding.decoders import Chain
from rvqspec_lib.decoding.sampling import Sampling, or_fresh_generator
from rvqspec_lib.device.fused import fused_sampling, warped_probs
from rvqspec_lib.device.lean import LeanCodePredictor, timed_call


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One code per row: ``(B, V)`` non-negative ``probs`` (unnormalised allowed) and ``(B,)`` float64 ``u`` in [0, 1)
    -> ``(B,)`` int64, the first code whose float64 cumulative mass exceeds ``u * total`` (never a code of mass 0)."""
    cdf = torch.cumsum(probs.to(torch.float64), -1)
    x = u * cdf[:, -1]
    idx = (cdf <= x[:, None]).sum(-1)
    v = probs.shape[-1]
    last = (v - 1) - torch.flip(probs > 0, (-1,)).to(torch.int64).argmax(-1)
    return torch.minimum(idx, last)


def draft_codes(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The drafts, :func:`inverse_cdf` (module-level so that a negative control can replace it, eager only)."""
    return inverse_cdf(q, u)


#: The rule's own ``min(1, p(x) / q(x))``, named here so that a negative control can replace it (eager).
acceptance = verify_rules.acceptance_ratio


class UniformFrame:
    """What the frames that draw their uniforms up front share: ``uniforms`` and ``decode``. A subclass sets
    ``n_codes``, ``u_width`` (``2 K + 1``) and ``device``, and is called as ``frame(context, uniforms)``."""

    def uniforms(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """A frame's uniforms, ``(B, n_codes, 2 K + 1)`` float64, one ``torch.rand`` from ``generator``."""
        return torch.rand(batch, self.n_codes, self.u_width, generator=generator, dtype=torch.float64,
                          device=self.device)

    def decode(self, context: torch.Tensor, generator: torch.Generator | None = None, **kw) -> torch.Tensor:
        """Uniforms from ``generator`` (``None``: fresh, never the global RNG), then the frame: ``(B, n_codes)``
        int64 (``kw``: the frame call's)."""
        generator = or_fresh_generator(generator, self.device)
        return self(context, self.uniforms(context.shape[0], generator), **kw)


class FusedChainFrame(UniformFrame):
    """Chain(window) speculation with one compiled graph per round (module docstring).

    Args:
        code_predictor: the official module (its parameters are read in place).
        window: the Chain window N, 2..8. sampling: default the checkpoints'; ``top_p < 1`` is refused.
        compile: compile the prefill and every round (``False``: the same functions eagerly, the reference).
        compile_mode: ``mode=`` for ``torch.compile`` (``"reduce-overhead"``: CUDA graphs on a GPU).

    Raises:
        ValueError: a window outside 2..8, ``top_p < 1``, what ``LeanCodePredictor`` refuses.
    """

    def __init__(self, code_predictor, window: int = 4, sampling: Sampling | None = None, *, compile: bool = True,
                 compile_mode: str | None = None):
        Chain(window)  # the same one-line error for a bad window
        self.sampling = fused_sampling(sampling, "fused chain", f"decode_frame(decoder=Chain({window}))")
        self.code_predictor = code_predictor
        self.lean = LeanCodePredictor(code_predictor)
        self.device = self.lean.device
        self.window, self.K = int(window), int(window) - 1
        self.n_codes = P.n_codes(code_predictor)
        self.vocab = int(code_predictor.config.vocab_size)
        self.slots = self.n_codes + 1  # positions 0..n_codes - 1 + 1: the last code is never fed
        self.u_width = 2 * self.K + 1  # uniforms per round (the order: module docstring)
        self.compiled = bool(compile)
        self.compile_s: dict[tuple, float] = {}
        self.last_calls: list[int] = []  # calls (prefill + rounds) each row of the last frame took
        self._opts = dict(dynamic=False, fullgraph=True, mode=compile_mode)
        self._graphs: dict[tuple, object] = {}

    # -- the graphs ---------------------------------------------------------------------------------------------
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped float32 probabilities, equal to :meth:`Sampling.probs`."""
        return warped_probs(logits, self.sampling)

    def _head(self, h: torch.Tensor, i: int) -> torch.Tensor:
        return self.lean.apply(self.code_predictor.lm_head[i], h)

    def _mask(self, first_pos: int, q_len: int, b: int, device) -> torch.Tensor:
        slot = torch.arange(self.slots, device=device)
        pos = torch.arange(first_pos, first_pos + q_len, device=device)
        mask = torch.zeros(q_len, self.slots, dtype=self.lean.dtype, device=device)
        mask = mask.masked_fill(slot[None, :] > pos[:, None], self.lean.mask_min)  # causal by position = slot
        return mask[None, None].expand(b, 1, q_len, self.slots)

    def _stack(self, x: torch.Tensor, first_pos: int, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The layer stack over ``x`` ``(B, Q, H)`` at positions (= slots) ``first_pos..first_pos+Q-1``."""
        lean, (b, q_len, _) = self.lean, x.shape
        cos = lean.cos[first_pos:first_pos + q_len][None, None].expand(b, 1, q_len, -1)
        sin = lean.sin[first_pos:first_pos + q_len][None, None].expand(b, 1, q_len, -1)
        write = torch.arange(first_pos, first_pos + q_len, device=x.device)
        write = write[None, None, :, None].expand(b, lean.n_kv, q_len, lean.head_dim)
        return lean.stack(x, cos, sin, self._mask(first_pos, q_len, b, x.device), write, k, v)

    def prefill(self, context: torch.Tensor, u: torch.Tensor):
        """The frame's first call (compiled): ``context`` ``(B, 2, talker_hidden)``, the frame's uniforms ``u``
        ``(B, n_codes, 2K+1)`` -> ``(codes (B, n_codes) int64 with code 1 in column 0, H_1 (B, H), k, v)``."""
        cp, lean = self.code_predictor, self.lean
        b = context.shape[0]
        shape = (lean.n_layers, b, lean.n_kv, self.slots, lean.head_dim)
        k = torch.zeros(shape, dtype=lean.dtype, device=context.device)
        v = torch.zeros(shape, dtype=lean.dtype, device=context.device)
        h = self._stack(cp.small_to_mtp_projection(context.to(lean.dtype)), 0, k, v)[:, 1]
        code = inverse_cdf(self.probs(self._head(h, 0)), u[:, 0, 0])
        codes = torch.cat([code[:, None], torch.zeros(b, self.n_codes - 1, dtype=torch.long, device=code.device)], 1)
        return codes, h, k, v

    def round(self, s: int, codes: torch.Tensor, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              u: torch.Tensor):
        """One speculative round after committed code ``s`` (compiled, one graph per s).

        Args:
            s: the last committed depth, 1..n_codes-1, the same for every row. codes: ``(B, n_codes)`` int64.
            h: ``(B, H)`` the hidden state of code s. k, v: the caches (written in place). u: the frame's uniforms.

        Returns:
            ``(codes (B, n_codes), committed (B,) int64 codes added (1..window), h (B, H) for the next round)``.
        """
        cp, n, kk = self.code_predictor, self.n_codes, self.K
        rows = torch.arange(codes.shape[0], device=codes.device)
        ur = u[:, s]  # (B, 2K+1)
        n_draft = min(kk, n - s)  # drafts at depths s+1..s+D
        q_len = 1 + min(kk, n - 1 - s)  # nodes with a code after them: the root and drafts below depth n
        bonus = q_len == n_draft + 1  # a fully accepted chain leaves a code to sample
        # 1. draft
        q = [self.probs(self._head(h, s + j - 1)) for j in range(1, n_draft + 1)]
        x = [draft_codes(q[j], ur[:, j]) for j in range(n_draft)]
        # 2. verify
        node_codes = [codes[:, s - 1]] + x[:q_len - 1]
        emb = torch.stack([F.embedding(c, cp.model.codec_embedding[s - 1 + i].weight)
                           for i, c in enumerate(node_codes)], 1)  # node i: code of depth s+i
        hid = self._stack(cp.small_to_mtp_projection(emb), s + 1, k, v)  # (B, Q, H)
        p = [self.probs(self._head(hid[:, i], s + i)) for i in range(q_len)]  # p_i: depth s+i+1
        # 3. accept
        acc = torch.stack([ur[:, kk + j] < acceptance(p[j], x[j], q[j].gather(1, x[j][:, None]).squeeze(1))
                           for j in range(n_draft)], 1)
        n_acc = (torch.cumsum((~acc).to(torch.int64), 1) == 0).sum(1)  # (B,) leading accepts (no CumProd in ONNX)
        final = [verify_rules.residual(p[j], x[j], q[j]) for j in range(n_draft)] + ([p[n_draft]] if bonus else [])
        final = torch.stack(final, 1)
        nxt = inverse_cdf(final[rows, n_acc.clamp(max=final.shape[1] - 1)], ur[:, 2 * kk])
        has_next = n_acc < n_draft if not bonus else torch.ones_like(acc[:, 0])
        # 4. commit: columns s..s+width-1 hold depths s+1..s+width
        width = n_draft + int(bonus)
        j = torch.arange(width, device=codes.device)[None, :]
        xs = torch.stack(x + ([x[0]] if bonus else []), 1)  # (B, width); the bonus column's draft is never used
        block = torch.where(j < n_acc[:, None], xs, torch.where((j == n_acc[:, None]) & has_next[:, None],
                                                                 nxt[:, None], codes[:, s:s + width]))
        codes = torch.cat([codes[:, :s], block, codes[:, s + width:]], 1)
        committed = n_acc + has_next.to(torch.int64)
        h = hid[rows, n_acc.clamp(max=q_len - 1)]
        return codes, committed, h

    # -- the frame ----------------------------------------------------------------------------------------------
    def _call(self, key, *args):
        """Run the prefill (``key = ("prefill", B)``) or the round of start depth s (``key = (s, B)``).

        Compiled, every (s, B) gets a code object of its own (a copy of :func:`_entry`'s), so dynamo keeps ONE graph
        per code object and a call evaluates one set of guards (not a search through every depth's graphs)."""
        fn = (_entry_prefill if key[0] == "prefill" else _entry_round)
        if key[0] != "prefill":  # h from the prefill graph may be strided, from a round contiguous: one graph for both
            args = (args[0], args[1].clone(memory_format=torch.contiguous_format), *args[2:])  # exact strides
        if not self.compiled:
            return fn(self, key[0], *args)
        graph = self._graphs.get(key)
        if graph is None:
            code = fn.__code__.replace(co_name=f"{fn.__name__}_{key[0]}_{key[1]}")
            graph = self._graphs[key] = torch.compile(types.FunctionType(code, fn.__globals__), **self._opts)
        return timed_call(graph, key, self.compile_s, self, key[0], *args)

    def __call__(self, context: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``(B, n_codes)`` int64 codes of ``B`` frames from ``context`` ``(B, 2, talker_hidden)`` and uniforms ``u``
        ``(B, n_codes, 2K+1)`` float64 (:meth:`uniforms`); ValueError for uniforms of another shape."""
        b = context.shape[0]
        want = (b, self.n_codes, self.u_width)
        if tuple(u.shape) != want:
            raise ValueError(f"uniforms must have shape {want} ({type(self).__name__}.uniforms), got {tuple(u.shape)}")
        with torch.inference_mode():
            codes, h, k, v = self._call(("prefill", b), context, u)
            s = [1] * b
            self.last_calls = [1] * b
            while True:  # one host read per round: the rows' new depths
                active = [d for d in sorted(set(s)) if d < self.n_codes]
                if not active:
                    return codes
                self.last_calls = [c + (d < self.n_codes) for c, d in zip(self.last_calls, s)]
                if len(set(s)) == 1:  # every row at one depth (always for one frame)
                    codes, com, h = self._call((active[0], b), codes, h, k, v, u)
                    s = [d + c for d, c in zip(s, com.tolist())]
                    continue
                new_s = list(s)
                for d in active:  # rows at different depths: one call per depth, on those rows
                    idx = torch.tensor([i for i, x in enumerate(s) if x == d], device=codes.device)
                    ks, vs = k[:, idx], v[:, idx]
                    c, com, hh = self._call((d, len(idx)), codes[idx], h[idx], ks, vs, u[idx])
                    codes[idx], h[idx], k[:, idx], v[:, idx] = c, hh, ks, vs
                    for i, x in zip(idx.tolist(), com.tolist()):
                        new_s[i] = s[i] + x
                s = new_s

    def compile_all(self, batch: int = 1) -> float:
        """Build the prefill graph and the round graph of every start depth for ``batch`` rows now (a frame meets
        only the depths it lands on; a benchmark must not compile inside a timed frame). Returns the seconds taken."""
        t0 = time.perf_counter()
        # made outside inference mode, as decode's context and uniforms are (dynamo guards on the dispatch keys)
        ctx = torch.zeros(batch, 2, P.talker_hidden_size(self.code_predictor), dtype=self.lean.dtype,
                          device=self.lean.device)
        u = torch.zeros(batch, self.n_codes, self.u_width, dtype=torch.float64, device=self.lean.device)
        with torch.inference_mode():
            codes, h, k, v = self._call(("prefill", batch), ctx, u)
            for s in range(1, self.n_codes):
                self._call((s, batch), codes, h, k, v, u)
        return time.perf_counter() - t0


def _entry_prefill(frame: FusedChainFrame, _key, context, u):
    """The prefill as a plain function (copied per batch size, then compiled: see ``FusedChainFrame._call``)."""
    return frame.prefill(context, u)


def _entry_round(frame: FusedChainFrame, s: int, codes, h, k, v, u):
    """A round as a plain function (copied per start depth and batch size, then compiled)."""
    return frame.round(s, codes, h, k, v, u)
