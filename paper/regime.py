"""The paper's regime made visible: a synthetic code predictor whose structure is set by two numbers, run through the
library's own decoders, accept rule, calibration and offset training (notebook 03).

Each frame draws evidence ``x_d`` ``(V,)`` ~ N(0, I) for its codes d = 1..n. The target of code d is
``p_d = softmax(peak * x_d)``: ``peak`` sets how peaked p is (0: uniform). The hidden state at inner-loop position
P (the state whose head emits code P) holds ``peak`` times the evidence of every code still to come, code d's weakened
by ``foresight ** (d - P)`` (a state sees the next code clearly and later ones less so), the position P and a constant;
``lm_head[d-1]`` reads code d's slot plus ``drift * g * (P - d)``, a fixed logit vector ``g`` scaled by how far the
state sits from the head's own position. The verifier always applies head d at position d, so the drift term vanishes
for p; a reused head drafting code s+t from the state at s adds ``-t * drift * g``: the shift that position-aware
offsets correct (``b_t = t`` on the position coordinate removes it exactly; offset training moves towards it). Codes
within a frame are independent given the evidence, so frames are sampled in closed form (the same law as AR decoding)
and the regime is about peakedness and drift only.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from bench.latency import PAPER_TOKENS_PER_CALL  # noqa: F401  (the paper's reported figure, quoted)
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import Tree
from rvqspec_lib.decoding.drafters import PositionOffsets, ReusedHeads
from rvqspec_lib.decoding.predictor import head_logits
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval.calibration import calibrate
from rvqspec_lib.training.drafters import train_drafter

#: Sampling of the synthetic loop: plain softmax (temperature 1, no top-k), so that p is exactly softmax(peak * x).
SAMPLING = Sampling(temperature=1.0, top_k=0)


class _Model(nn.Module):
    """The hidden states of every position from the projected context alone (what ``teacher_forced_hidden`` calls)."""

    def __init__(self, n: int, vocab: int, peak: float, foresight: float, codec_embedding: nn.ModuleList):
        super().__init__()
        self.n, self.vocab, self.peak, self.foresight = n, vocab, peak, foresight
        self.codec_embedding = codec_embedding

    def states(self, evidence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``(B, Q, n*V + 2)`` states at int ``positions`` ``(B, Q)`` from ``evidence`` ``(B, n, V)``."""
        d = torch.arange(1, self.n + 1, device=evidence.device)
        gap = d[None, None, :] - positions[..., None]  # (B, Q, n)
        w = torch.where(gap >= 0, self.foresight ** gap.clamp_min(0).float(), torch.zeros((), device=d.device))
        slots = (self.peak * w[..., None] * evidence[:, None]).flatten(2)  # (B, Q, n*V)
        return torch.cat([slots, positions[..., None].float(), torch.ones_like(slots[..., :1])], -1)

    def forward(self, inputs_embeds: torch.Tensor, use_cache: bool = False):
        b, length, _ = inputs_embeds.shape
        pos = torch.arange(length, device=inputs_embeds.device).expand(b, length)
        ev = inputs_embeds[:, 0].reshape(b, self.n, self.vocab)
        return SimpleNamespace(last_hidden_state=self.states(ev, pos))


class SyntheticPredictor(nn.Module):
    """A code predictor with the official module's interface (``config``, ``lm_head``, ``small_to_mtp_projection``,
    ``model``) whose p and reused-head drafts are set in closed form (module docstring).

    Args:
        peak: scale of the evidence in p's logits (>= 0; 0: uniform p). drift: scale of the reused heads' shift per
            offset (>= 0). foresight: in (0, 1], how much of a later code's evidence a state holds per position.
        n_codes: codes per frame (15 as Qwen3-TTS). vocab: codebook size V. seed: of the drift direction g.
    Raises:
        ValueError: a parameter outside its range.
    """

    def __init__(self, peak: float, drift: float = 1.0, *, foresight: float = 0.5, n_codes: int = 15,
                 vocab: int = 16, seed: int = 0):
        super().__init__()
        if not (peak >= 0 and drift >= 0 and 0 < foresight <= 1 and n_codes >= 2 and vocab >= 2):
            raise ValueError(f"need peak >= 0, drift >= 0, 0 < foresight <= 1, n_codes >= 2, vocab >= 2; got "
                             f"{peak}, {drift}, {foresight}, {n_codes}, {vocab}")
        self.peak, self.drift, self.foresight, self.vocab = float(peak), float(drift), float(foresight), vocab
        ctx, hid = n_codes * vocab, n_codes * vocab + 2
        self.config = SimpleNamespace(num_code_groups=n_codes + 1, vocab_size=vocab, hidden_size=hid)
        emb = nn.ModuleList(nn.Embedding(vocab, ctx) for _ in range(n_codes))
        self.model = _Model(n_codes, vocab, self.peak, foresight, emb)
        self.small_to_mtp_projection = nn.Identity()
        g = torch.randn(vocab, generator=torch.Generator().manual_seed(seed))
        self.lm_head = nn.ModuleList(nn.Linear(hid, vocab, bias=False) for _ in range(n_codes))
        with torch.no_grad():
            for i, head in enumerate(self.lm_head):  # lm_head[i] emits code d = i + 1
                head.weight.zero_()
                head.weight[:, i * vocab:(i + 1) * vocab] = torch.eye(vocab)
                head.weight[:, -2] = drift * g
                head.weight[:, -1] = -(i + 1) * drift * g
        for p in self.parameters():
            p.requires_grad_(False)

    @property
    def n_codes(self) -> int:
        """Codes a frame."""
        return self.model.n

    def frames(self, n_frames: int, seed: int = 0) -> Frames:
        """``n_frames`` frames: contexts ``(N, 2, n*V)`` (row 0 the evidence) and codes sampled from p (as AR)."""
        gen = torch.Generator().manual_seed(seed)
        ev = torch.randn(n_frames, self.n_codes, self.vocab, generator=gen)
        codes = torch.multinomial(torch.softmax(self.peak * ev, -1).reshape(-1, self.vocab), 1, generator=gen)
        ctx = torch.stack([ev.flatten(1), torch.zeros_like(ev.flatten(1))], 1)
        return Frames(ctx, codes.reshape(n_frames, self.n_codes), torch.arange(n_frames), None,
                      {"kind": "synthetic", "peak": self.peak, "drift": self.drift, "seed": seed})


class SyntheticBackend:
    """The :class:`~rvqspec_lib.decoding.predictor.VerifyBackend` of a :class:`SyntheticPredictor`: the evidence is
    kept from the prefill, every query's state follows from its position (nothing to compact)."""

    def __init__(self, cp: SyntheticPredictor):
        self.cp = cp

    def new_cache(self, batch: int, slots: int) -> dict:
        return {"evidence": None}

    def forward(self, embeds, positions, allow, cache, write_slots):
        if cache["evidence"] is None:  # the prefill: the projected context
            cache["evidence"] = embeds[:, 0].reshape(embeds.shape[0], self.cp.n_codes, self.cp.vocab)
        return self.cp.model.states(cache["evidence"], positions.clamp(max=self.cp.n_codes))

    def compact(self, cache, order) -> None:
        return None

    def embed(self, codes, depth):
        return torch.zeros(*codes.shape, 1)

    def logits(self, hidden, head):
        return head_logits(self.cp, hidden, head)


def exact_offsets(cp: SyntheticPredictor, K: int = 3) -> PositionOffsets:
    """The offsets that remove the drift exactly: ``b_t`` = t on the position coordinate."""
    off = PositionOffsets(K, int(cp.config.hidden_size))
    with torch.no_grad():
        off.offsets[:, -2] = torch.arange(1, K + 1, dtype=torch.float32)
    return off


def trained_offsets(cp: SyntheticPredictor, frames: Frames, *, K: int = 3, epochs: int = 8, seed: int = 0):
    """Offsets trained by the library's :func:`~rvqspec_lib.training.drafters.train_drafter` (TV loss, the
    acceptance itself; Adam at 0.3, batches of 16) from zero on ``frames``: tens of seconds."""
    off = PositionOffsets(K, int(cp.config.hidden_size))
    train_drafter(off, cp, frames, loss="tv", sampling=SAMPLING, lr=0.3, batch_size=16, max_epochs=epochs,
                  patience=epochs, seed=seed)
    return off


def tokens_per_call(cp: SyntheticPredictor, decoder, frames: Frames, seed: int = 0) -> np.ndarray:
    """``(N,)`` float64 tokens per call of each frame decoded by ``decoder`` (the library's decode loop)."""
    res = decode_frame(cp, frames.context, decoder=decoder, sampling=SAMPLING,
                       generator=torch.Generator().manual_seed(seed), backend=SyntheticBackend(cp))
    return res.tokens_per_call.double().numpy()


def regime_rows(peaks=(0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0), *, drift: float = 1.0, foresight: float = 0.5,
                nodes: int = 32, n_calibration: int = 128, n_eval: int = 256, offsets: str = "exact",
                seed: int = 0) -> list[dict]:
    """The sweep: for each ``peak``, reused heads and offsets (``offsets``: ``"exact"``, :func:`exact_offsets`, or
    ``"trained"``, :func:`trained_offsets`), each with its own calibrated point-mass and sampled tree of ``nodes``
    query positions (the library's :func:`~rvqspec_lib.eval.calibration.calibrate` on ``n_calibration`` frames),
    decoded on ``n_eval`` held-out frames by the library's decode loop.

    Returns:
        a row per (peak, drafter, tree): ``peak``, ``p_top`` (mean top probability of p), ``drift``, ``foresight``,
        ``drafter`` (``heads``, ``offsets``), ``tree`` (``point-mass``, ``sampled``), ``nodes``, ``tokens_per_call``
        (committed codes over calls, frames pooled), ``se`` (standard error of the per-frame mean),
        ``predicted_tokens_per_call`` (the calibration's E(N)), ``frames``.
    Raises:
        ValueError: an unknown ``offsets``.
    """
    if offsets not in ("exact", "trained"):
        raise ValueError(f"offsets must be 'exact' or 'trained', got {offsets!r}")
    rows = []
    for peak in peaks:
        cp = SyntheticPredictor(peak, drift, foresight=foresight, seed=seed)
        cal_frames, ev = cp.frames(n_calibration, seed), cp.frames(n_eval, seed + 1)
        x = ev.context[:, 0].reshape(len(ev), cp.n_codes, cp.vocab)
        p_top = float(torch.softmax(peak * x, -1).amax(-1).mean())
        off = exact_offsets(cp) if offsets == "exact" else trained_offsets(cp, cal_frames, seed=seed)
        for name, drafter in (("heads", ReusedHeads()), ("offsets", off)):
            cal = calibrate(cp, drafter, cal_frames, sampling=SAMPLING, budgets=(nodes,), max_offset=6,
                            max_rank=8, max_children=4, seed=seed, batch_size=512)
            for kind in ("point-mass", "sampled"):
                dec = Tree(tuple(map(tuple, cal[kind]["order"][: nodes - 1])), sampled=kind == "sampled",
                           drafter=drafter)
                tpc = tokens_per_call(cp, dec, ev, seed)
                rows.append({"peak": peak, "p_top": p_top, "drift": drift, "foresight": foresight, "drafter": name,
                             "tree": kind, "nodes": nodes, "tokens_per_call": float(cp.n_codes / np.mean(
                                 cp.n_codes / tpc)), "se": float(tpc.std(ddof=1) / np.sqrt(len(tpc))),
                             "predicted_tokens_per_call": cal[kind]["predicted_tokens_per_call"][str(nodes)],
                             "frames": len(tpc)})
    return rows


def tree_verdicts(rows, drafter: str, z: float = 2.0) -> dict[float, str]:
    """Per swept peak of ``rows`` (:func:`regime_rows`), which of ``drafter``'s two trees commits more tokens per
    call: ``"point-mass"``, ``"sampled"``, or ``"tie"`` where they differ by at most ``z`` standard errors of the
    difference (sqrt(se_pm^2 + se_sampled^2))."""
    by = {(r["peak"], r["tree"]): r for r in rows if r["drafter"] == drafter}
    out = {}
    for peak in sorted({pk for pk, _ in by}):
        pm, sa = by[(peak, "point-mass")], by[(peak, "sampled")]
        diff, se = pm["tokens_per_call"] - sa["tokens_per_call"], float(np.hypot(pm["se"], sa["se"]))
        out[peak] = "tie" if abs(diff) <= z * se else "point-mass" if diff > 0 else "sampled"
    return out


def point_mass_from(verdicts: dict[float, str]) -> float | None:
    """The smallest swept peak from which :func:`tree_verdicts` says ``"point-mass"`` at every larger peak too
    (``None``: not even at the largest)."""
    peaks = sorted(verdicts)
    return next((pk for i, pk in enumerate(peaks) if all(verdicts[q] == "point-mass" for q in peaks[i:])), None)


def where_on_curve(rows, tokens_per_call: float):
    """The peak at which the offsets' point-mass tree curve of ``rows`` reaches ``tokens_per_call`` (linear
    interpolation), or ``None`` when the curve never reaches it (below its first point or above its last)."""
    pts = sorted((r["peak"], r["tokens_per_call"]) for r in rows
                 if r["drafter"] == "offsets" and r["tree"] == "point-mass")
    for (a, ya), (b, yb) in zip(pts, pts[1:]):
        if min(ya, yb) <= tokens_per_call <= max(ya, yb) and ya != yb:
            return a + (tokens_per_call - ya) * (b - a) / (yb - ya)
    return None


def plot_regime(rows, *, marks: dict | None = None, title: str = ""):
    """Tokens per call against ``peak`` for each (drafter, tree) of ``rows`` (:func:`regime_rows`; ± 2 standard
    errors shaded), and a dashed horizontal line per ``marks`` entry ``{label: tokens per call}`` (e.g. a measured
    model, the paper's quoted figure), labelled as given. Returns the ``Figure``."""
    import matplotlib.pyplot as plt

    from paper.plots import DECODER_COLORS, _dress

    fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
    for drafter, ls in (("heads", "--"), ("offsets", "-")):
        for tree in ("point-mass", "sampled"):
            sub = sorted((r for r in rows if r["drafter"] == drafter and r["tree"] == tree), key=lambda r: r["peak"])
            x = np.array([r["peak"] for r in sub])
            y, e = np.array([r["tokens_per_call"] for r in sub]), np.array([r["se"] for r in sub])
            color = DECODER_COLORS[f"tree-{tree}"]
            ax.plot(x, y, ls=ls, marker="o", ms=4, color=color, label=f"{drafter}, {tree} tree")
            ax.fill_between(x, y - 2 * e, y + 2 * e, color=color, alpha=0.15, lw=0)
    for i, (label, value) in enumerate((marks or {}).items()):
        ax.axhline(value, color=("#4d4d4d", "#9467bd", "#8c564b")[i % 3], lw=1, ls=":", label=label)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)
    _dress(ax, title, "peak (p = softmax(peak · x), x ~ N(0, I); 0: uniform p)", "tokens per code-predictor call",
           grid={}, legend=dict(fontsize=7))
    return fig
