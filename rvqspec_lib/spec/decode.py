"""The inner loop: one frame's codes 1..15 from the code predictor, autoregressively or speculatively.

``decode_frame(code_predictor, context, decoder=AR() | Chain(window) | Tree(paths), sampling, generator)``

Every decoder runs the same round, the four calls of Medusa's loop (docs/style.md#the-decode-round):

1. draft: the drafter turns H_s (the hidden state that produced the last committed code s) into draft
   distributions q for depths s+1.. ; Chain SAMPLES one draft per depth from q, Tree takes the top-ranked codes;
2. verify: ONE code-predictor call over [code s] + the drafted nodes, each node attending only to its ancestors;
3. accept: :func:`rvqspec_lib.spec.verify.walk_tree`, the lossless rule (pure function of p, q and the generator);
4. commit: keep the accepted nodes' KV slots; the hidden state of the last accepted node drafts the next round.

AR is the same round with an empty tree (one code per call). The first call of every frame is the 2-position
prefill (context) that gives code 1. "Tokens per call" counts every call of the frame, the prefill included, as
the paper's toks/step. Drafts never run past the last depth: nodes beyond it are masked, the window shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rvqspec_lib.spec import predictor as P
from rvqspec_lib.spec import verify
from rvqspec_lib.spec.decoders import AR
from rvqspec_lib.spec.drafters import ReusedHeads
from rvqspec_lib.spec.sampling import Sampling, sample


def sample_drafts(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Sample Chain drafts from q. ``q``: ``(N, V)`` warped draft probabilities; returns ``(N,)`` int64.

    A module-level function so that tests can substitute a deliberately broken sampler (a negative control: drafts
    drawn at another temperature than the q handed to the verifier must be caught by the losslessness test).
    """
    return sample(q, generator)


@dataclass
class FrameResult:
    """Codes of one frame and what it cost.

    Attributes:
        codes: ``(B, n_codes)`` int64, codes 1..n_codes of the frame (n_codes = n_code_groups - 1 = 15).
        calls: ``(B,)`` int64, code-predictor calls the row used (the prefill included).
        committed: ``(B, n_calls)`` int64, codes committed by each call (0 once the row is done).
        accepted: ``(B, n_calls)`` int64, drafts accepted by each call.
        start_depth: ``(B, n_calls)`` int64, depth of the last committed code before each call (0 for the prefill).
    """

    codes: torch.Tensor
    calls: torch.Tensor
    committed: torch.Tensor
    accepted: torch.Tensor
    start_depth: torch.Tensor

    @property
    def tokens_per_call(self) -> torch.Tensor:
        """``(B,)`` float: codes per code-predictor call (n_codes / calls)."""
        return self.codes.shape[1] / self.calls.to(torch.float64)

    @property
    def n_model_calls(self) -> int:
        """Model invocations for the whole batch (the longest row)."""
        return int(self.calls.max())


def _check_context(code_predictor, context: torch.Tensor) -> None:
    if not (hasattr(code_predictor, "lm_head") and hasattr(code_predictor, "small_to_mtp_projection")):
        hint = " (pass lm.code_predictor)" if hasattr(code_predictor, "code_predictor") or hasattr(
            code_predictor, "talker") else ""
        raise ValueError(f"code_predictor must be the official code predictor module, model.talker.code_predictor; "
                         f"got {type(code_predictor).__name__}{hint}")
    if P.n_codes(code_predictor) < 1:
        raise ValueError(f"this code predictor has num_code_groups {P.n_codes(code_predictor) + 1}: with one code group "
                         "per frame the talker emits every code and the inner loop has nothing to decode (it needs "
                         "num_code_groups >= 2)")
    h = P.talker_hidden_size(code_predictor)
    if not isinstance(context, torch.Tensor) or context.dim() != 3 or context.shape[1] != 2 or context.shape[2] != h:
        shape = tuple(context.shape) if isinstance(context, torch.Tensor) else type(context).__name__
        raise ValueError(f"context must be a float tensor of shape (B, 2, {h}) = [talker hidden state that emitted "
                         f"code 0, talker embedding of code 0]; got {shape}")
    if context.shape[0] < 1 or not context.is_floating_point():
        raise ValueError("context must be a non-empty floating-point tensor")
    if not bool(torch.isfinite(context).all()):
        raise ValueError("context holds NaN or inf: check the talker's hidden states (a diverged or half-loaded "
                         "checkpoint, or float16 overflow: load in float32)")


@torch.inference_mode()
def decode_frame(
    code_predictor,
    context: torch.Tensor,
    *,
    decoder=None,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    drafter=None,
) -> FrameResult:
    """Decode codes 1..n_codes of one frame.

    Args:
        code_predictor: the official module (``model.talker.code_predictor``), any config, any dtype (its dtype is
            followed; probabilities are computed in float32 as transformers does).
        context: ``(B, 2, talker_hidden)`` float = [talker hidden state that emitted code 0 (after the final norm),
            talker embedding of code 0].
        decoder: :class:`AR` (default), :class:`Chain` or :class:`Tree`.
        sampling: :class:`~rvqspec_lib.spec.sampling.Sampling` (default: temperature 0.9, top-k 50, top-p 1.0, the
            checkpoints' generation config).
        generator: explicit ``torch.Generator`` (the global RNG is never used; ``None`` makes a fresh unseeded one).
        drafter: where q comes from (default :class:`~rvqspec_lib.spec.drafters.ReusedHeads`).

    Returns:
        :class:`FrameResult`. Rows of a batch are decoded together and may accept different lengths.

    Raises:
        ValueError: a context of the wrong shape, an invalid decoder, a code predictor with one code group (nothing
            to decode), a tree rank outside the codebook.
    """
    decoder = AR() if decoder is None else decoder
    if not hasattr(decoder, "tree"):
        raise ValueError(f"decoder must be AR(), Chain(window=N) or Tree(paths=...), got {decoder!r}")
    sampling = Sampling() if sampling is None else sampling
    drafter = ReusedHeads() if drafter is None else drafter
    if generator is None:
        generator = torch.Generator(device=context.device)
        generator.seed()
    elif not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)) or None, got "
                         f"{type(generator).__name__}")
    _check_context(code_predictor, context)
    cp = code_predictor
    n = P.n_codes(cp)
    tree = decoder.tree(n)
    vocab = int(cp.config.vocab_size)
    if tree.max_rank >= vocab:
        raise ValueError(f"tree rank {tree.max_rank} is out of range for a codebook of {vocab} codes: "
                         f"use ranks 0..{vocab - 1}")
    dtype, dev = P.param_dtype(cp), context.device
    b = context.shape[0]
    rows = torch.arange(b, device=dev)
    cache = P.SlotCache(cp.config.num_hidden_layers)

    # --- prefill: [context] at positions 0, 1 gives code 1 (one call, no drafts) ---------------------------------
    x = cp.small_to_mtp_projection(context.to(dtype))
    causal = torch.tril(torch.ones(2, 2, dtype=torch.bool, device=dev)).expand(b, 2, 2)
    hid = P.forward(cp, x, torch.arange(2, device=dev).expand(b, 2), None, causal, cache)
    valid = torch.ones(b, 2, dtype=torch.bool, device=dev)
    h = hid[:, 1]
    p1 = sampling.probs(cp.lm_head[0](h))
    codes = torch.zeros(b, n, dtype=torch.long, device=dev)
    codes[:, 0] = sample(p1, generator)
    s = torch.ones(b, dtype=torch.long, device=dev)  # depth of the last committed code
    calls = torch.ones(b, dtype=torch.long, device=dev)
    log_committed, log_accepted, log_start = [torch.ones_like(s)], [torch.zeros_like(s)], [torch.zeros_like(s)]

    # --- rounds: draft -> verify -> accept -> commit -------------------------------------------------------------
    m1 = tree.n_nodes + 1
    t_depth = tree.depth.to(dev)  # (M+1,) offset of each node, 0 = root
    anc = tree.ancestors.to(dev)
    k_max = tree.max_depth
    t_rank = tree.rank[1:].to(dev)
    eye = torch.eye(m1, dtype=torch.bool, device=dev)[None]  # every query sees itself: never an empty mask row
    children = tree.children.to(dev)
    while bool((s < n).any()):
        active = s < n
        abs_depth = s[:, None] + t_depth[None, :]  # (B, M+1) depth of each node's code
        node_valid = active[:, None] & (abs_depth <= n)
        fed = node_valid & (abs_depth < n)  # a code remains after the node: its hidden state is needed
        node_codes = torch.zeros(b, m1, dtype=torch.long, device=dev)
        node_codes[:, 0] = codes[rows, (s - 1).clamp(max=n - 1)]
        q_nodes = None
        if k_max > 0:
            d_logits = drafter.draft_logits(cp, h, s, k_max)  # (B, K, V)
            if decoder.sampled_drafts:
                q = sampling.probs(d_logits)  # same warpers as p
                drafts = sample_drafts(q.reshape(b * k_max, -1), generator).reshape(b, k_max)
                node_codes[:, 1:] = drafts[:, t_depth[1:] - 1]
                q_nodes = torch.cat([torch.zeros_like(q[:, :1]), q[:, t_depth[1:] - 1]], 1)  # (B, M+1, V)
            else:
                top = torch.topk(d_logits, tree.max_rank + 1, dim=-1).indices  # (B, K, R)
                node_codes[:, 1:] = top[:, t_depth[1:] - 1, t_rank]
        embeds = P.embed_codes(cp, node_codes, abs_depth)  # (B, M+1, H)
        self_mask = (anc[None] & fed[:, None, :]) | eye
        hid = P.forward(cp, embeds, abs_depth + 1, valid, self_mask, cache)  # (B, M+1, H)
        # p after each fed node: lm_head[d] predicts code d+1
        p = torch.zeros(b, m1, cp.lm_head[0].out_features, dtype=torch.float32, device=dev)
        if bool(fed.any()):
            p[fed] = sampling.probs(P.head_logits(cp, hid[fed], abs_depth[fed]))
        walk = verify.walk_tree(p, node_codes, children, node_valid, fed, generator, q_nodes)
        # commit accepted drafts, then the residual / bonus code
        for k in range(walk.path.shape[1]):
            on = walk.path[:, k] >= 0
            if bool(on.any()):
                codes[rows[on], (s + k)[on]] = node_codes[rows[on], walk.path[on, k]]
        has_next = walk.next_code >= 0
        col = (s + walk.n_accepted).clamp(max=n - 1)
        codes[rows[has_next & active], col[has_next & active]] = walk.next_code[has_next & active]
        keep = torch.zeros(b, m1, dtype=torch.bool, device=dev)
        keep[:, 0] = fed[:, 0]
        for k in range(walk.path.shape[1]):
            on = walk.path[:, k] >= 0
            keep[rows[on], walk.path[on, k]] = fed[rows[on], walk.path[on, k]]
        valid = cache.keep(torch.cat([valid, keep], 1))
        h = torch.where(active[:, None], hid[rows, walk.last_node], h)
        committed = torch.where(active, walk.n_accepted + has_next.long(), torch.zeros_like(s))
        log_committed.append(committed)
        log_accepted.append(torch.where(active, walk.n_accepted, torch.zeros_like(s)))
        log_start.append(torch.where(active, s, torch.zeros_like(s)))
        s = s + committed
        calls = calls + active.long()
    return FrameResult(codes, calls, torch.stack(log_committed, 1), torch.stack(log_accepted, 1),
                       torch.stack(log_start, 1))
