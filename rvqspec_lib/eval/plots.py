"""Figures drawn from result dicts (the notebooks call these; no measurement happens here).

* :func:`plot_verify_cost` -- latency of a code-predictor call against its number of query positions ``Q``, and the
  verify cost curve ``t(Q) / t(1)``, from a :func:`rvqspec_lib.eval.latency.bench_model` result.
* :func:`plot_two_loops`, :func:`plot_tree_and_mask`, :func:`plot_acceptance_by_offset` -- the paper's Figures 1-3
  here: the two loops with call counts from the configs, a calibrated tree beside the attention mask its verify call
  passed to the model, and acceptance by draft offset for the reused heads vs the offsets.
* :func:`plot_round`, :func:`plot_tree_ids`, :func:`plot_ancestor_mask` -- the lossless rule by hand (notebook 02
  the_lossless_rule): one speculative round as draft, verify, accept, commit panels; a draft tree with its node ids;
  its ancestor matrix as the verify call's attention mask. :data:`RULE_COLORS`: one colour for p, q, residual.
* :func:`oversubscribed_note` -- the label a timing figure or table carries when the CPU was oversubscribed.
* :func:`plot_spectrograms` -- log-mel spectrograms on one colour scale (notebook 00: the codec with k codebooks).
* :func:`plot_speedup_vs_n` -- the paper's Figure 4 here: speedup over AR by node budget N, measured, projected and
  the paper's device numbers (:data:`PAPER_DEVICE_SPEEDUPS`, quoted) in three panels apart.
* :func:`plot_frame_parts`, :func:`plot_audio_vs_wall` -- the whole frame (notebook 06): the parts of a frame against
  their floors and the real-time budget (the paper's Figure 1 tested), and audio produced against wall time.
"""

from __future__ import annotations

from typing import Sequence

from rvqspec_lib.decoding.decoder_names import parse_decoder_name
from rvqspec_lib.eval.timing import oversubscribed_note

#: The paper's reported speedups of RVQ token generation on devices (Core ML), by node budget N. Quoted, not measured
#: here: tables put them in their own labelled column, figures label them as the paper's.
PAPER_DEVICE_SPEEDUPS = (
    {"device": "M3 Pro (paper, Core ML)", "nodes": 32, "speedup": 2.13},
    {"device": "iPhone 17 Pro Max (paper, Core ML)", "nodes": 32, "speedup": 2.34},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 16, "speedup": 1.82},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 64, "speedup": 1.21},
)


#: THE colour of each family of decoders in every figure of the companion (one place: figures of different notebooks
#: compare by colour). Keys: the decoder's ``kind`` (:meth:`~rvqspec_lib.decoding.decoder_names.DecoderName.fields`),
#: with ``tree`` split by its children (``tree-point-mass``, ``tree-sampled``) and the drafters apart (``paper`` and
#: ``offsets`` trees: the paper's drafter; ``medusa``); ``null-control`` is AR under other seeds; ``heads``: the
#: reused heads as a drafter, in figures that compare drafters rather than decoders.
DECODER_COLORS = {"ar": "#4d4d4d", "null-control": "#a6a6a6", "chain": "#1f77b4", "tree-point-mass": "#ff7f0e",
                  "tree-sampled": "#2ca02c", "paper": "#9467bd", "offsets": "#9467bd", "medusa": "#8c564b",
                  "ssd-lossy": "#d62728", "heads": "#17becf"}
#: Marker and line style of a trained drafter by its loss (the label's suffix: ``offsets-tv``), so that drafters of
#: one family (one colour) stay apart; no suffix is cross-entropy, the paper's loss (``medusa``, Medusa-1's).
LOSS_STYLES = {"ce": dict(marker="s", ls="-"), "kl": dict(marker="^", ls="--"), "tv": dict(marker="v", ls=":")}


def decoder_color(fields) -> str:
    """THE colour of a decoder (:data:`DECODER_COLORS`), from its row's fields (``kind``, ``drafter``, ``decoder``)
    or its label (a :class:`~rvqspec_lib.decoding.decoder_names.DecoderName` is parsed from it, never a regex): the
    same decoder has the same colour in every figure. A drafter's trained variants share its colour (``offsets-tv``
    is an offsets drafter); ``{"drafter": "heads"}`` without a ``kind`` is the reused heads as a drafter."""
    if isinstance(fields, str):
        if fields == "ar-seed2":
            return DECODER_COLORS["null-control"]
        fields = parse_decoder_name(fields).fields()
    kind, drafter = fields.get("kind"), fields.get("drafter")
    family = str(drafter).split("-", 1)[0] if drafter else None  # offsets-tv, a trained variant: the offsets' colour
    if fields.get("decoder") == "ar-seed2":
        return DECODER_COLORS["null-control"]
    if kind in ("paper",) or family == "offsets":
        return DECODER_COLORS["paper"]
    if family == "medusa":
        return DECODER_COLORS["medusa"]
    if kind is None and family == "heads":  # a drafter's row, no decoder: the reused heads
        return DECODER_COLORS["heads"]
    if kind in ("tree", "calibrated"):
        return DECODER_COLORS["tree-sampled" if fields.get("sampled") else "tree-point-mass"]
    return DECODER_COLORS.get(kind, "#17becf")


def drafter_style(label: str) -> dict:
    """Line keywords of a drafter in figures that compare drafters: the colour of its family (:func:`decoder_color`)
    and the marker and line style of its loss (:data:`LOSS_STYLES`); the reused heads drawn thick, as the baseline.

    Args:
        label: ``heads``, ``offsets-ce``, ``medusa``, ``medusa-tv`` ...
    Returns:
        ``{"color", "marker", "ls", "lw"}`` for ``Axes.plot``.
    """
    color = decoder_color({"drafter": label})
    if label == "heads":
        return dict(color=color, marker="o", ls="-", lw=2.6)
    loss = str(label).partition("-")[2] or "ce"
    return dict(color=color, lw=1.4, **LOSS_STYLES.get(loss, dict(marker="D", ls="-.")))


def sampling_words(sampling) -> str:
    """The deployed sampling in words for a title: ``"T 0.9, top-k 50"`` (``top-p`` when below 1; ``"greedy"``), from a
    :class:`~rvqspec_lib.decoding.sampling.Sampling` or its ``describe()`` dict."""
    d = sampling.describe() if hasattr(sampling, "describe") else dict(sampling)
    if d.get("greedy"):
        return "greedy"
    words = [f"T {d['temperature']:g}"]
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
    """Two panels from a :func:`rvqspec_lib.eval.latency.bench_model` result, one colour per forward
    (:data:`FORWARD_COLORS`; the native pair too when the result has one).

    Left: median ms per code-predictor call against ``Q`` (log2 axis) with the p10-p90 band, and the talker step as a
    dashed line of the same colour. Right: ``t(Q) / t(1)`` with the line ``y = Q`` (no parallelism at all) for
    reference.

    Returns:
        the matplotlib ``Figure`` (not shown, not closed; save it with
        :func:`rvqspec_lib.common.provenance.save_figure`).

    Raises:
        KeyError: ``result`` is not a bench result.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

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
            ax1.plot(q, [r["ratio_to_1"] for r in rows], "o-", color=color, label=f"measured t(Q) / t(1), {name}")
        else:
            ratios_ok = False
    ax0.set_xscale("log", base=2)
    ax0.set_xticks(q, [str(v) for v in q])
    ax0.minorticks_off()
    ax0.set_xlabel("query positions per call, Q")
    ax0.set_ylabel("median latency per call (ms)")
    ax0.set_ylim(0, 1.35 * top)  # room for the legend
    ax0.legend(fontsize=7, loc="upper left")
    ax0.grid(alpha=0.3)
    ax0.set_title("one call: its latency (band: p10 to p90)", fontsize=9)
    if ratios_ok:
        ax1.plot(q, q, ":", color="gray", label="y = Q (no parallelism)")
        ax1.axhline(1.0, color="k", lw=0.8)
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log", base=2)
        ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax1.set_xticks(q, [str(v) for v in q])
        ax1.minorticks_off()
        ax1.set_xlabel("query positions per call, Q")
        ax1.set_ylabel("cost relative to one AR call")
        ax1.legend(fontsize=7, loc="upper left")
        ax1.grid(alpha=0.3, which="both")
        ax1.set_title("the verify cost curve t(Q) / t(1)", fontsize=9)
    else:
        ax1.set_axis_off()
        ax1.text(0.5, 0.5, "no Q = 1 measurement", ha="center", va="center")
    fig.suptitle(bench_title(result), fontsize=9)
    return fig


def plot_spectrograms(panels, *, hop_s: float, title: str = "", db_range: float = 80.0,
                      figsize: tuple[float, float] | None = None):
    """Log-mel spectrograms stacked on one time axis and ONE colour scale (the loudest panel's top and ``db_range``
    dB below it), so that panels compare by colour; one colour bar.

    Args:
        panels: ``(label, db, distance_db)`` per panel: ``db`` a ``(n_mels, frames)`` array in dB (e.g.
            :meth:`rvqspec_lib.models.rvq_codec.RVQCodec.log_mel_db`), ``distance_db`` a log-spectral distance to
            the first panel written beside the label (``None``: none).
        hop_s: seconds per spectrogram column. title: the figure title. db_range: dB shown below the top.
        figsize: default 8 inches wide, a little over an inch per panel.

    Returns:
        the matplotlib ``Figure`` (save it with :func:`rvqspec_lib.common.provenance.save_figure`).
    """
    import matplotlib.pyplot as plt

    panels = list(panels)
    vmax = max(float(db.max()) for _, db, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, sharex=True, constrained_layout=True,
                             figsize=figsize or (8.0, 1.15 * len(panels) + 0.9), squeeze=False)
    for ax, (label, db, dist) in zip(axes[:, 0], panels):
        im = ax.imshow(db, origin="lower", aspect="auto", cmap="magma", vmin=vmax - db_range, vmax=vmax,
                       extent=(0, db.shape[1] * hop_s, 0, db.shape[0]))
        ax.set_title(label + ("" if dist is None else f"  (log-spectral distance {dist:.1f} dB)"), fontsize=8,
                     loc="left")
        ax.set_ylabel("mel band", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("time (s)")
    fig.colorbar(im, ax=axes[:, 0], label="mel power (dB)", shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_tree(ax, paths, *, title: str = "", sampled: bool = False) -> None:
    """Draw a draft tree on ``ax``: the root at the left, one column per draft offset, each node labelled with its
    rank (point-mass) or child index (sampled), edges from parent to child.

    Args:
        ax: a matplotlib axes. paths: the tree's rank paths (e.g. ``Tree.paths``). title: axes title.
        sampled: label children ``#i`` (sampled child index) instead of ``r`` (rank).
    """
    paths = [tuple(p) for p in paths]
    by_depth: dict[int, list[tuple[int, ...]]] = {}
    for p in sorted(paths):
        by_depth.setdefault(len(p), []).append(p)
    pos = {(): (0.0, 0.0)}
    for d in sorted(by_depth):
        nodes = by_depth[d]
        for i, p in enumerate(nodes):
            pos[p] = (float(d), (len(nodes) - 1) / 2.0 - i)
    for p in paths:
        (x0, y0), (x1, y1) = pos[p[:-1]], pos[p]
        ax.plot([x0, x1], [y0, y1], color="0.6", lw=0.8, zorder=1)
    for p, (x, y) in pos.items():
        label = "root" if not p else (f"#{p[-1]}" if sampled else str(p[-1]))
        ax.scatter([x], [y], s=60 if p else 90, color="C3" if not p else ("C0" if p[-1] == 0 else "C1"), zorder=2)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("draft offset")
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def plot_two_loops(rows, *, title: str = "", figsize: tuple[float, float] = (11.0, 3.8)):
    """The paper's Figure 1, from the configs: the two nested loops and how many calls each makes per second.

    Left: one frame of the first row's model as a sequence of calls (1 talker call emitting code 0, then the code
    predictor's ``n_code_groups - 1`` sequential calls: a 2-position prefill for code 1 and one call per further
    code; its KV cache restarts every frame). Right: calls per second for real time, per model, talker and code
    predictor stacked (``frame_rate_hz`` and ``frame_rate_hz * (n_code_groups - 1)``).

    Args:
        rows: dicts with ``model``, ``talker_layers``, ``code_predictor_layers``, ``n_code_groups``,
            ``frame_rate_hz`` (e.g. :func:`rvqspec_lib.models.configs.loop_facts` plus a ``model`` name).
        title: the figure title.

    Returns:
        the matplotlib ``Figure`` (save it with :func:`rvqspec_lib.common.provenance.save_figure`).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

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
    ax1.set_ylabel("model calls per second for real time")
    ax1.set_ylim(0, 1.4 * max(t + c for t, c in zip(talker, inner)))
    ax1.tick_params(axis="x", labelsize=7, labelrotation=20)
    ax1.legend(fontsize=7, loc="upper right")
    ax1.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_tree_and_mask(paths, call: dict, *, title: str = "", sampled: bool = False,
                       figsize: tuple[float, float] = (12.0, 6.5)):
    """The paper's Figure 2: a draft tree beside the attention mask of its verify call.

    Args:
        paths: the tree's rank paths (``Tree.paths``), drawn with :func:`plot_tree`.
        call: one verify call as recorded by :func:`rvqspec_lib.eval.verify_calls.record_verify_calls`:
            ``allow`` ``(Q, S)`` bool, ``positions`` ``(Q,)``, ``write_slots`` ``(Q,)``. The mask is drawn exactly as
            the decode loop passed it to the model: rows are the call's query positions (the root first, then the
            nodes in tree order), columns the KV slots (committed codes of the frame, then the call's own slots).
        title: figure title. sampled: label the tree's children as sampled child indices.

    Returns:
        the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    allow = np.asarray(call["allow"], dtype=bool)
    write = [int(v) for v in call["write_slots"]]
    pos = [int(v) for v in call["positions"]]
    used = max(write) + 1  # slots past the call's own are never read: not drawn
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.0, 1.3]},
                                   constrained_layout=True)
    plot_tree(ax0, paths, title=f"draft tree: {len(paths)} nodes + root (N = {len(paths) + 1})", sampled=sampled)
    ax1.imshow(allow[:, :used], cmap="Blues", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
    ax1.axvline(write[0] - 0.5, color="C3", lw=1.0)
    ax1.set_xticks(range(used), [("c" if j < write[0] else "n") + str(j) for j in range(used)], fontsize=5,
                   rotation=90)
    ax1.set_yticks(range(len(pos)), [f"{'root' if i == 0 else 'node ' + str(i)} (pos {p})"
                                     for i, p in enumerate(pos)], fontsize=5)
    ax1.set_xlabel(f"KV slot (c: {write[0]} committed before this call | n: this call's query positions)")
    ax1.set_title("attention mask of the verify call (blue: may attend), as passed to the model", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_acceptance_by_offset(rows, *, max_offset: int, drafters, title: str = "",
                              figsize: tuple[float, float] = (10.0, 3.8)):
    """The paper's Figure 3 here: acceptance by draft offset for the reused heads and the offsets drafters.

    Args:
        rows: one dict per offset with ``offset_j`` and one acceptance column per drafter (the
            ``03_acceptance_by_offset`` table). max_offset: ``K``, the offsets the drafters were trained for (past it
            every drafter uses the reused head; shaded). drafters: the columns drawn, ``"heads"`` first.
        title: figure title.

    Returns:
        the matplotlib ``Figure``: left, acceptance against offset; right, each drafter minus the reused heads.

    Raises:
        KeyError: a drafter column is missing from ``rows``.
    """
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["offset_j"])
    j = [int(r["offset_j"]) for r in rows]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, constrained_layout=True)
    for lab in drafters:
        acc = [float(r[lab]) for r in rows]
        style = drafter_style(lab)
        ax0.plot(j, acc, ms=4, mfc="none", label=lab, **style)
        if lab != "heads":
            ax1.plot(j, [a - float(r["heads"]) for a, r in zip(acc, rows)], ms=4, mfc="none", label=lab, **style)
    for ax in (ax0, ax1):
        ax.axvspan(max_offset + 0.5, max(j) + 0.5, color="0.9", zorder=0)
        ax.set_xlabel("draft offset j (depth drafted = start depth + j)")
        ax.set_xticks(j)
        ax.grid(alpha=0.3)
    ax0.set_ylabel("exact acceptance of a sampled draft")
    ax0.set_title(f"acceptance by offset (shaded: past K = {max_offset}, reused head for all)", fontsize=9)
    ax1.axhline(0.0, color="k", lw=0.8)
    ax1.set_ylabel("minus the reused heads' acceptance")
    ax1.set_title("the offsets' gain over the reused heads", fontsize=9)
    ax0.legend(fontsize=7)
    ax1.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


# ---- the lossless rule by hand (notebooks/02_the_lossless_rule.py) -------------------------------------------------
#: One colour per quantity in every figure of the rule: target p, draft q, residual, the mass a draft keeps, a lossy
#: rule's output.
RULE_COLORS = {"p": "C0", "q": "C1", "residual": "C2", "accepted": "C4", "lossy": "C3"}
_KEPT, _REJECTED, _UNTRIED, _DRAWN = "#cdebd0", "#f6cfd2", "#eeeeee", "#d6e6f5"


def _box(ax, x: float, y: float, text: str, face: str, *, fontsize: float = 8.0) -> None:
    ax.text(x, y, text, ha="left", va="center", fontsize=fontsize, family="monospace",
            bbox={"boxstyle": "round,pad=0.35", "facecolor": face, "edgecolor": "0.55", "linewidth": 0.6})


def plot_round(axes, trace: dict, *, title: str = "") -> None:
    """One speculative round as four panels, left to right: draft, verify, accept walk, commit.

    Args:
        axes: four matplotlib axes (one row of a figure).
        trace: a :func:`rvqspec_lib.eval.toy_round.trace_round` result (nodes, steps, committed).
        title: written above the first panel (e.g. which decoder).

    Colours: green, a node kept by the walk; red, a node tried and rejected; grey, a node never tried; blue, the code
    drawn after the walk (residual or bonus).
    """
    nodes, steps, committed = trace["nodes"], trace["steps"], trace["committed"]
    sampled = trace["sampled"]
    tries = [s for s in steps if "accepted" in s]
    kept = {s["node"] for s in tries if s["accepted"]}
    rejected = {s["node"] for s in tries if not s["accepted"]}
    n_rows = max(len(nodes), len(steps), len(committed)) + 1

    def y(i: int) -> float:
        return n_rows - 1 - i

    heads = ["1. draft", "2. verify (one call)", "3. accept walk", "4. commit"]
    for ax, head in zip(axes, heads):
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
    """A :class:`~rvqspec_lib.decoding.trees.DraftTree` with its node ids: the root (node 0) at the left, one column
    per draft offset, each node labelled with its id inside and its rank (and code, when ``codes`` is given) beside.

    Args:
        ax: a matplotlib axes. tree: the compiled tree. codes: optional ``(M+1,)`` codes of the nodes. title: title.
    """
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
    ax.set_xlabel("draft offset t (depth drafted = last committed depth + t)")
    ax.set_yticks([])
    ys = [yv for _, yv in pos.values()]
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.6)
    ax.set_xlim(-0.4, tree.max_depth + 0.4)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=9)


def plot_ancestor_mask(ax, tree, *, title: str = "") -> None:
    """A tree's ancestor matrix as the attention mask of its verify call: row = the query node being verified,
    column = the node whose slot it may attend to (itself and its ancestors; every node also sees the codes committed
    before the call, not drawn). Same node ids on both axes as :func:`plot_tree_ids`."""
    import numpy as np

    anc = np.asarray(tree.ancestors, dtype=bool)
    m1 = anc.shape[0]
    ax.imshow(anc, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    for i in range(m1):
        for j in range(m1):
            ax.text(j, i, "1" if anc[i, j] else "0", ha="center", va="center", fontsize=8,
                    color="w" if anc[i, j] else "0.6")
    ticks = list(range(m1))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("node whose slot may be attended to (column)")
    ax.set_ylabel("query node being verified (row)")
    ax.set_title(title, fontsize=9)
def plot_speedup_vs_n(measured: Sequence[dict], projected: Sequence[dict] = (), *, fused: Sequence[dict] = (),
                      paper: Sequence[dict] = PAPER_DEVICE_SPEEDUPS, measured_title: str = "measured here",
                      projected_title: str = "PROJECTION", title: str = "", figsize=(12.0, 4.2)):
    """The paper's Figure 4 here, three panels side by side on one y axis, so that what was measured, what is
    projected and what is quoted never share a panel: speedup over AR of the same backend against the node budget N.

    Args:
        measured: :func:`rvqspec_lib.eval.speed.speedup_vs_n` rows (left: one line per backend and precision; a
            filled marker where the best decoder of that N is a point-mass tree or a chain, an open one where it is a
            sampled tree, as its ``decoder`` label says). measured_title: what and where (model, machine).
        projected: :func:`rvqspec_lib.eval.speed.projected_speedup` rows (middle, dashed; a PROJECTION).
            projected_title: its inputs.
        fused: :func:`rvqspec_lib.eval.speed.summary_by_backend` rows (left: the fused AR frame's speedup over AR,
            dotted). paper: the paper's device numbers (right: quoted, Core ML, point-mass trees). title: above all.

    Returns:
        the matplotlib ``Figure`` (not shown, not closed).
    """
    import matplotlib.pyplot as plt  # as every figure here: the library imports matplotlib only to draw

    fig, axes = plt.subplots(1, 3, figsize=figsize, sharey=True)
    colors = {b: f"C{i}" for i, b in enumerate(dict.fromkeys(r["backend"] for r in [*measured, *projected]))}
    ax = axes[0]
    for key in dict.fromkeys((r["backend"], r.get("precision")) for r in measured):
        rs = sorted((r for r in measured if (r["backend"], r.get("precision")) == key), key=lambda r: r["nodes"])
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
    ax.set_title(measured_title, fontsize=8)
    ax.set_ylabel("speedup over AR (same backend)")
    ax = axes[1]
    for b in dict.fromkeys(r["backend"] for r in projected):
        rs = sorted((r for r in projected if r["backend"] == b), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rs], [r["projected_speedup"] for r in rs], "s--", color=colors[b], label=b)
    ax.set_title(projected_title, fontsize=8)
    ax = axes[2]
    for i, p in enumerate(paper):
        ax.plot([p["nodes"]], [p["speedup"]], marker="*^vD"[i % 4], color="k", ls="none", ms=9, label=p["device"])
    ax.set_title("the paper's devices (QUOTED; Core ML, point-mass trees)", fontsize=8)
    for ax in axes:
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("node budget N (query positions of one verify call)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


#: One colour per part of a frame (:func:`plot_frame_parts`).
PART_COLORS = {"talker": "#8c564b", "inner": "#1f77b4", "codec": "#2ca02c"}


def plot_frame_parts(rows: Sequence[dict], *, frame_ms: float = 80.0, title: str = "", figsize=None):
    """The paper's Figure 1 tested: per row of :func:`rvqspec_lib.eval.pipeline.pipeline_table` (model, precision,
    decoder), the milliseconds of a frame spent in the talker step, the inner loop and the codec decoder (a stacked
    bar: the frame on one thread), their floors (a thin stacked bar under it), the frame on all cores (a diamond:
    ``max(talker + inner, codec)``) and the real-time budget of a frame (the vertical line).

    Returns:
        the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    rows = list(rows)
    fig, ax = plt.subplots(figsize=figsize or (9.0, 0.45 * len(rows) + 1.6))
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
    ax.axvline(frame_ms, color="r", ls="--", lw=1, label=f"real time: one frame of audio = {frame_ms:.0f} ms")
    ax.set_yticks(range(len(rows)), [f"{r['model']} {r['precision']} {r['decoder']}" for r in reversed(rows)],
                  fontsize=7)
    ax.set_xlabel("milliseconds per frame (80 ms of audio): one thread, in turn")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_audio_vs_wall(streams: Sequence[dict], *, title: str = "", figsize=(11.0, 4.0)):
    """Audio produced against wall time, one panel per layout (one thread, all cores), one curve per stream of
    :func:`rvqspec_lib.eval.pipeline.time_streams` (its ``chunks``): solid, the seconds of audio ready; thin dashed,
    real time from the first chunk (a player started then: while the solid curve stays above, nothing waits); red
    crosses, underruns (a chunk ready after the player ran out).

    Returns:
        the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    layouts = list(dict.fromkeys(s["layout"] for s in streams))
    fig, axes = plt.subplots(1, max(1, len(layouts)), figsize=figsize, sharey=True, squeeze=False)
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
        ax.set_title(f"{layout}", fontsize=8)
        ax.set_xlabel("wall time since the call (s)")
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("audio ready (s)")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
