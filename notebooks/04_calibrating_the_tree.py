# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — Calibrating the tree, and what it buys on this machine (paper §2.2, Figure 4)
#
# A verify call checks a **tree** of drafts in one masked call; each node attends only to its ancestors. Which tree?
# Every node costs a query position, so the tree should hold the drafts most likely to be accepted, and the number of
# nodes **N** (the *node budget*, root included: the query positions of one call) should be where the device's cost
# of a wider call `t(N)/t(1)` stops paying for the extra accepted codes. The paper calibrates a sparse tree of
# top-ranked drafts offline and chooses N by hand per device (N = 32 on an M3 Pro and an iPhone 17 Pro Max, N = 16 on
# an iPhone 12); automatic choice is its future work.
#
# Two kinds of children are calibrated here (docs/methods.md#sampled-trees):
#
# * **point-mass** (the paper's): the top-ranked codes of the draft q; a child x is accepted with probability p(x),
#   so a node is worth the **target mass** of its rank, `E[p(x_r)]`;
# * **sampled**: children drawn from q **without replacement** and verified by Sequoia's rule, which is exact; one
#   child is the chain rule (`Σ min(p, q)` accepted), extra children recover residual mass.
#
# From the **calibration split** (contexts teacher-forced on real speech, codes re-sampled from p by the inner loop
# itself), the per-(offset, rank) target mass and per-(offset, child) acceptance are tabulated, a greedy builder grows
# the best tree for every N = 2..64, and the predicted tokens per call E(N) is checked against what the decoders do on
# the **evaluation split**. Then every decoder is timed on this machine, interleaved, beside AR and the **fused AR
# frame** (the whole 15-code frame as one compiled call, the strongest non-speculative baseline), and `--decoder
# auto` picks from this device's own measurements.
#
# **Per drafter.** A tree is calibrated FOR the drafter whose ranks it holds. The reused heads are calibrated here;
# the position-aware offsets shipped beside the model (notebook 02) come with their own calibration
# (`<model>/trees/offsets.json`, read with `rvqspec_lib.models.tree_files`), and their point-mass tree is **the
# paper's decoder** (`--decoder paper`, N = 32 by default). E(N) and the timings below are shown for both drafters.
#
# Everything is computed by `rvqspec_lib` (`eval.calibration`, `eval.budget`, `eval.speed`); the notebook calls and
# plots. **Caveat**: the embedded model is a small model trained offline; its acceptance rates are its own, and the
# real-size 0.6B architecture has random weights here (timing only), so its speedups are **projections** from the
# embedded model's acceptance, labelled so.

# %% tags=["parameters"]
model = "embedded"  # the small trained model shipped in data/embedded (its calibration split ships beside it)
seed = 0  # frame order, decode generators, Monte Carlo draws
smoke = False  # True: few frames and repeats, no compilation (headless test, ~2 min)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
n_calibration_frames = 400  # frames of the shipped calibration split to calibrate on (its size is printed below;
#                              the shipped trees/heads.json: 1500)
n_eval_frames = 120  # evaluation frames for predicted vs measured tokens per call
budgets = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # node budgets N compared (the calibration builds 2..64)
draws = 2  # Monte Carlo draws of the sampled children per (frame, start depth) in the calibration
speed_budgets = (2, 4, 8, 16, 32, 64)  # N timed on this machine (Figure 4 analogue)
speed_contexts = 50  # evaluation contexts the timed frames cycle through
speed_repeats = 8  # the MINIMUM of timed frames per (decoder, backend), interleaved (more until noise_target)
compile_fused = True  # the fused AR frame compiled with torch.compile (~4 min on this machine); False: eager
compare_model = "qwen3-tts-0.6b-random"  # real-size architecture, RANDOM weights: cost curve and loop share only
compare_repeats = 4  # the minimum of timed frames per decoder on the compare model
noise_target = 0.05  # every timing goes on until the relative standard error of each median is at most this, or 4 x its
#                      minimum (rvqspec_lib.eval.noise; None: exactly the repeats above). Smoke: None
batch_sizes = (1, 4, 16)  # frames decoded together
temperatures = (1.5, 1.2, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1)  # code-predictor temperatures of the sweep
temperature_frames = 60  # calibration and evaluation frames per temperature
write_trees = False  # True (not smoke): write the calibration beside the model (<model>/trees/heads.json), where
#                      `rvqspec synth --tree calibrated:N` and `--decoder auto` read it; `make paper` leaves the
#                      shipped file as it is (notebook 01 and the CLI read it) and writes 03_trees_heads.json
table_repeats = 3  # the minimum of timed frames per decoder in the table to act on (more until noise_target; smoke: 1)
table_backends = ("eager", "native")  # the table's backends ("native": the C forward and the whole frame in C, where it
#                               builds); "compile" adds compiled rows of every native precision (many minutes:
#                               compile_fused's graphs are not reused); smoke: eager and native

# %%
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from rvqspec_lib.eval import paper_decoder as PD
from rvqspec_lib.eval import plots
from rvqspec_lib.eval.bench import measure_quietly
from rvqspec_lib.eval.acceptance import decoder_statistics
from rvqspec_lib.eval.budget import AUTO_BUDGETS, choose_decoder
from rvqspec_lib.eval.calibration import BUDGETS, calibrate, calibration_frames
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.eval.inner_loop import default_sampling
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.speed import batch_throughput, random_contexts, time_frames, verify_cost_curve
from rvqspec_lib.models.drafter_files import shipped_drafter
from rvqspec_lib.models.fused import FusedARFrame
from rvqspec_lib.models.kernels import cpforward
from rvqspec_lib.models.lean import LeanCodePredictor
from rvqspec_lib.models.loader import EMBEDDED_MODEL, load_model
from rvqspec_lib.models.native import NativeCodePredictor
from rvqspec_lib.models.tree_files import save_calibration, tree_file, tree_from_calibration
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.decoding.decoders import AR, Chain
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.predictor import OfficialBackend
from rvqspec_lib.decoding.sampling import Sampling

t_start = time.perf_counter()
if smoke:
    n_calibration_frames, n_eval_frames, draws = min(n_calibration_frames, 48), min(n_eval_frames, 32), 1
    budgets, speed_budgets = (2, 4, 8), (2, 8)
    speed_contexts, speed_repeats, compare_repeats, noise_target = 4, 2, 1, None
    compile_fused, compare_model = False, "tiny-random"
    batch_sizes, temperatures, temperature_frames = (1, 4), (0.9, 0.3), 24
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
if threads:  # two threads on a busy 2-core machine spin-wait
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
try:
    embedded_root(model)
    run_model = model
except FileNotFoundError:  # calibration needs trained weights and frames of real speech
    display(Markdown(f"**`{model}` ships no calibration utterances: this notebook calibrates the embedded model "
                     "instead** (its speed section still times `compare_model`)."))
    run_model = EMBEDDED_MODEL
budgets = tuple(sorted({int(b) for b in budgets}))
params = dict(model=model, run_model=run_model, seed=seed, smoke=bool(smoke), out_dir=str(out),
              threads=torch.get_num_threads(), n_calibration_frames=n_calibration_frames, n_eval_frames=n_eval_frames,
              budgets=list(budgets), draws=draws, speed_budgets=list(speed_budgets), speed_contexts=speed_contexts,
              speed_repeats=speed_repeats, compile_fused=bool(compile_fused), compare_model=compare_model,
              compare_repeats=compare_repeats, batch_sizes=list(batch_sizes), temperatures=list(temperatures),
              noise_target=noise_target,
              temperature_frames=temperature_frames, write_trees=bool(write_trees), notebook="03_calibrating_the_tree")
prov = provenance(params, seed=seed)
timings = {}
print(f"model {run_model}, outputs -> {out}")

# %% [markdown]
# ## The model and the frames
# Calibration frames: the contexts of the shipped `calibration` split (teacher-forced on real speech), codes 1..15
# re-sampled from p by AR decoding at the deployed sampling (what a decoder will verify). Evaluation frames: the
# `evaluation` split's contexts, decoded by each decoder itself.

# %%
lm = load_model(run_model)
cp = lm.code_predictor
sampling = default_sampling(lm)
n_codes = lm.n_code_groups - 1
t0 = time.perf_counter()
cal_frames = calibration_frames(lm, max_frames=n_calibration_frames, seed=seed, progress=True)
eval_frames = frames_from_shipped(lm, "evaluation", max_frames=n_eval_frames, seed=seed, progress=True)
timings["frames_s"] = time.perf_counter() - t0
display(pd.DataFrame([{"split": "calibration", "frames": len(cal_frames),
                       "utterances": int(torch.unique(cal_frames.utterance).numel())},
                      {"split": "evaluation", "frames": len(eval_frames),
                       "utterances": int(torch.unique(eval_frames.utterance).numel())}]))
# the paper's decoder: the offsets shipped beside the model and THEIR calibration (never the heads' trees)
has_paper = PD.has_paper_decoder(lm)
if has_paper:
    offsets_cal = PD.drafter_calibration(lm, "offsets")
    offsets = shipped_drafter(lm, "offsets", cp)  # the module beside the model (drafters/offsets.safetensors)
else:
    offsets_cal, offsets = None, None
    display(Markdown(f"**`{run_model}` ships no offsets drafter with a calibration: the paper's decoder is left out "
                     "below** (train it with `rvqspec train-drafter`, calibrate with `scripts/calibrate_trees.py`)."))
print(f"sampling {sampling!r}; {n_codes} codes a frame; drafters: the reused heads (calibrated below)"
      + (f", the shipped offsets ({offsets_cal['n_frames']} calibration frames)" if has_paper else ""))

# %%
# the calibration split's size, read from the data that ships it (the same sentence in notebooks 00, 03 and 04)
from rvqspec_lib.data.utterances import shipped_split_sizes

split = shipped_split_sizes(run_model)["calibration"]
display(Markdown(f"The shipped calibration split (`{split['file']}`): **{split['utterances']} utterances, "
                 f"{split['frames']} frames**; this notebook calibrates on {len(cal_frames)} of its frames "
                 f"(`n_calibration_frames`)."))

# %% [markdown]
# ## Calibration
# Point-mass: `rank_mass[s, t, r] = E[p(x_r)]` for the rank-r draft at offset t from start depth s (exact given the
# teacher-forced prefix). Sampled: the probability that the i-th child drawn without replacement is the accepted
# one, once its parent was reached (Monte Carlo over the children, Sequoia's rule computed exactly). Pooled over start
# depths, each table grows a tree greedily, one node at a time (the most valuable node whose parent is in).

# %%
t0 = time.perf_counter()
cal = calibrate(cp, ReusedHeads(), cal_frames, sampling=sampling, budgets=BUDGETS if not smoke else budgets,
                draws=draws, seed=seed)
timings["calibrate_s"] = time.perf_counter() - t0
cal["provenance"] = prov
trees_path = tree_file(run_model, "heads")
if write_trees and not smoke and trees_path is not None and run_model == model:
    save_calibration(cal, trees_path)
    where = trees_path
else:
    where = save_calibration(cal, out / "03_trees_heads.json")
print(f"calibrated on {cal['n_frames']} frames in {timings['calibrate_s']:.0f} s -> {where}")

# %%
rank_tab = pd.DataFrame(cal["point-mass"]["table"], index=pd.Index(range(1, len(cal["point-mass"]["table"]) + 1),
                                                                   name="offset"))
rank_tab.columns = [f"rank {r}" for r in rank_tab.columns]
child_tab = pd.DataFrame(cal["sampled"]["table"], index=rank_tab.index)
child_tab.columns = [f"child {i}" for i in child_tab.columns]
save_table(rank_tab.reset_index(), out / "03_rank_mass", prov)
save_table(child_tab.reset_index(), out / "03_child_acceptance", prov)
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax, tab, title in ((axes[0], rank_tab, "point-mass: target mass E[p(x_r)] of the rank-r draft"),
                       (axes[1], child_tab, "sampled: P(child i is accepted | parent reached)")):
    im = ax.imshow(tab.values.T, aspect="auto", cmap="viridis", vmin=0, vmax=max(0.01, float(np.nanmax(tab.values))),
                   origin="lower", extent=(0.5, tab.shape[0] + 0.5, -0.5, tab.shape[1] - 0.5))
    ax.set_xlabel("draft offset t")
    ax.set_ylabel("rank r" if "rank" in title else "child index i")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
fig.suptitle(f"{run_model}: acceptance by offset (calibration split, {cal['n_frames']} frames, {sampling!r})",
             fontsize=10)
fig.tight_layout()
save_figure(fig, out / "03_acceptance_heatmap", prov)
plt.show()

# %% [markdown]
# ## The calibrated trees
# The trees of a few budgets: columns are draft offsets, labels are ranks (point-mass) or child indices (sampled).

# %%
show_n = [b for b in (4, 8, 16, 32) if b in cal["budgets"]] or cal["budgets"][:2]
fig, axes = plt.subplots(2, len(show_n), figsize=(3.2 * len(show_n), 6.4), squeeze=False)
for row, kind in enumerate(("point-mass", "sampled")):
    for col, b in enumerate(show_n):
        tr = tree_from_calibration(cal, kind, b)
        plots.plot_tree(axes[row][col], tr.paths, sampled=tr.sampled,
                        title=f"{kind}, N={b}: E={cal[kind]['predicted_tokens_per_call'][str(b)]:.2f}")
fig.tight_layout()
save_figure(fig, out / "03_trees", prov)
plt.show()

# %% [markdown]
# ## A calibrated tree and its verify attention mask (the paper's Figure 2, here)
# The shipped calibration (`<model>/trees/heads.json`, read with `rvqspec_lib.models.tree_files`), its point-mass
# tree (the paper's kind) at the paper's node budget, beside the attention mask of that tree's first verify
# call of a frame. The mask is not drawn from a formula: one evaluation frame is decoded through
# `rvqspec_lib.decoding.decode.decode_frame` and the `allow` mask the verify step passed to the model is recorded
# (`rvqspec_lib.eval.verify_calls.record_verify_calls`). Rows: the call's query positions (root, then the nodes);
# columns: the frame's KV slots, the codes committed before the call, then the call's own.

# %%
from rvqspec_lib.eval.verify_calls import record_verify_calls
from rvqspec_lib.models.tree_files import load_calibration

fig2_budget = 32  # N of the drawn tree: the paper's node budget (its Figure 2 draws a sparse tree of that size)
shipped_path = tree_file(run_model, "heads")
shipped_cal = load_calibration(shipped_path, n_codes=n_codes, codebook_size=lm.codebook_size)
fig2_tree = tree_from_calibration(shipped_cal, "point-mass", fig2_budget)
calls = record_verify_calls(cp, eval_frames.context[:1], fig2_tree, sampling=sampling, seed=seed)
first_verify = next(c for c in calls if c["kind"] == "verify")
fig = plots.plot_tree_and_mask(fig2_tree.paths, first_verify,
                               title=f"{run_model}: calibrated point-mass tree of N = {fig2_budget} from "
                                     f"{shipped_path.name} ({shipped_cal['n_frames']} calibration frames), and its "
                                     f"verify call's attention mask")
save_figure(fig, out / "03_tree_and_mask", {**prov, "calibration_file": str(shipped_path)})
plt.show()

# %% [markdown]
# ## Predicted vs measured tokens per call
# E(N) is predicted over whole frames (prefill included, drafts stopped at the frame's last depth) from the
# calibration tables; "measured" decodes the evaluation split's contexts with each tree (batched, one seed). Chains of
# 2..8 are the sampled trees with one child per node.

# %%
t0 = time.perf_counter()
rows = []
per_drafter = [("heads", ReusedHeads(), cal, "")] + ([("offsets", offsets, offsets_cal, "@offsets")]
                                                    if has_paper else [])
cands = [(f"calibrated-{kind}:{b}{tag}", tree_from_calibration(c, kind, b), kind, b, dname, d, c)
         for dname, d, c, tag in per_drafter for kind in ("point-mass", "sampled") for b in budgets]
for label, dec, kind, b, dname, d, c in cands:
    st = decoder_statistics(cp, d, eval_frames.context, dec, sampling=sampling, seed=seed)
    pred = c[kind]["predicted_tokens_per_call"][str(b)]
    rows.append({"decoder": label, "drafter": dname, "kind": kind, "nodes": b, "depth": dec.tree(n_codes).max_depth,
                 "predicted_tokens_per_call": pred, "measured_tokens_per_call": st["tokens_per_call"],
                 "relative_error": pred / st["tokens_per_call"] - 1.0,
                 "paper_decoder": dname == "offsets" and kind == "point-mass"})
for dname, d, _, tag in per_drafter:
    for w in (2, 4, 8):
        st = decoder_statistics(cp, d, eval_frames.context, Chain(w), sampling=sampling, seed=seed)
        rows.append({"decoder": f"chain:{w}{tag}", "drafter": dname, "kind": "chain", "nodes": w, "depth": w - 1,
                     "predicted_tokens_per_call": None, "measured_tokens_per_call": st["tokens_per_call"],
                     "relative_error": None, "paper_decoder": False})
pvm = pd.DataFrame(rows)
timings["measured_tokens_per_call_s"] = time.perf_counter() - t0
save_table(pvm, out / "03_predicted_vs_measured", prov)
fig, ax = plt.subplots(figsize=(6.5, 4))
for dname, color in (("heads", "C0"), ("offsets", "C3")):
    for kind, mk in (("point-mass", "o"), ("sampled", "s")):
        d = pvm[(pvm.kind == kind) & (pvm.drafter == dname)]
        if not len(d):
            continue
        name = "paper's decoder (offsets, point-mass)" if dname == "offsets" and kind == "point-mass" else \
            f"{dname}, {kind}"
        line, = ax.plot(d.nodes, d.measured_tokens_per_call, mk + "-", color=color if kind == "point-mass" else None,
                        label=f"{name}: measured")
        ax.plot(d.nodes, d.predicted_tokens_per_call, mk + "--", alpha=0.6, color=line.get_color(),
                label=f"{name}: predicted E(N)")
    ch = pvm[(pvm.kind == "chain") & (pvm.drafter == dname)]
    if len(ch):
        ax.plot(ch.nodes, ch.measured_tokens_per_call, "^:", color=color, alpha=0.7,
                label=f"{dname}, chain (window = N): measured")
ax.set_xscale("log", base=2)
ax.set_xlabel("node budget N (query positions per verify call)")
ax.set_ylabel("tokens per call")
ax.set_title(f"{run_model}: each drafter's own calibrated trees, evaluation split ({len(eval_frames)} frames)",
             fontsize=10)
ax.legend(fontsize=6)
fig.tight_layout()
save_figure(fig, out / "03_tokens_per_call_vs_N", prov)
plt.show()
pvm.round(3)

# %% [markdown]
# ## The cost of a verify call on this machine
# `t(Q)/t(1)` of one verify call of Q query positions, per backend: the official transformers module, the lean
# forward over the same weights (bit-identical with torch's matmul), the lean forward with the multi-row GEMV
# kernel (docs/offline.md#verify-cost-on-this-cpu) and the native forward (the whole call in one C function,
# row for row the same arithmetic in a verify call as in an AR call; docs/precision.md#the-native-forward), where it
# builds.

# %%
backends = {"official": OfficialBackend(cp), "lean": LeanCodePredictor(cp),
            "lean-mgemv": LeanCodePredictor(cp, matmul="mgemv")}
if cpforward.available():
    backends["native"] = NativeCodePredictor(cp)
speed_backends = [k for k in ("official", "lean-mgemv", "native") if k in backends]
qs = sorted({1, *speed_budgets})
t0 = time.perf_counter()
cost, cost_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: verify_cost_curve(
    cp, backends, query_sizes=qs, repeats=max(3, speed_repeats // 2), seed=seed, noise_target=noise_target),
    meta=lambda r: r["meta"])
timings["verify_cost_s"] = time.perf_counter() - t0
cost_tab = pd.DataFrame(cost["rows"])
save_table(cost_tab, out / "03_verify_cost", {**prov, "meta": cost["meta"], "timing": cost_quiet},
           caption="; ".join(filter(None, [noise_words(cost["meta"]), cost_quiet["note"]])))
cost_tab.pivot(index="query_positions", columns="backend", values="ratio_to_q1").round(3)

# %% [markdown]
# ## Speed: every decoder timed, interleaved, beside AR and the fused AR frame (the paper's Figure 4, here)
# One frame at a time (batch 1, the streaming case), every (decoder, backend) condition on the same contexts in a
# shuffled order each repeat. `outside_share` is the loop outside the model call (masks, sampling, the accept walk,
# commit). The fused AR frame is one compiled call with sampling inside (Gumbel-max).

# %%
speed_ctx = eval_frames.context[:speed_contexts]
decoders = {"ar": AR(), "chain:4": Chain(4), "chain:8": Chain(8)}
for kind in ("point-mass", "sampled"):
    for b in speed_budgets:
        if b in cal["budgets"]:
            decoders[f"calibrated-{kind}:{b}"] = tree_from_calibration(cal, kind, b)
if has_paper:  # the paper's decoder (offsets + their own point-mass tree) at every timed N and at its default 32
    paper_budgets = sorted({*[b for b in speed_budgets if b in offsets_cal["budgets"]], 32})
    decoders.update(PD.named_decoders(lm, [f"paper:{b}" for b in paper_budgets],
                                      calibrations={"offsets": offsets_cal}, drafters={"offsets": offsets}))
t0 = time.perf_counter()
fused = {"fused-compiled" if compile_fused else "fused-eager": FusedARFrame(cp, sampling, compile=bool(compile_fused))}
# an oversubscribed CPU (eval.bench.OTHER_CPU_LIMIT) is re-measured once; if it still is, title and caption say so
speed, speed_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: time_frames(
    cp, speed_ctx, decoders, {k: backends[k] for k in speed_backends}, fused=fused, sampling=sampling,
    repeats=speed_repeats, seed=seed, random_weights=lm.is_random, noise_target=noise_target), meta=lambda r: r["meta"])
timings["speed_s"] = time.perf_counter() - t0
speed_tab = pd.DataFrame(speed["rows"])
save_table(speed_tab, out / "03_speed", {**prov, "meta": speed["meta"], "timing": speed_quiet},
           caption="; ".join(filter(None, [noise_words(speed["meta"]), speed_quiet["note"]])))
display(speed_tab[["decoder", "backend", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms", "outside_share",
                   "speedup_vs_ar", "speedup_vs_fused"]].round(3))
print(json.dumps({k: speed["meta"][k] for k in ("threads", "cpu", "load_avg_1min_before", "other_cpu_frac")}))

# %%
def _n_of(label: str) -> int | None:
    if label.startswith("paper-N"):
        return int(label[len("paper-N"):])
    return int(label.rsplit(":", 1)[1]) if label.startswith("calibrated-") else None


fig, axes = plt.subplots(1, len(speed_backends), figsize=(5.8 * len(speed_backends), 4.2), squeeze=False)
for ax, backend in zip(axes[0], speed_backends):
    d = speed_tab[speed_tab.backend == backend]
    for kind, mk in (("point-mass", "o"), ("sampled", "s")):
        k = d[d.decoder.str.startswith(f"calibrated-{kind}:")]
        ax.plot([_n_of(x) for x in k.decoder], k.speedup_vs_ar, mk + "-", label=f"heads, calibrated {kind} tree")
    pp = d[d.decoder.str.startswith("paper-N")]
    if len(pp):
        ax.plot([_n_of(x) for x in pp.decoder], pp.speedup_vs_ar, "D-", color="C3",
                label="paper's decoder (offsets + own point-mass tree)")
    for lab, ls in (("chain:4", ":"), ("chain:8", "-.")):
        v = d[d.decoder == lab].speedup_vs_ar
        if len(v):
            ax.axhline(float(v.iloc[0]), ls=ls, color="0.4", label=f"{lab} (window N = {lab.split(':')[1]})")
    fz = speed_tab[speed_tab.decoder == "fused-AR"]
    ar_ms = float(d[d.decoder == "ar"].ms_per_frame.iloc[0])
    if len(fz):
        ax.axhline(ar_ms / float(fz.ms_per_frame.iloc[0]), color="C3", lw=1, label="fused AR frame (one call)")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("node budget N")
    ax.set_ylabel("speedup vs AR (same backend), wall clock per frame")
    ax.set_title(f"{run_model}, {backend} forward, {speed['meta']['threads']} thread(s)", fontsize=9)
    ax.legend(fontsize=7)
fig.suptitle("Figure 4 analogue on this machine (batch 1, measured)"
             + (f"\n{speed_quiet['note']}: the times are pessimistic" if speed_quiet["note"] else ""), fontsize=10)
fig.tight_layout()
save_figure(fig, out / "03_speedup_vs_N", {**prov, "meta": speed["meta"]})
plt.show()

# %%
# the paper's per-device optima (its Figure 4 / §3), in a labelled comparison column; this machine's measured best
best_here = speed_tab[speed_tab.decoder.str.startswith("calibrated-")].sort_values("speedup_vs_ar").iloc[-1]
paper = pd.DataFrame([
    {"device": "M3 Pro (paper, Core ML)", "best_N": 32, "speedup": 2.13, "source": "paper"},
    {"device": "iPhone 17 Pro Max (paper, Core ML)", "best_N": 32, "speedup": 2.34, "source": "paper"},
    {"device": "iPhone 12 (paper, Core ML)", "best_N": 16, "speedup": 1.82, "source": "paper (1.21x at N = 64)"},
    {"device": f"this machine: {speed['meta']['cpu']} ({best_here.backend})", "best_N": _n_of(best_here.decoder),
     "speedup": float(best_here.speedup_vs_ar), "source": f"measured here, {best_here.decoder}"},
])
best_paper = speed_tab[speed_tab.decoder.str.startswith("paper-N")].sort_values("speedup_vs_ar")
if len(best_paper):  # the paper's decoder at its fastest N here, beside the heads' trees
    bp = best_paper.iloc[-1]
    paper.loc[len(paper)] = {"device": f"this machine: {speed['meta']['cpu']} ({bp.backend}), the paper's decoder",
                             "best_N": _n_of(bp.decoder), "speedup": float(bp.speedup_vs_ar),
                             "source": f"measured here, {bp.decoder} (offsets + own tree)"}
save_table(paper, out / "03_paper_devices", prov)
paper

# %% [markdown]
# ## `--decoder auto`: the budget chosen from this device's own measurements
# `rvqspec_lib.eval.budget.choose_decoder` times the verify call of every candidate (AR, chains, both kinds of
# calibrated trees), predicts `E(N) t(1)/t(N)`, then decodes frames with the most promising ones (interleaved) and
# keeps the least measured time per committed code (what `rvqspec synth --decoder auto` does and caches). Like
# `synth`, it chooses the forward too: the official module and, where it builds, the native forward, every
# shortlisted decoder timed through each, and AR and every chain window as the native whole frame (one C call a
# frame, backend `native-frame`); the speedup is over AR through the official module.

# %%
t0 = time.perf_counter()
choice = choose_decoder(cp, cal, cal_frames.context, sampling=sampling,
                        budgets=[b for b in AUTO_BUDGETS if b in cal["budgets"]], frames=8 if smoke else 24,
                        repeats=1 if smoke else 3, shortlist=3 if smoke else 5, seed=seed, progress=True,
                        noise_target=noise_target,
                        backends={k: backends[k] for k in ("official", "native") if k in backends})
timings["auto_s"] = time.perf_counter() - t0
auto_tab = pd.DataFrame(choice.table)
save_table(auto_tab, out / "03_auto", prov)
how = ("as the whole frame in one C call over the native forward" if choice.backend == "native-frame"
       else f"through the {choice.backend or 'official'} forward")
display(Markdown(f"**auto chose `{choice.label}`** {how}: {choice.reason}"))
auto_tab.round(3)

# %% [markdown]
# ## Batches: where the gain of speculation vanishes
# Frames per second when B frames are decoded together (one call per round for the whole batch; a batch's round
# lasts as long as its slowest row needs). Bigger batches fill the machine with AR alone.

# %%
best_label = choice.label if choice.label != "ar" else "chain:4"
best_dec = {**{c: d for c, d in decoders.items()}, **{choice.label: choice.decoder}}.get(best_label, Chain(4))
t0 = time.perf_counter()
batches, batches_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: batch_throughput(
    cp, eval_frames.context, {"ar": AR(), best_label: best_dec}, {"lean-mgemv": backends["lean-mgemv"]},
    batch_sizes=batch_sizes, sampling=sampling, repeats=2 if smoke else 6, seed=seed, noise_target=noise_target),
    meta=lambda r: r["meta"])
timings["batches_s"] = time.perf_counter() - t0
batch_tab = pd.DataFrame(batches["rows"])
save_table(batch_tab, out / "03_batches", {**prov, "meta": batches["meta"], "timing": batches_quiet},
           caption="; ".join(filter(None, [noise_words(batches["meta"]), batches_quiet["note"]])))
batch_tab.pivot(index="batch", columns="decoder", values="frames_per_s").round(2)

# %% [markdown]
# ## The real-size 0.6B architecture (random weights: timing only) and a projection
# The 0.6B code predictor's verify cost curve on this machine, per backend, and the loop's share of a frame for each
# decoder. Its acceptance means nothing (random weights), so its frames' tokens per call are those of random heads
# and no speedup of those frames is shown. The speedup it **would** reach is projected from the embedded model's
# calibrated E(N) and the measured `t(1)/t(N)`: **a projection, not a measurement**, which leaves out the prefill, the
# talker and the loop outside the verify call; its caption names its inputs.

# %%
t0 = time.perf_counter()
big = load_model(compare_model)
big_cp = big.code_predictor
big_backends = {"official": OfficialBackend(big_cp), "lean-mgemv": LeanCodePredictor(big_cp, matmul="mgemv")}
big_cost, big_cost_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: verify_cost_curve(
    big_cp, big_backends, query_sizes=qs, repeats=max(2, compare_repeats // 2), seed=seed,
    random_weights=big.is_random, noise_target=noise_target), meta=lambda r: r["meta"])
big_cost_tab = pd.DataFrame(big_cost["rows"])
save_table(big_cost_tab, out / "03_verify_cost_compare_model",
           {**prov, "meta": big_cost["meta"], "timing": big_cost_quiet},
           caption=f"{compare_model}: random weights, timing only; {noise_words(big_cost['meta'])}" + (
               f"; {big_cost_quiet['note']}" if big_cost_quiet["note"] else ""))
big_dec = {"ar": AR(), "chain:4": Chain(4)}
for b in [x for x in (4, 16) if x in cal["budgets"]]:
    big_dec[f"calibrated-sampled:{b}"] = tree_from_calibration(cal, "sampled", b)
big_speed, big_speed_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: time_frames(
    big_cp, random_contexts(big_cp, 4, seed=seed), big_dec, big_backends, repeats=compare_repeats, warmup=1,
    seed=seed, random_weights=big.is_random, noise_target=noise_target), meta=lambda r: r["meta"])
timings["compare_model_s"] = time.perf_counter() - t0
# random weights: the tokens per call of these frames are random heads', so a speedup over AR computed from them is
# no result; the table keeps the costs (ms per frame, the model call, the loop's share) and drops the speedups
big_speed_tab = pd.DataFrame(big_speed["rows"]).drop(columns=["speedup_vs_ar", "speedup_vs_fused"], errors="ignore")
save_table(big_speed_tab, out / "03_loop_share_compare_model",
           {**prov, "meta": big_speed["meta"], "timing": big_speed_quiet},
           caption=f"{compare_model}: RANDOM weights, so tokens_per_call is that of random heads and no speedup is "
                   f"shown; the costs (ms per frame, model_ms, outside_share) are the result; "
                   f"{noise_words(big_speed['meta'])}" + (
                       f"; {big_speed_quiet['note']}" if big_speed_quiet["note"] else ""))
proj = []
for backend in big_backends:
    cur = big_cost_tab[big_cost_tab.backend == backend].set_index("query_positions").ratio_to_q1
    for kind in ("point-mass", "sampled"):
        for b in speed_budgets:
            if b in cal["budgets"] and b in cur.index:
                e = cal[kind]["predicted_tokens_per_call"][str(b)]
                proj.append({"model": compare_model, "backend": backend, "kind": kind, "nodes": b,
                             "E(N) (embedded model)": e, "t(N)/t(1) (measured)": float(cur[b]),
                             "projected_speedup": e / float(cur[b]), "label": "PROJECTION"})
proj_tab = pd.DataFrame(proj)
save_table(proj_tab, out / "03_projection_compare_model", prov,
           caption=f"PROJECTION, not a measurement: E(N) predicted from {run_model}'s calibration (its trained "
                   f"weights, the reused heads) x t(1)/t(N) of one verify call measured on {compare_model}'s code "
                   f"predictor ({'random' if big.is_random else 'trained'} weights) per backend; leaves out the "
                   f"prefill, the talker and the loop outside the verify call")
display(big_speed_tab[["decoder", "backend", "ms_per_frame", "model_ms", "outside_share"]].round(3))
proj_tab.pivot_table(index="nodes", columns=["backend", "kind"], values="projected_speedup").round(2)

# %% [markdown]
# ## Temperature: does a point-mass tree overtake a sampled tree as p sharpens?
# A point-mass child is worth the target mass of its rank, so point-mass trees gain as p sharpens; a sampled child is
# worth `Σ min(p, q)` whatever p's entropy. For each code-predictor temperature, calibrate again (fewer frames) and
# compare E(16) of both kinds, with the tokens per call measured on evaluation frames. Whether, and where, the
# point-mass tree overtakes is printed from the measurements below the figure.

# %%
t0 = time.perf_counter()
temp_rows = []
sweep_n = 16 if 16 in cal["budgets"] else cal["budgets"][-1]
for temp in temperatures:
    s_t = Sampling(temperature=float(temp), top_k=sampling.top_k, top_p=sampling.top_p)
    fr_t = calibration_frames(lm, max_frames=temperature_frames, seed=seed)
    fr_t.codes = decoder_statistics(cp, ReusedHeads(), fr_t.context, AR(), sampling=s_t, seed=seed)["codes"]
    cal_t = calibrate(cp, ReusedHeads(), fr_t, sampling=s_t, budgets=(sweep_n,), draws=1, seed=seed)
    for kind in ("point-mass", "sampled"):
        tr = tree_from_calibration(cal_t, kind, sweep_n)
        st = decoder_statistics(cp, ReusedHeads(), eval_frames.context[:temperature_frames], tr, sampling=s_t,
                                seed=seed)
        temp_rows.append({"temperature": temp, "kind": kind, "nodes": sweep_n,
                          "predicted_tokens_per_call": cal_t[kind]["predicted_tokens_per_call"][str(sweep_n)],
                          "measured_tokens_per_call": st["tokens_per_call"],
                          "top1_target_mass": float(cal_t["point-mass"]["table"][0][0])})
timings["temperature_s"] = time.perf_counter() - t0
temp_tab = pd.DataFrame(temp_rows)
save_table(temp_tab, out / "03_temperature", prov)
fig, ax = plt.subplots(figsize=(6.5, 4))
for kind, mk in (("point-mass", "o"), ("sampled", "s")):
    d = temp_tab[temp_tab.kind == kind]
    ax.plot(d.temperature, d.measured_tokens_per_call, mk + "-", label=f"{kind} tree N={sweep_n}: measured")
    ax.plot(d.temperature, d.predicted_tokens_per_call, mk + "--", alpha=0.5, label=f"{kind}: predicted")
ax.set_xlabel("code-predictor temperature (lower = sharper p)")
ax.set_ylabel("tokens per call")
ax.invert_xaxis()
ax.set_title(f"{run_model}: which tree wins as p sharpens", fontsize=10)
ax.legend(fontsize=7)
fig.tight_layout()
save_figure(fig, out / "03_temperature", prov)
plt.show()
wide = temp_tab.pivot(index="temperature", columns="kind", values="measured_tokens_per_call")
overtake = [float(t) for t in wide.index if wide.loc[t, "point-mass"] > wide.loc[t, "sampled"]]
t_low = float(min(wide.index))
display(Markdown(
    (f"Point-mass trees commit more codes per call than sampled trees at temperature(s) {overtake}."
     if overtake else
     f"Point-mass trees overtake sampled trees at **none** of the temperatures tried: at the sharpest, "
     f"T {t_low:g}, {wide.loc[t_low, 'point-mass']:.2f} vs {wide.loc[t_low, 'sampled']:.2f} codes per call "
     f"(N {sweep_n}).")))

# %% [markdown]
# ## Which decoder to run on this CPU: the table to act on
# The table `rvqspec bench --table` and `make bench` print (`rvqspec_lib.eval.bench_table.bench_table`), here for the
# embedded model only: per precision this CPU runs natively (float32 always) and per backend of `table_backends`
# (eager and native by default: a compiled backend compiles graphs of its own, minutes per precision; native runs
# the calls through the C forward and its fused rows as one C call a frame), the rows stepped AR,
# fused AR, the best speculative decoder, the fused speculative round (one graph a round) and `auto`'s choice, in ms
# per frame, as the inner loop's real-time factor (ms per frame over the 80 ms a frame lasts) and as `x_fused_ar`
# (ms per frame over the fused AR frame's, same precision and backend; the target for the fused speculative
# round is `FUSED_TARGET` or below). Its trees are those of `<model>/trees/heads.json` (the calibration above when
# `write_trees`; smoke: the shipped one). Notebook 05 shows the same table, compiled rows included, with the
# real-size 0.6B architecture beside it (random weights, its speculative frames a timing replay of the embedded
# model's acceptance). Smoke: float32, eager and native, one frame per decoder.

# %%
from rvqspec_lib.eval.bench_table import FUSED_TARGET, bench_table, caption, format_bench_table, save_bench_table

t0 = time.perf_counter()
table_res = bench_table(
    models=[EMBEDDED_MODEL], precisions=["float32"] if smoke else None,
    backends=[b for b in (["eager", "native"] if smoke else list(table_backends))
              if b != "native" or cpforward.available()],
    repeats=1 if smoke else int(table_repeats), warmup=0 if smoke else 1,
    chains=(4,) if smoke else (3, 4, 6), budgets=(4,) if smoke else (4, 8, 16), auto_frames=2 if smoke else 4,
    n_contexts=2 if smoke else 8, seed=seed, progress=False, noise_target=noise_target)
timings["bench_table_s"] = time.perf_counter() - t0
save_bench_table(table_res, out / "03_bench_table", prov)
print(format_bench_table(table_res).splitlines()[0])
table_cols = ["precision", "backend", "row", "decoder", "ms_per_frame", "rtf", "tokens_per_call", "speedup_vs_ar",
              "x_fused_ar", "floor_ar_ms", "x_floor_ar", "note"]
display(pd.DataFrame(table_res["rows"])[table_cols].round(3))
# what to run, read from the table: its fastest row, and the fused speculative round against the target
timed_rows = [r for r in table_res["rows"] if r["ms_per_frame"]]
fused_rows = [r for r in timed_rows if r["row"] == "fused speculative" and r["x_fused_ar"]]
act = []
if timed_rows:
    top = min(timed_rows, key=lambda r: r["ms_per_frame"])
    act.append(f"Fastest here: **{top['row']}** (`{top['decoder']}`, {top['precision']}, {top['backend']}), "
               f"{top['ms_per_frame']:.1f} ms a frame (RTF {top['rtf']:.2f})"
               + (f", {top['x_fused_ar']:.2f}x the fused AR frame of the same precision and backend."
                  if top["x_fused_ar"] else "."))
if fused_rows:
    fb = min(fused_rows, key=lambda r: r["x_fused_ar"])
    target = table_res["meta"].get("fused_target", FUSED_TARGET)
    act.append(f"The fused speculative round at its best (`{fb['decoder']}`, {fb['precision']}, {fb['backend']}) "
               f"is {fb['x_fused_ar']:.2f}x the fused AR frame: the target of <= {target} is "
               f"{'met' if fb['x_fused_ar'] <= target else 'missed'} on this CPU.")
if not act:
    act.append("No row of the table was timed here: " + "; ".join(sorted({r["note"] for r in table_res["rows"]})))
if table_res["meta"]["oversubscribed"]:
    act.append("The CPU was oversubscribed while timing: these times are pessimistic.")
display(Markdown(" ".join(act) + f"\n\n*{caption(table_res)}*"))
display(Markdown("\n".join(f"* {line}" for line in table_res["footer"])))

# %% [markdown]
# ## Summary

# %%
def _row(decoder, backend):
    d = speed_tab[(speed_tab.decoder == decoder) & (speed_tab.backend == backend)]
    return d.iloc[0].to_dict() if len(d) else None


calib = pvm[pvm.kind != "chain"]
summary = {
    "model": run_model, "n_codes": n_codes, "sampling": sampling.describe(),
    "calibration_frames": cal["n_frames"], "eval_frames": len(eval_frames), "trees_file": str(where),
    "predicted_vs_measured": pvm.to_dict("records"),
    "max_abs_relative_error": float(calib.relative_error.abs().max()),
    "speed": speed["rows"], "speed_meta": speed["meta"],
    "auto": {"label": choice.label, "reason": choice.reason},
    "paper_decoder": {"available": bool(has_paper),
                      "calibration_frames": offsets_cal["n_frames"] if has_paper else None,
                      "speed": [r for r in speed["rows"] if r["decoder"].startswith("paper-N")]},
    "auto_speedup_official": (_row(choice.label, "official") or {}).get("speedup_vs_ar"),
    "best_measured": {"decoder": best_here.decoder, "backend": best_here.backend,
                      "speedup_vs_ar": float(best_here.speedup_vs_ar),
                      "speedup_vs_fused": float(best_here.speedup_vs_fused)},
    "verify_cost": cost["rows"], "compare_model_verify_cost": big_cost["rows"],
    "compare_model_loop_share": big_speed_tab.to_dict("records"), "projection": proj,
    "batches": batches["rows"], "temperature": temp_rows, "point_mass_overtakes_at": overtake,
    "timings_s": {**timings, "total": time.perf_counter() - t_start},
}
save_json(summary, out / "03_metrics.json", prov)
ar_off = _row("ar", "official")
pap, hpm = _row("paper-N32", "official"), _row("calibrated-point-mass:32", "official")
paper_line = (f"* The paper's decoder (`paper`: the offsets + their own point-mass tree of N = 32): "
              f"{pap['tokens_per_call']:.3f} tokens per call, {pap['speedup_vs_ar']:.2f}x over AR (official forward), "
              f"{_row('paper-N32', 'lean-mgemv')['speedup_vs_ar']:.2f}x (lean-mgemv)"
              + (f"; the heads' point-mass tree of N = 32: {hpm['tokens_per_call']:.3f} tokens per call, "
                 f"{hpm['speedup_vs_ar']:.2f}x" if hpm else "") + ".") if pap else None
lines = [
    f"* Calibration: {cal['n_frames']} frames; predicted E(N) within "
    f"{100 * summary['max_abs_relative_error']:.1f}% of the measured tokens per call for every calibrated tree.",
    f"* Measured speedup per frame over AR (official forward): best "
    f"{max(r['speedup_vs_ar'] for r in speed['rows'] if r['backend'] == 'official' and r['speedup_vs_ar']):.2f}x; "
    f"AR {ar_off['ms_per_frame']:.1f} ms a frame.",
    f"* auto chose `{choice.label}`.",
    *([paper_line] if paper_line else []),
    f"* Point-mass trees overtake sampled trees at temperatures: {overtake or 'none of those tried'}.",
]
display(Markdown("\n".join(lines)))
print(f"total {summary['timings_s']['total']:.0f} s")
