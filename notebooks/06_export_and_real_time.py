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
# # 05 — Export and timing: the graphs a device runs, and speedup vs node budget per backend
#
# The paper measures its speed on Apple devices through Core ML: **2.13×** on an M3 Pro and **2.34×** on an iPhone 17
# Pro Max at N = 32, **1.82×** on an iPhone 12 at N = 16, falling to **1.21×** at N = 64 (its Figure 4: speedup of
# RVQ token generation over autoregressive decoding vs the node budget N of the verify call). This notebook builds
# the graphs such a deployment runs and times them on the backends this machine has:
#
# * **three exportable graphs** over the official weights (`rvqspec_lib.models.export_graphs`): *stepped* (one
#   position per call, KV cache as state, logits of every head), *fused verify* (the root and N − 1 drafted nodes in
#   one call, tree mask and positions as inputs, the verifier's logits for every node and the drafter's logits for
#   the next round), *fused frame* (all 15 codes in one call, top-k sampling inside with Gumbel noise as an input);
# * each exported to **ONNX** (run and checked here with ONNX Runtime) and **Core ML** (`.mlpackage`, KV cache as
#   `ct.StateType`, macOS 15 / iOS 18; built here, predicted on macOS only), float32 and float16, their sizes and
#   their agreement with eager PyTorch;
# * **frame times per backend** (torch eager, torch.compile, ONNX Runtime; Core ML and CUDA where present): AR, the
#   fused AR frame (the strongest non-speculative baseline) and speculative decoders with calibrated trees of every
#   node budget N, interleaved; speedup over AR **of the same backend** vs N, and the speedup the verify cost curve
#   of the real-size architecture projects, `E(N) × t(1) / t(N)`.
#
# Acceptance comes from `model` (the small trained embedded model: its trees are calibrated on its calibration split
# and its frames come from its evaluation split); exported sizes and call costs from `cost_model` (the real-size 0.6B
# architecture, random weights: its timings are real, its outputs mean nothing). Backends that are not here are
# listed as absent, never estimated. The paper's numbers appear only in their own labelled column.
#
# **The paper's decoder** (`paper`: the position-aware offsets shipped beside the model + their own calibrated
# point-mass tree, N = 32) gets its own section: its verify graph exported with the paper's tree (the library call
# `rvqspec export --graph verify --decoder paper` makes) and checked against eager PyTorch, and its frames timed
# beside AR, the fused AR frame, a chain and the reused heads' calibrated tree of the same N. It needs trained
# offsets, so it runs on the embedded model whenever `model` ships none (and says so).

# %% tags=["parameters"]
model = "embedded"  # acceptance and measured frame times (trained weights)
cost_model = "qwen3-tts-0.6b-random"  # exported sizes, agreement and verify cost curves (RANDOM weights, timing only)
seed = 0
smoke = False  # True: tiny-random for both, budgets 2 and 4, two repeats, float32 exports (headless test, ~2 min)
out_dir = "figures"  # relative paths resolve against the repository root
threads = 1  # torch and ONNX Runtime threads (the committed figures use 1)
repeats = 8  # the MINIMUM of timed frames per condition (median reported; more until noise_target is met)
noise_target = 0.05  # every timing goes on until the relative standard error of each median is at most this, or 4 x repeats
#                      (rvqspec_lib.eval.noise; None: exactly `repeats`). Smoke: None
warmup = 2  # untimed frames per condition (compiled backends compile there)
budgets = [2, 4, 8, 16, 32, 64]  # node budgets N of the calibrated trees
chains = [2, 4, 8]  # chain windows timed beside the trees
backends = ["eager", "compile", "onnx", "native", "coreml", "cuda"]
calib_frames = 128  # calibration-split frames the trees are calibrated on
eval_frames = 32  # evaluation-split frames whose contexts are decoded in the timing
gpu_json = "figures/05_gpu.json"  # written by scripts/gpu_bench.py on a GPU machine; shown when present
paper_budget = 32  # node budget of the paper's decoder (`paper:N`; 32 is the paper's)
table_repeats = 3  # the minimum of timed frames per decoder in the table to act on (`rvqspec bench --table`'s default)
table_backends = ("eager", "native")  # the table's backends (of those in `backends` that run here); "native": the C
#                               forward and the whole frame in C; "compile" adds compiled rows in every native
#                               precision, minutes each (compiled float32 frames: section above)

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.common.paths import REPO_ROOT
from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from rvqspec_lib.eval import export_timing as T
from rvqspec_lib.eval import paper_decoder as PD
from rvqspec_lib.eval.calibration import calibrate
from rvqspec_lib.data.frame_sources import frames_from_contexts, frames_from_shipped
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.speed import format_rows, random_contexts
from rvqspec_lib.models import export_formats as F
from rvqspec_lib.models.loader import EMBEDDED_MODEL, load_model
from rvqspec_lib.decoding.drafters import ReusedHeads

run_model = "tiny-random" if smoke else model
run_cost_model = "tiny-random" if smoke else cost_model
run_budgets = [2, 4] if smoke else [int(n) for n in budgets]
run_chains = [2] if smoke else [int(w) for w in chains]
run_repeats = min(int(repeats), 2) if smoke else int(repeats)
run_noise_target = None if smoke else noise_target  # smoke: the fixed small count (fast)
run_warmup = min(int(warmup), 1) if smoke else int(warmup)
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
n_calib = 16 if smoke else int(calib_frames)
n_eval = 4 if smoke else int(eval_frames)
run_paper_budget = 4 if smoke else int(paper_budget)
skipped = {"compile": "skipped in smoke mode (compiling every call shape takes minutes)"} if smoke else {}
run_backends = [b for b in backends if b not in skipped]
if threads:
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
work = Path(tempfile.mkdtemp(prefix="rvqspec-05-"))  # exported files (not results): removed at the end
params = dict(model=run_model, cost_model=run_cost_model, requested_model=str(model),
              requested_cost_model=str(cost_model), seed=seed, smoke=bool(smoke), out_dir=str(out),
              threads=torch.get_num_threads(), repeats=run_repeats, warmup=run_warmup, budgets=run_budgets,
              chains=run_chains, backends=list(backends), calib_frames=n_calib, eval_frames=n_eval,
              paper_budget=run_paper_budget, table_repeats=1 if smoke else int(table_repeats),
              table_backends=list(table_backends),
              noise_target=run_noise_target,
              notebook="05_export_and_timing")
print(f"model {run_model}, cost model {run_cost_model}, outputs -> {out}")

# %% [markdown]
# ## The backends on this machine
# A backend that is not here is reported with the reason; nothing is estimated for it.

# %%
backend_rows = T.backend_table(backends)
for r in backend_rows:
    if r["backend"] in skipped:
        r["reason"] = skipped[r["backend"]]
backends_df = pd.DataFrame(backend_rows)
save_table(backends_df, out / "05_backends", provenance(params, seed=seed))
backends_df

# %% [markdown]
# ## The exported graphs, their sizes, and their agreement with eager PyTorch
# Each graph of `cost_model` is exported to ONNX and Core ML in float32 and float16 (smoke: stepped and verify,
# float32). The reference is the **official module in float32, eager**. ONNX files run here with ONNX Runtime (CPU);
# Core ML packages are checked for the inputs, outputs and states they declare and run only on macOS 15+. The
# tolerance is on the max abs logit difference relative to the largest logit, `export_timing.RELATIVE_TOLERANCE`
# per precision: float32 allows summation order only, float16 its rounding (as does every Core ML package: its
# KV-cache states are float16). The frame graph outputs codes: the
# share equal to eager PyTorch's for the same noise is shown (float16 may flip near-tied codes).

# %%
lm = load_model(run_model, seed=seed)
cp = lm.code_predictor.eval()
cost_lm = lm if run_cost_model == run_model else load_model(run_cost_model, seed=seed)
cost_cp = cost_lm.code_predictor.eval()
verify_nodes = 4 if smoke else 32
agreement = T.numerical_agreement(
    cost_cp, graphs=("stepped", "verify") if smoke else ("stepped", "verify", "frame"),
    dtypes=("float32",) if smoke else ("float32", "float16"), formats=("onnx", "coreml"), nodes=verify_nodes,
    work_dir=work / "graphs")
graphs_df = pd.DataFrame(agreement["rows"])
graphs_df["MB"] = graphs_df["bytes"] / 1e6
show_cols = [c for c in ("graph", "format", "dtype", "nodes", "MB", "export_s", "interface_ok", "runner",
                         "max_abs_logit_diff", "relative_diff", "tolerance", "within_tolerance", "codes_equal_frac",
                         "note") if c in graphs_df]
save_table(graphs_df[show_cols], out / "05_exported_graphs", provenance(params, seed=seed))
graphs_df[show_cols]

# %% [markdown]
# ## Trees calibrated on `model`, for every node budget N
# The best tree of each node budget (point-mass or sampled children, whichever predicts more tokens per call) from
# the calibration split (`rvqspec_lib.eval.calibration`). The calibration file is also what `scripts/gpu_bench.py`
# times on a GPU.

# %%
if run_model == "embedded":
    calib = frames_from_shipped(lm, "calibration", max_frames=n_calib)
    contexts = frames_from_shipped(lm, "evaluation", max_frames=n_eval).context
else:  # no speech for this model here: its own samples from random contexts (self-distillation)
    calib = frames_from_contexts(cp, random_contexts(cp, n_calib, seed=seed + 1), seed=seed)
    contexts = random_contexts(cp, n_eval, seed=seed)
calibration = calibrate(cp, ReusedHeads(), calib, budgets=run_budgets, seed=seed)
save_json(calibration, out / "05_calibration.json", provenance(params, seed=seed))
decoders = T.decoders_by_budget(calibration, run_budgets, chains=run_chains)
calib_df = pd.DataFrame([{"N": n, "kind": calibration["best_kind"][str(n)],
                          "expected_tokens_per_call": T.expected_tokens_per_call(calibration)[n],
                          "predicted_frame_tokens_per_call":
                              calibration[calibration["best_kind"][str(n)]]["predicted_tokens_per_call"][str(n)]}
                         for n in run_budgets])
calib_df

# %% [markdown]
# ## Frame times per backend, interleaved
# Every (decoder, backend) condition decodes the same frames in a shuffled order each repeat; the fused AR frame of
# each backend is timed beside them. `model_ms` is the backend's verify call, `heads_ms` the heads, embeddings and
# drafts (PyTorch for every backend: the protocol's `logits` and `embed`), `outside_ms` the loop. Speedups are over
# AR of the same backend, measured in the same run.

# %%
# an oversubscribed CPU (eval.bench.OTHER_CPU_LIMIT) is re-measured once; if it still is, titles and captions say so
from rvqspec_lib.eval.bench import measure_quietly

timing, timing_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: T.frame_times(
    cp, contexts, decoders, run_backends, repeats=run_repeats, warmup=run_warmup, seed=seed,
    threads=torch.get_num_threads(), work_dir=work / "backend", random_weights=lm.is_random,
    noise_target=run_noise_target), meta=lambda r: r["meta"])
prov = {**provenance(params, seed=seed), "timing": timing_quiet}
frames_df = pd.DataFrame(timing["rows"])
save_table(frames_df, out / "05_frame_times", prov,
           caption="; ".join(filter(None, [noise_words(timing["meta"]), timing_quiet["note"]])))
summary = T.summary_by_backend(timing["rows"])
summary_df = pd.DataFrame(summary)
save_table(summary_df, out / "05_summary", prov, caption=timing_quiet["note"] or None)
absent = {**timing["absent"], **skipped}
m = timing["meta"]
display(Markdown(
    f"**{run_model}** ({'random' if lm.is_random else 'trained'} weights), {m.get('cpu')}, {m.get('dtype')}, "
    f"{m.get('threads')} thread(s), {noise_words(m) if m.get('repeats') else f'{run_repeats} repeats'}; "
    f"other processes used "
    f"{100 * (m.get('other_cpu_frac') or 0):.0f}% of the machine's CPU time during the run. Absent: "
    + ("; ".join(f"**{k}**: {v}" for k, v in absent.items()) or "none") + "."))
display(Markdown(format_rows(summary, digits=2)))
frames_df[["decoder", "backend", "nodes", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms", "model_ms",
           "heads_ms", "outside_ms", "speedup_vs_ar", "speedup_vs_fused"]]

# %% [markdown]
# ## Figure 4's analogue: speedup vs node budget N, per backend
# Solid: measured frames of `model` (the best speculative decoder of each N: the calibrated tree, or a chain of the
# same N). Dashed: the speedup the verify cost curve of `cost_model` projects for `model`'s expected tokens per call,
# `E(N) × t(1) / t(N)` (call level: the prefill and the loop are left out). Dotted: the fused AR frame. Black
# markers: the paper's devices (Core ML), quoted.

# %%
measured = T.speedup_vs_n(timing["rows"])
costs, costs_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: T.verify_costs(
    cost_cp, [b for b in run_backends if b not in ("coreml", "cuda")], query_sizes=sorted({1, *run_budgets}),
    repeats=run_repeats, warmup=run_warmup, threads=torch.get_num_threads(), work_dir=work / "cost",
    random_weights=cost_lm.is_random, progress=True, built=timing["built"] if cost_cp is cp else None,
    noise_target=run_noise_target), meta=lambda r: r.get("meta", {}))
projected = T.projected_speedup(T.expected_tokens_per_call(calibration), costs["rows"])
prov = provenance(params, seed=seed)
table = []
for n in run_budgets:
    row = {"N": n}
    for b in dict.fromkeys(r["backend"] for r in measured):
        hit = next((r for r in measured if r["backend"] == b and r["nodes"] == n), None)
        row[f"{b} measured ({run_model})"] = hit and hit["speedup_vs_ar"]
    for b in dict.fromkeys(r["backend"] for r in projected):
        hit = next((r for r in projected if r["backend"] == b and r["nodes"] == n), None)
        row[f"{b} PROJECTION (E(N) of {run_model}, cost of {run_cost_model})"] = hit and hit["projected_speedup"]
    row["paper (Core ML devices, quoted)"] = "; ".join(f"{p['device'].split(' (')[0]} {p['speedup']}x"
                                                       for p in T.PAPER_DEVICE_SPEEDUPS if p["nodes"] == n)
    table.append(row)
speedup_df = pd.DataFrame(table)
cost_weights = "random" if cost_lm.is_random else "trained"
projection_caption = (
    f"measured columns: frames of {run_model} timed here, speedup over AR of the same backend. PROJECTION columns "
    f"(not measurements): E(N), the tokens per call predicted from {run_model}'s calibration ({'random' if lm.is_random else 'trained'} "
    f"weights, reused heads), x t(1)/t(N) of one verify call of {run_cost_model}'s code predictor ({cost_weights} "
    f"weights) through that backend; they leave out the prefill, the talker, the heads and drafts, and the loop "
    f"outside the call. The paper's Core ML numbers are quoted in their own column")
save_table(speedup_df, out / "05_speedup_vs_n", prov,
           caption=projection_caption + (f"; {timing_quiet['note']}" if timing_quiet["note"] else ""))
save_table(pd.DataFrame(costs["rows"]), out / "05_verify_cost", {**prov, "cost_timing": costs_quiet},
           caption=f"{run_cost_model}: {cost_weights} weights, timing only"
                   + (f"; {noise_words(costs['meta'])}" if costs.get("meta", {}).get("repeats") else "")
                   + (f"; {costs_quiet['note']}" if costs_quiet["note"] else ""))
save_table(pd.DataFrame(T.PAPER_DEVICE_SPEEDUPS), out / "05_paper_devices", prov)
fig = T.plot_speedup_vs_n(measured, projected, fused=summary,
                          title=f"{run_model} frames measured ({m.get('cpu')}, {m.get('threads')} thread(s)); dashed: "
                                f"PROJECTION = E(N) of {run_model} x t(1)/t(N) of {run_cost_model} ({cost_weights} "
                                f"weights), prefill and loop left out"
                                + (f"\n{timing_quiet['note']}: the times are pessimistic" if timing_quiet["note"]
                                   else ""))
save_figure(fig, out / "05_speedup_vs_n", prov)
plt.show()
speedup_df

# %% [markdown]
# ## The paper's decoder: its verify graph, exported, and its frames timed
# The paper's decoder drafts with the offsets shipped beside the model and verifies through THEIR calibrated
# point-mass tree (`<model>/trees/offsets.json`); the reused heads' point-mass tree of the same N comes from the
# heads' own calibration (`<model>/trees/heads.json`). The verify graph holds the tree's mask and positions (the
# drafter stays outside the graph, like the heads): exported to ONNX with the paper's tree by
# `rvqspec_lib.models.export_formats.export_graph` and checked by `rvqspec_lib.eval.export_timing.check_file`, as
# `rvqspec export --graph verify --decoder paper` does. The frames are timed interleaved through torch eager and
# ONNX Runtime, as above. (Smoke: N = 4.)

# %%
paper_lm = lm if PD.has_paper_decoder(lm) else load_model(EMBEDDED_MODEL)
paper_model = run_model if paper_lm is lm else EMBEDDED_MODEL
if paper_lm is not lm:
    display(Markdown(f"**`{run_model}` ships no offsets drafter with a calibration: the paper's decoder is measured on "
                     f"`{paper_model}` (trained weights) in this section.**"))
paper_cp = paper_lm.code_predictor.eval()
n_pap = run_paper_budget
paper_decs = PD.named_decoders(paper_lm, ["ar", f"chain:{min(n_pap, 8)}", f"tree:calibrated-point-mass:{n_pap}",
                                          f"paper:{n_pap}"])
PAPER = f"paper-N{n_pap}"
paper_decs = {("AR" if k == "ar" else k): d for k, d in paper_decs.items()}
paper_tree = paper_decs[PAPER].tree(0)  # the graph holds the tree, not the drafter
paper_path = work / "paper" / f"verify-n{n_pap}-float32.onnx"
paper_path.parent.mkdir(parents=True, exist_ok=True)
paper_export = F.export_graph(paper_cp, "verify", "onnx", paper_path, dtype="float32", nodes=n_pap, tree=paper_tree)
paper_check = T.check_file(paper_cp, "verify", paper_path, dtype="float32", nodes=n_pap, tree=paper_tree)
paper_graph = [{"model": paper_model, "decoder": PAPER, "graph": "verify", "format": "onnx", "dtype": "float32",
                "nodes": n_pap, "MB": paper_export["bytes"] / 1e6, "export_s": paper_export["export_s"],
                "interface_ok": paper_export["declared"] == paper_export["written"],
                **{k: r.get(k) for k in ("runner", "ran", "relative_diff", "tolerance", "within_tolerance")}}
               for r in paper_check]
paper_contexts = frames_from_shipped(paper_lm, "evaluation", max_frames=n_eval).context
paper_timing, paper_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: T.frame_times(
    paper_cp, paper_contexts, paper_decs, [b for b in run_backends if b in ("eager", "onnx")], repeats=run_repeats,
    warmup=run_warmup, seed=seed, threads=torch.get_num_threads(), work_dir=work / "paper-backend",
    random_weights=paper_lm.is_random, noise_target=run_noise_target), meta=lambda r: r["meta"])
prov_paper = {**provenance({**params, "paper_model": paper_model}, seed=seed), "timing": paper_quiet}
save_table(paper_graph, out / "05_paper_export", prov_paper)
paper_frames_df = pd.DataFrame(paper_timing["rows"])
save_table(paper_frames_df, out / "05_paper_frame_times", prov_paper,
           caption=f"{paper_model}: the paper's decoder ({PAPER}: offsets + their own point-mass tree) beside AR, "
                   f"the fused AR frame, a chain and the reused heads' point-mass tree of the same N; "
                   f"{noise_words(paper_timing['meta'])}" + (f"; {paper_quiet['note']}" if paper_quiet["note"] else ""))
lines = []
for b in dict.fromkeys(paper_frames_df.backend):
    d = paper_frames_df[paper_frames_df.backend == b].set_index("decoder")
    heads_n = f"tree-pm-N{n_pap}"
    if PAPER in d.index:
        lines.append(f"* {b}: {PAPER} {d.loc[PAPER, 'ms_per_frame']:.2f} ms a frame, "
                     f"{d.loc[PAPER, 'tokens_per_call']:.3f} tokens per call, {d.loc[PAPER, 'speedup_vs_ar']:.2f}x "
                     f"over AR" + (f"; the heads' {heads_n}: {d.loc[heads_n, 'ms_per_frame']:.2f} ms, "
                                   f"{d.loc[heads_n, 'speedup_vs_ar']:.2f}x" if heads_n in d.index else ""))
display(Markdown(f"**The paper's decoder on `{paper_model}`** (exported verify graph: "
                 + "; ".join(f"{r['runner']} relative difference {r['relative_diff']:.2g}, within tolerance: "
                             f"{r['within_tolerance']}" for r in paper_graph if r.get("ran")) + ")\n\n"
                 + "\n".join(lines)))
paper_frames_df[["decoder", "backend", "nodes", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms", "model_ms",
                 "heads_ms", "outside_ms", "speedup_vs_ar", "speedup_vs_fused"]]

# %% [markdown]
# ## On a GPU: CUDA graphs (scripts/gpu_bench.py)
# The same comparison for the real-size architecture in bfloat16 on one GPU, every verify call shape and the fused
# frame captured as CUDA graphs, and the fused speculative rounds (one graph per start depth) beside the fused AR
# frame. The JSON is written by `python scripts/gpu_bench.py` on a GPU machine.

# %%
gpu_path = Path(gpu_json) if Path(gpu_json).is_absolute() else REPO_ROOT / gpu_json  # an input: read, not written
gpu = json.loads(gpu_path.read_text()) if gpu_path.is_file() else None
if gpu is None:
    display(Markdown(f"**No GPU results**: `{gpu_json}` does not exist (no GPU was available when this ran; run "
                     "`python scripts/gpu_bench.py` on a GPU machine to write it)."))
else:
    display(Markdown(f"GPU results from `{gpu_json}`: {gpu['device']}, {gpu['model']} in {gpu['dtype']}, CUDA graphs "
                     f"{'on' if gpu['cuda_graphs'] else 'off'}{' (DRY RUN on the CPU)' if gpu['dry_run'] else ''}, "
                     f"written {gpu['provenance'].get('timestamp', '?')}."))
    display(Markdown(format_rows(gpu["summary"], digits=2)))
    display(Markdown(format_rows(gpu["speedup_vs_n"], digits=2)))
    if gpu.get("fused_spec"):  # JSONs written before the fused rounds were captured have no such rows
        display(Markdown("The fused speculative rounds as CUDA graphs beside the fused AR frame (`x_fused_ar`: ms "
                         "per frame over the fused AR frame's, below 1 the speculative frame is the faster):\n\n"
                         + format_rows(gpu["fused_spec"], digits=2)))
    if gpu["projected"]:
        display(Markdown(format_rows(gpu["projected"], digits=2)))

# %% [markdown]
# ## Core ML on this machine
# On macOS 15+ the packages are predicted and timed per compute unit (CPU only, CPU and GPU, CPU and Neural
# Engine); elsewhere this section says so.

# %%
ok, why = F.coreml_available()
coreml_rows = []
if ok:
    coreml_rows = T.coreml_call_times(cost_cp, work / "coreml", nodes=run_budgets, repeats=run_repeats)["rows"]
    save_table(pd.DataFrame(coreml_rows), out / "05_coreml_calls", provenance(params, seed=seed))
    display(pd.DataFrame(coreml_rows))
else:
    display(Markdown(f"**Core ML not run here**: {why}"))

# %% [markdown]
# ## The table to act on
# The same table `rvqspec bench --table` and `make bench` print (`rvqspec_lib.eval.bench_table.bench_table`): per
# precision this CPU runs natively and per backend, the rows stepped AR, fused AR, the best speculative decoder, the
# fused speculative round (one graph a round; beside the fused AR frame, `x_fused_ar` their ratio) and `auto`'s
# choice, in ms per frame and as the inner loop's real-time factor (ms per frame over the 80 ms a frame lasts), for
# `model` and for `cost_model`. A random-weight model's speculative frames are a **timing replay**: its real verify
# calls, with the acceptance decisions replayed from the embedded model's calibration (every row says so; a replay
# has no fused speculative row, its acceptance being inside the round's graph). Beside them the AR frame's weight-streaming floor, and under them the public ports' published figures, quoted
# and labelled, never in a measured column. Its backends are `table_backends` (eager and native by default: native
# runs every call through the C forward, its fused AR frame and fused chains as one C call a frame; compiling the fused
# rounds of every precision takes many minutes; the compiled float32 frames are in the frame times above, and
# `rvqspec bench --table --backends eager,native,compile` times the compiled rows). Smoke: `tiny-random`, float32,
# eager and native, one frame per decoder.

# %%
from rvqspec_lib.eval.bench_table import bench_table, format_bench_table, save_bench_table

table_res = bench_table(
    models=["tiny-random"] if smoke else list(dict.fromkeys([run_model, run_cost_model])),
    precisions=["float32"] if smoke else None,
    backends=[b for b in ("eager", "native", "compile") if b in run_backends and (smoke or b in table_backends)
              and T.backend_status(b)[0]],
    repeats=params["table_repeats"], warmup=0 if smoke else 1,
    chains=(4,) if smoke else (3, 4, 6), budgets=(4,) if smoke else (4, 8, 16), auto_frames=2 if smoke else 4,
    n_contexts=2 if smoke else 8, seed=seed, progress=False, noise_target=run_noise_target)
save_bench_table(table_res, out / "05_bench_table", provenance(params, seed=seed))
print(format_bench_table(table_res).splitlines()[0])
display(pd.DataFrame(table_res["rows"]))
display(Markdown("\n".join(f"* {line}" for line in table_res["footer"])))

# %%
import shutil

shutil.rmtree(work, ignore_errors=True)
onnx_summary = next((r for r in summary if r["backend"] == "onnx"), None)
metrics = {
    "model": run_model, "cost_model": run_cost_model, "random_weights": lm.is_random,
    "cost_random_weights": cost_lm.is_random, "backends": backend_rows, "absent": absent, "skipped": skipped,
    "exported": agreement["rows"], "calibration_budgets": run_budgets,
    "frame_rows": timing["rows"], "summary": summary, "onnx": onnx_summary,
    "speedup_vs_n": measured, "projected": projected, "verify_cost": costs["rows"],
    "paper_devices": list(T.PAPER_DEVICE_SPEEDUPS), "gpu": None if gpu is None else {
        k: gpu[k] for k in ("device", "model", "dtype", "dry_run", "summary", "speedup_vs_n", "projected")},
    "gpu_json_present": gpu is not None, "coreml_available": ok, "coreml_reason": why, "coreml_calls": coreml_rows,
    "meta": timing["meta"], "bench_table": table_res,
    "paper_decoder": {"model": paper_model, "label": PAPER, "nodes": n_pap, "export": paper_graph,
                      "frame_rows": paper_timing["rows"], "absent": paper_timing["absent"]},
}
save_json(metrics, out / "05_metrics.json", provenance(params, seed=seed))
print(json.dumps({"summary": summary, "absent": absent}, indent=1, default=str))
