"""Figures drawn from result dicts (the notebooks call these; no measurement happens here).

* :func:`plot_verify_cost` -- latency of a code-predictor call against its number of query positions ``Q``, and the
  verify cost curve ``t(Q) / t(1)``, from a :func:`rvqspec_lib.eval.bench.bench_model` result.
"""

from __future__ import annotations


def bench_title(result: dict) -> str:
    """One-line figure title: model, whether weights are random, device, dtype and thread count."""
    m = result["model"]
    rnd = " (random weights: timing only)" if result.get("random_weights") else ""
    return (f"{m['name']}{rnd}\n{result['device']} {result['device_name']}, {result['dtype']}, "
            f"{result['threads']} thread{'s' if result['threads'] != 1 else ''}, torch {result['torch']}")


def plot_verify_cost(result: dict, *, figsize: tuple[float, float] = (9.0, 3.6)):
    """Two panels from a :func:`rvqspec_lib.eval.bench.bench_model` result.

    Left: median ms per code-predictor call against ``Q`` (log2 axis) with the p10-p90 band, and the talker step as a
    dashed line. Right: ``t(Q) / t(1)`` with the line ``y = Q`` (no parallelism at all) for reference.

    Returns:
        the matplotlib ``Figure`` (not shown, not closed; save it with :func:`rvqspec_lib.common.provenance.save_figure`).

    Raises:
        KeyError: ``result`` is not a bench result.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = sorted(result["code_predictor"], key=lambda r: r["n_queries"])
    q = [r["n_queries"] for r in rows]
    med = [r["median_ms"] for r in rows]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, constrained_layout=True)

    ax0.plot(q, med, "o-", color="C0", label=f"code predictor, KV prefix {result['prefix_len']}")
    ax0.fill_between(q, [r["p10_ms"] for r in rows], [r["p90_ms"] for r in rows], color="C0", alpha=0.2,
                     label="p10-p90")
    t = result["talker_step"]
    ax0.axhline(t["median_ms"], color="C3", ls="--", label=f"talker step, KV prefix {result['talker_context']}")
    ax0.set_xscale("log", base=2)
    ax0.set_xticks(q, [str(v) for v in q])
    ax0.set_xlabel("query positions per call, Q")
    ax0.set_ylabel("median latency per call (ms)")
    ax0.set_ylim(0, 1.25 * max(max(r["p90_ms"] for r in rows), t["median_ms"]))  # room for the legend
    ax0.legend(fontsize=8, loc="upper left")
    ax0.grid(alpha=0.3)

    if all(r.get("ratio_to_1") is not None for r in rows):
        ax1.plot(q, [r["ratio_to_1"] for r in rows], "o-", color="C0", label="measured t(Q) / t(1)")
        ax1.plot(q, q, ":", color="gray", label="y = Q (no parallelism)")
        ax1.axhline(1.0, color="k", lw=0.8)
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log", base=2)
        ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax1.set_xticks(q, [str(v) for v in q])
        ax1.set_xlabel("query positions per call, Q")
        ax1.set_ylabel("cost relative to one AR call")
        ax1.legend(fontsize=8, loc="upper left")
        ax1.grid(alpha=0.3, which="both")
    else:
        ax1.set_axis_off()
        ax1.text(0.5, 0.5, "no Q = 1 measurement", ha="center", va="center")
    fig.suptitle(bench_title(result), fontsize=9)
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
