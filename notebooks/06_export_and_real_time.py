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
# # 06 — Export and real time: the graphs a device runs, and the whole frame as a listener hears it
#
# The paper measures its speed on Apple devices through Core ML, for the **inner loop** alone (codes 1..15 of each
# frame): its Figure 4 plots the speedup of that loop over autoregressive decoding against the node budget N of the
# verify call, and its Section 1 (Figure 1) says that the decoder from audio tokens to waveform "adds negligible
# throughput demand". This notebook has two parts.
#
# **Export.** The three graphs a deployment runs, built over the official weights
# (`rvqspec_lib.device.export_graphs`): *stepped* (one position per call, the KV cache as state), *fused verify* (the
# root and N − 1 drafted nodes in one call, the tree's mask and positions as inputs), *fused frame* (all 15 codes in
# one call, sampling inside). Each is exported to ONNX (run here by ONNX Runtime), the stepped and verify graphs also
# to Core ML (built here; run on macOS 15+ only; the parameter `exports` lists which), and checked against eager PyTorch (`rvqspec_lib.device.export_check`); the paper's own decoder gets
# its verify graph apart. Then **Figure 4's analogue**, drawn so that what was measured here, what is projected, and
# what the paper reports never share a panel.
#
# **Real time.** A listener hears the **whole frame**: the talker step that emits code 0, the inner loop, and the
# codec decoder that turns 16 codes into 80 ms of audio. The terms used below (the whole frame, real-time factor,
# time to first audio, underrun, floor, timing replay) are defined in [the glossary](../docs/glossary.md) and worked
# out in [docs/streaming.md](../docs/streaming.md). Here the **real-time factor** (RTF) is always the whole frame's
# (ms per frame over the 80 ms of audio it makes; notebook 07's inner-loop RTF counts codes 1..15 alone). We time
# each part against its **floor** (the time it takes when its weights stream once from memory at the measured
# bandwidth, for the codec decoder its FLOPs at the core's peak rate; a bound for that case, not the least time
# possible: a call whose weights stay in the CPU's caches can run below it; notebook 07, section 5, counts the
# frames that do; each row here prints its own ratio to its floor), the frame on one thread and, projected from the
# one-thread parts, with generation and decoding overlapped on two cores (one each: the larger of the two); then we
# measure streams as they play (time to first audio, real-time factor, underruns), and several streams batched. The real-size 0.6B architecture has RANDOM weights here: it is a **timing replay** (its times are
# real; its speculative frames take their acceptance decisions from the trained embedded model; its audio means
# nothing and is never kept). The embedded model is trained, and its streamed audio is what the last section plays.
#
# Every number in the text below is rendered from the results the cells compute; nothing is typed in.

# %% tags=["parameters"]
model = "embedded"  # measured frames for Figure 4, the paper's decoder, the listening example (trained weights)
cost_model = "qwen3-tts-0.6b-random"  # exported graphs and the verify cost curve (RANDOM weights, timing only)
seed = 0
smoke = False  # True: tiny-random for the real-size parts, few frames and repeats (headless test)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch threads of the one-thread timings (the committed figures use 1); the all-cores rows use every core
repeats = 5  # the MINIMUM of timed runs per condition (median reported)
noise_target = None  # a relative standard error to reach per median (rvqspec_lib.eval.noise); None: exactly `repeats`
warmup = 1  # untimed runs of each condition first
exports = [["stepped", "onnx", "float32"], ["stepped", "coreml", "float16"], ["verify", "onnx", "float32"],
           ["verify", "coreml", "float16"], ["frame", "onnx", "float32"]]  # (graph, format, dtype); the Core ML frame
#                                  package and the float16 ONNX graphs are one line more each, a minute or so apiece
verify_nodes = 32  # node budget N of the exported verify graph (a chain of N - 1 drafts)
paper_budget = 32  # node budget of the paper's decoder (`paper:N`; 32 is the paper's)
budgets = [2, 4, 8, 16, 32, 64]  # node budgets N of the calibrated trees timed for Figure 4
chains = [2, 4, 8]  # chain windows timed beside them
backends = ["eager", "native"]  # Figure 4's measured frames ("onnx", "compile": minutes per call shape here)
eval_frames = 8  # evaluation-split frames whose contexts are decoded in Figure 4's timing
pipeline_models = ["qwen3-tts-0.6b-random", "embedded"]  # the pipeline table's models
pipeline_precisions = None  # None: every precision this CPU runs natively
chunk_frames = 2  # frames decoded to audio at once in the pipeline's streams
stream_frames = 40  # frame cap of a measured stream (80 ms of audio a frame; a sentence that ends sooner stops there)
stream_repeats = 2  # runs of each measured stream
batches = [1, 2, 4]  # streams batched in the concurrency measurement
concurrency_models = ["qwen3-tts-0.6b-random"]  # the models whose streams are batched (None: every pipeline model)
listen_text = "The weather is fine today, and we are going for a long walk by the river."
cpu_sizes = {"eval_frames": 4, "budgets": [2, 8, 32], "chains": [4], "repeats": 3, "stream_frames": 24}
#            a full run on a real-size checkpoint on a machine with no GPU: these in place of the sizes above (numbers:
#            the smaller), so that `make paper` fits 90 minutes on 2 cores; None or {}: the sizes above
#            (paper.checkpoint.cpu_sized)

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Audio, Markdown, display

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_audio, save_figure, save_json, save_table
from tools.results_doc import entry, headline
from rvqspec_lib.data.frame_sources import frames_from_contexts, frames_from_shipped
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.device.export_check import check_file
from rvqspec_lib.eval import export_check as X
from paper.notebook_measures import numerical_agreement
from bench import table as PL
from rvqspec_lib.eval import speed as S
from bench import frames as BF
from rvqspec_lib.eval.calibration import calibrate
from bench.latency import PAPER_TOKENS_PER_CALL
from paper.plots import PAPER_DEVICE_SPEEDUPS, plot_audio_vs_wall, plot_frame_parts, plot_speedup_vs_n
from paper import notebook_measures as M
from rvqspec_lib.eval.timing import measure_quietly
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.models.backends import available, backend_table, frame_runner, verify_backend
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.models.loader import EMBEDDED_MODEL, load_model
from paper.checkpoint import cpu_sized, is_checkpoint, not_here, prepare_checkpoint, takes_cpu_sizes
from rvqspec_lib.models.named_decoders import has_paper_decoder, resolve, resolve_all
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.models.streaming import synthesize_stream
from rvqspec_lib.models.tree_files import load_calibration, tree_file

cpu_run = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes, device="cpu")  # real size: it measures on the CPU
eval_frames, budgets, chains, repeats, stream_frames = cpu_sized("06", dict(
    eval_frames=eval_frames, budgets=budgets, chains=chains, repeats=repeats, stream_frames=stream_frames), cpu_sizes,
    applies=cpu_run).values()
run_cost_model = "tiny-random" if smoke else cost_model
run_exports = [["stepped", "onnx", "float32"], ["verify", "onnx", "float32"], ["verify", "coreml", "float16"]] \
    if smoke else [list(e) for e in exports]
run_verify_nodes = 4 if smoke else int(verify_nodes)
run_paper_budget = 4 if smoke else int(paper_budget)
run_budgets = [2, 4] if smoke else [int(n) for n in budgets]
run_chains = [2] if smoke else [int(w) for w in chains]
run_repeats = 2 if smoke else int(repeats)
run_noise_target = None if smoke else noise_target
run_warmup = 0 if smoke else int(warmup)
n_eval = 2 if smoke else int(eval_frames)
run_pipeline_models = ["tiny-random", "embedded"] if smoke else list(pipeline_models)
on_checkpoint = is_checkpoint(model)
if on_checkpoint:  # a released checkpoint: its own frames, offsets and trees; it takes the embedded model's place
    prepare_checkpoint(model, smoke=smoke, notebook="06", out_dir=resolve_out_dir(out_dir, smoke=smoke), seed=seed,
                       cpu_sizes=cpu_sizes)  # prepared on the best device, sized for it
    run_pipeline_models = list(dict.fromkeys(str(model) if m == EMBEDDED_MODEL else m for m in run_pipeline_models))
run_precisions = ["float32"] if smoke else pipeline_precisions
run_frames = 6 if smoke else int(stream_frames)
run_batches = [1, 2] if smoke else [int(b) for b in batches]
run_stream_repeats = 1 if smoke else int(stream_repeats)
run_concurrency = ["tiny-random"] if smoke else (True if concurrency_models is None else list(concurrency_models))
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
if threads:
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
work = Path(tempfile.mkdtemp(prefix="rvqspec-06-"))  # exported files (not results): removed at the end
params = dict(model=model, cost_model=run_cost_model, requested_cost_model=str(cost_model), seed=seed,
              smoke=bool(smoke), out_dir=str(out), threads=torch.get_num_threads(), repeats=run_repeats,
              warmup=run_warmup, noise_target=run_noise_target, exports=run_exports, verify_nodes=run_verify_nodes,
              paper_budget=run_paper_budget, budgets=run_budgets, chains=run_chains, backends=list(backends),
              eval_frames=n_eval, pipeline_models=run_pipeline_models, pipeline_precisions=run_precisions,
              chunk_frames=int(chunk_frames), stream_frames=run_frames, stream_repeats=run_stream_repeats,
              batches=run_batches, concurrency_models=run_concurrency, notebook="06_export_and_real_time",
              cpu_sized=cpu_run)
prov = provenance(params, seed=seed)
print(f"model {model}, cost model {run_cost_model}, pipeline models {run_pipeline_models}, outputs -> {out}")
if run_cost_model != cost_model:  # a smoke run: the prose below describes the real-size model it stands in for
    display(Markdown(f"**Smoke run:** `{run_cost_model}` runs in place of `{cost_model}`; where the text says real-size or 0.6B, read `{run_cost_model}`, and read every number as a check that the code runs, not a measurement."))

# %% [markdown]
# ## The backends on this machine
# What runs the code predictor here (the registry, `rvqspec_lib.models.backends`); a backend that is absent is listed
# with the reason, and nothing is estimated for it.

# %%
backends_df = pd.DataFrame(backend_table())
save_table(backends_df, out / "06_backends", prov)
run_backends = [b for b in backends if available(b)[0]]
backends_df

# %% [markdown]
# ## The exported graphs: their sizes and their agreement with eager PyTorch
# Each (graph, format, precision) of `exports` is exported from `cost_model`'s code predictor and compared with the
# **official module in float32, eager**, on the graph's example inputs. ONNX files run here; a Core ML package is
# checked for the inputs, outputs and states it declares and runs on macOS 15+ only (the deployment's precision is
# float16: Core ML keeps its KV-cache states in float16 whatever the weights). The tolerance is the largest logit
# difference relative to the largest logit (`export_check.RELATIVE_TOLERANCE`): summation order in float32, rounding
# in float16. The frame graph outputs codes: the share equal to eager PyTorch's for the same noise is shown.

# %%
# every model here loads on the CPU whatever `make paper DEVICE=...` says: this notebook times the native forward,
# the native talker and the CPU's precisions, which run on the CPU only (the GPU leg: `make bench-gpu`)
cost_lm = load_model(run_cost_model, seed=seed, device="cpu", dtype="float32")
cost_cp = cost_lm.code_predictor.eval()
exported = []
for graph, fmt, dtype in run_exports:
    res = numerical_agreement(cost_cp, graphs=(graph,), formats=(fmt,), dtypes=(dtype,), nodes=run_verify_nodes,
                                work_dir=work / "graphs")
    exported += res["rows"]
graphs_df = pd.DataFrame(exported)
graphs_df["MB"] = graphs_df["bytes"] / 1e6
show = [c for c in ("graph", "format", "dtype", "nodes", "MB", "export_s", "interface_ok", "runner", "relative_diff",
                    "tolerance", "within_tolerance", "codes_equal_frac", "note") if c in graphs_df]
save_table(graphs_df[show], out / "06_exported_graphs", prov,
           caption=f"{run_cost_model} ({'RANDOM' if cost_lm.is_random else 'trained'} weights): exported graphs "
                   "against the official module in float32, eager")
ran = graphs_df[graphs_df.get("ran", False) == True]  # noqa: E712 (a pandas mask)
display(Markdown(f"{len(graphs_df)} exported files; of those run here, {int(ran.within_tolerance.sum())} of "
                 f"{len(ran)} agree with eager PyTorch within their tolerance. `nodes` is the verify graph's number of "
                 "positions per call (the root counts: a chain of N has N nodes; empty for the stepped graph); "
                 "`interface_ok` is True when the graph declares the inputs, outputs and states it was written with; "
                 "`MB` is the file's size in megabytes (10^6 bytes) and `export_s` the seconds its export took on "
                 "this machine; `runner` is what ran it (`not run`, with the reason in `note`, where nothing here "
                 "can); `relative_diff` is the largest logit difference over the largest logit, `within_tolerance` "
                 "compares it with `tolerance`, and `codes_equal_frac` is the share of codes equal to eager "
                 "PyTorch's."))
with pd.option_context("display.max_colwidth", None, "display.max_columns", None, "display.width", 250):
    display(graphs_df[show])

# %% [markdown]
# ## The paper's decoder: its verify graph
# The paper's decoder drafts with the position-aware offsets shipped beside `model` and verifies through the
# point-mass tree calibrated for them and shipped with them (`<model>/trees/offsets.json`), N = `paper_budget`: in this
# notebook `paper:N` always means these SHIPPED offsets and tree, not a calibration made in a run. Its verify graph
# holds that tree's mask and positions (the drafter stays outside the graph, like the heads), exported to ONNX as
# `rvqspec export --graph verify --decoder paper` does, and checked against eager PyTorch.

# %%
lm = load_model(model, seed=seed, device="cpu", dtype="float32")
paper_lm = lm if has_paper_decoder(lm) else load_model(EMBEDDED_MODEL, device="cpu", dtype="float32")
paper_model = model if paper_lm is lm else EMBEDDED_MODEL
if paper_lm is not lm:
    not_here("06", f"the paper's decoder of {model}", f"it ships no offsets with a calibration: {paper_model}'s is "
             "exported instead", "06_metrics.json")
    display(Markdown(f"`{model}` ships no offsets with a calibration: the paper's decoder is taken from "
                     f"`{paper_model}`."))
paper_named = resolve(f"paper:{run_paper_budget}", paper_lm)
paper_tree = paper_named.decoder.tree(0)  # the graph holds the tree, not the drafter
paper_nodes = paper_tree.n_nodes + 1
paper_path = work / "paper" / f"verify-n{paper_nodes}-float32.onnx"
paper_path.parent.mkdir(parents=True, exist_ok=True)
paper_export = F.export_graph(paper_lm.code_predictor, "verify", "onnx", paper_path, dtype="float32",
                              nodes=paper_nodes, tree=paper_tree)
paper_rows = [{"model": paper_model, "decoder": paper_named.label, "graph": "verify", "format": "onnx",
               "dtype": "float32", "nodes": paper_nodes, "MB": paper_export["bytes"] / 1e6,
               "interface_ok": paper_export["declared"] == paper_export["written"], **r}
              for r in check_file(paper_lm.code_predictor, "verify", paper_path, dtype="float32",
                                    nodes=paper_nodes, tree=paper_tree)]
save_table(paper_rows, out / "06_paper_export", prov)
display(Markdown("; ".join(f"**{r['decoder']}** verify graph ({r['nodes']} nodes, {r['MB']:.1f} MB): "
                           f"{r['runner']}, relative difference {r['relative_diff']:.2g}, within tolerance: "
                           f"{r['within_tolerance']}" for r in paper_rows if r.get("ran"))))
display(Markdown("`runner`: what ran the graph (`ran`: whether it ran here); `max_abs_logit_diff`: the largest "
                 "absolute difference of a logit from eager PyTorch's; `max_abs_logit`: the largest absolute logit "
                 "of eager PyTorch; `relative_diff`: the first over the second, checked against `tolerance`; "
                 "`max_abs_cache_diff`: the largest absolute difference of the KV-cache entries the graph writes "
                 "(keys and values) from eager PyTorch's; `note`: why a graph did not run."))
pd.DataFrame(paper_rows)

# %% [markdown]
# ## Figure 4's analogue: speedup by node budget, measured, projected and quoted apart
# **Measured**: frames of `model` (trained weights; contexts of its evaluation split) decoded by AR, chains and its
# calibrated trees of every node budget N (`<model>/trees/heads.json`: at each N the better kind of tree, point-mass
# or sampled children; the names `tree:calibrated-point-mass:N` and `tree:calibrated-sampled:N` printed in this
# notebook's tables are always these SHIPPED trees (a model that ships none is calibrated here, and the cell says so);
# notebooks 03-05 name their own calibrations the same way),
# through each backend, interleaved; speedup over stepped AR of the same backend. **Projected**:
# the tokens per call per frame the same calibration predicts, E(N) (notebook 04, section 5), over t(N)/t(1) of one
# verify call of `cost_model`'s code predictor through the same backends (`bench.frames.projected_speedup`, as in
# notebook 04): a PROJECTION of the call level (every call of a frame costed as one verify call of N positions; the
# heads and the loop are left out). **Quoted**: the paper's Core ML devices, whose trees are point-mass trees. The
# three never share a panel.

# %%
cp = lm.code_predictor.eval()
cal_path = tree_file(lm, "heads")
if cal_path is not None and cal_path.is_file():  # the shipped calibration and evaluation split
    cal = load_calibration(cal_path, n_codes=lm.n_code_groups - 1, drafter="heads")
    contexts = frames_from_shipped(lm, "evaluation", max_frames=n_eval, seed=seed).context
else:  # no speech for this model here: its own samples from random contexts (self-distillation), calibrated now
    display(Markdown(f"`{model}` ships no calibration: its trees are calibrated here on its own samples from random "
                     "contexts (self-distillation), and its frames are decoded from random contexts."))
    calib = frames_from_contexts(cp, S.random_contexts(cp, 16 if smoke else 128, seed=seed + 1), seed=seed)
    cal = calibrate(cp, ReusedHeads(), calib, budgets=run_budgets, seed=seed)
    contexts = S.random_contexts(cp, n_eval, seed=seed)
names = ["ar", *(f"chain:{w}" for w in run_chains), *(f"tree:calibrated:{n}" for n in run_budgets)]
decoders = resolve_all(names, lm, calibrations={"heads": cal})
runners, absent = S.build_runners(run_backends, cp, decoders, sampling=inner_sampling(lm))
timing, timing_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: S.time_frames(
    runners, contexts, repeats=run_repeats, warmup=run_warmup, seed=seed, progress=False,
    noise_target=run_noise_target, random_weights=lm.is_random), meta=lambda r: r["meta"])
measured = [r for r in BF.speedup_vs_n(timing["rows"]) if r["nodes"] > 1]  # N = 1 is AR itself
summary = BF.summary_by_backend(timing["rows"])
cost_backends = {b: verify_backend(b, cost_cp) for b in run_backends}
costs, costs_quiet = measure_quietly(attempts=timing_attempts, measure=lambda: S.verify_cost_curve(
    cost_cp, cost_backends, query_sizes=sorted({1, *run_budgets}), repeats=max(run_repeats, 3), warmup=run_warmup + 1,
    seed=seed, progress=False, noise_target=run_noise_target, random_weights=cost_lm.is_random),
    meta=lambda r: r["meta"])
projected = BF.projected_speedup(BF.expected_tokens_per_call(cal), costs["rows"])
m = timing["meta"]
speedup_rows = []
for n in run_budgets:
    row = {"N": n}
    for r in measured:
        if r["nodes"] == n:
            row[f"{r['backend']} measured ({model})"] = r["speedup_vs_ar"]
            row[f"{r['backend']} measured decoder"] = r["decoder"]
    for r in projected:
        if r["nodes"] == n:
            row[f"{r['backend']} PROJECTION (E(N) of {model}, cost of {run_cost_model})"] = r["projected_speedup"]
    row["paper (Core ML devices, point-mass trees, quoted)"] = "; ".join(
        f"{p['device'].split(' (')[0]} {p['speedup']}x" for p in PAPER_DEVICE_SPEEDUPS if p["nodes"] == n)
    speedup_rows.append(row)
fig4_caption = (f"measured: frames of {model} on {m.get('cpu')}, {m.get('threads')} thread(s), speedup over "
                f"stepped AR of the same backend; PROJECTION (not a measurement): E(N) per frame from {model}'s "
                f"calibration over t(N)/t(1) of {run_cost_model}'s verify call "
                f"({'random' if cost_lm.is_random else 'trained'} weights), heads and loop left out; the paper's Core "
                "ML numbers quoted in their own column"
                + "".join(f"; {q['note']}" for q in (timing_quiet, costs_quiet) if q["note"]))
save_table(speedup_rows, out / "06_speedup_vs_n", {**prov, "timing": timing_quiet}, caption=fig4_caption)
save_table(timing["rows"], out / "06_frame_times", {**prov, "timing": timing_quiet},
           caption=f"{model}: frames per decoder and backend, interleaved" + (
               f"; {timing_quiet['note']}" if timing_quiet["note"] else ""))
save_table(costs["rows"], out / "06_verify_cost", {**prov, "timing": costs_quiet},
           caption=f"{run_cost_model}: one verify call of Q positions ({'RANDOM' if cost_lm.is_random else 'trained'} "
                   "weights, timing only)")
save_table([dict(p) for p in PAPER_DEVICE_SPEEDUPS], out / "06_paper_devices", prov, caption="quoted from the paper")
fig = plot_speedup_vs_n(
    measured, projected, fused=summary,
    measured_title=f"MEASURED here: {model} frames, {m.get('cpu')}, {m.get('threads')} thread(s)"
                   + (f"\n{timing_quiet['note']}" if timing_quiet["note"] else ""),
    projected_title=f"PROJECTION: E(N) of {model} x t(1)/t(N) of {run_cost_model}\n(call level: heads and loop left "
                    "out)")
save_figure(fig, out / "06_speedup_vs_n", prov)
plt.show()
pd.DataFrame(speedup_rows)

# %%
def projection_caveat() -> str:
    """A sentence that says when this run's projection is not to be trusted ('' when nothing says so): a verify call
    of N > 1 positions timed no slower than one of 1 position, or a cost curve timed on an oversubscribed CPU."""
    below = sorted({(r["backend"], r["nodes"]) for r in projected if r["nodes"] > 1 and r["cost_ratio"] < 1})
    why = ([f"t(N)/t(1) is below 1 at {', '.join(f'N = {n} ({b})' for b, n in below)} (a call of N positions timed "
            "faster than a call of one)"] if below else []) + (
        ["other processes used the CPU while the cost curve was timed (oversubscribed)"] if costs_quiet["oversubscribed"]
        else [])
    return (f" **Caveat:** in this run {' and '.join(why)}, so the cost ratios are dominated by timing noise and the "
            f"projection is not to be trusted; its costs are those of `{run_cost_model}` (the table's PROJECTION "
            "columns), not of another model." if why else "")


best_measured = max(measured, key=lambda r: r["speedup_vs_ar"]) if measured else None
best_projected = max(projected, key=lambda r: r["projected_speedup"]) if projected else None
if best_measured:
    display(Markdown(
        f"Measured here, the best speedup of `{model}`'s frames over stepped AR of the same backend is "
        f"**{best_measured['speedup_vs_ar']:.2f}×** ({best_measured['decoder']} through {best_measured['backend']}, "
        f"N = {best_measured['nodes']}, this run's {len(contexts)} contexts; notebook 04 times other decoders, its own "
        "calibration's trees, over its own number of contexts in its own run, so its best speedups differ)" + (
            f"; the projection peaks at **{best_projected['projected_speedup']:.2f}×** at N = "
            f"{best_projected['nodes']} ({best_projected['backend']}): E(N) = {best_projected['expected_tokens']:.2f} "
            f"codes per call per frame from {model}'s calibration ({cal['n_frames']} frames) over t(N)/t(1) = "
            f"{best_projected['cost_ratio']:.2f} of {run_cost_model}, timed here (notebook 04 projects with its own "
            "calibration and timing, so its peak differs)" if best_projected else "")
        + f". The paper reports {max(p['speedup'] for p in PAPER_DEVICE_SPEEDUPS):.2f}× at best on its devices (over "
          "AR on the same device)." + projection_caveat()))

# %% [markdown]
# ## Core ML on this machine
# On macOS 15+ the packages are predicted and timed per compute unit; elsewhere this section says why not.

# %%
coreml_ok, coreml_why = F.coreml_available()
coreml_rows = []
if coreml_ok:
    coreml_rows = X.coreml_call_times(cost_cp, work / "coreml", nodes=run_budgets, repeats=run_repeats)["rows"]
    save_table(coreml_rows, out / "06_coreml_calls", prov)
    display(pd.DataFrame(coreml_rows))
else:
    display(Markdown(f"**Core ML not run here**: {coreml_why}"))

# %% [markdown]
# ## Real time: the whole frame, part by part
# For each model of `pipeline_models` and each precision this CPU runs natively (the whole talker, code predictor
# included, converted; the official codec decoder in bfloat16 where the CPU runs it natively), three decoder rows:
# **AR** (the native whole frame in one C call), the **best speculative** decoder (the fastest of chains and
# calibrated trees; on the random-weight architecture stepped, its acceptance replayed) and **auto**'s choice: what
# `--decoder auto` picks through the native backend by its own short timing run (a shortlist of three decoded on a
# few frames once each, stepped only on the random-weight architecture, whose replay drives no fused frame), keeping
# the least time per committed code of THAT run ([notebook 07 §4](07_device_engineering.ipynb);
# `rvqspec_lib.eval.budget.choose_decoder`, timed on the spot). Its pick is then timed again with the other rows, so
# with so few frames it can be slower here than the best speculative row, or than AR. The three parts of a frame are
# timed in one
# interleaved run, on one thread, wall clock with the thread's CPU time beside it:
#
# * **talker**: one native talker step after a cached context, and its `codec_head`; floor: the bytes of its weights
#   and of the KV cache it reads, over the machine's measured read bandwidth;
# * **inner loop**: one frame of codes 1..15 through the native forward; floor: the calls it makes times the weight
#   bytes of one call, over the same bandwidth;
# * **codec decoder**: one chunk of `chunk_frames` frames in steady state, per frame; floor: its matmul FLOPs over
#   the core's measured peak rate in its dtype (the embedded codec's phase reconstruction has no floor here).
#
# From them: the frame on **one thread** (the sum: generation and decoding in turn, the `_1t` columns) and on **both
# cores** (2c, the `_2c` columns: generation and decoding overlapped, the larger of talker + inner loop and codec; a
# PROJECTION from the one-thread parts, which assumes each part keeps its one-thread speed beside the other),
# their real-time factors, the parts' shares, speculation's gain on the whole frame beside its gain on the inner loop,
# and what would move the frame further. Then, at the precision whose frame took the least CPU time (the measure
# least disturbed by other load; named in each line), **measured streams** of a
# sentence on one thread and on all cores; and **concurrent streams** batched. The public ports' own figures follow in
# rows of their own, quoted.

# %%
pipe, pipe_quiet = measure_quietly(attempts=1, measure=lambda: PL.pipeline_table(
    models=run_pipeline_models, precisions=run_precisions, chunk_frames=int(chunk_frames), frames=run_frames,
    batches=run_batches, repeats=max(run_repeats, 2), warmup=run_warmup, stream_repeats=run_stream_repeats,
    chains=(4,) if smoke else PL.DEFAULT_CHAINS, budgets=(4,) if smoke else PL.DEFAULT_BUDGETS,
    auto_frames=2 if smoke else 4, n_contexts=2 if smoke else 8, text=listen_text, seed=seed,
    noise_target=run_noise_target, concurrency=run_concurrency, codec_config="tiny" if smoke else "released"),
    meta=lambda r: {"other_cpu_frac": max((x["other_cpu_frac"] or 0) for x in r["meta"]["parts_runs"]),
                    "cpu_count": r["meta"]["cpu_count"], "threads": 1})
pipe_prov = {**prov, "timing": pipe_quiet}
PL.save(pipe, out / "06_pipeline", pipe_prov)
print(PL.caption(pipe))
parts_cols = ["model", "precision", "row", "decoder", "fused", "tokens_per_call", "talker_ms", "inner_ms", "codec_ms",
              "frame_1t_ms", "rtf_1t", "frame_2c_ms", "rtf_2c", "codec_share", "inner_gain", "frame_gain_1t"]
display(Markdown(f"The columns the text below reads (every column, the floors and the streams' among them: "
                 f"`{out.name}/06_pipeline.csv`). `row`: AR, best speculative or auto (above); `fused`: True when the "
                 "inner loop ran as one whole-frame call, False when stepped call by call; `tokens_per_call`: codes "
                 "committed per inner-loop call (the prefill counted); `talker_ms`, `inner_ms`, `codec_ms`: each "
                 "part's median per frame on one thread; `frame_1t_ms` their sum and `rtf_1t` it over 80 ms; "
                 "`frame_2c_ms` and `rtf_2c` the overlapped PROJECTION (the larger of talker + inner loop and codec); "
                 "`codec_share`: the codec decoder's share of `frame_1t_ms`; `inner_gain` and `frame_gain_1t`: "
                 "the AR row's `inner_ms` and `frame_1t_ms` over this row's (above 1: faster than AR); "
                 "`quoted_rtf`, `quoted_ttfa_ms`: a public port's published real-time factor and time to first audio "
                 "(quoted rows only, empty elsewhere). The measured streams follow in their own table."))
with pd.option_context("display.max_columns", None, "display.width", 250):
    display(pd.DataFrame(PL.pipeline_rows(pipe))[parts_cols + ["quoted_rtf", "quoted_ttfa_ms"]].round(3))
display(Markdown("The quoted rows give what their sources publish (a real-time factor, a time to first audio in ms, or "
                 "both), with the precision and thread count as far as the quote records them: "
                 + "; ".join(f"{q['source']}, {q['device']}: "
                             + ", ".join(filter(None, [
                                 q["quoted_rtf"] and f"RTF {q['quoted_rtf']}",
                                 q["quoted_ttfa_ms"] and f"first audio {q['quoted_ttfa_ms']} ms"]))
                             + f" (precision {q['precision'] or 'not stated'}, threads not stated)"
                             for q in PL.PUBLIC_PIPELINES)
                 + ". Per-frame figures of public ports, as notebook 07's table quotes them, each with the precision "
                   "and threads its source gives: " + "; ".join(PL.PUBLIC_PORTS) + ". A real-time factor whose "
                 "precision or threads are not stated cannot be set beside the one-thread per-frame figures of the "
                 "same port (ms per frame over 80 gives their real-time factor): they need not describe the same "
                 "run."))

# %%
pipe_oversubscribed = bool(pipe_quiet["oversubscribed"]) or "OVERSUBSCRIBED" in PL.caption(pipe)
oversubscribed_words = (" **This run was oversubscribed** (other processes used the CPU while the frame's parts were "
                        "timed: OVERSUBSCRIBED in the parts table's header), so its times are pessimistic and noisy, "
                        "and its gains over AR and its real-time verdicts are not to be trusted."
                        if pipe_oversubscribed else "")


def gain_verdict(gain: float, noise: float | None) -> str:
    """One gain over AR read with the tie rule of every timing notebook (``paper.notebook_measures.read_gain``: within
    1 + 2 x noise of 1 either way a tie, within its edge band at the edge of the noise), as words."""
    c = M.read_gain(gain, noise)
    if c in ("tie", "edge"):
        return "a tie" if c == "tie" else "at the edge of the noise (a tie or " + (
            "faster" if gain > 1 else "slower") + " than AR)"
    return ("faster than AR" if gain > 1 else "slower than AR") + (" beyond the noise" if c else "")


def fastest(model_name: str, row: str = "best speculative") -> dict | None:
    """The row of ``model_name`` at its fastest precision by one criterion: the least projected frame on both cores
    (``frame_2c_ms``) of that row."""
    rs = [r for r in pipe["rows"] if r["model"] == model_name and r["row"] == row]
    return min(rs, key=lambda r: r["frame_2c_ms"]) if rs else None


def streamed(model_name: str, row: str, layout: str) -> dict | None:
    return next((s for s in pipe["streams"] if s["model"] == model_name and s["row"] == row
                 and s["layout"] == layout), None)


def part_noise(model_name: str, precision: str) -> float | None:
    """The largest relative standard error of a part's median in this run's timing of one model and precision."""
    return next((p["rel_se_max"] for p in pipe["meta"].get("parts_runs", [])
                 if p["model"] == model_name and p["precision"] == precision), None)


def batch_one(model_name: str) -> dict | None:
    """The measured batch of one stream on all cores, best speculative row (the concurrency measurement)."""
    return next((c for c in pipe["concurrency"] if c["model"] == model_name and c["row"] == "best speculative"
                 and c["layout"] == "all cores" and c["batch"] == 1), None)


lines = []
for name in run_pipeline_models:
    r, ar_r = fastest(name), fastest(name, "AR")
    if r is None:
        continue
    one, two = streamed(name, "best speculative", "1 thread"), streamed(name, "best speculative", "all cores")
    b1, noise = batch_one(name), part_noise(name, r["precision"])
    gen_ms = r["talker_ms"] + r["inner_ms"]
    least_1t = min((x for x in pipe["rows"] if x["model"] == name and x["row"] == "best speculative"),
                   key=lambda x: x["frame_1t_ms"])
    text = (
        f"* **{name}** ({'timing replay, random weights' if r['weights'] != 'trained' else 'trained'}), the "
        f"precision whose best speculative row has the least projected two-core frame (`frame_2c_ms`, the one "
        f"criterion of this bullet's parts and gains): {r['precision']}, {r['decoder']}"
        + (f" (by the one-thread frame instead, the least of the best speculative rows is at "
           f"{least_1t['precision']}, {least_1t['decoder']}, {least_1t['frame_1t_ms']:.1f} ms)"
           if least_1t["precision"] != r["precision"] else
           " (also the least one-thread frame of the best speculative rows)")
        + f": talker {r['talker_ms']:.1f} ms "
        f"({r['talker_x_floor']:.2f}× its floor), inner loop {r['inner_ms']:.1f} ms "
        f"({r['inner_x_floor']:.2f}×), codec decoder {r['codec_ms']:.1f} ms"
        + (f" ({r['codec_x_floor']:.2f}×)" if r["codec_x_floor"] else " (no floor)")
        + f", each timed on one thread. Measured, in turn on one thread, the frame takes {r['frame_1t_ms']:.1f} ms "
          f"(RTF of the parts, their summed ms over 80 ms: {r['rtf_1t']:.2f}). PROJECTED for two cores with "
          f"generation and decoding overlapped: {r['frame_2c_ms']:.1f} ms (projected RTF of the parts "
          f"{r['rtf_2c']:.2f}), the larger of talker + inner loop ({gen_ms:.1f} ms) "
          f"and codec ({r['codec_ms']:.1f} ms), which assumes each part keeps its one-thread speed beside the other.")
    if one and two:
        text += (" MEASURED streams, a second choice by a second criterion (the precision whose frame took the least "
                 "thread CPU time, the measure least disturbed by other load; "
                 + ("here the same precision as above" if one["precision"] == r["precision"] else
                    "here another precision than the one above")
                 + f"): {one['precision']} with {one['decoder']}: first audio {one['ttfa_ms']:.0f} ms after the "
                   f"prompt on one thread, stream RTF {one['rtf']:.2f} (the **stream RTF** is the stream's wall time "
                   "from the start of the synthesis call to its last chunk over the audio's length, so it includes "
                   f"the prompt and the wait for the first audio; each figure the median over the stream's timed runs), "
                   f"{one['underruns']:g} underrun(s); on all cores "
                   f"{two['ttfa_ms']:.0f} ms, stream RTF {two['rtf']:.2f}, {two['underruns']:g} underrun(s)")
        if two["precision"] == r["precision"]:
            text += (f": the measured overlapped stream takes {two['frame_ms']:.1f} ms a frame, "
                     f"{two['frame_ms'] / r['frame_2c_ms']:.2f}× the projection"
                     + (", so the parts do not keep their one-thread speed when they run side by side here"
                        if two["frame_ms"] > 1.1 * r["frame_2c_ms"] else ""))
        text += ("; by the measurement it is " + ("not " if two["rtf"] > 1 else "") + "real time on all cores"
                 + ("" if (two["rtf"] > 1) == (r["rtf_2c"] > 1) else ", whatever the projection says") + ".")
        if one["precision"] == r["precision"] and one["frame_ms"] < r["frame_1t_ms"] / 1.1:
            text += (f" The streamed frame on one thread ({one['frame_ms']:.1f} ms) is shorter than the parts' sum "
                     f"({r['frame_1t_ms']:.1f} ms) because the two measure "
                     "different things: the stream's frame is the time between its audio chunks after the first, "
                     f"over the frames they carry, in a stream of at most {run_frames} frames that starts from a "
                     f"short history; each part is timed in steady state after a long one (the talker after "
                     f"{PL.CONTEXT} cached positions, the codec decoder after {PL.CODEC_WARMUP_FRAMES} frames).")
    if b1 is not None:
        text += (f" One stream in the concurrency measurement (batch 1, all cores) took {b1['frame_ms']:.1f} ms a "
                 f"round: {'' if b1['realtime'] else 'not '}real time.")
    text += (f" Against AR (the native whole frame, one C call: fused AR), speculation ({r['decoder']}, "
             f"{'fused' if r['fused'] else 'stepped'} through {r['backend']}) runs the inner loop at "
             f"{r['inner_gain']:.2f}× AR's speed and the whole frame at {r['frame_gain_1t']:.2f}× (one thread) and "
             f"{r['frame_gain_2c']:.2f}× (the two-core projection)"
             + (f"; this run's part medians have a relative standard error (sqrt(pi/2) x 1.4826 x MAD / sqrt(n) / "
                f"median over n timed frames, MAD the median absolute deviation) up to {100 * noise:.0f}%, so a gain "
                f"within a factor of {M.noise_factor(noise):.2f} of 1 either way (twice that error) is a "
                "tie: the inner "
                f"loop's is {gain_verdict(r['inner_gain'], noise)}, the one-thread frame's "
                f"{gain_verdict(r['frame_gain_1t'], noise)}"
                if noise and r["inner_gain"] and r["frame_gain_1t"] else "")
             + f". What would move it further: {r['moves_frame']}.")
    lines.append(text)
lines.append(
    oversubscribed_words.strip() + (" " if oversubscribed_words else "") + "These are this run's timings, each speculative decoder against the fused AR frame. Notebook 07's table (its "
    "section 5) times stepped AR, fused AR and the speculative frames again in its own run, per backend: where "
    "candidates are within the timing noise of each other, the two runs can name a different best speculative "
    "decoder, or put speculation on the other side of AR, at the same model and precision. Tokens per call here "
    "come from this run's frames"
    + (f" with the trees shipped beside the model (`trees/heads.json`, calibrated on {cal['n_frames']:,} frames of "
       "the calibration split; on the random-weight architecture, the embedded model's acceptance replayed)"
       if cal_path is not None and cal_path.is_file() and cal.get("n_frames") else "")
    + "; notebooks 01, 03, 04 and 05 measure the same decoder names on other frames, some with their own "
      "calibration, so the same decoder's tokens per call differs between notebooks; a timing run decodes few "
      "frames per runner, which adds sampling noise to its value.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Does the codec decoder add negligible demand? (the paper's Figure 1, tested)
# Each bar is one frame on one thread, split into its three parts, with the parts' floors in the thin bar under it;
# the diamond is the frame with generation and decoding overlapped, and the dashed line the 80 ms one frame of audio
# lasts. A part whose share is small against the others would support the paper's sentence; a large one would not.

# %%
fig = plot_frame_parts(pipe["rows"], title="the whole frame, part by part, one thread (diamond: both cores, 2c); "
                                           "random-weight rows are TIMING REPLAYS" + (
                                               f"\n{pipe_quiet['note']}" if pipe_quiet["note"] else ""))
save_figure(fig, out / "06_frame_parts", pipe_prov)
plt.show()
SMALL_SHARE = 0.10  # a part of the frame at most this share is called small below


def codec_words(r: dict) -> str:
    """Which codec decoder a pipeline row times: the embedded model's offline stand-in, or the official one."""
    if r["model"] == EMBEDDED_MODEL:
        return "the embedded model's offline stand-in (neural code decoder, mel inversion, Griffin-Lim phase)"
    return "the official 12 Hz codec decoder" + (
        f" (RANDOM weights, {'its tiny test configuration' if smoke else 'real size'})" if r["weights"] != "trained"
        else "")


def faster_where_large(rows: list[dict]) -> bool:
    """Whether every row where the codec decoder's share is above SMALL_SHARE has a shorter frame than every row
    where it is small (the codec decoder's time about equal: the others sped up)."""
    small = [r["frame_1t_ms"] for r in rows if r["codec_share"] <= SMALL_SHARE]
    large = [r["frame_1t_ms"] for r in rows if r["codec_share"] > SMALL_SHARE]
    return bool(small and large) and max(large) < min(small)


def share_verdicts(rows: list[dict]) -> list[str]:
    """Per codec decoder, its share of the one-thread frame at each precision, and where it is small."""
    out_lines = []
    for codec_name in dict.fromkeys(codec_words(r) for r in rows):
        mine = [r for r in rows if codec_words(r) == codec_name]
        small = [r["precision"] for r in mine if r["codec_share"] <= SMALL_SHARE]
        large = [r["precision"] for r in mine if r["codec_share"] > SMALL_SHARE]
        out_lines.append(
            f"* **{codec_name}** ({', '.join(dict.fromkeys(r['model'] for r in mine))}): "
            + ", ".join(f"{100 * r['codec_share']:.0f}% at {r['precision']}" for r in mine) + ". "
            + (f"Small (at most {100 * SMALL_SHARE:.0f}%) at {', '.join(small)}" if small else
               f"Above {100 * SMALL_SHARE:.0f}% at "
               + ("every precision timed" if len(mine) > 1 else f"{mine[0]['precision']}, the one precision timed"))
            + (f"; above it at {', '.join(large)}" + (
                ", where the talker and inner loop run faster and leave the codec decoder a larger share"
                if faster_where_large(mine) else "") if small and large else "") + ".")
    return out_lines


spec_rows = [r for r in pipe["rows"] if r["row"] == "best speculative"]
if spec_rows:
    display(Markdown(
        "With the best speculative decoder, the codec decoder's share of the one-thread frame, per codec decoder "
        "(the paper's sentence is about the official one; the stand-in's Griffin-Lim phase reconstruction is this "
        "project's own cost and says nothing about it):\n\n" + "\n".join(share_verdicts(spec_rows))))

# %% [markdown]
# ## Audio produced against wall time
# Each curve is one measured stream (at the precision whose frame took the least CPU time): the seconds of audio ready, against the
# wall time since the call. The thin dashed line of the same colour is real time from the first chunk: a player
# started then keeps playing as long as the curve stays above it; a red cross marks an underrun. Left: one thread,
# generation and decoding in turn; right: all cores, overlapped.

# %%
for name in run_pipeline_models:
    mine = [s for s in pipe["streams"] if s["model"] == name]
    if not mine:
        continue
    fig = plot_audio_vs_wall(mine, title=f"{name}, {mine[0]['precision']}, chunks of {chunk_frames} frame(s)" + (
        " (TIMING REPLAY: random weights)" if mine[0]["weights"] != "trained" else ""))
    save_figure(fig, out / f"06_audio_vs_wall_{name.replace('/', '_')}", pipe_prov)
    plt.show()
display(pd.DataFrame([{k: v for k, v in s.items() if k != "chunks"} for s in pipe["streams"]])[
    ["model", "precision", "row", "decoder", "layout", "ttfa_ms", "ttfa_call_ms", "rtf", "frame_ms", "underruns",
     "overlap", "tokens_per_call"]].round(3))
display(Markdown("`ttfa_ms`: time to first audio after the prompt; `ttfa_call_ms`: the same from the start of the "
                 "synthesis call; `rtf`: the stream's wall time to its last chunk over the audio's length; `frame_ms`: "
                 "the steady milliseconds per frame of audio; `overlap`: generation's and decoding's busy time over "
                 "the wall time (above 1 when the two ran at once; docs/streaming.md)."))

# %% [markdown]
# ## Concurrent streams
# B copies of the sentence are batched: one talker step and one inner-loop call per round for all rows (AR and the
# best speculative decoder stepped through the native verify backend, whose rows share each pass over the weights),
# one codec push of the B rows. A batch is real time while a round (one frame of every stream) takes at most 80 ms.

# %%
conc = pd.DataFrame([{k: v for k, v in s.items() if k != "chunks"} for s in pipe["concurrency"]])
sustained = pd.DataFrame(pipe["sustained"])
if len(sustained):
    display(Markdown("\n".join(
        f"* {s['model']}, {s['row']} ({s['decoder']}), {s['layout']}: **{s['streams']}** real-time stream(s) of "
        f"the batches tried ({', '.join(map(str, s['batches']))})"
        + (f", first audio {s['ttfa_ms']:.0f} ms after the prompt" if s["ttfa_ms"] is not None else "")
        for s in pipe["sustained"])))
conc[["model", "precision", "row", "decoder", "layout", "batch", "frame_ms", "ttfa_ms", "underruns",
      "realtime"]].round(2) if len(conc) else conc

# %% [markdown]
# ## Listen
# The embedded model (trained) speaks `listen_text`, streamed: the native talker, the best speculative decoder of the
# table in float32, chunks of `chunk_frames` frames decoded as they come by its own codec (which waits a few frames of
# look-ahead, printed below), generation and decoding overlapped. The chunks are joined, written with their provenance,
# and played.

# %%
listen_lm = lm if model == EMBEDDED_MODEL or on_checkpoint else load_model(EMBEDDED_MODEL, device="cpu",
                                                                             dtype="float32")
listen_model = str(model) if on_checkpoint else EMBEDDED_MODEL
pick = next((r for r in pipe["rows"] if r["model"] == listen_model and r["row"] == "best speculative"
             and r["precision"] == "float32"), None)
label, fused = (pick["decoder"], bool(pick["fused"])) if pick else ("chain:4", False)
listen_runner = frame_runner("native", listen_lm.code_predictor, resolve(label, listen_lm), fused=fused,
                             sampling=inner_sampling(listen_lm))
listen = synthesize_stream(listen_lm, listen_text, runner=listen_runner, talker=NativeTalker(listen_lm),
                           chunk_frames=int(chunk_frames), generator=torch.Generator().manual_seed(seed),
                           max_frames=200, language="english")
listen_wav = torch.cat([c.audio for c in listen])
ls = listen.summary()
listen_path = save_audio(listen_wav, 24000, out / "06_listen", {**prov, "listen": {
    "text": listen_text, "decoder": label, "fused": fused, **{k: ls[k] for k in ("frames", "ttfa_ms", "rtf",
                                                                                 "underruns")}}})
display(Markdown(f"{ls['frames']} frames ({ls['audio_s']:.2f} s), {label}{' (fused)' if fused else ''}: first audio "
                 f"{ls['ttfa_ms']:.0f} ms after the prompt, RTF {ls['rtf']:.2f}, {ls['underruns']} underrun(s), "
                 f"{ls['tokens_per_call']:.2f} tokens per call; the codec's first audio needed "
                 f"{ls['first_audio_frames']} frame(s), its look-ahead once under way {ls['lookahead_frames']}."))
Audio(filename=str(listen_path))

# %% [markdown]
# ## What this notebook showed, and why

# %%
def span_pct(rows: list[dict], key: str) -> str:
    """``a%`` or ``a%-b%`` (precision at each end): the range of a share over some rows, as text."""
    lo, hi = min(rows, key=lambda r: r[key]), max(rows, key=lambda r: r[key])
    return (f"{100 * lo[key]:.0f}%" if lo is hi else
            f"{100 * lo[key]:.0f}% ({lo['precision']}) to {100 * hi[key]:.0f}% ({hi['precision']})")


def whole_frame_gain(r: dict) -> str:
    """The inner loop's gain over AR and the one-thread frame's, read with the same tie rule as the lines above
    (within 1 + 2 x the run's worst part noise either way: a tie)."""
    if not r.get("inner_gain") or not r.get("frame_gain_1t"):
        return ""
    noise = part_noise(r["model"], r["precision"])
    inner, frame = gain_verdict(r["inner_gain"], noise), gain_verdict(r["frame_gain_1t"], noise)
    said = (f" Speculation runs the inner loop at {r['inner_gain']:.2f}× AR's speed ({inner}) and the one-thread "
            f"frame at {r['frame_gain_1t']:.2f}× ({frame})"
            + (f", read with this run's noise factor of {M.noise_factor(noise):.2f} (within it either way: a "
               "tie)" if noise
               else ""))
    if inner == "a tie":
        return (said + ". So this run does not tell speculation from AR on the inner loop; a real inner-loop gain "
                "would shrink on the frame anyway (Amdahl's law: the talker and the codec decoder do not speed up)."
                + oversubscribed_words)
    if r["inner_gain"] < 1:
        return (said + ". Speculation has no inner-loop gain here to carry to the frame." + oversubscribed_words)
    return (said + ". The inner-loop gain shrinks on the frame by Amdahl's law, since the talker and the codec "
            "decoder do not speed up." + oversubscribed_words)


rep, emb = fastest(run_pipeline_models[0]), fastest(EMBEDDED_MODEL) if EMBEDDED_MODEL in run_pipeline_models else None
if on_checkpoint and str(model) in run_pipeline_models:  # the checkpoint in the embedded model's place
    emb = fastest(str(model))
told = []
ok_graphs = int(ran.within_tolerance.sum()) if len(ran) else 0
told.append(f"* **Export (measured).** {len(graphs_df)} graph files of `{run_cost_model}` were written; "
            f"{ok_graphs} of the {len(ran)} run here agree with eager PyTorch within tolerance. The paper's decoder's "
            f"verify graph ({paper_named.label}) agrees: "
            f"{all(r.get('within_tolerance') for r in paper_rows if r.get('ran'))}.")
if best_measured:
    told.append(f"* **Figure 4's analogue (measured, projected, quoted apart).** Here `{model}`'s frames reach "
                f"{best_measured['speedup_vs_ar']:.2f}× over stepped AR of the same backend at best; the projection (E(N) of `{model}` over the verify-call "
                f"cost of `{run_cost_model}`, the table's PROJECTION columns) peaks at "
                + (f"{best_projected['projected_speedup']:.2f}×" if best_projected else "n/a")
                + (" (not to be trusted in this run: see the caveat under the figure)" if projection_caveat() else "")
                + f"; the paper reports {', '.join(str(p['speedup']) + 'x' for p in PAPER_DEVICE_SPEEDUPS)} on "
                  "its Apple devices (point-mass trees). The three differ in what they count: measured whole frames on "
                  "this CPU, a projection (per-frame E(N) over the cost ratio t(N)/t(1)), and the paper's devices.")
if rep:
    rep_rows = [r for r in spec_rows if r["model"] == rep["model"]]
    small = [r["precision"] for r in rep_rows if r["codec_share"] <= SMALL_SHARE]
    large = [r["precision"] for r in rep_rows if r["codec_share"] > SMALL_SHARE]
    told.append(
        f"* **The whole frame (measured; {rep['model']}"
        + (", a timing replay" if rep["weights"] != "trained" else "") + f", {codec_words(rep)}).** "
        f"The codec decoder takes {span_pct(rep_rows, 'codec_share')} of the one-thread frame"
        + (" across precisions" if len(rep_rows) > 1 else "")
        + f" (at {rep['precision']}, the precision of the least projected two-core frame: "
          f"{100 * rep['codec_share']:.0f}%, the talker {100 * rep['talker_share']:.0f}%). "
        + (f"So the paper's Figure 1 sentence (negligible demand) holds on this CPU at {', '.join(small)}, where the "
           f"codec decoder is at most {100 * SMALL_SHARE:.0f}% of the frame, and not at {', '.join(large)}"
           + (", where the talker and inner loop have become fast enough that the codec decoder's share grows."
              if faster_where_large(rep_rows) else ".")
           if small and large else
           f"The paper's Figure 1 sentence (negligible demand) holds at "
           + ("every precision timed here" if len(rep_rows) > 1 else f"{rep['precision']}, the one precision timed here")
           + f" (at most {100 * SMALL_SHARE:.0f}%)." if small else
           f"Against the paper's Figure 1 sentence, it is above {100 * SMALL_SHARE:.0f}% at "
           + ("every precision timed here." if len(rep_rows) > 1 else f"{rep['precision']}, the one precision timed here."))
        + whole_frame_gain(rep))
if emb:
    e1 = streamed(EMBEDDED_MODEL, "best speculative", "1 thread")
    if e1:
        told.append(f"* **The embedded model (measured, trained).** The pipeline's stream on one thread "
                    f"({e1['precision']}, {e1['decoder']}{' fused' if e1['fused'] else ''}): first audio "
                    f"{e1['ttfa_ms']:.0f} ms after the prompt, RTF {e1['rtf']:.2f}, {e1['underruns']:g} "
                    f"underrun(s) (medians over its timed runs). The Listen stream above is another stream (float32, {label}"
                    f"{' fused' if fused else ''}): first audio {ls['ttfa_ms']:.0f} ms"
                    + (f", part of it its codec's wait for {ls['first_audio_frames']} frames before the first audio."
                       if ls["first_audio_frames"] > 1 else "; its codec waited for no look-ahead."))
conc_all = [s for s in pipe["sustained"] if s["layout"] == "all cores" and s["model"] == run_pipeline_models[0]]
if conc_all:
    told.append("* **Concurrency (measured).** " + "; ".join(
        f"{s['row']}: {s['streams']} real-time stream(s) on all cores" for s in conc_all) + ".")
told.append(
    "* **What the released checkpoint should show (inference, not measured).** Its weights change no shape, so the "
    + ("talker, code-predictor and codec times per call above hold for it (the replay already runs the real-size "
       "shapes)." if cost_model in run_pipeline_models else
       f"times per call of `{cost_model}` hold for it; this run's replay ran `{run_pipeline_models[0]}`, not the "
       "real-size shapes, so its times above do not.")
    + " What changes is acceptance: the replay used the embedded model's reused-heads acceptance, while the "
    f"paper reports {PAPER_TOKENS_PER_CALL} tokens per call for its offsets (paper). More codes per call shrink the "
    "inner loop only; the frame then leans even more on the talker and the codec decoder, so the whole-frame gain "
    "stays below the inner loop's.")
display(Markdown("\n".join(told)))

# %%
import shutil

shutil.rmtree(work, ignore_errors=True)
metrics = {
    "model": model, "cost_model": run_cost_model, "cost_random_weights": cost_lm.is_random,
    "backends": backends_df.to_dict("records"), "exported": exported, "paper_decoder": {
        "model": paper_model, "label": paper_named.label, "nodes": paper_nodes, "export": paper_rows},
    "frame_rows": timing["rows"], "absent": absent, "speedup_vs_n": measured, "projected": projected,
    "summary": summary, "verify_cost": costs["rows"], "paper_devices": [dict(p) for p in PAPER_DEVICE_SPEEDUPS],
    "coreml_available": coreml_ok, "coreml_reason": coreml_why, "coreml_calls": coreml_rows,
    "pipeline": {k: pipe[k] for k in ("rows", "sustained", "quoted", "meta")},
    "streams": [{k: v for k, v in s.items() if k != "chunks"} for s in pipe["streams"]],
    "concurrency": [{k: v for k, v in s.items() if k != "chunks"} for s in pipe["concurrency"]],
    "listen": {"path": listen_path.name, "text": listen_text, "decoder": label, "fused": fused,
               **{k: v for k, v in ls.items() if k not in ("cpu_s",)}},
    "timing": {"frames": timing_quiet, "verify_cost": costs_quiet, "pipeline": pipe_quiet},
}


def pipeline_headline(r: dict | None, glance: bool = False) -> list:
    """A model's whole frame in words: its real-time factor and first audio, streamed on one thread, and what
    speculation gains on the frame (nothing when the model's row is absent)."""
    if r is None:
        return []
    who = r["model"] + ((" (small trained model)" if r["model"] == EMBEDDED_MODEL else " (trained weights)")
                        if r["weights"] == "trained" else
                        " (RANDOM weights: a timing replay, timing only)")
    how = f"{r['decoder']} ({r['precision']}), one thread on this CPU"
    one = streamed(r["model"], "best speculative", "1 thread")
    return [entry(f"real-time factor of the whole frame (talker + inner loop + codec decoder; below 1 is faster than "
                  f"real time), {who}, {how}", r["rtf_1t"], "", "06_pipeline.md", glance=glance),
            entry(f"time to first audio after the prompt, streamed, {who}, {how}", one and one["ttfa_ms"], "ms",
                  "06_pipeline_streams.md"),
            entry(f"speculation's gain on the whole frame over AR, {who}, {how}", r["frame_gain_1t"], "x",
                  "06_pipeline.md")]


# what a reader most wants from this notebook (docs/results.md, generated): the whole frame of the real-size timing
# replay and of the embedded model, in real time
metrics["headline"] = headline(*(pipeline_headline(rep) if rep is not emb else []),
                               *pipeline_headline(emb, glance=True))
save_json(metrics, out / "06_metrics.json", prov)
print(f"{len(pipe['rows'])} pipeline rows and {len(pipe['streams'])} measured streams saved (06_metrics.json). "
      "Real-time streams sustained, of the batches tried:")
for s_ in pipe["sustained"]:
    print(f"  {s_['model']}, {s_['row']} ({s_['decoder']}), {s_['layout']}: {s_['streams']} of batches "
          f"{', '.join(map(str, s_['batches']))}")

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **`budgets = [2, 4, 8]`**: small trees only; Figure 4's measured curve ends earlier, and the fastest decoder named
#   under it may change.
# * **`chunk_frames = 1`**: audio decoded one frame at a time; look at the time to first audio and the underruns of
#   the streamed rows.
# * **`batches = [1, 8]`**: more concurrent streams; watch the milliseconds per frame and the real-time flag of each batch size.
