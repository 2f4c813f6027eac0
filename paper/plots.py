"""Figures drawn from result dicts (the notebooks call these; nothing is measured here). :data:`DECODER_COLORS` and
:data:`BACKEND_COLORS` are THE colours of a decoder family and a backend in every figure. A ``plot_*`` returns the
``Figure`` (save it with :func:`rvqspec_lib.common.provenance.save_figure`); one given ``ax`` or ``axes`` returns
``None``."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt  # the library imports matplotlib only here, to draw (notebooks import this module)
import numpy as np
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from rvqspec_lib.decoding.decoder_names import parse_decoder_name, tree_from_calibration
from rvqspec_lib.eval.timing import oversubscribed_note
from rvqspec_lib.models.backends import runner_label

#: The paper's reported speedups of RVQ token generation on devices (Core ML), by node budget N. Quoted, not measured
#: here: tables put them in their own labelled column, figures label them as the paper's.
PAPER_DEVICE_SPEEDUPS = (
    {"device": "M3 Pro (paper, Core ML)", "nodes": 32, "speedup": 2.13},
    {"device": "iPhone 17 Pro Max (paper, Core ML)", "nodes": 32, "speedup": 2.34},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 16, "speedup": 1.82},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 64, "speedup": 1.21})


#: THE colour of each decoder family in every figure (:func:`decoder_family`: the ``kind``, trees split by their
#: children, the paper's and Medusa drafters apart; ``null-control``: AR under other seeds; ``heads``: the reused heads
#: as a drafter).
DECODER_COLORS = {"ar": "#4d4d4d", "null-control": "#a6a6a6", "chain": "#1f77b4", "tree-point-mass": "#ff7f0e",
                  "tree-sampled": "#2ca02c", "paper": "#9467bd", "offsets": "#9467bd", "medusa": "#8c564b",
                  "ssd-lossy": "#d62728", "heads": "#17becf"}
#: Marker and line style of a trained drafter by its loss (the label's suffix: ``offsets-tv``), so that drafters of
#: one family (one colour) stay apart; no suffix is cross-entropy, the paper's loss (``medusa``, Medusa-1's).
LOSS_STYLES = {"ce": dict(marker="s", ls="-"), "kl": dict(marker="^", ls="--"), "tv": dict(marker="v", ls=":")}


def decoder_color(fields) -> str:
    """THE colour of a decoder (:data:`DECODER_COLORS`) from its row's fields (``kind``, ``drafter``, ``decoder``) or
    its label; a drafter's trained variants (``offsets-tv``) share its colour."""
    return DECODER_COLORS.get(decoder_family(fields), "#17becf")


#: What each family of :data:`DECODER_COLORS` is called in legends.
FAMILY_LABELS = {"ar": "AR", "null-control": "AR, other seeds", "chain": "chain (sampled drafts, reused heads)",
                 "tree-point-mass": "point-mass tree (reused heads)", "tree-sampled": "sampled tree (reused heads)",
                 "paper": "the paper's decoder (offsets + their point-mass tree)", "offsets": "offsets drafter",
                 "medusa": "Medusa heads", "ssd-lossy": "SSD tolerance rule (LOSSY)",
                 "heads": "the reused heads (as a drafter)"}

#: THE colour of each verify backend of the registry (:data:`rvqspec_lib.models.backends.BACKENDS`) in every figure.
BACKEND_COLORS = {"official": "#7f7f7f", "eager": "#17becf", "compile": "#bcbd22", "onnx": "#e377c2",
                  "native": "#8c564b", "cuda": "#1a1a1a", "coreml": "#aec7e8"}
#: The line style of each backend where colour already says the decoder family.
BACKEND_STYLES = {"official": ":", "eager": "--", "compile": "-.", "onnx": (0, (3, 1, 1, 1)), "native": "-"}


def decoder_family(fields) -> str:
    """The key of :data:`DECODER_COLORS` a decoder belongs to (fields or label, parsed by
    :func:`~rvqspec_lib.decoding.decoder_names.parse_decoder_name`, never a regex)."""
    if isinstance(fields, str):  # ar-seed2: the null control's row, not a decoder name
        fields = {"decoder": fields} if fields == "ar-seed2" else parse_decoder_name(fields).fields()
    kind, drafter = fields.get("kind"), fields.get("drafter")
    family = str(drafter).split("-", 1)[0] if drafter else None  # offsets-tv, a trained variant: the offsets' colour
    if fields.get("decoder") == "ar-seed2":
        return "null-control"
    if kind == "paper" or family == "offsets":
        return "paper"
    if family == "medusa":
        return "medusa"
    if kind is None and family == "heads":  # a drafter's row, no decoder: the reused heads
        return "heads"
    if kind in ("tree", "calibrated"):
        return "tree-sampled" if fields.get("sampled") else "tree-point-mass"
    return kind if kind in DECODER_COLORS else "other"


def backend_color(name: str) -> str:
    """THE colour of a backend (:data:`BACKEND_COLORS`; an unknown one grey)."""
    return BACKEND_COLORS.get(name, "#999999")


def _log2_ticks(ax, values, *, log2_y: bool = False) -> None:
    """A log2 x axis with integer ticks at ``values`` (node budgets, query positions: whole numbers); ``log2_y``: a
    log2 y axis too, labelled in plain numbers."""
    vals = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(vals, [str(v) for v in vals])
    ax.xaxis.set_minor_locator(NullLocator())
    if log2_y:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))


def _log_y(ax) -> None:
    """A log y axis labelled at 1, 2 and 5 times the powers of ten, in plain numbers (``20``, not ``2x10^1``)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _dress(ax, title=None, xlabel=None, ylabel=None, *, size: float = 9, grid=None, legend=None) -> None:
    """Title (``size`` points), axis labels, a light grid (``grid``: ``Axes.grid`` keywords) and a legend (``legend``:
    ``Axes.legend`` keywords) on ``ax``; ``None`` leaves each out."""
    if title is not None:
        ax.set_title(title, fontsize=size)
    ax.set(**{k: v for k, v in (("xlabel", xlabel), ("ylabel", ylabel)) if v is not None})
    if grid is not None:
        ax.grid(alpha=0.3, **grid)
    if legend is not None:
        ax.legend(**legend)


def _by(rows, key, order):
    """``rows`` grouped by ``key(row)`` in first-seen order, each group sorted by ``order(row)``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: sorted(g, key=order) for k, g in groups.items()}


def _titled(fig, title: str, fontsize: float = 10, *, tight: bool = False):
    """``fig`` with ``title`` as its suptitle (none when empty), laid out tight when ``tight``."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    if tight:
        fig.tight_layout()
    return fig


def drafter_style(label: str) -> dict:
    """``{"color", "marker", "ls", "lw"}`` for ``Axes.plot`` of a drafter (``heads``, ``offsets-ce``, ``medusa-tv``
    ...): its family's colour, its loss's marker and line (:data:`LOSS_STYLES`); the reused heads thick (baseline)."""
    color = decoder_color({"drafter": label})
    if label == "heads":
        return dict(color=color, marker="o", ls="-", lw=2.6)
    loss = str(label).partition("-")[2] or "ce"
    return dict(color=color, lw=1.4, **LOSS_STYLES.get(loss, dict(marker="D", ls="-.")))


def sampling_words(sampling) -> str:
    """A :class:`~rvqspec_lib.decoding.sampling.Sampling` (or its ``describe()`` dict) in words for a title:
    ``"temperature 0.9, top-k 50"`` (``top-p`` when below 1; ``"greedy"``)."""
    d = sampling.describe() if hasattr(sampling, "describe") else dict(sampling)
    if d.get("greedy"):
        return "greedy"
    words = [f"temperature {d['temperature']:g}"]
    if d.get("top_k"):
        words.append(f"top-k {d['top_k']}")
    if d.get("top_p", 1.0) < 1.0:
        words.append(f"top-p {d['top_p']:g}")
    return ", ".join(words)


def bench_title(result: dict) -> str:
    """Figure title: model, whether weights are random, device, dtype and thread count, and
    :func:`rvqspec_lib.eval.timing.oversubscribed_note` on a line of its own when the CPU was oversubscribed."""
    m = result["model"]
    rnd = " (random weights: timing only)" if result.get("random_weights") else ""
    note = oversubscribed_note(result)
    return (f"{m['name']}{rnd}\n{result['device']} {result['device_name']}, {result['dtype']}, "
            f"{result['threads']} thread{'s' if result['threads'] != 1 else ''}, torch {result['torch']}"
            + (f"\n{note}: the times are pessimistic" if note else ""))


#: The colour of each forward (the official module, the native C forward) in the latency figures.
FORWARD_COLORS = {"official": "C0", "native": "C1"}


def plot_verify_cost(result: dict, *, figsize: tuple[float, float] = (9.0, 3.6)):
    """A :func:`bench.latency.bench_model` result, a colour per forward (:data:`FORWARD_COLORS`): left,
    median ms per call against N with the p10-p90 band and the talker step dashed; right, ``t(N) / t(1)`` beside
    ``y = N``. Raises KeyError: not a bench result."""
    pairs = [(result["backend"], result)] + ([("native", result["native"])] if "native" in result else [])
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, constrained_layout=True)
    top, ratios_ok = 0.0, True
    for name, pair in pairs:
        color = FORWARD_COLORS.get(name, "C2")
        rows = sorted(pair["code_predictor"], key=lambda r: r["n_queries"])
        q = [r["n_queries"] for r in rows]
        ax0.plot(q, [r["median_ms"] for r in rows], "o-", color=color,
                 label=f"code predictor ({name}), KV prefix {result['prefix_len']}")
        ax0.fill_between(q, [r["p10_ms"] for r in rows], [r["p90_ms"] for r in rows], color=color, alpha=0.2)
        talker = "official" if pair is result else name
        ax0.axhline(pair["talker_step"]["median_ms"], color=color, ls="--",
                    label=f"talker step ({talker}), KV prefix {result['talker_context']}")
        top = max(top, max(r["p90_ms"] for r in rows), pair["talker_step"]["median_ms"])
        if all(r.get("ratio_to_1") is not None for r in rows):
            ax1.plot(q, [r["ratio_to_1"] for r in rows], "o-", color=color, label=f"measured t(N) / t(1), {name}")
        else:
            ratios_ok = False
    _log2_ticks(ax0, q)
    ax0.set_ylim(0, 1.35 * top)  # room for the legend
    _dress(ax0, "one call: its latency (band: p10 to p90)", "query positions per call, N",
           "median latency per call (ms)", grid={}, legend=dict(fontsize=7, loc="upper left"))
    if ratios_ok:
        ax1.plot(q, q, ":", color="gray", label="y = N (no parallelism)")
        ax1.axhline(1.0, color="k", lw=0.8)
        _log2_ticks(ax1, q, log2_y=True)
        ax1.minorticks_off()
        _dress(ax1, "the verify cost curve t(N) / t(1)", "query positions per call, N", "cost relative to one AR call",
               grid=dict(which="both"), legend=dict(fontsize=7, loc="upper left"))
    else:
        ax1.set_axis_off()
        ax1.text(0.5, 0.5, "no Q = 1 measurement", ha="center", va="center")
    fig.suptitle(bench_title(result), fontsize=9)
    return fig


def plot_spectrograms(panels, *, hop_s: float, title: str = "", db_range: float = 80.0):
    """Log-mel spectrograms stacked on one time axis and ONE colour scale (the loudest top and ``db_range`` dB below).

    Args:
        panels: ``(label, db, distance_db)`` each: ``db`` ``(n_mels, frames)`` in dB
            (:func:`paper.notebook_measures.log_mel_db`), ``distance_db`` a log-spectral distance to
            the first panel (``None``: none). hop_s: seconds per column.
    """
    panels = list(panels)
    vmax = max(float(db.max()) for _, db, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, sharex=True, constrained_layout=True,
                             figsize=(8.0, 1.15 * len(panels) + 0.9), squeeze=False)
    for ax, (label, db, dist) in zip(axes[:, 0], panels):
        im = ax.imshow(db, origin="lower", aspect="auto", cmap="magma", vmin=vmax - db_range, vmax=vmax,
                       extent=(0, db.shape[1] * hop_s, 0, db.shape[0]))
        ax.set_title(label + ("" if dist is None else f"  (log-spectral distance {dist:.1f} dB)"), fontsize=8,
                     loc="left")
        ax.set_ylabel("mel band", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("time (s)")
    fig.colorbar(im, ax=axes[:, 0], label="mel power (dB)", shrink=0.8)
    return _titled(fig, title, 9)


def plot_tree(ax, paths, *, title: str = "", sampled: bool = False, color: str | None = None) -> None:
    """A draft tree's rank ``paths`` (``Tree.paths``) on ``ax``: a column per draft offset, nodes labelled with their
    rank (``sampled``: child index ``#i``); ``color`` (e.g. :func:`decoder_color`) first children solid, later ones
    pale (default C0 and C1)."""
    paths = [tuple(p) for p in paths]
    pos = {(): (0.0, 0.0)}
    for d in sorted({len(p) for p in paths}):
        nodes = sorted(p for p in paths if len(p) == d)
        pos.update({p: (float(d), (len(nodes) - 1) / 2.0 - i) for i, p in enumerate(nodes)})
    for p in paths:
        (x0, y0), (x1, y1) = pos[p[:-1]], pos[p]
        ax.plot([x0, x1], [y0, y1], color="0.6", lw=0.8, zorder=1)
    for p, (x, y) in pos.items():
        label = "root" if not p else (f"#{p[-1]}" if sampled else str(p[-1]))
        first = not p or p[-1] == 0
        face = ("C3" if not p else "C0" if first else "C1") if color is None else (color if p else "0.25")
        ax.scatter([x], [y], s=60 if p else 90, color=face, alpha=1.0 if color is None or first else 0.45, zorder=2)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
    _dress(ax, title, "draft offset")
    depths = sorted({len(p) for p in paths} | {0})
    ax.set_xticks(depths, ["root" if d == 0 else str(d) for d in depths])
    ax.set_yticks([])
    ax.spines[["top", "right", "left"]].set_visible(False)


def plot_two_loops(rows, *, title: str = "", figsize: tuple[float, float] = (11.0, 3.8)):
    """The paper's Figure 1 from the configs: left, one frame of the first row's model as its calls (1 talker call,
    ``n_code_groups - 1`` code-predictor calls); right, calls per second for real time per model, stacked.

    Args:
        rows: dicts with ``model``, ``talker_layers``, ``code_predictor_layers``, ``n_code_groups``,
            ``frame_rate_hz`` (:func:`paper.notebook_measures.loop_facts` plus a ``model`` name).
    """
    rows = list(rows)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.7, 1.0]},
                                   constrained_layout=True)
    r0 = rows[0]
    g, fr = int(r0["n_code_groups"]), float(r0["frame_rate_hz"])
    # one frame: the talker call, then the inner loop's calls, left to right
    ax0.add_patch(Rectangle((0, 1.2), 1.6, 0.8, color="C3", alpha=0.8))
    ax0.text(0.8, 1.6, f"talker\n{r0['talker_layers']} layers", ha="center", va="center", fontsize=8, color="w")
    ax0.text(0.8, 1.05, "code 0", ha="center", va="top", fontsize=7)
    x = 2.0
    width = 7.6 / (g - 1)
    for j in range(1, g):
        ax0.add_patch(Rectangle((x, 0.0), width * 0.85, 0.8, color="C0", alpha=0.35 + 0.6 * (j == 1)))
        if j in (1, 2, g - 1):
            ax0.text(x + width * 0.42, -0.08, f"code {j}", ha="center", va="top", fontsize=6, rotation=90)
        x += width
    ax0.text(2.0 + 3.8, 0.95, f"code predictor ({r0['code_predictor_layers']} layers): {g - 1} sequential calls\n"
             f"(a prefill for code 1, then one per code)", ha="center", va="bottom", fontsize=7)
    ax0.add_patch(FancyArrowPatch((1.6, 1.4), (2.0, 0.6), arrowstyle="->", mutation_scale=8, color="0.3"))
    ax0.add_patch(FancyArrowPatch((9.6, 0.9), (0.9, 2.1), connectionstyle="arc3,rad=0.35", arrowstyle="->",
                                  mutation_scale=8, color="0.5", ls="--"))
    ax0.text(5.3, 3.45, f"next frame: {g} codes fed back to the talker; {fr:g} frames a second, "
             f"{1000 / fr:g} ms of audio each", ha="center", fontsize=7)
    ax0.set_xlim(-0.2, 10.0)
    ax0.set_ylim(-1.0, 3.8)
    ax0.set_axis_off()
    ax0.set_title(f"one frame of {r0['model']}: 1 + {g - 1} = {g} model calls", fontsize=9)

    names = [r["model"] for r in rows]
    talker = [float(r["frame_rate_hz"]) for r in rows]
    inner = [float(r["frame_rate_hz"]) * (int(r["n_code_groups"]) - 1) for r in rows]
    ax1.bar(names, talker, color="C3", alpha=0.8, label="talker calls / s")
    ax1.bar(names, inner, bottom=talker, color="C0", alpha=0.6, label="code-predictor calls / s")
    for i, (t, c) in enumerate(zip(talker, inner)):
        ax1.text(i, t + c, f"{t + c:g}", ha="center", va="bottom", fontsize=8)
    ax1.set_ylim(0, 1.4 * max(t + c for t, c in zip(talker, inner)))
    ax1.tick_params(axis="x", labelsize=7, labelrotation=20)
    _dress(ax1, ylabel="model calls per second for real time", grid=dict(axis="y"),
           legend=dict(fontsize=7, loc="upper right"))
    return _titled(fig, title, 9)


def plot_tree_and_mask(paths, call: dict, *, title: str = "", color: str | None = None):
    """The paper's Figure 2: a point-mass draft tree (:func:`plot_tree` of ``paths``, ``color``) beside the
    attention mask of its verify call exactly as passed to the model (rows: query positions, root first; columns: KV
    slots, committed then the call's own).

    Args:
        call: one call of :func:`paper.verify_calls.record_verify_calls`: ``allow`` ``(Q, S)`` bool,
            ``positions`` ``(Q,)``, ``write_slots`` ``(Q,)``.
    """
    allow = np.asarray(call["allow"], dtype=bool)
    write = [int(v) for v in call["write_slots"]]
    pos = [int(v) for v in call["positions"]]
    used = max(write) + 1  # slots past the call's own are never read: not drawn
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12.0, 6.5), gridspec_kw={"width_ratios": [1.0, 1.3]},
                                   constrained_layout=True)
    plot_tree(ax0, paths, title=f"draft tree: {len(paths)} nodes + root (N = {len(paths) + 1})", color=color)
    ax1.imshow(allow[:, :used], cmap="Blues", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
    ax1.axvline(write[0] - 0.5, color="C3", lw=1.0)
    ax1.set_xticks(range(used), [("c" if j < write[0] else "n") + str(j) for j in range(used)], fontsize=5, rotation=90)
    ax1.set_yticks(range(len(pos)), [f"{'root' if i == 0 else 'node ' + str(i)} (pos {p})"
                                     for i, p in enumerate(pos)], fontsize=5)
    _dress(ax1, "attention mask of the verify call (blue: may attend), as passed to the model",
           f"KV slot (c: {write[0]} committed before this call | n: this call's query positions)")
    return _titled(fig, title, 9)


def plot_acceptance_by_offset(rows, *, max_offset: int, drafters, title: str = ""):
    """The paper's Figure 3: left, acceptance by draft offset per drafter; right, each minus the reused heads.

    Args:
        rows: per offset, ``offset_t`` and an acceptance column per drafter (the ``03_acceptance_by_offset`` table).
        max_offset: ``K`` the drafters were trained for (past it, shaded, all use the reused head).
        drafters: the columns drawn, ``"heads"`` first.
    Raises:
        KeyError: a drafter column is missing from ``rows``.
    """
    rows = sorted(rows, key=lambda r: r["offset_t"])
    j = [int(r["offset_t"]) for r in rows]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10.0, 3.8), constrained_layout=True)
    for lab in drafters:
        acc = [float(r[lab]) for r in rows]
        style = drafter_style(lab)
        ax0.plot(j, acc, ms=4, mfc="none", label=lab, **style)
        if lab != "heads":
            ax1.plot(j, [a - float(r["heads"]) for a, r in zip(acc, rows)], ms=4, mfc="none", label=lab, **style)
    ax1.axhline(0.0, color="k", lw=0.8)
    for ax, name, ylabel in ((ax0, f"acceptance by offset (shaded: past K = {max_offset}, reused head for all)",
                              "exact acceptance of a sampled draft"),
                             (ax1, "the offsets' gain over the reused heads", "minus the reused heads' acceptance")):
        ax.axvspan(max_offset + 0.5, max(j) + 0.5, color="0.9", zorder=0)
        ax.set_xticks(j)
        _dress(ax, name, "draft offset t (depth drafted = start depth s + t)", ylabel, grid={}, legend=dict(fontsize=7))
    return _titled(fig, title, 9)


# ---- the lossless rule by hand (notebooks/02_the_lossless_rule.py) -------------------------------------------------
#: One colour per quantity in every figure of the rule: target p, draft q, residual, the mass a draft keeps, a lossy
#: rule's output.
RULE_COLORS = {"p": "C0", "q": "C1", "residual": "C2", "accepted": "C4", "lossy": "C3"}
_KEPT, _REJECTED, _UNTRIED, _DRAWN = "#cdebd0", "#f6cfd2", "#eeeeee", "#d6e6f5"


def _box(ax, x: float, y: float, text: str, face: str) -> None:
    ax.text(x, y, text, ha="left", va="center", fontsize=8.0, family="monospace",
            bbox={"boxstyle": "round,pad=0.35", "facecolor": face, "edgecolor": "0.55", "linewidth": 0.6})


def plot_round(axes, trace: dict, *, title: str = "") -> None:
    """One speculative round of a :func:`paper.toy_round.trace_round` ``trace`` on four ``axes``: draft,
    verify, accept walk, commit (green kept, red rejected, grey untried, blue the code drawn after the walk)."""
    nodes, steps, committed, sampled = trace["nodes"], trace["steps"], trace["committed"], trace["sampled"]
    tries = [s for s in steps if "accepted" in s]
    kept = {s["node"] for s in tries if s["accepted"]}
    rejected = {s["node"] for s in tries if not s["accepted"]}
    n_rows = max(len(nodes), len(steps), len(committed)) + 1
    y = (lambda i: n_rows - 1 - i)  # noqa: E731
    for ax, head in zip(axes, ["1. draft", "2. verify (one call)", "3. accept walk", "4. commit"]):
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.7, n_rows - 0.3)
        ax.set_axis_off()
        ax.set_title(head, fontsize=9, loc="left")
    a0, a1, a2, a3 = axes
    for i, nd in enumerate(nodes):
        indent = 0.02 + 0.07 * nd["offset"]
        if nd["node"] == 0:
            _box(a0, indent, y(i), "node 0 = root\nthe last committed code", _KEPT)
            _box(a1, 0.02, y(i), "node 0: p of the next depth", "white")
            continue
        face = _KEPT if nd["node"] in kept else _REJECTED if nd["node"] in rejected else _UNTRIED
        how = f"q(x) = {nd['q_x']:.2f}" if sampled else f"rank {nd['rank']} of q"
        _box(a0, indent, y(i), f"node {nd['node']}, offset {nd['offset']}\ncode {nd['code']}, {how}", face)
        _box(a1, 0.02, y(i), f"node {nd['node']}: p(code {nd['code']} | its path)\n= {nd['p_x']:.2f} "
                             f"(from node {nd['parent']})", "white")
    rule = "min(1, p/q)" if sampled else "p(x) left"
    for i, s in enumerate(steps):
        if "accepted" in s:
            mark = "kept" if s["accepted"] else "rejected"
            _box(a2, 0.02, y(i), f"try node {s['node']} (code {s['code']}):\nu = {s['u']:.2f} "
                                 f"{'<' if s['accepted'] else '>='} {rule} = {s['ratio']:.2f}: {mark}",
                 _KEPT if s["accepted"] else _REJECTED)
        elif s["draw"] == "none":
            _box(a2, 0.02, y(i), "the frame's last depth:\nno code left to draw", "white")
        else:
            what = "residual (after a rejection)" if s["draw"] == "residual" else "bonus: p after the last kept node"
            _box(a2, 0.02, y(i), f"draw code {s['code']} from the\n{what}", _DRAWN)
    for i, c in enumerate(committed):
        _box(a3, 0.02, y(i), f"depth +{c['depth']}: code {c['code']}\n({c['how']})",
             _KEPT if c["how"] == "accepted draft" else _DRAWN)
    _box(a3, 0.02, y(len(committed)), f"{len(committed)} code{'s' if len(committed) != 1 else ''} for one call",
         "white")
    if title:
        a0.text(0.0, n_rows + 0.25, title, fontsize=10, fontweight="bold", ha="left", va="bottom",
                transform=a0.transData)


def _tree_layout(tree) -> dict[int, tuple[float, float]]:
    """x = draft offset, y = leaves in depth-first order, a parent midway between its children."""
    kids = [[int(c) for c in row if c >= 0] for row in tree.children]
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(v: int) -> float:
        if not kids[v]:
            yv = -next_leaf[0]
            next_leaf[0] += 1.0
        else:
            ys = [place(c) for c in kids[v]]
            yv = sum(ys) / len(ys)
        pos[v] = (float(tree.depth[v]), yv)
        return yv

    place(0)
    return pos


def plot_tree_ids(ax, tree, *, codes=None, title: str = "") -> None:
    """A compiled :class:`~rvqspec_lib.decoding.trees.DraftTree` on ``ax``, a column per draft offset, each node's id
    inside it and its rank (and code, from ``codes`` ``(M+1,)`` when given) beside."""
    pos = _tree_layout(tree)
    for v, (x, yv) in pos.items():
        par = int(tree.parent[v])
        if par >= 0:
            ax.plot([pos[par][0], x], [pos[par][1], yv], color="0.5", lw=1.0, zorder=1)
    for v, (x, yv) in pos.items():
        ax.scatter([x], [yv], s=420, color="0.3" if v == 0 else RULE_COLORS["q"], zorder=2, edgecolor="k", lw=0.6)
        ax.text(x, yv, str(v), ha="center", va="center", fontsize=9, color="w", fontweight="bold", zorder=3)
        label = "root" if v == 0 else f"rank {int(tree.rank[v])}"
        if codes is not None and v:
            label += f", code {int(codes[v])}"
        ax.annotate(label, (x, yv), textcoords="offset points", xytext=(0, -17), ha="center", fontsize=7)
    ax.set_xticks(range(tree.max_depth + 1), ["root"] + [str(t) for t in range(1, tree.max_depth + 1)])
    ax.set_yticks([])
    ys = [yv for _, yv in pos.values()]
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.6)
    ax.set_xlim(-0.4, tree.max_depth + 0.4)
    ax.spines[["top", "right", "left"]].set_visible(False)
    _dress(ax, title, "draft offset t (depth drafted = last committed depth + t)")


def plot_ancestor_mask(ax, tree, *, title: str = "") -> None:
    """A tree's ancestor matrix as the attention mask of its verify call: row = the query node being verified,
    column = the node whose slot it may attend to (itself and its ancestors; every node also sees the codes committed
    before the call, not drawn). Same node ids on both axes as :func:`plot_tree_ids`."""
    anc = np.asarray(tree.ancestors, dtype=bool)
    m1 = anc.shape[0]
    ax.imshow(anc, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    for i, j in np.ndindex(m1, m1):
        ax.text(j, i, str(int(anc[i, j])), ha="center", va="center", fontsize=8, color="w" if anc[i, j] else "0.6")
    ax.set_xticks(range(m1), [str(t) for t in range(m1)])
    ax.set_yticks(range(m1), [str(t) for t in range(m1)])
    _dress(ax, title, "node whose slot may be attended to (column)", "query node being verified (row)")


def plot_speedup_vs_n(measured: Sequence[dict], projected: Sequence[dict] = (), *, fused: Sequence[dict] = (),
                      measured_title: str = "measured here", projected_title: str = "PROJECTION"):
    """The paper's Figure 4: speedup over AR of the same backend against N, measured, projected and quoted each in
    its own panel on one y axis.

    Args:
        measured: :func:`bench.frames.speedup_vs_n` rows (a line per backend and precision; open markers
            where the best decoder is a sampled tree). projected: :func:`bench.frames.projected_speedup`
            rows. fused: :func:`bench.frames.summary_by_backend` rows (the fused AR frame, dotted). The quoted
            device numbers: :data:`PAPER_DEVICE_SPEEDUPS`.
    """
    fig, axes = plt.subplots(1, 3, figsize=(12.0, 4.2), sharey=True)
    colors = {b: f"C{i}" for i, b in enumerate(dict.fromkeys(r["backend"] for r in [*measured, *projected]))}
    ax = axes[0]
    for key, rs in _by(measured, lambda r: (r["backend"], r.get("precision")), lambda r: r["nodes"]).items():
        ax.plot([r["nodes"] for r in rs], [r["speedup_vs_ar"] for r in rs], "-", color=colors[key[0]],
                label=" ".join(filter(None, key)))
        for r in rs:
            sampled = bool(parse_decoder_name(r["decoder"]).fields().get("sampled"))
            ax.plot([r["nodes"]], [r["speedup_vs_ar"]], "o", color=colors[key[0]], mfc="white" if sampled else None)
    for r in fused:
        if r.get("fused_speedup_vs_ar"):
            ax.axhline(r["fused_speedup_vs_ar"], color=colors.get(r["backend"], "grey"), ls=":", lw=1,
                       label=f"{r['backend']}: fused AR frame")
    ax.plot([], [], "o", color="grey", label="point-mass tree or chain")
    ax.plot([], [], "o", color="grey", mfc="white", label="sampled tree")
    _dress(ax, measured_title, ylabel="speedup over AR (same backend)", size=8)
    for b, rs in _by(projected, lambda r: r["backend"], lambda r: r["nodes"]).items():
        axes[1].plot([r["nodes"] for r in rs], [r["projected_speedup"] for r in rs], "s--", color=colors[b], label=b)
    axes[1].set_title(projected_title, fontsize=8)
    for i, p in enumerate(PAPER_DEVICE_SPEEDUPS):
        axes[2].plot([p["nodes"]], [p["speedup"]], marker="*^vD"[i % 4], color="k", ls="none", ms=9, label=p["device"])
    axes[2].set_title("the paper's devices (QUOTED; Core ML, point-mass trees)", fontsize=8)
    for ax in axes:
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        _dress(ax, xlabel="node budget N (query positions of one verify call)",
               legend=dict(fontsize=7, loc="best") if ax.get_legend_handles_labels()[0] else None)
    return _titled(fig, "", tight=True)


#: One colour per part of a frame (:func:`plot_frame_parts`).
PART_COLORS = {"talker": "#8c564b", "inner": "#1f77b4", "codec": "#2ca02c"}


def plot_frame_parts(rows: Sequence[dict], *, title: str = ""):
    """The paper's Figure 1 tested, per :func:`bench.table.pipeline_table` row: a frame's ms in the
    talker, inner loop and codec stacked (one thread), their floors thin below, all cores a diamond, real time a line.
    """
    rows = list(rows)
    fig, ax = plt.subplots(figsize=(9.0, 0.45 * len(rows) + 1.6))
    names = {"talker": "talker step", "inner": "inner loop (codes 1..15)", "codec": "codec decoder"}
    for i, r in enumerate(rows):
        y, left, fleft = len(rows) - 1 - i, 0.0, 0.0
        for p in ("talker", "inner", "codec"):
            ax.barh(y + 0.1, r[f"{p}_ms"], left=left, height=0.5, color=PART_COLORS[p],
                    label=names[p] if i == 0 else None)
            fl = r.get(f"{p}_floor_ms") or 0.0
            ax.barh(y - 0.28, fl, left=fleft, height=0.14, color=PART_COLORS[p], alpha=0.45,
                    label="floors (bytes / bandwidth; FLOPs / peak)" if i == 0 and p == "talker" else None)
            left, fleft = left + r[f"{p}_ms"], fleft + fl
        ax.plot([r["frame_2c_ms"]], [y + 0.1], "D", color="k", ms=5, label="frame on all cores" if i == 0 else None)
        ax.text(left + 1, y + 0.1, f"RTF {r['rtf_1t']:.2f} / {r['rtf_2c']:.2f}", va="center", fontsize=7)
    ax.axvline(80.0, color="r", ls="--", lw=1, label="real time: one frame of audio = 80 ms")
    ax.set_yticks(range(len(rows)), [f"{r['model']} {r['precision']} {r['decoder']}" for r in reversed(rows)],
                  fontsize=7)
    _dress(ax, title, "milliseconds per frame (80 ms of audio): one thread, in turn", size=8,
           legend=dict(fontsize=7, loc="lower right"))
    return _titled(fig, "", tight=True)


def plot_audio_vs_wall(streams: Sequence[dict], *, title: str = ""):
    """Audio produced against wall time, one panel per layout (one thread, all cores), one curve per stream of
    :func:`bench.table.time_streams` (its ``chunks``): solid, the seconds of audio ready; thin dashed,
    real time from the first chunk (a player started then: while the solid curve stays above, nothing waits); red
    crosses, underruns (a chunk ready after the player ran out).
    """
    layouts = list(dict.fromkeys(s["layout"] for s in streams))
    fig, axes = plt.subplots(1, max(1, len(layouts)), figsize=(11.0, 4.0), sharey=True, squeeze=False)
    for ax, layout in zip(axes[0], layouts):
        marked = False
        for s in (s for s in streams if s["layout"] == layout and s["chunks"]):
            color, ch, sr = decoder_color(s), s["chunks"], float(s.get("sample_rate", 24000))
            t = [c["t_ready_s"] for c in ch]
            done = [sum(c["samples"] for c in ch[:k + 1]) / sr for k in range(len(ch))]
            ax.step([0.0, *t], [0.0, *done], where="post", color=color, label=f"{s['row']}: {s['decoder']}")
            ax.plot([t[0], t[0] + done[-1]], [0.0, done[-1]], "--", color=color, lw=0.8)
            late = [k for k, c in enumerate(ch) if c["late_ms"] > 0]
            ax.plot([t[k] for k in late], [done[k - 1] if k else 0.0 for k in late], "x", color="r", ms=6,
                    label="underrun" if late and not marked else None)
            marked = marked or bool(late)
        _dress(ax, f"{layout}", "wall time since the call (s)", size=8, legend=dict(fontsize=7, loc="upper left"))
    axes[0][0].set_ylabel("audio ready (s)")
    return _titled(fig, title, 9, tight=True)


# ---- the calibrated tree (notebooks/04_calibrating_the_tree.py) ---------------------------------------------------
def plot_acceptance_heatmaps(calibration: dict, *, max_index: int = 8, title: str = ""):
    """What one drafted node is worth, point-mass and sampled, on ONE linear colour scale from 0 (on separate scales
    a point-mass node would look as valuable as a sampled one). Top: by start depth s and offset t, the rank-0 draft's
    target mass and the first sampled child's acceptance; bottom, start depths pooled, by offset and rank r or child
    index i (up to ``max_index``): P(this node accepted | parent reached).

    Args:
        calibration: :func:`rvqspec_lib.eval.calibration.calibrate`'s dict (or its file).
    """
    kinds = ("point-mass", "sampled")  # a calibration's JSON tables hold None for NaN: numpy reads it as NaN
    pm_s, sp_s = (np.array(calibration[k]["by_start_depth"], dtype=np.float64)[..., 0] for k in kinds)  # (S, K)
    pm_t, sp_t = (np.array(calibration[k]["table"], dtype=np.float64)[:, :max_index] for k in kinds)  # (K, R)
    vmax = float(np.nanmax([np.nanmax(a) for a in (pm_s, sp_s, pm_t, sp_t)]))
    norm = Normalize(vmin=0.0, vmax=max(vmax, 1e-6))
    fig, axes = plt.subplots(2, 2, figsize=(11.0, 7.0), constrained_layout=True)
    panels = ((axes[0][0], pm_s, "point-mass: target mass of the rank-0 draft", "start depth s"),
              (axes[0][1], sp_s, "sampled: acceptance of the first child", "start depth s"),
              (axes[1][0], pm_t.T, "point-mass: target mass by rank (start depths pooled)", "rank r"),
              (axes[1][1], sp_t.T, "sampled: P(child i accepted | parent reached), pooled", "child index i"))
    im = None
    for ax, a, name, ylab in panels:
        first = 1 if ylab == "start depth s" else 0
        im = ax.imshow(np.ma.masked_invalid(a), cmap="viridis", norm=norm, origin="lower", aspect="auto",
                       interpolation="nearest", extent=(0.5, a.shape[1] + 0.5, first - 0.5, a.shape[0] + first - 0.5))
        ax.set_facecolor("white")
        _dress(ax, f"{name}\nmean {np.nanmean(a):.3f}, max {np.nanmax(a):.3f}",
               "draft offset t (depth drafted = s + t)", ylab)
        ax.set_yticks(range(first, first + a.shape[0]), [str(v) for v in range(first, first + a.shape[0])], fontsize=7)
        ax.set_xticks(range(1, a.shape[1] + 1), [str(v) for v in range(1, a.shape[1] + 1)], fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.8, label="probability (one scale for all four panels)")
    return _titled(fig, title)


def plot_calibrated_trees(calibration: dict, budgets: Sequence[int], *, title: str = ""):
    """The greedy calibrated trees of a few node budgets, point-mass (top row) and sampled (bottom row), each titled
    with its predicted tokens per call E(N) and coloured by :func:`decoder_color`.

    Raises:
        ValueError: a budget the calibration does not hold.
    """
    budgets = [int(b) for b in budgets]
    fig, axes = plt.subplots(2, len(budgets), figsize=(3.0 * len(budgets), 6.0), squeeze=False, constrained_layout=True)
    for row, kind in enumerate(("point-mass", "sampled")):
        for col, b in enumerate(budgets):
            tree = tree_from_calibration(calibration, kind, b)
            e = calibration[kind]["predicted_tokens_per_call"][str(b)]
            plot_tree(axes[row][col], tree.paths, sampled=tree.sampled,
                      color=decoder_color({"kind": "calibrated", "drafter": "heads", "sampled": tree.sampled}),
                      title=f"{kind}, N = {b}: E(N) = {e:.2f}")
    return _titled(fig, title)


def _family_label(fields) -> str:
    fam = decoder_family(fields)
    if fam == "paper" and fields.get("kind") != "paper":
        return ("sampled" if fields.get("sampled") else "point-mass") + " tree (offsets drafter)" \
            if fields.get("kind") in ("tree", "calibrated") else f"{fields.get('kind')} (offsets drafter)"
    return FAMILY_LABELS.get(fam, fam)


def plot_tokens_per_call_vs_n(rows: Sequence[dict], *, title: str = ""):
    """:func:`paper.calibration_checks.predicted_vs_measured` ``rows``: E(N) predicted (dashed) against tokens
    per call measured (solid), point-mass trees left, sampled trees and chains (triangles) right, ONE y scale."""
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2), sharey=True, constrained_layout=True)
    panels = {False: axes[0], True: axes[1]}
    groups = _by((r for r in rows if r["kind"] != "ar"),
                 lambda r: (bool(r.get("sampled")), r["kind"] == "chain", r.get("drafter")), lambda r: r["nodes"])
    for (sampled, chain, drafter), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")):
        ax = panels[sampled]
        color = decoder_color(rs[0])
        who = ("the paper's decoder (offsets)" if rs[0]["kind"] == "paper" else
               "offsets drafter" if drafter == "offsets" else "reused heads")
        what = "chain, " if chain else ""
        xs = [r["nodes"] for r in rs]
        ax.plot(xs, [r["measured_tokens_per_call"] for r in rs], "^:" if chain else "o-", color=color, ms=4,
                mfc="white" if drafter == "offsets" and rs[0]["kind"] != "paper" else color,
                label=f"{what}{who}: measured")
        pred = [(r["nodes"], r["predicted_tokens_per_call"]) for r in rs if r["predicted_tokens_per_call"] is not None]
        if pred and not chain:
            ax.plot(*zip(*pred), "--", color=color, alpha=0.6, lw=1.2, label=f"{what}{who}: predicted E(N)")
    nodes = [r["nodes"] for r in rows if r["kind"] != "ar"]
    for ax, name in ((axes[0], "point-mass trees"), (axes[1], "sampled trees and chains")):
        _log2_ticks(ax, nodes)
        ax.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8)
        _dress(ax, f"{name} (AR: the grey line, one code per call)",
               "node budget N (query positions of one verify call)", grid={},
               legend=dict(fontsize=6.5, loc="upper left"))
    axes[0].set_ylabel("tokens per call (codes per inner-loop call)")
    return _titled(fig, title)


def plot_verify_cost_curves(curves, *, projection: Sequence[dict] = (), projection_title: str = "", title: str = ""):
    """t(N)/t(1) of one verify call per backend, a panel per model on ONE y scale, and optionally a last panel with a
    PROJECTION ``E(N) t(1) / t(N)`` (:func:`bench.frames.projected_speedup` rows with a ``kind``).

    Args:
        curves: ``{panel title: verify_cost_curve rows}``. projection: projected rows (dashed, titled PROJECTION).
        projection_title: what the projection is made of (its inputs). title: the figure title.
    """
    n = len(curves) + (1 if projection else 0)
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n, 3.9), squeeze=False, constrained_layout=True)
    axes = axes[0]
    qs_all = [r["query_positions"] for rows in curves.values() for r in rows]
    ratios = [r["ratio_to_q1"] for rows in curves.values() for r in rows]
    top, low = max(ratios + [max(qs_all)]), min(ratios + [1.0])
    for ax, (name, rows) in zip(axes, curves.items()):
        for b, rs in _by(rows, lambda r: r["backend"], lambda r: r["query_positions"]).items():
            ax.plot([r["query_positions"] for r in rs], [r["ratio_to_q1"] for r in rs], "o-", ms=3,
                    color=backend_color(b), label=f"{b}: t(1) = {rs[0]['median_ms']:.2f} ms")
        qs = sorted({r["query_positions"] for r in rows})
        ax.plot(qs, qs, ":", color="0.6", label="y = N (no parallelism at all)")
        _log2_ticks(ax, qs, log2_y=True)
        ax.set_ylim(0.8 * low, 1.2 * top)  # one scale for every model's panel
        _dress(ax, name, "query positions N of one call", "t(N) / t(1), measured", grid=dict(which="both"),
               legend=dict(fontsize=6, loc="upper left"))
    if projection:
        ax = axes[-1]
        for (b, kind), rs in _by(projection, lambda r: (r["backend"], r["kind"]), lambda r: r["nodes"]).items():
            ax.plot([r["nodes"] for r in rs], [r["projected_speedup"] for r in rs], marker="s", ms=3,
                    color=decoder_color({"kind": "calibrated", "sampled": kind == "sampled"}),
                    ls=BACKEND_STYLES.get(b, "--"), label=f"{kind} trees, {b} cost")
        ax.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8)
        _log2_ticks(ax, [r["nodes"] for r in projection])
        _dress(ax, "PROJECTION, not a measurement" + (f"\n{projection_title}" if projection_title else ""),
               "node budget N", "PROJECTED speedup over AR, E(N) t(1)/t(N)", size=8, grid={}, legend=dict(fontsize=6))
    return _titled(fig, title)


def plot_frames_vs_n(rows: Sequence[dict], *, title: str = ""):
    """The paper's Figure 4 with every AR baseline, a column per backend of
    :func:`rvqspec_lib.eval.speed.time_frames` rows: top, speedup over stepped AR of that backend against N (a line per
    decoder family, chains triangles, fused hollow, the paper's devices black); bottom, ms per frame on ONE scale with
    a line for EVERY AR of the run (the fastest thickest). One legend, under the figure.
    """
    rows = [r for r in rows if not r.get("lossy")]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    fig, axes = plt.subplots(2, len(backends), figsize=(4.0 * len(backends), 7.6), squeeze=False,
                             sharey="row", layout="constrained")
    ars = sorted((r for r in rows if r["kind"] == "ar"), key=lambda r: r["ms_per_frame"])
    nodes = sorted({r["nodes"] for r in rows if r["kind"] != "ar" and r["nodes"]}
                   | {p["nodes"] for p in PAPER_DEVICE_SPEEDUPS})
    ar_styles = (":", "--", "-.", (0, (1, 1)), (0, (5, 1)), (0, (3, 1, 1, 1)))
    handles: dict = {}
    for col, b in enumerate(backends):
        top, bottom = axes[0][col], axes[1][col]
        mine = [r for r in rows if r["backend"] == b and r["kind"] != "ar"]
        for fused in (False, True):
            groups = _by((r for r in mine if bool(r["fused"]) == fused),
                         lambda r: (decoder_family(r), r["kind"] == "chain"), lambda r: r["nodes"])
            for (fam, chain), rs in groups.items():
                style = dict(color=decoder_color(rs[0]), marker="^" if chain else "o", ms=5,
                             ls=":" if chain else "-", mfc="white" if fused else decoder_color(rs[0]))
                label = _family_label(rs[0]) + (", fused frame" if fused else ", stepped")
                xs = [r["nodes"] for r in rs]
                if all(r["speedup_vs_ar"] for r in rs):
                    top.plot(xs, [r["speedup_vs_ar"] for r in rs], **style)
                handles[label] = bottom.plot(xs, [r["ms_per_frame"] for r in rs], **style)[0]
        for i, p in enumerate(PAPER_DEVICE_SPEEDUPS):
            h = top.plot([p["nodes"]], [p["speedup"]], marker="*^vD"[i % 4], color="k", ls="none", ms=7)[0]
            handles.setdefault(f"{p['device']}, N = {p['nodes']} (quoted)", h)
        top.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8)
        for i, a in enumerate(ars):
            h = bottom.axhline(a["ms_per_frame"], color=backend_color(a["backend"]), ls=ar_styles[i % len(ar_styles)],
                               lw=2.2 if i == 0 else 1.2)
            handles.setdefault(f"AR {runner_label(a)[3:]}" + (": the fastest AR" if i == 0 else ""), h)
        for ax in (top, bottom):
            _log2_ticks(ax, nodes)
            ax.grid(alpha=0.3)
        _log_y(bottom)
        _dress(top, f"{b} backend")
        _dress(bottom, xlabel="node budget N (query positions of one verify call)")
    _dress(axes[0][0], ylabel="speedup over stepped AR, same backend")
    _dress(axes[1][0], ylabel="ms per frame (median); lines: every AR")
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=3, fontsize=7)
    return _titled(fig, title)


def plot_temperature_sweep(rows: Sequence[dict], *, title: str = ""):
    """A :func:`paper.calibration_checks.temperature_sweep`: left, tokens per call of both kinds of tree,
    measured (solid) and predicted (dashed), against the temperature (sharper p to the right); right, the mechanism:
    what one point-mass child is worth (the target mass of the top-ranked code) against one sampled child
    (``sum min(p, q)``), at offset 1.
    """
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10.5, 3.9), constrained_layout=True)
    nodes = rows[0]["nodes"] if rows else None
    for kind in ("point-mass", "sampled"):
        rs = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["temperature"])
        color = decoder_color({"kind": "calibrated", "sampled": kind == "sampled"})
        t = [r["temperature"] for r in rs]
        a0.plot(t, [r["measured_tokens_per_call"] for r in rs], "o-", color=color,
                label=f"{kind} tree, N = {nodes}: measured")
        a0.plot(t, [r["predicted_tokens_per_call"] for r in rs], "--", color=color, alpha=0.7,
                label=f"{kind} tree: predicted E(N)")
    one = sorted({r["temperature"]: r for r in rows}.values(), key=lambda r: r["temperature"])
    t = [r["temperature"] for r in one]
    a1.plot(t, [r["top1_target_mass"] for r in one], "o-", color=DECODER_COLORS["tree-point-mass"],
            label="one point-mass child: target mass of the top-ranked code")
    a1.plot(t, [r["first_child_acceptance"] for r in one], "s-", color=DECODER_COLORS["tree-sampled"],
            label="one sampled child: sum min(p, q)")
    a1.set_ylim(0, 1)
    for ax, name, ylabel in ((a0, "which tree commits more codes per call", "tokens per call"),
                             (a1, "why: what one child is worth", "probability one child is kept (offset 1)")):
        ax.invert_xaxis()
        _dress(ax, name, "code-predictor temperature (sharper p to the right)", ylabel, grid={},
               legend=dict(fontsize=7))
    return _titled(fig, title)


# ---- the device appendix (notebooks/07_device_engineering.py) ------------------------------------------------------
def plot_floor(call_rows: Sequence[dict], talker_rows: Sequence[dict] = (), *, title: str = ""):
    """Each call over its weight-streaming floor (the line at 1), per precision, ONE y scale, bars labelled in ms:
    left, :func:`bench.latency.precision_rows` (a bar per backend); right,
    :func:`bench.latency.bench_talker_precisions` rows (per forward and context, longer hatched).
    """
    panels = [("code-predictor call, one position", call_rows, "backend", "t1_ms", "t1_over_floor")]
    if talker_rows:
        panels.append(("talker step, one position", talker_rows, "forward", "median_ms", "over_floor"))
    fig, axes = plt.subplots(1, len(panels), figsize=(11.0, 4.0), sharey=True, squeeze=False, constrained_layout=True)
    for ax, (name, rows, who, ms_key, ratio_key) in zip(axes[0], panels):
        precs = list(dict.fromkeys(r["precision"] for r in rows))
        groups = list(dict.fromkeys((r[who], r.get("context")) for r in rows))
        contexts = sorted({c for _, c in groups if c is not None})
        width = 0.8 / len(groups)
        for j, (b, ctx) in enumerate(groups):
            for i, prec in enumerate(precs):
                r = next((x for x in rows if (x["precision"], x[who], x.get("context")) == (prec, b, ctx)), None)
                if r is None or r[ratio_key] is None:
                    continue
                x = i + (j - (len(groups) - 1) / 2) * width
                ax.bar(x, r[ratio_key], width * 0.95, color=backend_color(b),
                       hatch="//" if ctx is not None and ctx != contexts[0] else None, edgecolor="white",
                       label=(f"{b}" + (f", context {ctx}" if ctx is not None else "")) if i == 0 else None)
                ax.text(x, r[ratio_key], f"{r[ms_key]:.2g} ms", ha="center", va="bottom", fontsize=6)
        ax.axhline(1.0, color="k", lw=0.8, label="the floor: weights read once")
        ax.set_xticks(range(len(precs)), precs)
        _dress(ax, name, ylabel="median time / weight-streaming floor", grid=dict(axis="y"),
               legend=dict(fontsize=7, loc="upper right"))
    ymax = max(max((r[k] or 0) for r in rows) for _, rows, _, _, k in panels)
    axes[0][0].set_ylim(0, 1.4 * max(ymax, 1.0))  # room for the legend above the bars
    return _titled(fig, title)


def plot_batches(rows: Sequence[dict], *, title: str = ""):
    """:func:`bench.frames.batch_throughput` rows: left, frames per second against the batch size B (a
    line per runner: colour its decoder family, line style its backend, hollow markers fused); right, the speedup
    over stepped AR of the same backend and B (below the line at 1, speculation loses).
    """
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11.0, 4.0), constrained_layout=True)
    for (dec, b, fused), rs in _by(rows, lambda r: (r["decoder"], r["backend"], bool(r["fused"])),
                                   lambda r: r["batch"]).items():
        color = decoder_color(rs[0])
        style = dict(color=color, ls=BACKEND_STYLES.get(b, "-"), marker="o", ms=4,
                     mfc="white" if fused else color, label=runner_label(rs[0]))
        bs = [r["batch"] for r in rs]
        a0.plot(bs, [r["frames_per_s"] for r in rs], **style)
        if rs[0]["kind"] != "ar" and all(r["speedup_vs_ar"] for r in rs):
            a1.plot(bs, [r["speedup_vs_ar"] for r in rs], **style)
    batches = [r["batch"] for r in rows]
    _log_y(a0)
    a1.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8)
    for ax, name, ylabel in ((a0, "throughput", "frames per second (inner loop)"),
                             (a1, "what speculation adds as the batch grows",
                              "speedup over stepped AR, same backend and B")):
        _log2_ticks(ax, batches)
        _dress(ax, name, "frames decoded together, B", ylabel, grid={}, legend=dict(fontsize=6))
    return _titled(fig, title)


def plot_auto(table: Sequence[dict], *, chosen: tuple | None = None, title: str = ""):
    """What ``--decoder auto`` timed (:attr:`rvqspec_lib.eval.budget.AutoChoice.table`): a bar per runner it decoded,
    its measured milliseconds per committed code, fastest at the top, coloured by decoder family, hatched when fused;
    ``chosen`` = ``(decoder label, backend, fused)`` outlined in black.
    """
    timed = sorted((r for r in table if r.get("ms_per_code")), key=lambda r: -r["ms_per_code"])
    fig, ax = plt.subplots(figsize=(8.0, 4.5), constrained_layout=True)
    picks = [chosen is not None and (r["decoder"], r["backend"], bool(r["fused"])) == tuple(chosen) for r in timed]
    for y, (r, pick) in enumerate(zip(timed, picks)):
        ax.barh(y, r["ms_per_code"], color=decoder_color(r), hatch="//" if r["fused"] else None,
                edgecolor="k" if pick else "white", lw=1.8 if pick else 0.5)
    ax.set_yticks(range(len(timed)), [runner_label(r) + ("  <- chosen" if pick else "")
                                      for r, pick in zip(timed, picks)], fontsize=7)
    _dress(ax, title, "measured ms per committed code (median frame / 15 codes)", grid=dict(axis="x"))
    return fig


#: The rows of the table to act on (:data:`bench.table.ROWS`) as bars: (hatched, edge).
_TABLE_BARS = {"stepped AR": (None, "white"), "fused AR": ("//", "white"), "best speculative": (None, "white"),
               "fused speculative": ("//", "white"), "auto": (None, "k")}


def plot_bench_table(result: dict, *, title: str = ""):
    """:func:`bench.table.bench_table`: a panel per model (a timing replay's title says so), a group
    per (precision, backend), a bar per row (colour the decoder family, fused hatched, auto outlined; absent rows
    marked), ms per frame on a log scale, the AR floor a black tick, 80 ms dotted.
    """
    rows = result["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(11.0, 3.6 * len(models)), squeeze=False, constrained_layout=True)
    names = list(_TABLE_BARS)
    for ax, m in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == m]
        groups = list(dict.fromkeys((r["precision"], r["backend"]) for r in mine))
        width = 0.8 / len(names)
        for g, key in enumerate(groups):
            for j, name in enumerate(names):
                r = next((x for x in mine if (x["precision"], x["backend"], x["row"]) == (*key, name)), None)
                x = g + (j - (len(names) - 1) / 2) * width
                if r is None or not r["ms_per_frame"]:
                    ax.text(x, 0.02, "absent", rotation=90, ha="center", va="bottom", fontsize=6, color="0.4",
                            transform=ax.get_xaxis_transform())
                    continue
                hatch, edge = _TABLE_BARS[name]
                color = decoder_color(r) if r.get("kind") else DECODER_COLORS["ar"]
                ax.bar(x, r["ms_per_frame"], width * 0.95, color=color, hatch=hatch, edgecolor=edge,
                       lw=1.2 if edge == "k" else 0.3)
                ax.text(x, r["ms_per_frame"], f"{r['ms_per_frame']:.3g}", ha="center", va="bottom", fontsize=5.5)
            floor = next((x["floor_ar_ms"] for x in mine if (x["precision"], x["backend"]) == key), None)
            if floor:
                ax.plot([g - 0.45, g + 0.45], [floor, floor], color="k", lw=2)
        ax.axhline(80.0, color="0.4", ls=":", lw=1)
        _log_y(ax)
        ax.set_xticks(range(len(groups)), [f"{p}\n{b}" for p, b in groups], fontsize=7)
        weights = mine[0]["weights"]
        _dress(ax, m + (" (trained weights)" if weights == "trained" else f" ({weights})"),
               ylabel="ms per frame (median)", size=8, grid=dict(axis="y"))
    handles = [Patch(facecolor=DECODER_COLORS["ar"], label="stepped AR"),
               Patch(facecolor=DECODER_COLORS["ar"], hatch="//", edgecolor="white", label="fused AR"),
               Patch(facecolor="0.85", label="best speculative (colour: its family)"),
               Patch(facecolor="0.85", hatch="//", edgecolor="white", label="fused speculative"),
               Patch(facecolor="0.85", edgecolor="k", label="auto's choice"),
               Line2D([], [], color="k", lw=2, label="floor of the AR frame (15 calls' weights)"),
               Line2D([], [], color="0.4", ls=":", label="80 ms: one frame of audio (inner loop only)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=7)
    return _titled(fig, title)
