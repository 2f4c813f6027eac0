"""The figures of notebook 04 (paper.plots): drawn from result rows, one colour scale where panels are
compared, one colour per decoder family and per backend, integer ticks on node budgets."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from paper import plots  # noqa: E402


def _calibration(n_codes: int = 4, k: int = 3, c: int = 3) -> dict:
    """A calibration-shaped dict: point-mass entries small, sampled ones large (as on the embedded model)."""
    def by_start(scale):
        return [[[None if s + t > n_codes else scale / (1 + i + t) for i in range(c)] for t in range(1, k + 1)]
                for s in range(1, n_codes)]

    def pooled(scale):
        return [[scale / (1 + i + t) for i in range(c)] for t in range(1, k + 1)]

    out = {"budgets": [2, 3, 4], "n_codes": n_codes}
    for kind, scale, order in (("point-mass", 0.2, [[0], [1], [0, 0]]), ("sampled", 0.9, [[0], [0, 0], [1]])):
        out[kind] = {"by_start_depth": by_start(scale), "table": pooled(scale), "order": order,
                     "predicted_tokens_per_call": {"2": 1.1, "3": 1.2, "4": 1.3}}
    return out


def test_acceptance_heatmaps_share_one_colour_scale():
    fig = plots.plot_acceptance_heatmaps(_calibration(), max_index=3, title="t")
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 4
    norms = {(im.norm.vmin, im.norm.vmax) for im in images}
    assert len(norms) == 1 and norms.pop() == (0.0, pytest.approx(0.9 / 2))  # the largest entry of all four: sampled
    assert len(fig.axes) == 5  # four panels and ONE colour bar
    plt.close(fig)


def test_calibrated_trees_are_drawn_per_kind_and_budget():
    fig = plots.plot_calibrated_trees(_calibration(), [2, 4])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["point-mass, N = 2: E(N) = 1.10", "point-mass, N = 4: E(N) = 1.30",
                      "sampled, N = 2: E(N) = 1.10", "sampled, N = 4: E(N) = 1.30"]
    plt.close(fig)


def _pvm(decoder, kind, drafter, nodes, sampled, pred, meas):
    return {"decoder": decoder, "kind": kind, "drafter": drafter, "nodes": nodes, "sampled": sampled, "lossy": False,
            "predicted_tokens_per_call": pred, "measured_tokens_per_call": meas}


def test_tokens_per_call_panels_share_y_and_use_the_family_colours():
    rows = [_pvm("tree:calibrated-point-mass:2", "calibrated", "heads", 2, False, 1.1, 1.05),
            _pvm("tree:calibrated-point-mass:4", "calibrated", "heads", 4, False, 1.2, 1.15),
            _pvm("paper:4", "paper", "offsets", 4, False, 1.2, 1.16),
            _pvm("tree:calibrated-sampled:4", "calibrated", "heads", 4, True, 2.5, 2.45),
            _pvm("chain:4", "chain", "heads", 4, True, None, 2.4)]
    fig = plots.plot_tokens_per_call_vs_n(rows)
    a0, a1 = fig.axes[:2]
    assert a0.get_ylim() == a1.get_ylim()
    colors = {ln.get_label(): ln.get_color() for ax in (a0, a1) for ln in ax.get_lines()}
    assert colors["reused heads: measured"] in (plots.DECODER_COLORS["tree-point-mass"],
                                                plots.DECODER_COLORS["tree-sampled"])
    assert colors["the paper's decoder (offsets): measured"] == plots.DECODER_COLORS["paper"]
    assert colors["chain, reused heads: measured"] == plots.DECODER_COLORS["chain"]
    assert [t.get_text() for t in a0.get_xticklabels()] == ["2", "4"]  # integer ticks on an integer axis
    plt.close(fig)


def _frame(decoder, kind, nodes, backend, fused, ms, sampled=None, drafter="heads"):
    return {"decoder": decoder, "kind": kind, "drafter": None if kind == "ar" else drafter, "nodes": nodes,
            "lossy": False, "sampled": sampled, "backend": backend, "fused": fused, "precision": "float32",
            "ms_per_frame": ms, "speedup_vs_ar": None}


def test_figure_4_draws_every_ar_as_a_baseline():
    from rvqspec_lib.eval.speed import _speedups

    rows = [_frame("ar", "ar", 1, "official", False, 50.0), _frame("ar", "ar", 1, "native", False, 12.0),
            _frame("ar", "ar", 1, "native", True, 6.0),
            _frame("tree:calibrated-sampled:4", "calibrated", 4, "official", False, 35.0, True),
            _frame("tree:calibrated-sampled:4", "calibrated", 4, "native", False, 13.0, True),
            _frame("paper:4", "paper", 4, "native", False, 20.0, False, "offsets"),
            _frame("chain:4", "chain", 4, "native", True, 5.5, True)]
    _speedups(rows)
    fig = plots.plot_frames_vs_n(rows, title="t")
    top, bottoms = fig.axes[:2], fig.axes[2:4]
    for ax in bottoms:  # a horizontal line per AR row of the run, in every backend's panel
        ar_lines = [ln for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1 and len(ln.get_xdata()) == 2]
        assert sorted(ln.get_ydata()[0] for ln in ar_lines) == [6.0, 12.0, 50.0]
    assert bottoms[0].get_ylim() == bottoms[1].get_ylim() and top[0].get_ylim() == top[1].get_ylim()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "AR (native, fused): the fastest AR" in labels
    assert any(lab.endswith("(quoted)") and "paper" in lab for lab in labels)
    plt.close(fig)


def test_verify_cost_projection_is_labelled_and_sampling_in_words():
    from rvqspec_lib.decoding.sampling import Sampling

    cost = [{"backend": b, "query_positions": q, "median_ms": 1.0 * q, "ratio_to_q1": r}
            for b in ("official", "native") for q, r in ((1, 1.0), (2, 1.2), (4, 1.9))]
    proj = [{"kind": "sampled", "backend": "native", "nodes": 2, "projected_speedup": 1.4},
            {"kind": "sampled", "backend": "native", "nodes": 4, "projected_speedup": 1.3}]
    fig = plots.plot_verify_cost_curves({"a": cost, "b": cost}, projection=proj, projection_title="inputs")
    assert fig.axes[2].get_title().startswith("PROJECTION, not a measurement\ninputs")
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
    assert {ln.get_color() for ln in fig.axes[0].get_lines() if ln.get_label().startswith("native")} == \
        {plots.BACKEND_COLORS["native"]}
    plt.close(fig)
    assert plots.sampling_words(Sampling(temperature=0.9, top_k=50)) == "temperature 0.9, top-k 50"
    assert plots.sampling_words(Sampling(greedy=True)) == "greedy"


def test_the_device_appendix_figures_draw_from_rows():
    from bench.table import ROWS

    calls = [{"precision": p, "backend": b, "t1_ms": 2.0, "t1_over_floor": r}
             for p, b, r in (("float32", "official", 1.9), ("float32", "native", 0.96), ("int8", "native", 1.1))]
    talk = [{"precision": "float32", "forward": f, "context": c, "median_ms": 50.0, "over_floor": r}
            for f, c, r in (("official", 64, 2.0), ("native", 64, 1.05), ("native", 512, 1.2))]
    fig = plots.plot_floor(calls, talk)
    a0, a1 = fig.axes
    assert a0.get_ylim() == a1.get_ylim()  # one scale: multiples of each call's own floor
    assert {round(b.get_height(), 2) for b in a0.patches} == {1.9, 0.96, 1.1}
    plt.close(fig)
    rows = [{"decoder": d, "kind": k, "drafter": None if k == "ar" else "heads", "sampled": k == "chain",
             "backend": "native", "fused": f, "precision": "float32", "batch": b, "frames_per_s": 100.0 * b / s,
             "speedup_vs_ar": s0 / s} for d, k, f in (("ar", "ar", False), ("chain:4", "chain", False))
            for b, s, s0 in ((1, 1.0, 1.0), (4, 2.0, 2.0))]
    fig = plots.plot_batches(rows)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "4"]
    plt.close(fig)
    table = [{"decoder": "ar", "kind": "ar", "drafter": None, "sampled": None, "backend": "native", "fused": True,
              "ms_per_code": 0.4}, {"decoder": "chain:4", "kind": "chain", "drafter": "heads", "sampled": True,
                                    "backend": "native", "fused": False, "ms_per_code": 0.8},
             {"decoder": "chain:5", "kind": "chain", "drafter": "heads", "sampled": True, "backend": "official",
              "fused": False, "ms_per_code": None}]  # not decoded: no bar
    fig = plots.plot_auto(table, chosen=("ar", "native", True))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["chain:4 (native)", "ar (native, fused)  <- chosen"]
    plt.close(fig)
    bench = {"rows": [{"model": "m", "weights": "trained", "precision": "float32", "backend": "native", "row": r,
                       "decoder": None if r == "fused speculative" else "ar", "kind": None if r == "fused speculative"
                       else "ar", "drafter": None, "sampled": None, "fused": r.startswith("fused"),
                       "ms_per_frame": None if r == "fused speculative" else 10.0, "floor_ar_ms": 5.0} for r in ROWS]}
    fig = plots.plot_bench_table(bench)
    ax = fig.axes[0]
    assert len([p for p in ax.patches if p.get_height() == 10.0]) == len(ROWS) - 1  # the absent row leaves a gap
    assert any(t.get_text() == "absent" for t in ax.texts)
    plt.close(fig)
