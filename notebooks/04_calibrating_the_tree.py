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
# # 04 — Calibrating the tree, and what it buys on this CPU (paper §2.2, Figures 2 and 4)
#
# **The question.** A speculative round drafts several codes and checks them all in ONE call of the code predictor,
# the **verify call** ([glossary](../docs/glossary.md)). The drafts form a **tree**: the last committed code is the
# root, and each node is a guessed code for a later depth, checked in the same call under an attention mask that
# lets it see only its own ancestors. Which drafts should the tree hold, and how many? Every node costs one query
# position of the call, so the tree should hold the drafts most likely to be kept, and its size, the **node budget
# N** (the query positions of one call, root included), should stop where a wider call costs more than the codes it
# adds. The paper answers with a **calibrated sparse tree** (its §2.2): acceptance is tabulated offline per draft
# offset and rank, a tree is grown from the most valuable nodes and pruned to a budget N chosen by hand per device
# (its Figure 4). **Acceptance** here is the chance that a drafted node is kept once its parent is, and it has two
# forms, one per kind of child (below): for a point-mass node the target mass p(x_r) of its code, for a sampled
# child `sum min(p, q)` (and, for later children, what of p the earlier ones missed); every table of this notebook
# says which of the two it holds. This notebook does the same on the embedded model and then times every decoder on
# this CPU.
#
# **Terms**, each defined in [the glossary](../docs/glossary.md#speculative-decoding) and
# [docs/methods.md](../docs/methods.md#letters-and-indices): the **start depth s** is the last committed code's
# **depth** j (its index in the frame, 1..15); a draft at **offset t** guesses the code of depth s + t; its
# **rank r** is its place in the drafter's distribution q sorted by probability (r = 0: q's top code). p is always
# the target (the code predictor), q the draft.
#
# **Two kinds of children** ([methods.md](../docs/methods.md#sampled-trees)):
#
# * **point-mass** (the paper's): the children are q's top-ranked codes; a child x is kept with probability p(x), so
#   a node is worth the **target mass** of its rank, E[p(x_r)];
# * **sampled**: children drawn from q without replacement and kept by Sequoia's rule, exact too; one child is the
#   chain's rule, kept with `sum min(p, q)`, and later children recover what is left of p.
#
# **What is measured, in order** (section 1 loads the model): (§2) what one node of each kind is worth, by start
# depth and offset; (§3) the greedy trees this gives for budgets N; (§4) a calibrated tree beside the attention mask
# of its verify call, the paper's Figure 2; (§5) the tokens per call each tree is predicted to reach per frame, E(N),
# against what it reaches on held-out frames, for the reused heads calibrated here and for the shipped **offsets**
# with their own calibration, which is **the paper's decoder** (`paper:N`); (§6) the cost of a wider call,
# t(N)/t(1), through three backends, on the embedded model and on the real-size 0.6B architecture; (§7) the paper's
# Figure 4 here: every decoder timed beside every way of running AR; (§8) a temperature sweep: does a point-mass tree
# win when p is sharper?
#
# **Caveats.** The embedded model is small and trained here on synthetic speech; its acceptance rates are its own.
# The 0.6B architecture has RANDOM weights here: its call costs are real, its outputs mean nothing, so its speedups
# are PROJECTIONS from the embedded model's acceptance, labelled so. Everything below is computed by `rvqspec_lib`
# (`eval.calibration`, `eval.speed`, the registry `models.backends`); the notebook calls and plots.

# %% tags=["parameters"]
model = "embedded"  # the small trained model shipped in data/embedded (its calibration split ships beside it)
seed = 0  # frame order, decode generators, Monte Carlo draws
smoke = False  # True: few frames and repeats, tiny-random as the real-size stand-in (headless test, a few minutes)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
n_calibration_frames = 400  # frames of the shipped calibration split calibrated on (trees/heads.json records its own)
n_eval_frames = 120  # held-out evaluation frames of predicted vs measured tokens per call
budgets = (2, 4, 8, 16, 32, 64)  # node budgets N of predicted vs measured (the calibration builds every N in 2..64)
chains = (2, 4, 8)  # chain windows measured beside the trees
draws = 2  # Monte Carlo draws of the sampled children per (frame, start depth) in the calibration
tree_budgets = (4, 8, 16, 32)  # the calibrated trees drawn
fig2_budget = 32  # N of Figure 2's tree: the paper's node budget
backends = ("official", "eager", "native")  # verify backends of the registry timed ("compile" adds minutes)
speed_budgets = (2, 4, 8, 16, 32, 64)  # N of the trees timed (Figure 4)
speed_chains = (4, 8)  # chain windows timed
speed_contexts = 50  # evaluation contexts the timed frames cycle through
speed_repeats = 8  # the MINIMUM of timed frames per runner, interleaved (more until noise_target)
compare_model = "qwen3-tts-0.6b-random"  # real-size architecture, RANDOM weights: verify cost only
compare_repeats = 4  # the minimum of timed rounds of the real-size verify cost curve
noise_target = 0.05  # every timing goes on until the relative standard error of each median is at most this, or 4 x
#                      its minimum (rvqspec_lib.eval.noise; None: exactly the repeats above). Smoke: None
temperatures = (1.5, 1.2, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1)  # code-predictor temperatures of the sweep
temperature_budget = 16  # N of both trees in the sweep
temperature_frames = 60  # calibration and evaluation frames per temperature
write_trees = False  # True (not smoke): write the calibration beside the model (<model>/trees/heads.json), where
#                      `rvqspec synth --decoder tree:calibrated:N` and `--decoder auto` read it; `make paper` leaves
#                      the shipped file as it is and writes 04_trees_heads.json
cpu_sizes = {"n_calibration_frames": 100, "n_eval_frames": 32, "budgets": (2, 8, 32), "chains": (2, 4),
             "speed_budgets": (2, 8, 32), "speed_chains": (4,), "speed_contexts": 8, "speed_repeats": 4,
             "temperatures": (1.2, 0.9, 0.5, 0.2), "temperature_frames": 24}
#            a full run on a real-size checkpoint on a machine with no GPU: these in place of the sizes above (numbers:
#            the smaller), so that `make paper` fits 90 minutes on 2 cores; None or {}: the sizes above
#            (paper.checkpoint.cpu_sized)

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.common.paths import REPO_ROOT
from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from tools.results_doc import entry, headline
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.data.utterances import embedded_root
from paper.notebook_measures import cost_growth_words, shipped_split_sizes
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET, tree_from_calibration
from rvqspec_lib.decoding.drafters import ReusedHeads
from paper import plots
from rvqspec_lib.eval import speed as S
from bench import frames as BF
from rvqspec_lib.eval.calibration import BUDGETS, KINDS, calibrate, calibration_frames
from paper.calibration_checks import point_mass_overtakes, predicted_vs_measured, temperature_sweep
from rvqspec_lib.models.frame import inner_sampling
from bench.latency import PAPER_TOKENS_PER_CALL
from paper import notebook_measures as M
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.timing import measure_quietly
from paper.verify_calls import record_verify_calls
from rvqspec_lib.models.backends import available, verify_backend
from rvqspec_lib.models.loader import EMBEDDED_MODEL, load_model
from paper.checkpoint import cpu_sized, is_checkpoint, not_here, prepare_checkpoint, takes_cpu_sizes
from rvqspec_lib.models.named_decoders import drafter_calibration, has_paper_decoder, resolve, resolve_all
from rvqspec_lib.models.tree_files import save_calibration, tree_file

t_start = time.perf_counter()
compare_asked = compare_model
if smoke:
    n_calibration_frames, n_eval_frames, draws = min(n_calibration_frames, 48), min(n_eval_frames, 32), 1
    budgets, chains, tree_budgets, speed_budgets, speed_chains = (2, 4, 8), (2, 4), (4, 8), (2, 8), (4,)
    speed_contexts, speed_repeats, compare_repeats, noise_target = 4, 2, 2, None
    temperatures, temperature_frames = (0.9, 0.3), 24
    if compare_model == "qwen3-tts-0.6b-random":  # the default: its tiny stand-in (a model given by name is kept)
        compare_model = "tiny-random"
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
if threads:  # two threads on a busy 2-core machine spin-wait
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
cpu_run = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes, device="cpu")  # real size: it measures on the CPU
(n_calibration_frames, n_eval_frames, budgets, chains, speed_budgets, speed_chains, speed_contexts, speed_repeats,
 temperatures, temperature_frames) = cpu_sized("04", dict(
    n_calibration_frames=n_calibration_frames, n_eval_frames=n_eval_frames, budgets=budgets, chains=chains,
    speed_budgets=speed_budgets, speed_chains=speed_chains, speed_contexts=speed_contexts,
    speed_repeats=speed_repeats, temperatures=temperatures, temperature_frames=temperature_frames),
    cpu_sizes, applies=cpu_run).values()
if is_checkpoint(model):  # a released checkpoint: its own frames (rvqspec prepare's stages), its own verify cost
    prepare_checkpoint(model, smoke=smoke, notebook="04", out_dir=out, seed=seed,
                       cpu_sizes=cpu_sizes)  # prepared on the best device, sized for it
    if compare_model in ("qwen3-tts-0.6b-random", "tiny-random"):  # the default: the checkpoint is real size itself
        compare_model = model
try:
    embedded_root(model)
    run_model = model
except FileNotFoundError:  # calibration needs trained weights and frames of real speech
    run_model, compare_model = EMBEDDED_MODEL, model
    not_here("04", f"trees calibrated on {model}", "random weights built in memory: the embedded model is "
             "calibrated instead, the model timed as the compare model", "04_metrics.json")
    display(Markdown(f"**`{model}` ships no calibration utterances: this notebook calibrates the embedded model "
                     f"instead**, and times `{model}` as the compare model of section 6 (its verify cost curve)."))
if smoke and compare_model == "tiny-random" != compare_asked:
    display(Markdown(f"**Smoke run:** `{compare_model}` runs in place of `{compare_asked}`; where the text says "
                     f"real-size or 0.6B, read `{compare_model}`, and read every number as a check that the code "
                     "runs, not a measurement."))
budgets = tuple(sorted({int(b) for b in budgets}))
params = dict(notebook="04_calibrating_the_tree", model=model, run_model=run_model, seed=seed, smoke=bool(smoke),
              out_dir=str(out), threads=torch.get_num_threads(), n_calibration_frames=n_calibration_frames,
              n_eval_frames=n_eval_frames, budgets=list(budgets), chains=list(chains), draws=draws,
              tree_budgets=list(tree_budgets), fig2_budget=fig2_budget, backends=list(backends),
              speed_budgets=list(speed_budgets), speed_chains=list(speed_chains), speed_contexts=speed_contexts,
              speed_repeats=speed_repeats, compare_model=compare_model, compare_repeats=compare_repeats,
              noise_target=noise_target, temperatures=list(temperatures), temperature_budget=temperature_budget,
              temperature_frames=temperature_frames, write_trees=bool(write_trees), cpu_sized=cpu_run)
prov = provenance(params, seed=seed)
timings = {}
print(f"model {run_model}, outputs -> {out}")

# %% [markdown]
# ## 1. The model, the frames, the sampling
#
# Two disjoint splits of the model's shipped utterances. **Calibration frames**: contexts of the `calibration` split
# (teacher-forced on real speech), their codes 1..15 sampled again from p by AR decoding at the deployed sampling,
# so the tables describe exactly the codes a decoder will verify. **Evaluation frames**: contexts of the `evaluation`
# split, decoded by each decoder itself: the held-out check of every prediction. The paper calibrated on
# LibriSpeech and evaluated on Fleurs, the same separation.

# %%
# on the CPU whatever `make paper DEVICE=...` says: section 6 times this model through the native backend (CPU only)
lm = load_model(run_model, device="cpu", dtype="float32")
cp = lm.code_predictor
sampling = inner_sampling(lm)
n_codes = lm.n_code_groups - 1
t0 = time.perf_counter()
cal_frames = calibration_frames(lm, max_frames=n_calibration_frames, seed=seed, progress=True)
eval_frames = frames_from_shipped(lm, "evaluation", max_frames=n_eval_frames, seed=seed, progress=True)
timings["frames_s"] = time.perf_counter() - t0
has_paper = has_paper_decoder(lm)
offsets_cal = drafter_calibration(lm, "offsets") if has_paper else None
split = shipped_split_sizes(run_model)["calibration"]
display(pd.DataFrame([{"split": "calibration", "frames used": len(cal_frames),
                       "utterances": int(torch.unique(cal_frames.utterance).numel())},
                      {"split": "evaluation", "frames used": len(eval_frames),
                       "utterances": int(torch.unique(eval_frames.utterance).numel())}]))
display(Markdown(
    f"The shipped calibration split (`{os.path.relpath(split['file'], REPO_ROOT)}`): **{split['utterances']} "
    f"utterances, {split['frames']} frames**; this notebook calibrates the reused heads on {len(cal_frames)} of its "
    f"frames (`n_calibration_frames`). Sampling: {plots.sampling_words(sampling)} (the model's generation config); "
    f"{n_codes} codes a frame come from the code predictor. "
    + (f"The shipped offsets drafter comes with its own calibration ({offsets_cal['n_frames']} calibration frames, "
       "`trees/offsets.json`): with its point-mass tree it is the paper's decoder, `paper:N`."
       if has_paper else f"**`{run_model}` ships no offsets drafter with a calibration: the paper's decoder is left "
       "out below** (train it with `rvqspec train-drafter`, calibrate with `rvqspec prepare`).")))

# %% [markdown]
# ## 2. What one drafted node is worth
#
# For every calibration frame and every start depth s, one teacher-forced pass gives the target p of each later
# depth and the drafter's q for each offset t. Two tables follow (`rvqspec_lib.eval.calibration.calibrate`):
#
# * **point-mass**, exact given the prefix: `rank_mass[s, t, r] = E[p(x_r)]`, the probability that the rank-r code
#   of q is the code the verifier draws;
# * **sampled**: the probability that the i-th child drawn from q without replacement is the one accepted, once its
#   parent is reached; the children are drawn by Monte Carlo (`draws` per frame and start depth), the acceptance of
#   each draw computed exactly by Sequoia's rule. Child 0 is kept with `sum min(p, q)` = 1 − TV(p, q).
#
# All four panels below share ONE colour scale: the point here is how the two kinds compare, which separate scales
# would hide.

# %%
t0 = time.perf_counter()
cal = calibrate(cp, ReusedHeads(), cal_frames, sampling=sampling, budgets=budgets if smoke else BUDGETS,
                draws=draws, seed=seed)
timings["calibrate_s"] = time.perf_counter() - t0
cal["provenance"] = prov
trees_path = tree_file(run_model, "heads")
if write_trees and not smoke and trees_path is not None and run_model == model:
    where = save_calibration(cal, trees_path)
else:
    where = save_calibration(cal, out / "04_trees_heads.json")
pm_tab = np.array(cal["point-mass"]["table"], dtype=float)  # (offsets, ranks), start depths pooled
sp_tab = np.array(cal["sampled"]["table"], dtype=float)  # (offsets, children)
offsets_idx = pd.Index(range(1, pm_tab.shape[0] + 1), name="offset")
save_table(pd.DataFrame(pm_tab, index=offsets_idx, columns=[f"rank {r}" for r in range(pm_tab.shape[1])])
           .reset_index(), out / "04_rank_mass", prov,
           caption=f"E[p(x_r)] of the rank-r draft at offset t, start depths pooled; {run_model}, reused heads, "
                   f"{cal['n_frames']} calibration frames")
save_table(pd.DataFrame(sp_tab, index=offsets_idx, columns=[f"child {i}" for i in range(sp_tab.shape[1])])
           .reset_index(), out / "04_child_acceptance", prov,
           caption=f"P(the i-th sampled child is accepted | its parent reached) at offset t, start depths pooled; "
                   f"{run_model}, reused heads, {cal['n_frames']} calibration frames, {draws} draws each")
by_s = [{"kind": kind, "start_depth": s + 1, **{f"offset {t + 1}": v[0] for t, v in enumerate(row)}}
        for kind in KINDS for s, row in enumerate(cal[kind]["by_start_depth"])]
save_table(by_s, out / "04_acceptance_by_start_depth", prov,
           caption="point-mass: target mass of the rank-0 draft; sampled: acceptance of the first child; by start "
                   "depth s and offset t (empty: s + t past the frame)")
fig = plots.plot_acceptance_heatmaps(
    cal, title=f"{run_model}, reused heads: what one drafted node is worth ({cal['n_frames']} calibration frames, "
               f"{plots.sampling_words(sampling)})")
save_figure(fig, out / "04_acceptance_heatmap", prov)
plt.show()
ratio_first = sp_tab[0, 0] / pm_tab[0, 0]
ratio_pooled = np.nanmean(sp_tab[:, 0]) / np.nanmean(pm_tab[:, 0])
display(Markdown(
    f"At offset 1 the first sampled child is kept with probability {sp_tab[0, 0]:.3f}, the top-ranked point-mass "
    f"draft with {pm_tab[0, 0]:.3f}: the sampled child is kept **{ratio_first:.1f} times as often** as the "
    f"point-mass node ({ratio_pooled:.1f} times as often averaged over offsets). Further point-mass ranks add "
    f"{pm_tab[0, 1]:.3f}, {pm_tab[0, 2]:.3f}, ... each (the target mass of codes q ranks lower), further sampled "
    f"children {sp_tab[0, 1]:.3f}, {sp_tab[0, 2]:.3f}, ... (the leftover mass of p the first child missed). "
    + (f"Both fall with the offset (at offset {pm_tab.shape[0]} the first sampled child to {sp_tab[-1, 0]:.3f}, the "
       f"top-ranked point-mass draft to {pm_tab[-1, 0]:.3f}): a "
       f"draft from H_s knows less about depth s + t the larger t is."
       if pm_tab[-1, 0] < pm_tab[0, 0] and sp_tab[-1, 0] < sp_tab[0, 0] else "")))

# %% [markdown]
# ## 3. The calibrated trees
#
# Pooled over start depths, each table grows a tree greedily (`rvqspec_lib.decoding.trees.grow_tree`): one node at
# a time, the most valuable node whose parent is already in, where a node's value is the product of the table's
# entries along its path. The tree of node budget N is the root and the first N − 1 drafted nodes added, so every
# budget's tree extends the smaller ones. Each is titled with E(N), the tokens per call it is predicted to reach per
# frame (defined in section 5).
# Columns are draft offsets; labels are ranks (point-mass) or child indices (sampled).

# %%
show_n = [b for b in tree_budgets if b in cal["budgets"]]
fig = plots.plot_calibrated_trees(cal, show_n, title=f"{run_model}: greedy calibrated trees of the reused heads")
save_figure(fig, out / "04_trees", prov)
plt.show()
shape_rows = []
for kind in KINDS:
    for b in show_n:
        tr = tree_from_calibration(cal, kind, b)
        widths = np.bincount([len(p) for p in tr.paths])
        shape_rows.append({"kind": kind, "nodes": b, "deepest_offset": max(len(p) for p in tr.paths),
                           "widest_offset": int(np.argmax(widths)), "nodes_at_widest": int(widths.max()),
                           "predicted_tokens_per_call": cal[kind]["predicted_tokens_per_call"][str(b)]})
shape = pd.DataFrame(shape_rows)
display(Markdown("Columns: `nodes` is the node budget N, the root included (N − 1 drafted nodes); `deepest_offset` "
                 "the largest offset a drafted node reaches; `widest_offset` the offset holding the most drafted "
                 "nodes, and `nodes_at_widest` how many; `predicted_tokens_per_call` is E(N)."))
display(shape)
big = show_n[-1]
pm_big, sp_big = (shape[(shape.kind == k) & (shape.nodes == big)].iloc[0] for k in KINDS)
display(Markdown(
    f"At N = {big} the point-mass tree reaches offset {pm_big.deepest_offset} with {pm_big.nodes_at_widest} drafted "
    f"nodes at offset {pm_big.widest_offset}; the sampled tree reaches offset {sp_big.deepest_offset}"
    + (". A point-mass node is worth little, so the builder spends the budget on siblings near the root; a sampled "
       "first child is worth much, so the builder goes deep along first children"
       if pm_big.deepest_offset < sp_big.deepest_offset else "")
    + f". Predicted: E({big}) = {pm_big.predicted_tokens_per_call:.2f} (point-mass) against "
      f"{sp_big.predicted_tokens_per_call:.2f} (sampled)."))

# %% [markdown]
# ### Greedy growth and E(N) by hand
#
# The same builder on a table small enough for a pencil: three offsets, three ranks, each entry the probability that
# the rank-r draft at offset t is accepted once its parent is (for the point-mass table above, its target mass).
#
# | offset t | rank 0 | rank 1 | rank 2 |
# |---|---|---|---|
# | 1 | 0.50 | 0.20 | 0.10 |
# | 2 | 0.60 | 0.15 | 0.05 |
# | 3 | 0.70 | 0.10 | 0.05 |
#
# A node's value is the product of the entries along its path: (0, 0) is 0.50 × 0.60 = 0.30. Start with the root's
# children, (0) 0.50, (1) 0.20, (2) 0.10, as candidates, and repeat: add the candidate of highest value, then make its
# children candidates.
#
# 1. add (0), 0.50; new candidates (0, 0) 0.30, (0, 1) 0.075, (0, 2) 0.025;
# 2. add (0, 0), 0.30; new (0, 0, 0) 0.21, (0, 0, 1) 0.03, (0, 0, 2) 0.015;
# 3. add (0, 0, 0), 0.21 (it beats (1), 0.20; offset 3 is the table's last, so no children);
# 4. add (1), 0.20; new (1, 0) 0.12, (1, 1) 0.03, (1, 2) 0.01;
# 5. add (1, 0), 0.12 (it beats (2), 0.10).
#
# Each added node is reached and accepted with its value, so one round (one verify call, far from the frame's end)
# is expected to commit 1 (the code the verifier always adds) plus the sum of the values: after 5 drafted nodes, a
# node budget of N = 6 query positions, 1 + 0.50 + 0.30 + 0.21 + 0.20 + 0.12 = 2.33 codes per round. That is not
# yet E(N): E(N) counts per frame (section 5), where the prefill call commits one code and drafts past the frame's
# last depth are cut, so it is lower. Below, the library does the same on the same table: it pools its
# per-start-depth tables with `pool_by_offset`, grows with `grow_tree` and sums one round with `expected_tokens`
# (`calibrate` then turns the rounds into E(N) per frame).

# %%
from rvqspec_lib.decoding.trees import expected_tokens, grow_tree
from rvqspec_lib.eval.calibration import pool_by_offset

hand_table = [[0.50, 0.20, 0.10], [0.60, 0.15, 0.05], [0.70, 0.10, 0.05]]  # offset t = 1, 2, 3; ranks 0, 1, 2
by_pencil = [((0,), 0.50), ((0, 0), 0.30), ((0, 0, 0), 0.21), ((1,), 0.20), ((1, 0), 0.12)]  # the steps above
pooled_hand = pool_by_offset(np.array([hand_table]))  # one start depth: the table itself
lib_order = grow_tree(pooled_hand, len(by_pencil), sampled=False)
hand_rows = [{"step": i + 1, "by pencil": str(pp), "value by pencil": pv, "library": str(lp),
              "value (library)": round(expected_tokens([lp], pooled_hand) - 1.0, 6),
              "codes per round after this step (library)": round(expected_tokens(lib_order[: i + 1], pooled_hand), 6),
              "agrees": pp == lp and abs(pv - (expected_tokens([lp], pooled_hand) - 1.0)) < 1e-9}
             for i, ((pp, pv), lp) in enumerate(zip(by_pencil, lib_order))]
display(Markdown(
    f"The library adds the nodes in the order {', '.join(str(p) for p in lib_order)} and expects "
    f"{expected_tokens(lib_order, pooled_hand):.2f} codes per round for N = {len(lib_order) + 1}: "
    + ("every step agrees with the pencil." if all(r["agrees"] for r in hand_rows) else
       "the steps marked False in `agrees` differ from the pencil: redo them by hand.")))
pd.DataFrame(hand_rows)

# %% [markdown]
# ### From rounds to E(N) per frame, by hand
#
# The same tree and table, now in a frame of only n = 4 codes (a real frame has more; the rule is the same), with
# the table taken as the same at every start depth. The first call of a frame (the prefill) commits one code, depth 1,
# and drafts nothing. After that, from the last committed depth s, a round can draft only offsets up to
# min(3, n − s): drafts past the frame's last depth are cut. The chance that a round keeps at least i drafts,
# reach(i), is the sum of the values of the tree's nodes at offset i: 0.50 + 0.20 = 0.70, 0.30 + 0.12 = 0.42 and
# 0.21; so it keeps exactly 0, 1, 2 or 3 drafts with 0.30, 0.28, 0.21 and 0.21. A round commits its kept drafts
# plus the verifier's code, except when the drafts reached depth n: then no code is left to add. Let C(s) be the
# calls still expected from depth s; C(4) = 0:
#
# * C(3) = 1: one code is left, and one call commits it whatever happens;
# * C(2) = 1 + 0.30 · C(3) + (0.28 + 0.42) · C(4) = 1.30 (two offsets left, so reach(2) = 0.42 and nothing deeper);
# * C(1) = 1 + 0.30 · C(2) + 0.28 · C(3) + (0.21 + 0.21) · C(4) = 1 + 0.39 + 0.28 = 1.67.
#
# A frame then takes 1 + C(1) = 2.67 calls for its 4 codes: E(N) = 4 / 2.67 = 1.50 tokens per call, well below the
# 2.33 codes of a round far from the frame's end. `calibrate` does this for every budget with the frame's real
# number of codes and the per-start-depth tables (`rvqspec_lib.eval.acceptance.predicted_tokens_per_call`); below,
# that function on the same small frame.

# %%
from rvqspec_lib.decoding.decoders import Tree
from rvqspec_lib.eval.acceptance import predicted_tokens_per_call

n_hand = 4
per_depth = np.repeat(np.array([hand_table]), n_hand - 1, axis=0)  # (start depth, offset, rank): the same table
e_hand_lib = predicted_tokens_per_call({"alpha": per_depth[..., 0], "rank_mass": per_depth},
                                       Tree([tuple(x) for x in lib_order], sampled=False), n_hand)
c3 = 1.0
c2 = 1.0 + 0.30 * c3
c1 = 1.0 + 0.30 * c2 + 0.28 * c3
e_hand_pencil = n_hand / (1.0 + c1)
display(Markdown(
    f"By pencil E(6) = {n_hand} / {1.0 + c1:.2f} = {e_hand_pencil:.4f}; the library gives {e_hand_lib:.4f}: "
    + ("they agree." if abs(e_hand_lib - e_hand_pencil) < 1e-9 else "they differ: redo the pencil steps.")
    + f" This notebook's frames have {cal['n_codes']} codes, so the prefill and the cut weigh less there than here."))

# %% [markdown]
# ## 4. A calibrated tree and its verify attention mask (the paper's Figure 2, here)
#
# The paper's decoder at the paper's node budget: the shipped offsets drafter with its own calibrated point-mass tree
# (`paper:N`, resolved by `rvqspec_lib.models.named_decoders.resolve`; the reused heads' shipped tree where a model
# ships no offsets). The mask is not drawn from a formula: one evaluation frame is decoded through
# `decode_frame` and the `allow` mask the first verify call passed to the model is recorded
# (`paper.verify_calls.record_verify_calls`). Rows: the call's query positions (the root, then the nodes);
# columns: the frame's KV slots, the codes committed before the call, then the call's own. Each node sees the
# committed codes, the root and its own ancestors: its p is what AR along its path would give.

# %%
fig2 = resolve(f"paper:{fig2_budget}" if has_paper else f"tree:calibrated-point-mass:{fig2_budget}", lm)
calls = record_verify_calls(cp, eval_frames.context[:1], fig2.decoder, sampling=sampling, seed=seed)
first_verify = next(c for c in calls if c["kind"] == "verify")
fig = plots.plot_tree_and_mask(
    fig2.decoder.paths, first_verify, color=plots.decoder_color(fig2.fields()),
    title=f"{run_model}: {fig2.label}, the {fig2.name.drafter} drafter's calibrated point-mass tree "
          f"({fig2.calibration['n_frames']} calibration frames), and its first verify call's attention mask")
save_figure(fig, out / "04_tree_and_mask", {**prov, "decoder": fig2.label,
                                            "calibration_file": str(tree_file(lm, fig2.name.drafter))})
plt.show()

# %% [markdown]
# ## 5. Predicted E(N) against measured tokens per call, per drafter
#
# **E(N)** ([glossary](../docs/glossary.md)), the one definition this notebook uses: the tokens per call a tree of
# node budget N (the root and N − 1 drafted nodes) is predicted to reach **per frame**, the codes a frame commits
# over the verify calls it makes, the prefill call counted and drafts cut at the frame's last depth. It is computed
# from the calibration tables alone, offsets treated as independent (the model both the paper's calibration and
# Medusa's use). **Measured**: the same ratio when each decoder decodes the held-out evaluation contexts, all codes
# over all calls (`paper.calibration_checks.predicted_vs_measured`). Two drafters, each with ITS OWN calibration (a
# tree ranks the codes its drafter proposes): the reused heads calibrated in section 2, and the position-aware
# offsets shipped beside the model, trained and calibrated when the model was built (notebook 03 shows how they are
# trained), whose point-mass trees are the paper's decoder. Chains (window = N) are the sampled trees of one child
# per node.

# %%
t0 = time.perf_counter()
names = ([f"tree:calibrated-{k}:{b}" for k in KINDS for b in budgets] + [f"chain:{w}" for w in chains]
         + ([f"paper:{b}" for b in budgets] + [f"tree:calibrated-sampled:{b}@offsets" for b in budgets]
            + [f"chain:{w}@offsets" for w in chains] if has_paper else []))
pvm_rows = predicted_vs_measured(cp, resolve_all(names, lm, calibrations={"heads": cal}), eval_frames.context,
                                 calibrations={"heads": cal, "offsets": offsets_cal}, sampling=sampling, seed=seed)
timings["predicted_vs_measured_s"] = time.perf_counter() - t0
pvm = pd.DataFrame(pvm_rows)
save_table(pvm, out / "04_predicted_vs_measured", prov,
           caption=f"{run_model}: E(N) predicted from each drafter's own calibration against the tokens per call "
                   f"measured on {len(eval_frames)} held-out evaluation frames (seed {seed})")
fig = plots.plot_tokens_per_call_vs_n(
    pvm_rows, title=f"{run_model}: predicted E(N) and measured tokens per call, {len(eval_frames)} held-out frames")
save_figure(fig, out / "04_tokens_per_call_vs_N", prov)
plt.show()
trees_only = pvm[pvm.kind != "chain"]
err = {k: trees_only[trees_only.sampled == (k == "sampled")].relative_error for k in KINDS}
best_row = pvm.loc[pvm.measured_tokens_per_call.idxmax()]
heads_pm = pvm[(pvm.kind == "calibrated") & ~pvm.sampled.astype(bool)].set_index("nodes").measured_tokens_per_call
paper_tpc = pvm[pvm.kind == "paper"].set_index("nodes").measured_tokens_per_call
n_eval_utts = int(torch.unique(eval_frames.utterance).numel())
on_eval = f"on these {len(eval_frames)} held-out frames, from {n_eval_utts} utterance{'s' * (n_eval_utts != 1)},"
pm_above = int((err["point-mass"] > 0).sum())
err_tab = (trees_only.assign(tree=[f"{'sampled' if smp else 'point-mass'} ({d})" for smp, d in
                                   zip(trees_only.sampled.astype(bool), trees_only.drafter)],
                             relative_error_pct=100 * trees_only.relative_error)
           .pivot_table(index="nodes", columns="tree", values="relative_error_pct", aggfunc="first", sort=False))
display(Markdown("The relative error of each calibrated tree, in % (predicted E(N) / measured tokens per call - 1; "
                 "positive: the prediction is above the measurement), one row per node budget N, one column per kind "
                 "of tree and drafter (`heads`: the reused heads; `offsets`: the shipped offsets, whose point-mass "
                 "trees are `paper:N`). Each tree's predicted and measured tokens per call are in "
                 "`04_predicted_vs_measured.csv` beside this notebook's figures (`predicted_tokens_per_call`, "
                 "`measured_tokens_per_call`, `relative_error`)."))
display(err_tab.round(1))
shipped_heads = drafter_calibration(lm, "heads")
lines = [f"In this notebook `tree:calibrated-point-mass:N` and `tree:calibrated-sampled:N` are the reused heads' "
         f"trees of ITS OWN calibration (section 2, {cal['n_frames']} calibration frames)"
         + (f", not the trees shipped beside the model (`trees/heads.json`, {shipped_heads['n_frames']:,} frames) "
            "that notebooks 01, 06 and 07 read under the same names, so a name can commit other tokens per call "
            "there" if shipped_heads else "")
         + ("; `paper:N` and the names ending in `@offsets` use the offsets' shipped calibration "
            f"({offsets_cal['n_frames']:,} frames)." if has_paper else "."),
         f"Over the calibrated trees {on_eval} E(N) is off by at most {100 * err['point-mass'].abs().max():.1f}% "
         f"for point-mass trees (mean {100 * err['point-mass'].mean():+.1f}%) and "
         f"{100 * err['sampled'].abs().max():.1f}% for sampled trees (mean {100 * err['sampled'].mean():+.1f}%); a "
         f"positive error is a prediction above the measurement.",
         f"The most codes per call: `{best_row.decoder}`, {best_row.measured_tokens_per_call:.2f}."]
if pm_above == len(err["point-mass"]):
    lines.append(f"Each of the {len(err['point-mass'])} calibrated point-mass trees of the table above has its "
                 f"prediction above its measurement {on_eval[:-1]} (notebook 03's Table 2 "
                 "shows the same lean, its `tree_N32_predicted` above `tree_N32_tokens_per_call`). Two causes could "
                 "give that and this notebook does not separate them: the greedy builder keeps the nodes whose "
                 "calibration estimates are highest, so those estimates lean high on new frames; and E(N) multiplies "
                 "values along a path as if acceptance at one offset said nothing about the next.")
else:
    lines.append(f"{pm_above} of the {len(err['point-mass'])} calibrated point-mass trees of the table above "
                 f"have their prediction above their measurement {on_eval[:-1]}.")
if len(paper_tpc):
    n_max = int(paper_tpc.index.max())
    lines.append(f"The paper's decoder, `paper:{n_max}`, commits {paper_tpc[n_max]:.2f} codes per call; the reused "
                 f"heads' point-mass tree of the same N {heads_pm[n_max]:.2f}.")
display(Markdown(" ".join(lines)))

# %% [markdown]
# ## 6. The cost of a wider call: t(N)/t(1) per backend
#
# A tree of node budget N (the root and N − 1 drafted nodes) commits E(N) codes per call, per frame, but each of
# its calls processes N query positions. What matters is how the call's time grows with N: at the call level the
# speedup over stepped AR of the same backend (AR with one backend call per code, each call launched from Python;
# section 7 adds fused AR) is E(N) / (t(N)/t(1))
# ([methods.md](../docs/methods.md#choosing-the-node-budget)). One verify call of N positions after a few committed
# slots is timed through three backends of the registry (`rvqspec_lib.models.backends`): **official** (the
# transformers module), **eager** (the lean forward over the same weights, plain tensor code) and **native** (the
# whole call as one C function at the weight-streaming floor; [precision.md](../docs/precision.md#the-native-forward)),
# on the embedded model and on the real-size 0.6B architecture (RANDOM weights: the cost is real, nothing else). A
# CPU call of one position mostly streams the weights; extra positions reuse them, so t(N)/t(1) can stay near one
# while the arithmetic of N rows is small beside the streaming. Whether it does, and up to which N, depends on the
# model and the backend: the sentences after the table say it for each, from the measurements.
#
# **Where these ratios come from.** The backend's forward alone (`rvqspec_lib.eval.speed.verify_cost_curve`: no
# input projection, no head), every (backend, N) interleaved in this notebook's run. Notebook 01 times the whole
# call (input projection, layers and one head) in a run interleaved with talker steps, so its t(N)/t(1) of the same
# model differs from these.
#
# The last panel is a **PROJECTION, not a measurement** (`bench.frames.projected_speedup`, the function notebook 06
# calls too): E(N) per frame of this notebook's calibrated trees over the 0.6B architecture's measured t(N)/t(1),
# every call of a frame costed as one verify call of N positions; its title and the table's caption name both
# inputs and what is left out.

# %%
cost_backends = [b for b in backends if available(b)[0]]
t0 = time.perf_counter()
qs = sorted({1, *speed_budgets})


def cost_curve(code_predictor, random_weights: bool, repeats: int):
    """t(N)/t(1) of one verify call through every backend present, re-measured once if the CPU was crowded."""
    return measure_quietly(attempts=timing_attempts, meta=lambda r: r["meta"], measure=lambda: S.verify_cost_curve(
        code_predictor, {b: verify_backend(b, code_predictor) for b in cost_backends}, query_sizes=qs,
        repeats=repeats, seed=seed, random_weights=random_weights, noise_target=noise_target, progress=False))


cost, cost_quiet = cost_curve(cp, lm.is_random, max(3, speed_repeats // 2))
big_lm = load_model(compare_model, device="cpu", dtype="float32")
big_cost, big_quiet = cost_curve(big_lm.code_predictor, big_lm.is_random, max(2, compare_repeats))
big_is_random = bool(big_lm.is_random)
big_words = "RANDOM weights: cost only" if big_is_random else "trained weights"
big_lm = None  # the real-size model's memory back before the frames are timed
timings["verify_cost_s"] = time.perf_counter() - t0
cpu = cost["meta"]["cpu"]
cost_tab = pd.DataFrame([{"model": run_model, "weights": "random" if lm.is_random else "trained", **r}
                         for r in cost["rows"]]
                        + [{"model": compare_model, "weights": "random" if big_is_random else "trained", **r}
                           for r in big_cost["rows"]])
save_table(cost_tab, out / "04_verify_cost",
           {**prov, "meta": cost["meta"], "compare_meta": big_cost["meta"], "timing": [cost_quiet, big_quiet]},
           caption="; ".join(filter(None, [
               f"one verify call of N positions on {cpu}, {cost['meta']['threads']} thread(s); {run_model}: "
               f"{noise_words(cost['meta'])}; {compare_model} ({big_words}): "
               f"{noise_words(big_cost['meta'])}", cost_quiet["note"], big_quiet["note"]])))
proj_rows = [{"kind": kind, **r} for kind in KINDS
             for r in BF.projected_speedup(BF.expected_tokens_per_call(cal, kind), big_cost["rows"])]
proj_inputs = (f"E(N): tokens per call per frame predicted by {run_model}'s calibrated trees (reused heads, trained "
               f"weights, this notebook's {cal['n_frames']} calibration frames) over t(N)/t(1): one verify call of "
               f"{compare_model}'s code predictor ({'random' if big_is_random else 'trained'} weights) per backend on "
               f"{cpu}, timed here")
save_table(pd.DataFrame(proj_rows), out / "04_projection_compare_model", prov,
           caption=f"PROJECTION, not a measurement: {proj_inputs}; every call of a frame (the prefill counted) costed "
                   f"as one verify call of N positions; leaves out the heads and embeddings, the loop outside the "
                   f"call and the talker")
fig = plots.plot_verify_cost_curves(
    {f"{run_model} (trained weights)": cost["rows"], f"{compare_model} ({big_words})": big_cost["rows"]},
    projection=proj_rows, projection_title=f"E(N) of {run_model}, cost of {compare_model}",
    title=f"the cost of a wider verify call on {cpu}, {cost['meta']['threads']} thread(s)"
          + "".join(f"\n{n}: the times are pessimistic" for n in (cost_quiet["note"], big_quiet["note"]) if n))
save_figure(fig, out / "04_verify_cost", {**prov, "meta": cost["meta"]})
plt.show()
wide = cost_tab.pivot_table(index="query_positions", columns=["model", "backend"], values="ratio_to_q1")
display(wide.round(2))
n_top = max(qs)
flat = {b: cost_tab[(cost_tab.model == run_model) & (cost_tab.backend == b) & (cost_tab.query_positions == n_top)]
        .ratio_to_q1.iloc[0] for b in cost_backends}
n_at = PAPER_BUDGET if PAPER_BUDGET in set(cost_tab.query_positions) else n_top  # the paper's N where timed
big_flat = {b: cost_tab[(cost_tab.model == compare_model) & (cost_tab.backend == b)
                        & (cost_tab.query_positions == n_top)].ratio_to_q1.iloc[0] for b in cost_backends}
best_proj = max(proj_rows, key=lambda r: r["projected_speedup"])
cost_models = list(dict.fromkeys((run_model, compare_model)))
ratio_of = {(m, b): dict(zip(g.query_positions, g.ratio_to_q1)) for (m, b), g in cost_tab.groupby(["model", "backend"])}
steep = {m: max(cost_backends, key=lambda b: ratio_of[(m, b)][n_top]) for m in cost_models}
display(Markdown(
    f"A call of {n_top} positions costs "
    + ", ".join(f"{flat[b]:.2f}x ({b})" for b in cost_backends) + f" one of a single position on {run_model}, and "
    + ", ".join(f"{big_flat[b]:.2f}x ({b})" for b in cost_backends) + f" on {compare_model}. "
    + " ".join(f"On {m}, t(N)/t(1) by backend: " + "; ".join(f"{b} {cost_growth_words(ratio_of[(m, b)])}"
                                                              for b in cost_backends) + "." for m in cost_models)
    + f"\n\nPROJECTION for {compare_model}: at best {best_proj['projected_speedup']:.2f}x over stepped AR of the same "
    f"backend at the call level, {best_proj['kind']} trees of N = {best_proj['nodes']} through "
    f"{best_proj['backend']}: E({best_proj['nodes']}) = {best_proj['expected_tokens']:.2f} codes per call per frame "
    f"over t({best_proj['nodes']})/t(1) = {best_proj['cost_ratio']:.2f} ({proj_inputs}). Notebook 06 prints this "
    "projection from the same function (`bench.frames.projected_speedup`) with other inputs: "
    + (f"the calibration shipped beside the model (`trees/heads.json`, {shipped_heads['n_frames']} frames; at each N "
       "the better kind of tree)" if shipped_heads else "its own calibration")
    + " and its own timing of the verify call, so its peak differs from this one as much as those inputs do."))

# %% [markdown]
# ## 7. The paper's Figure 4 here: every decoder timed beside every AR
#
# Tokens per call overstates speed: a wider call costs more, and the loop around the calls costs time too
# ([methods.md](../docs/methods.md#reporting-speed)). So whole frames are timed, one at a time (batch 1, the streaming
# case), every runner on the same contexts with the same generator seed, in a shuffled order every round, through
# the registry (`rvqspec_lib.eval.speed.build_runners`, `time_frames`): AR, chains and both kinds of calibrated tree
# with the reused heads, and the paper's decoder, **stepped** (one backend call per round) through each backend; and
# the **fused** frames where a backend has them: the eager fused AR frame and fused chains (each round one graph,
# sampling inside), and the native whole frame (AR or a chain as ONE C call a frame). AR therefore runs several ways,
# and which is fastest is read off the rows below, not assumed. The paper measures speedup over AR of the same
# backend (top row); the bottom row puts every runner on one time axis beside every AR.

# %%
spec_names = (["ar", *(f"chain:{w}" for w in speed_chains)]
              + [f"tree:calibrated-{k}:{b}" for k in KINDS for b in speed_budgets if b in cal["budgets"]]
              + ([f"paper:{b}" for b in speed_budgets] if has_paper else []))
named = resolve_all(spec_names, lm, calibrations={"heads": cal})
runners, absent = S.build_runners(backends, cp, named, sampling=sampling)
t0 = time.perf_counter()
speed, speed_quiet = measure_quietly(
    attempts=timing_attempts, meta=lambda r: r["meta"], measure=lambda: S.time_frames(
        runners, eval_frames.context[:speed_contexts], repeats=speed_repeats, seed=seed, random_weights=lm.is_random,
        noise_target=noise_target, progress=False))
timings["speed_s"] = time.perf_counter() - t0
speed_rows = speed["rows"]
speed_tab = pd.DataFrame(speed_rows)
where_cpu = (f"{speed['meta']['cpu']}, {speed['meta']['threads']} thread(s), torch {speed['meta']['torch']}, "
             f"batch 1, {plots.sampling_words(sampling)}")
save_table(speed_tab, out / "04_speed", {**prov, "meta": speed["meta"], "timing": speed_quiet},
           caption="; ".join(filter(None, [f"{run_model} frames on {where_cpu}", noise_words(speed["meta"]),
                                           speed_quiet["note"]]
                                    + [f"{b} absent: {why}" for b, why in absent.items()])))
fig = plots.plot_frames_vs_n(speed_rows, title=f"the paper's Figure 4 on this CPU: {run_model}, measured; {where_cpu}"
                             + (f"\n{speed_quiet['note']}: the times are pessimistic" if speed_quiet["note"] else ""))
save_figure(fig, out / "04_speedup_vs_N", {**prov, "meta": speed["meta"]})
plt.show()
cols = ["decoder", "backend", "fused", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms", "outside_share",
        "speedup_vs_ar", "speedup_vs_fused"]
n_fastest = min(12, len(speed_tab))
display(Markdown(f"All {len(speed_tab)} timed runners are in `04_speed.csv` beside this notebook's figures; below, "
                 f"the {n_fastest} fastest runners (one row each, by median ms a frame), which the sentences after "
                 "the next table discuss."))
display(speed_tab[cols].sort_values("ms_per_frame").head(n_fastest).round(3))
display(Markdown("`outside_share`: the median share of a frame's time spent outside the backend's forward and the "
                 "heads, embeddings and drafts, i.e. in the loop around the calls (the accept walk, bookkeeping). "
                 "`ms_per_frame` is the median over the timed frames, `p10_ms` and `p90_ms` their 10th and 90th "
                 "percentiles; `speedup_vs_ar` is over stepped AR, `speedup_vs_fused` over the fused AR frame, each "
                 "of the same backend and precision (ratios of medians)."))
pred_of = pvm[pvm.kind.isin(["calibrated", "paper"])].set_index("decoder")
speed_pred = (speed_tab[speed_tab.decoder.isin(pred_of.index)].drop_duplicates("decoder")
              .assign(predicted=lambda d: pred_of.loc[d.decoder, "predicted_tokens_per_call"].to_numpy(),
                      point_mass=lambda d: ~pred_of.loc[d.decoder, "sampled"].astype(bool).to_numpy()))
speed_err = speed_pred.predicted / speed_pred.tokens_per_call - 1
n_speed_ctx = int(speed["meta"]["n_contexts"])  # the first evaluation contexts the timed rounds cycle through
n_speed_frames = min(speed_repeats, n_speed_ctx)  # distinct contexts among the rounds tokens per call counts
# one statement of what the timed frames are, used here and in the summary
n_timed = int(speed["meta"]["repeats"])  # timed rounds; every runner is timed once in each interleaved round
speed_target, speed_cap = speed["meta"].get("noise_target"), speed["meta"].get("max_repeats")
timed_frames_words = (
    f"{n_timed} timed frames per runner, one per interleaved round, "
    + (f"at least `speed_repeats` = {speed_repeats} rounds and then more until every runner's median has a relative "
       f"standard error of at most {100 * speed_target:g}% or the cap of {speed_cap} rounds is reached, and this run "
       + ("stopped at the cap" if n_timed >= speed_cap else "met the target first")
       if speed_target else f"exactly `speed_repeats` = {speed_repeats} rounds with no noise target")
    + "; "
    f"round r decoding context r mod {n_speed_ctx} of the first {n_speed_ctx} evaluation contexts with its own "
    f"generator draw; a timed row's tokens per call is the mean over its first {speed_repeats} rounds only"
    + (", which every run makes whatever the noise target adds" if speed_target else "")
    + f": {n_speed_frames} distinct context{'s' if n_speed_frames != 1 else ''}")
if len(speed_pred):
    pm_rows = speed_pred.point_mass.to_numpy()
    display(Markdown(
        f"These timed rows count tokens per call too: {timed_frames_words} (the mean of each frame's codes over its "
        f"calls). Those frames are neither section 5's {len(eval_frames)} evaluation frames nor the calibration "
        f"frames E(N) was computed on (this notebook's {len(cal_frames)} for the reused heads' trees"
        + ("; the shipped calibration's own for `paper:N`" if has_paper else "") + "): E(N) is a mean over "
        f"calibration frames, "
        f"while a few evaluation frames can have a p sharper or flatter than that mean (a top-ranked draft kept far "
        f"more or less often than the calibration's rate), so a timed row's tokens per call can sit well away from "
        f"E(N), and from section 5's value for the same tree. Against E(N), the {len(speed_pred)} trees timed here "
        f"are off by {100 * speed_err.min():+.1f}% to {100 * speed_err.max():+.1f}%; the point-mass trees' "
        f"predictions lie above these timed measurements in {int((speed_err[pm_rows] > 0).sum())} of the "
        f"{int(pm_rows.sum())} point-mass rows timed (section 5: {pm_above} of {len(err['point-mass'])} above on "
        f"its {len(eval_frames)} frames). Every timed row decodes the same contexts, so their errors move together. "
        "Section 5's verdicts speak of its own frames, not of these."))

# %%
over_ar = BF.speedups_over_ar(speed_rows)
save_table(over_ar, out / "04_speedup_over_each_ar", {**prov, "meta": speed["meta"]},
           caption=f"every AR of the run (stepped through each backend, each fused AR frame), fastest first, and the "
                   f"fastest lossless speculative decoders' speedup over it; one interleaved run on {where_cpu}")
display(pd.DataFrame(over_ar).round(3))
fastest = over_ar[0]
stepped_official = next((r for r in over_ar if r["backend"] == "official"), None)
others = "; ".join(f"{r['ar']} takes {r['ar_vs_fastest_ar']:.2f}x as long" for r in over_ar[1:])
speed_noise = speed["meta"].get("rel_se_max")  # the run's worst relative standard error of a median
noise_factor = M.noise_factor(speed_noise)


def gain_verdict(g):
    """A gain's verdict in words, with the factor to three decimals: the tie rule of every timing notebook
    (``paper.notebook_measures.read_gain``: within the noise factor 1 + 2 x the run's worst relative standard error of
    a median, either way, a tie; within ``EDGE_SHARE`` of the factor's margin, either side, at the edge)."""
    c = M.read_gain(g, speed_noise)
    if g is None:
        return ""
    if c is None:
        return " (too few timed frames to estimate this run's noise, so not a verdict)"
    inv = f"1/{g:.3f} = {1 / g:.3f}, " if g < 1 else ""  # a ratio below 1 is read as its inverse
    if c == "tie":
        return f" ({inv}within this run's noise factor of {noise_factor:.3f} either way: a tie)"
    if c == "edge":
        return (f" ({inv}{max(g, 1 / g):.3f} against this run's noise factor of {noise_factor:.3f}: at the edge of "
                f"noise, "
                f"{'faster' if g > 1 else 'slower'} or a tie)")
    return f" ({inv}beyond this run's noise factor of {noise_factor:.3f}: {c})"


lines = [f"The fastest AR here is **{fastest['ar']}**, {fastest['ar_ms']:.1f} ms a frame" + (f"; {others}" if others
                                                                                               else "") + ".",
         f"The lossless speculative runner with the shortest median is {fastest['fastest_speculative']}: a speedup "
         f"of {fastest['speedup']:.2f}x over the fastest AR{gain_verdict(fastest['speedup'])}"
         + (f", {stepped_official['speedup']:.2f}x over stepped AR through the official module"
            f"{gain_verdict(stepped_official['speedup'])}" if stepped_official else "") + "."]
if has_paper:
    lines.append(f"The paper's decoder at its fastest here, {fastest['paper_decoder']}: a speedup of "
                 f"{fastest['paper_speedup']:.2f}x over the fastest AR{gain_verdict(fastest['paper_speedup'])}"
                 + (f", {stepped_official['paper_speedup']:.2f}x over stepped official AR"
                    f"{gain_verdict(stepped_official['paper_speedup'])}" if stepped_official else "")
                 + ".")
lines.append("The tie rule is the one notebooks 06 and 07 use too: this run's medians have a relative standard error up to "
             + (f"{100 * speed_noise:.2f}%" if speed_noise else "an unknown amount here")
             + (" (a median's relative standard error is sqrt(pi/2) x 1.4826 x MAD / sqrt(n) / median over its n "
                "timed frames, MAD the median absolute deviation from the median: the normal approximation of a "
                "median's spread, sigma estimated robustly)")
             + (f", so a gain within a factor of {noise_factor:.3f} of 1 either way "
                "(twice that error) is a tie, and another run (notebook 07 times some of these runners again) may "
                "order tied runners the other way. A ratio below 1 (slower) is read as its inverse, 1/ratio, so both "
                "directions use the same factor. That factor rests on an estimated error, so the rule calls "
                f"a gain (or inverse) within {M.EDGE_SHARE * (noise_factor - 1):.3f} of it, either side, at the "
                "edge of "
                "noise: neither a tie nor a gain." if speed_noise else "."))
lines.append("Columns: `ar` names one AR (a backend, stepped or fused); `ar_ms` is that AR's median ms a frame; "
             "`ar_vs_fastest_ar` its time over the fastest AR's; `fastest_ar` is True on the row of the fastest AR "
             "of the run; `fastest_speculative` the lossless speculative runner with the shortest median, "
             "`same_backend_speculative` the shortest of the AR's own backend and precision, `paper_decoder` the "
             "paper's decoder at its fastest; "
             "`speedup` is the fastest lossless speculative runner's speedup over that AR, `same_backend_speedup` "
             "the fastest one of the AR's own backend and precision, `paper_speedup` the paper's decoder's.")
display(Markdown(" ".join(lines)))

# %% [markdown]
# The paper's device numbers (its Figure 4: Core ML on Apple devices, speedup over AR of the same device) stand in
# their own labelled columns, beside each backend's best measured here (the best stepped speculative decoder over
# stepped AR of the same backend, and its N, from section 7's run). Notebook 06's Figure 4 analogue times other
# decoders (the trees of the calibration shipped beside the model) over its own number of contexts of the same split,
# in its own run with its own timing noise, so its best speedups differ from these.

# %%
best_by_backend = {}
for r in BF.speedup_vs_n(speed_rows):
    if r["nodes"] > 1 and (r["backend"] not in best_by_backend
                           or r["speedup_vs_ar"] > best_by_backend[r["backend"]]["speedup_vs_ar"]):
        best_by_backend[r["backend"]] = r
device_rows = [{"where": f"this CPU, {b} backend", "decoder": r["decoder"], "best_N (measured)": r["nodes"],
                "speedup_vs_ar (measured)": r["speedup_vs_ar"], "paper: device (quoted)": None,
                "paper: N (quoted)": None, "paper: speedup (quoted)": None} for b, r in best_by_backend.items()]
device_rows += [{"where": "paper", "decoder": None, "best_N (measured)": None, "speedup_vs_ar (measured)": None,
                 "paper: device (quoted)": p["device"], "paper: N (quoted)": p["nodes"],
                 "paper: speedup (quoted)": p["speedup"]} for p in plots.PAPER_DEVICE_SPEEDUPS]
save_table(device_rows, out / "04_paper_devices", {**prov, "meta": speed["meta"]},
           caption=f"measured on {where_cpu} (speedup over stepped AR of the same backend, one interleaved run) beside "
                   f"the paper's quoted Core ML numbers (its Figure 4), each in its own columns")
pd.DataFrame(device_rows)

# %% [markdown]
# ## 8. Temperature: does a point-mass tree overtake a sampled tree as p sharpens?
#
# A point-mass child is worth the target mass of its code, which grows as p sharpens. A sampled child is kept with
# probability `sum min(p, q)`: the same formula for any p, flat or sharp, but the sum itself depends on how close q is
# to p, and q sharpens with p, so it can rise or fall with the temperature (the measurements below show which). So a
# point-mass tree should gain on a sampled tree as the temperature falls.
# For each code-predictor temperature the calibration codes are sampled again, both trees of N =
# `temperature_budget` are calibrated on them and decoded on held-out frames at that temperature
# (`paper.calibration_checks.temperature_sweep`). Whether, and where, the point-mass tree overtakes is printed
# from the measurements below the figure.

# %%
t0 = time.perf_counter()
temp_rows = temperature_sweep(cp, cal_frames.context[:temperature_frames], eval_frames.context[:temperature_frames],
                              temperatures=temperatures, budget=temperature_budget, sampling=sampling, seed=seed)
timings["temperature_s"] = time.perf_counter() - t0
save_table(temp_rows, out / "04_temperature", prov,
           caption=f"{run_model}, reused heads: both trees of N = {temperature_budget} calibrated and decoded at each "
                   f"code-predictor temperature ({temperature_frames} calibration and {temperature_frames} held-out "
                   f"frames; top-k {sampling.top_k})")
fig = plots.plot_temperature_sweep(temp_rows, title=f"{run_model}: which kind of tree wins as p sharpens")
save_figure(fig, out / "04_temperature", prov)
plt.show()
overtake = point_mass_overtakes(temp_rows)
temp_tab = pd.DataFrame(temp_rows)
tpc_at = temp_tab.pivot(index="temperature", columns="kind", values="measured_tokens_per_call")
t_low = float(min(temperatures))
said = (f"The point-mass tree commits more codes per call than the sampled tree at temperature(s) "
        f"{', '.join(f'{t:g}' for t in overtake)}" if overtake else
        "The point-mass tree overtakes the sampled tree at **none** of the temperatures tried")
said += (f": at the sharpest, T {t_low:g}, {tpc_at.loc[t_low, 'point-mass']:.2f} against "
         f"{tpc_at.loc[t_low, 'sampled']:.2f} codes per call (N {temperature_budget}).")
deployed = temp_tab[temp_tab.temperature == sampling.temperature]
if len(deployed):
    said += (f" At the deployed T {sampling.temperature:g} p puts {deployed.top1_target_mass.iloc[0]:.3f} of its "
             f"mass on q's top-ranked code at offset 1 (`top1_target_mass`, p(argmax q): the chance a rank-0 "
             f"point-mass draft is kept, not p's own top-code mass max_x p(x)) on average over this sweep's "
             f"{temperature_frames} frames, "
             f"their codes sampled again (section 2's table, over every calibration frame, says {pm_tab[0, 0]:.3f}); "
             f"at T {t_low:g}, {temp_tab[temp_tab.temperature == t_low].top1_target_mass.iloc[0]:.3f}.")
display(Markdown(said))

# %% [markdown]
# ## What this notebook showed, and why

# %%
pm_best = pvm[(pvm.kind == "calibrated") & ~pvm.sampled.astype(bool)].measured_tokens_per_call.max()
sp_best = pvm[(pvm.kind == "calibrated") & pvm.sampled.astype(bool)].measured_tokens_per_call.max()
worst_err = max(err["point-mass"].abs().max(), err["sampled"].abs().max())
fastest_t1 = {m: min(cost_backends, key=lambda b: cost_tab[(cost_tab.model == m) & (cost_tab.backend == b)
                                                          & (cost_tab.query_positions == 1)].median_ms.iloc[0])
              for m in cost_models}
streaming_first = [m for m in cost_models if steep[m] == fastest_t1[m]]  # steepest = fastest single-position call
pm_by_t = tpc_at["point-mass"]
pm_gains = pm_by_t.loc[t_low] > pm_by_t.loc[max(pm_by_t.index)]
gap_shrinks = (tpc_at.loc[t_low, "sampled"] - tpc_at.loc[t_low, "point-mass"]
               < tpc_at.loc[max(pm_by_t.index), "sampled"] - tpc_at.loc[max(pm_by_t.index), "point-mass"])
paper_best_n = {}  # the paper's fastest node budget per device (quoted, plots.PAPER_DEVICE_SPEEDUPS)
for r in plots.PAPER_DEVICE_SPEEDUPS:
    d = r["device"].replace(" (paper, Core ML)", "")
    if d not in paper_best_n or r["speedup"] > paper_best_n[d][1]:
        paper_best_n[d] = (r["nodes"], r["speedup"])
paper_best_n = {d: n for d, (n, _) in paper_best_n.items()}
paper_at_budget = [r["speedup"] for r in plots.PAPER_DEVICE_SPEEDUPS if r["nodes"] == PAPER_BUDGET]
summary = {
    "model": run_model, "n_codes": n_codes, "sampling": sampling.describe(), "calibration_frames": cal["n_frames"],
    "eval_frames": len(eval_frames), "trees_file": str(where), "paper_decoder": {
        "available": bool(has_paper), "calibration_frames": offsets_cal["n_frames"] if has_paper else None,
        "figure2": fig2.label},
    "acceptance": {"first_sampled_child_offset1": float(sp_tab[0, 0]), "top_rank_mass_offset1": float(pm_tab[0, 0]),
                   "ratio_offset1": float(ratio_first), "ratio_pooled": float(ratio_pooled)},
    "tree_shapes": shape_rows, "predicted_vs_measured": pvm_rows,
    "max_abs_relative_error": {k: float(err[k].abs().max()) for k in KINDS},
    "verify_cost": cost_tab.to_dict("records"), "projection": proj_rows, "speed": speed_rows,
    "speed_meta": speed["meta"], "absent_backends": absent, "speedups_over_ar": over_ar,
    "best_by_backend": best_by_backend, "paper_devices": [dict(p) for p in plots.PAPER_DEVICE_SPEEDUPS],
    "temperature": temp_rows, "point_mass_overtakes_at": overtake,
    "timings_s": {**timings, "total": time.perf_counter() - t_start},
}
# what a reader most wants from this notebook (docs/results.md, generated): the paper's decoder, predicted against
# measured, and what speculation gains over the fastest AR on this CPU
who = lm.name + (" (RANDOM weights)" if lm.is_random else " (small trained model)" if lm.name == "embedded" else "")
pap_n = PAPER_BUDGET if PAPER_BUDGET in budgets else max(budgets)  # the paper's N; smoke's largest below it
pap_row = next((r for r in pvm_rows if r["decoder"] == f"paper:{pap_n}"), None) if has_paper else None
on_cpu = f"{who}, timed on this CPU ({speed['meta']['threads']} thread(s))"
summary["headline"] = headline(
    entry(f"tokens per call of the paper's decoder (paper:{pap_n}), predicted from its calibration, {who}",
          pap_row and pap_row["predicted_tokens_per_call"], "", "04_predicted_vs_measured.md"),
    entry(f"tokens per call of the paper's decoder (paper:{pap_n}), measured on {len(eval_frames)} held-out "
          f"frames, {who}", pap_row and pap_row["measured_tokens_per_call"], "", "04_predicted_vs_measured.md"),
    entry(f"time a frame takes through the fastest AR ({fastest['ar']}), {on_cpu}", fastest["ar_ms"], "ms",
          "04_speedup_over_each_ar.md"),
    entry(f"speedup of the fastest lossless speculative decoder ({fastest['fastest_speculative']}) over the fastest "
          f"AR ({fastest['ar']}), {on_cpu}", fastest["speedup"], "x", "04_speedup_over_each_ar.md", glance=True),
    entry(f"speedup of the paper's decoder at its fastest ({fastest['paper_decoder']}) over the fastest AR, {on_cpu}",
          fastest["paper_speedup"] if has_paper else None, "x", "04_speedup_over_each_ar.md"),
)
save_json(summary, out / "04_metrics.json", prov)
bullets = [
    f"* **What a node is worth (measured, {run_model}).** At offset 1 the first sampled child is kept "
    f"{ratio_first:.1f} times as often as the top-ranked point-mass draft: a point-mass child is kept with p(x), and "
    f"this model's p puts {pm_tab[0, 0]:.3f} of its mass on q's top code at offset 1 (the mean over the "
    f"{cal['n_frames']} calibration frames, whose codes 1..15 are p's own samples, and over the start depths, "
    f"after the deployed warpers; not p's own top-code mass max_x p(x), which bounds it from above), while a "
    f"sampled child is kept with sum min(p, q) = {sp_tab[0, 0]:.3f}.",
    "* **The trees (measured).** "
    + ("So the greedy builder spends a point-mass budget on siblings near the root and a sampled one on depth; "
       if ratio_first > 1 and pm_big.deepest_offset < sp_big.deepest_offset else "")
    + f"on held-out frames the best point-mass tree commits {pm_best:.2f} codes per call, the "
    f"best sampled tree {sp_best:.2f}. E(N) from the calibration tables alone is within {100 * worst_err:.1f}% of "
    f"every calibrated tree's measurement {on_eval[:-1]} (chains are not predicted)"
    + ((": on these frames a tree could be chosen without decoding" if n_eval_utts >= 5 else
        f": frames of {n_eval_utts} utterance{'s' * (n_eval_utts != 1)} suggest, not show, that a tree could be "
        "chosen without decoding") if worst_err < 0.1 else
       ": the independence of offsets it assumes costs accuracy on this model")
    + (f". Section 7's timed rows, whose tokens per call count {n_speed_frames} frames each, scatter more "
       f"({100 * speed_err.min():+.1f}% to {100 * speed_err.max():+.1f}% against E(N)): too few frames to check a "
       "prediction." if len(speed_pred) else ".")]
if len(paper_tpc):
    gap = paper_tpc[n_max] / heads_pm[n_max] - 1
    bullets.append(
        f"* **The paper's decoder (measured).** The shipped offsets with their own point-mass tree commit "
        f"{paper_tpc[n_max]:.2f} codes per call at N = {n_max}, {100 * gap:+.1f}% against the reused heads' point-mass "
        f"tree of that N" + ("; on this model the point-mass rule, more than the drafter, sets the tree's yield."
                             if abs(gap) < 0.05 else "."))
best_class = {b: M.read_gain(r["speedup_vs_ar"], speed_noise) for b, r in best_by_backend.items()}
bullets += [
    f"* **The cost of a wider call (measured, {cpu}, the backend's forward alone).** A call of {n_top} positions "
    f"costs " + ", ".join(f"{flat[b]:.2f}x ({b})" for b in cost_backends)
    + f" a single-position call on {run_model}, "
    + ", ".join(f"{big_flat[b]:.2f}x ({b})" for b in cost_backends) + f" on {compare_model}: at N = {n_top} the "
    "steepest backend is " + " and ".join(f"{steep[m]} on {m}" for m in cost_models)
    + (f". On {' and '.join(streaming_first)} that is the backend with the fastest single-position call: a call of "
       "one position mostly streams weights, so the faster a backend streams them, the sooner the extra rows' "
       "arithmetic shows." if streaming_first else ".")
    + " Notebook 01's ratios time the whole call (projection and head too) in another run, so they differ.",
    f"* **Which AR is fastest (measured).** {fastest['ar']}, {fastest['ar_ms']:.1f} ms a frame. The speculative "
    f"runner with the shortest median, {fastest['fastest_speculative']}, is {fastest['speedup']:.2f}x as fast as "
    f"that AR{gain_verdict(fastest['speedup'])}"
    + (f", and {stepped_official['speedup']:.2f}x as fast as stepped official AR"
       f"{gain_verdict(stepped_official['speedup'])}" if stepped_official else "")
    + ". Speculation saves calls; a fused or native AR frame removes the cost around each call instead, and the "
      "figure compares both on one clock.",
    "* **Best node budget (measured) against the paper's (quoted).** The best stepped speculative decoder of each "
    "backend here (speedup over stepped AR of the same backend) sits at "
    + ", ".join(f"N = {r['nodes']} ({b}, {r['speedup_vs_ar']:.3f}x)" for b, r in best_by_backend.items())
    + (f" (against this run's noise factor of {noise_factor:.3f}: " + "; ".join(
        f"{len(bs)} of {len(best_by_backend)} {words}" + (f": {', '.join(bs)}" if bs else "")
        for words, bs in (
            ("within it, i.e. ties with stepped AR", [b for b, c in best_class.items() if c == "tie"]),
            (f"at its edge, within {M.EDGE_SHARE * (noise_factor - 1):.3f} of it either side",
             [b for b, c in best_class.items() if c == "edge"]),
            ("beyond it", [b for b, c in best_class.items() if c in ("faster", "slower")]))
        if bs or words.startswith("within")) + ")"
       if noise_factor and best_by_backend else "")
    + f": section 7's one run ({timed_frames_words}), with this notebook's calibration. "
    "Notebook 06 times other decoders (the shipped calibration's trees) over its own number of contexts in its own "
    "run, so its best speedups differ. The paper's fastest N per device (speedup over AR on the same device, "
    "quoted): " + ", ".join(f"N = {n} on {d}" for d, n in paper_best_n.items()) + ".",
    (f"* **Temperature (measured).** The point-mass tree overtakes the sampled tree at T "
     f"{', '.join(f'{t:g}' for t in overtake)}: as p sharpens its nodes gain what the sampled children already had."
     if overtake else
     f"* **Temperature (measured).** The point-mass tree overtakes the sampled tree at none of the temperatures "
     f"tried, down to T {t_low:g}" + (", though it gains on it as p sharpens." if gap_shrinks else ".")),
    f"* **What the RELEASED checkpoint should show.** The paper reports {PAPER_TOKENS_PER_CALL} tokens per call for "
    f"its offsets with a point-mass tree of N = {PAPER_BUDGET} on the released 0.6B model, and "
    f"{min(paper_at_budget):.2f}x-{max(paper_at_budget):.2f}x at N = {PAPER_BUDGET} on Apple devices (speedup over AR "
    "on the same device). Inference, "
    "not measured here: a point-mass tree reaches that only if the released code predictor's p puts far more mass "
    "on q's top codes than the embedded model's does"
    + (" (section 8: point-mass trees gain as p sharpens)" if pm_gains else "") + f", and a best N "
    f"of {PAPER_BUDGET} needs a device on which a call of {PAPER_BUDGET} positions costs little more than one "
    f"(here a call of {n_at} positions costs "
    + " and ".join(f"{min(v):.2f}x-{max(v):.2f}x one on {m}" for m, v in (
        (m, [ratio_of[(m, b)][n_at] for b in cost_backends]) for m in cost_models))
    + ", over the backends). The speedups of "
    f"{compare_model} above are projections from the embedded model's acceptance; "
    + ("notebook 07 times frames" if smoke else "notebook 07 times the released size's frames")
    + " as a **timing replay** (a frame on a random-weight architecture in which everything is real except the "
      "accept step, whose decisions come from acceptance measured on a trained model: real times at that size, "
      "meaningless codes)"
    + (", in a smoke run on its own small stand-in, not the released size." if smoke else "."),
]
display(Markdown("\n".join(bullets)))
print(f"total {summary['timings_s']['total']:.0f} s")

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **In section 3's hand-worked table, change one entry of `hand_table`**, e.g. the rank-1 mass at offset 1 from
#   `0.20` to `0.40`: redo the greedy growth by pencil, write your steps into `by_pencil` (the cell's list of
#   (path, value) pairs), then rerun the cell; the library's order must agree with yours.
# * **`temperatures = (0.9, 0.1, 0.05, 0.02)`**: colder temperatures than the sweep's; look at whether the
#   point-mass curve reaches the sampled one (a colder p is more peaked, the regime of notebook 03's section 10).
# * **`budgets = (2, 8, 32)`**: fewer node budgets; compare predicted with measured tokens per call in the relative
#   error table of section 5 (its columns are the relative error in %).
