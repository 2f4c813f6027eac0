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
# # 07 — Device engineering: the fastest lossless inner loop on a CPU (an appendix, beyond the paper)
#
# **This notebook goes beyond the paper.** The paper measures its decoder on Apple devices through Core ML, against
# AR on the same device, and picks the node budget by hand per device. This appendix, for engineers deploying the
# inner loop on CPUs, asks the question before that one: how fast can AR itself be made on the hardware, and does
# speculation still pay against the fastest AR?
#
# **The question.** What is the fastest lossless way to run codes 1..15 of a frame on this CPU, and why? Every
# candidate is lossless (the same output distribution as AR,
# [docs/methods.md](../docs/methods.md#why-the-rules-preserve-p)), so the answer is a matter of time alone.
#
# **The terms** ([glossary](../docs/glossary.md)). A CPU call of the code predictor on one position is bound by
# **streaming its weights** from memory: the **weight-streaming floor** of a call (the **floor**, in this notebook) is
# the bytes of weights it reads over the machine's measured read bandwidth, the time to stream every weight once from
# memory ([precision.md](../docs/precision.md#the-floor)). It bounds a call whose weights come from memory, not the
# least time a call can take: a fused frame runs its calls back to back over the same weights, which can then stay
# in the CPU's caches, and a speculative frame makes fewer calls, so a frame can run below 15 calls' floor. Lower
# **precisions** read fewer bytes
# (bfloat16, int8 weights, int8 with per-row dynamic activations), where the CPU has the instructions to compute in
# them ([precision.md](../docs/precision.md)). The **native forward** is the whole call as one C function over packed
# weights, built to run at the floor; the **fused** and **native whole frames** run all 15 codes of a frame as one
# graph per round or one C call, removing the loop around the calls ([glossary](../docs/glossary.md#running-it-fast)).
#
# **What is measured, in order:** (1) the machine; (2) the code-predictor call and the talker step against their floors,
# per precision, through the official module and the native forward; (3) batches of several frames decoded together
# (`batch_sizes`; this run's sizes are printed below the parameters): whether, and where, the gain of speculation
# vanishes; (4) `--decoder auto`, the per-device choice among decoders and backends; (5) the table to act on: stepped
# AR, fused AR, the best speculative decoder, the fused speculative frame and auto, per
# precision and backend, for the embedded model and the real-size 0.6B architecture, beside the floor and the public
# ports' quoted figures; (6) the GPU leg, when its results exist. Every figure names the CPU it ran on.
#
# **Caveats.** The real-size 0.6B architecture has RANDOM weights: its call costs are real, its outputs mean nothing;
# its speculative frames are a **timing replay** of the embedded model's acceptance
# ([precision.md](../docs/precision.md#timing-replay)), labelled so wherever they appear.

# %% tags=["parameters"]
model = "qwen3-tts-0.6b-random"  # the call and the talker step against the floor (real size, RANDOM weights)
small_model = "embedded"  # trained weights: batches and --decoder auto
seed = 0  # random inputs, contexts, generators, the replay's oracle
smoke = False  # True: tiny-random, float32 only, a few repeats (headless test, a few minutes)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
precisions = None  # the precisions timed (None: those this CPU runs natively, float32 always); smoke: float32
floor_backends = ("official", "native")  # the code-predictor call through these backends of the registry
floor_repeats = 15  # the minimum of timed rounds of the call against its floor (more until noise_target)
talker_contexts = (64, 512)  # positions in the talker's KV cache before the timed step
talker_repeats = 10  # timed rounds of the talker step
batch_sizes = (1, 2, 4, 8, 16)  # frames decoded together
batch_decoders = ("ar", "chain:4")  # decoders of the batch sweep (decoder names: AR and a chain of window 4: the root
#                                      and 3 sampled drafts)
batch_backends = ("eager", "native")  # their backends (stepped, and fused where a backend has a fused frame)
batch_repeats = 6  # the minimum of timed batches per (runner, B)
auto_backends = ("official", "eager", "native")  # what --decoder auto chooses among
auto_frames = 16  # calibration frames auto decodes its shortlist on
table_models = ("embedded", "qwen3-tts-0.6b-random")  # the table's models (a random-weight one is a timing replay)
table_backends = ("eager", "native")  # the table's backends ("compile" adds minutes per precision)
table_repeats = 3  # the minimum of timed frames per runner in the table (`rvqspec bench table`'s default)
noise_target = 0.05  # every timing goes on until the relative standard error of each median is at most this, or 4 x
#                      its minimum (rvqspec_lib.eval.noise; None: exactly the repeats above). Smoke: None
gpu_json = "build/gpu_bench.json"  # written on a GPU by `make bench-gpu` (rvqspec bench frames --device cuda ...)
cpu_sizes = {"batch_sizes": (1, 16), "batch_repeats": 3, "auto_frames": 4, "table_repeats": 2,
             "table_models": ("embedded",)}  # the table: the checkpoint alone (real size itself, no random replay)
#            a full run on a real-size checkpoint on a machine with no GPU (it takes the small model's place): these in
#            place of the sizes above (numbers: the smaller), so that `make paper` fits 90 minutes on 2 cores; None or
#            {}: the sizes above (paper.checkpoint.cpu_sized)

# %%
import gc
import json
import re
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.common.paths import REPO_ROOT
from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from tools.results_doc import entry, headline
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET
from bench import table as BT
from paper import plots
from rvqspec_lib.eval import speed as S
from bench import frames as BF
from rvqspec_lib.eval.budget import auto_for_model
from bench.latency import bench_precisions, precision_rows
from paper import notebook_measures as M
from rvqspec_lib.eval.noise import noise_words
from bench.latency import bench_talker_precisions, slim_talker
from rvqspec_lib.eval.timing import machine_meta, measure_quietly, oversubscribed_note
from rvqspec_lib.models.backends import available, backend_table, runner_label
from rvqspec_lib.models.loader import EMBEDDED_MODEL, load_model
from paper.checkpoint import cpu_sized, is_checkpoint, not_here, prepare_checkpoint, takes_cpu_sizes
from rvqspec_lib.models.named_decoders import resolve_all
from rvqspec_lib.device.precision import cpu_features, native_precisions
from rvqspec_lib.models.tree_files import tree_file

t_start = time.perf_counter()
requested_model = str(model)  # what the prose describes; a smoke run may swap in a tiny stand-in below
if smoke:
    if model == "qwen3-tts-0.6b-random":  # the default: its tiny stand-in (a model given by name is kept)
        model = "tiny-random"
    precisions, floor_repeats, talker_contexts, talker_repeats = ["float32"], 2, (8,), 2
    batch_sizes, batch_decoders, batch_repeats, auto_frames = (1, 4), ("ar", "chain:4"), 2, 2
    table_models, table_repeats, noise_target = ("embedded", "tiny-random"), 1, None
skipped = []  # headline entries of what this notebook could not measure here (docs/results.md)
cpu_run = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes, device="cpu")  # real size: it measures on the CPU
batch_sizes, batch_repeats, auto_frames, table_repeats, table_models = cpu_sized("07", dict(
    batch_sizes=batch_sizes, batch_repeats=batch_repeats, auto_frames=auto_frames, table_repeats=table_repeats,
    table_models=table_models), cpu_sizes, applies=cpu_run).values()
if is_checkpoint(model):  # a released checkpoint: it takes the embedded model's place (its own frames and trees)
    prepare_checkpoint(model, smoke=smoke, notebook="07", out_dir=resolve_out_dir(out_dir, smoke=smoke), seed=seed,
                       cpu_sizes=cpu_sizes)  # prepared on the best device, sized for it
    small_model = str(model) if small_model == EMBEDDED_MODEL else small_model
    table_models = tuple(dict.fromkeys(str(model) if m == EMBEDDED_MODEL else m for m in table_models))
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
if threads:  # two threads on a busy 2-core machine spin-wait
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
precisions = list(precisions or native_precisions())
params = dict(notebook="07_device_engineering", model=model, small_model=small_model, seed=seed, smoke=bool(smoke),
              out_dir=str(out), threads=torch.get_num_threads(), precisions=precisions,
              floor_backends=list(floor_backends), floor_repeats=floor_repeats, talker_contexts=list(talker_contexts),
              talker_repeats=talker_repeats, batch_sizes=list(batch_sizes), batch_decoders=list(batch_decoders),
              batch_backends=list(batch_backends), batch_repeats=batch_repeats, auto_backends=list(auto_backends),
              auto_frames=auto_frames, table_models=list(table_models), table_backends=list(table_backends),
              table_repeats=table_repeats, noise_target=noise_target, gpu_json=gpu_json, cpu_sized=cpu_run)
prov = provenance(params, seed=seed)
timings = {}


def span(values, fmt=".2f"):
    """``a`` or ``a-b``: the range of some measured values, as text."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


print(f"outputs -> {out}")
display(Markdown(f"This run times batches of {', '.join(map(str, batch_sizes))} frames and the precisions "
                 f"{', '.join(precisions)} (this CPU runs {', '.join(native_precisions())} natively"
                 + ("; the table of section 5 times float32 only" if smoke else "") + ")."))
if str(model) != requested_model:  # a smoke run: the prose below describes the real-size model it stands in for
    display(Markdown(f"**Smoke run:** `{model}` runs in place of `{requested_model}`; where the text says real-size, "
                     f"0.6B or the released config's 28 layers, read `{model}` (its own layers), and read every number "
                     "as a check that the code runs, not a measurement."))

# %% [markdown]
# ## 1. The machine
#
# Everything below depends on it: the CPU's instructions decide which precisions run natively (bfloat16 needs
# `avx512_bf16` or AMX, int8 a dot-product instruction such as VNNI), and its memory bandwidth sets every floor. The
# registry says which backends run here and why not otherwise.

# %%
meta = machine_meta()
flags = cpu_features()
cpu = meta["cpu"]
machine = pd.DataFrame([{"CPU": cpu, "cores": meta["cpu_count"], "torch threads": meta["threads"],
                         "torch": meta["torch"], "bf16 flags": ", ".join(flags["bf16"]) or "none",
                         "int8 dot-product flags": ", ".join(flags["int8_dot"]) or "none",
                         "native precisions": ", ".join(native_precisions()), "timed here": ", ".join(precisions)}])
save_table(machine, out / "07_machine", prov, caption="the CPU this notebook ran on")
display(machine.T)
display(pd.DataFrame(backend_table()))

# %% [markdown]
# ## 2. Each call against its floor, per precision
#
# **The code-predictor call.** One call of one query position (what AR makes 15 times a frame), in each precision of
# `precisions` (by default every precision this CPU runs natively; the machine table's "timed here" row names them),
# through the official module and the native forward, every (precision, backend, N) in ONE interleaved run
# (`bench.latency.bench_precisions`), with the read bandwidth measured before and after
# (the faster kept). `t(1) / floor` near one means the call is as fast as reading its weights allows; t(N)/t(1) is
# the cost of a wider call, what a speculative round pays.
#
# **The talker step.** The big model's step (the released config's 28 layers, [model.md](../docs/model.md); one new
# position after a KV prefix, then `codec_head`), the other half of a frame, timed the same way
# (`bench.latency.bench_talker_precisions`): the official step and the native one, at each context
# length of `talker_contexts`. Its floor counts the weights; the KV cache it attends adds bytes as the context grows.

# %%
# on the CPU in float32 whatever `make paper DEVICE=...` says: this notebook times the CPU's precisions (each derived
# from float32) and the native forward, which run on the CPU only (the GPU leg: `make bench-gpu`)
lm = load_model(model, device="cpu", dtype="float32")
random_weights = bool(lm.is_random)
weights_words = "RANDOM weights: timing only" if random_weights else "trained weights"
t0 = time.perf_counter()
floor_res, floor_quiet = measure_quietly(
    attempts=timing_attempts, meta=lambda r: r, measure=lambda: bench_precisions(
        lm, precisions, backends=[b for b in floor_backends if available(b)[0]], repeats=max(2, floor_repeats),
        seed=seed, progress=False, noise_target=noise_target))
timings["floor_s"] = time.perf_counter() - t0
call_rows = precision_rows(floor_res)
bw = floor_res["bandwidth"]
save_table(call_rows, out / "07_floor", {**prov, "meta": {k: v for k, v in floor_res.items() if k != "precisions"},
                                         "timing": floor_quiet},
           caption="; ".join(filter(None, [
               f"{model} ({weights_words}) code-predictor call on {cpu}, {floor_res['threads']} thread(s), "
               f"{noise_words(floor_res)}; floor = weight bytes of one call / read bandwidth {bw['gb_per_s']:.1f} GB/s "
               f"(the faster of {bw['gb_per_s_before']:.1f} before and {bw['gb_per_s_after']:.1f} after)",
               floor_quiet["note"]])))
talker = slim_talker(lm.talker)
lm = None  # the full model's memory back: the talker benchmark holds a copy per precision
gc.collect()
t0 = time.perf_counter()
talker_res = bench_talker_precisions(talker, precisions, contexts=talker_contexts, repeats=talker_repeats, seed=seed,
                                     model_name=model, random_weights=random_weights)
timings["talker_s"] = time.perf_counter() - t0
talker = None
gc.collect()
talker_rows = talker_res["rows"]
save_table(talker_rows, out / "07_talker", {**prov, "meta": {k: v for k, v in talker_res.items() if k != "rows"}},
           caption="; ".join(filter(None, [
               f"{model} ({weights_words}) talker step on {cpu}, {talker_res['threads']} thread(s), median of "
               f"{talker_repeats} interleaved rounds; floor = the step's weight bytes / "
               f"{talker_res['bandwidth']['gb_per_s']:.1f} GB/s; floor_kv adds the KV cache it attends",
               oversubscribed_note(talker_res)])))
fig = plots.plot_floor(call_rows, talker_rows, title=f"{model} ({weights_words}) against the weight-streaming floor "
                       f"on {cpu}, {floor_res['threads']} thread(s), {bw['gb_per_s']:.1f} GB/s"
                       + "".join(f"\n{n}: the times are pessimistic"
                                 for n in (floor_quiet["note"], oversubscribed_note(talker_res)) if n))
save_figure(fig, out / "07_floor", {**prov, "meta": {k: v for k, v in floor_res.items() if k != "precisions"}})
plt.show()
display(Markdown("`t1_ms`: the median time of one code-predictor call with one query position; `tN_over_t1`: the "
                 "time of one call verifying N query positions over `t1_ms`; `mb_per_call`: the weight bytes one call "
                 "reads, in millions; `floor_ms`: `mb_per_call` over the read bandwidth; `t1_over_floor`: `t1_ms` over "
                 "`floor_ms`."))
display(pd.DataFrame(call_rows).round(3))
display(Markdown("`floor_ms`: the step's weight bytes over the read bandwidth; `floor_kv_ms`: the same with the "
                 "bytes of the KV cache the step attends added (`context` positions); `over_floor` and `over_floor_kv`:"
                 " the measured median over each."))
display(pd.DataFrame(talker_rows)[["precision", "forward", "context", "median_ms", "floor_ms", "over_floor",
                                   "floor_kv_ms", "over_floor_kv"]].round(3))
native_calls = [r for r in call_rows if r["backend"] == "native"]
official_calls = [r for r in call_rows if r["backend"] == "official"]
lines = []
if native_calls:
    best_call = min(native_calls, key=lambda r: r["t1_ms"])
    lines.append(f"One call of {model} through the native forward runs at "
                 f"{span([r['t1_over_floor'] for r in native_calls])}x its floor"
                 + (" across precisions (fastest: " if len({r["precision"] for r in native_calls}) > 1 else " (")
                 + f"{best_call['precision']}, {best_call['t1_ms']:.2f} ms)"
                 + (f"; through the official module at {span([r['t1_over_floor'] for r in official_calls])}x"
                    if official_calls else "") + ".")
nat_talk = [r for r in talker_rows if r["forward"] == "native"]
if nat_talk:
    lines.append(f"The native talker step: {span([r['over_floor'] for r in nat_talk])}x its weights' floor "
                 f"({span([r['over_floor_kv'] for r in nat_talk])}x with the KV cache counted); the official step "
                 f"{span([r['over_floor'] for r in talker_rows if r['forward'] == 'official'])}x.")
    quick = min(nat_talk, key=lambda r: (r["context"], r["median_ms"]))  # the fastest precision, fewest positions
    lines.append(f"Notebook 06 times the same native step again in its own run (its `talker_ms`; here "
                 f"{quick['precision']} takes "
                 + " and ".join(f"{r['median_ms']:.1f} ms at {r['context']}" for r in nat_talk
                                if r["precision"] == quick["precision"])
                 + f" positions), at "
                 f"{BT.CONTEXT} cached positions and interleaved with the inner loop and the codec decoder instead "
                 "of other talker steps: a separate measurement in another run, so its time need not "
                 + (f"fall between the times at {min(talker_contexts)} and {max(talker_contexts)} positions here."
                    if len(set(talker_contexts)) > 1 else "agree with the time here."))
lines.append(f"Each timing measures the read bandwidth around itself: {bw['gb_per_s']:.1f} GB/s for the calls, "
             f"{talker_res['bandwidth']['gb_per_s']:.1f} GB/s for the talker step; the same memory at two times, "
             "apart by the measurement's own spread under other load, so each floor uses its own timing's value.")
display(Markdown(" ".join(lines)))

# %% [markdown]
# ## 3. Batches: whether the gain of speculation vanishes
#
# Serving several streams at once decodes B frames together: one call per round for the whole batch, a round lasting
# as long as its slowest row needs. A batched AR call reads the weights once for B rows, so AR alone fills the
# machine as B grows, and the calls speculation saves become cheap. Frames per second of the embedded model
# (`bench.frames.batch_throughput`) for AR and speculative decoders, stepped and fused, every (runner, B)
# interleaved. (The native whole frame decodes a batch's rows one after the other: it does not batch.) The B = 1
# column is this run's own timing (`batch_throughput`, on its own contexts and repeats); notebook 04 times single
# frames separately (`time_frames`), so the two speedups of one decoder at batch 1 differ by those settings and by
# each run's timing noise.

# %%
small = load_model(small_model, device="cpu", dtype="float32")
small_cp = small.code_predictor
small_trees = tree_file(small, "heads")
small_trees_n = json.loads(small_trees.read_text()).get("n_frames") if small_trees is not None and \
    small_trees.is_file() else None
named = resolve_all(list(batch_decoders), small)
batch_runners, batch_absent = S.build_runners([b for b in batch_backends], small_cp, named)
contexts = frames_from_shipped(small, "evaluation", max_frames=max(batch_sizes) * 4, seed=seed).context
t0 = time.perf_counter()
batches, batch_quiet = measure_quietly(
    attempts=timing_attempts, meta=lambda r: r["meta"], measure=lambda: BF.batch_throughput(
        batch_runners, contexts, batch_sizes=batch_sizes, repeats=max(2, batch_repeats), seed=seed, progress=False,
        noise_target=noise_target))
timings["batches_s"] = time.perf_counter() - t0
batch_rows = batches["rows"]
save_table(batch_rows, out / "07_batches", {**prov, "meta": batches["meta"], "timing": batch_quiet},
           caption="; ".join(filter(None, [f"{small_model} (trained weights) on {cpu}, "
                                           f"{batches['meta']['threads']} thread(s)", noise_words(batches["meta"]),
                                           batch_quiet["note"]]
                                    + [f"{b} absent: {why}" for b, why in batch_absent.items()])))
fig = plots.plot_batches(batch_rows, title=f"{small_model}: frames decoded together on {cpu}, "
                         f"{batches['meta']['threads']} thread(s)"
                         + (f"\n{batch_quiet['note']}: the times are pessimistic" if batch_quiet["note"] else ""))
save_figure(fig, out / "07_batches", {**prov, "meta": batches["meta"]})
plt.show()
bt = pd.DataFrame(batch_rows)
spec_b = bt[(bt.kind != "ar") & ~bt.fused.astype(bool)]
lose = []
for (dec, b), g in spec_b.groupby(["decoder", "backend"], sort=False):
    g = g.sort_values("batch")
    below = g[g.speedup_vs_ar < 1.0]
    lose.append(f"{dec} through {b}: {g.speedup_vs_ar.iloc[0]:.2f}x stepped AR at B = {g.batch.iloc[0]}, "
                f"{g.speedup_vs_ar.iloc[-1]:.2f}x at B = {g.batch.iloc[-1]}"
                + (f", below AR from B = {below.batch.iloc[0]}" if len(below) else ", never below AR here"))
display(Markdown("Stepped speculative decoders against stepped AR of the same backend and batch: "
                 + "; ".join(lose) + "."))

# %% [markdown]
# ## 4. `--decoder auto`: the choice made from this device's own measurements
#
# The paper chose N by hand per device and left automatic choice as future work. `rvqspec synth --decoder auto`
# (`rvqspec_lib.eval.budget.auto_for_model`) times, on the running machine: the verify call of every candidate's
# shape, the predicted speedup E(N) t(1)/t(N) from the calibration, then whole frames of the most promising
# candidates, interleaved, through every backend it may use, AR and the chains also as fused frames; the runner with
# the least measured time per committed code wins. Here it runs afresh (a temporary cache) on the embedded model. Its
# calibrated trees are the ones shipped beside the model (`trees/heads.json`): in this notebook a
# `tree:calibrated-point-mass:N` or `tree:calibrated-sampled:N` is always such a SHIPPED tree, never one calibrated in
# the run.

# %%
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    choice = auto_for_model(small, backends=[b for b in auto_backends if available(b)[0]], refresh=True,
                            cache=Path(tmp) / "auto.json", frames=auto_frames, repeats=1 if smoke else 3,
                            shortlist=2 if smoke else 5, seed=seed, noise_target=noise_target)
timings["auto_s"] = time.perf_counter() - t0
auto_rows = [{k: v for k, v in r.items()} for r in choice.table]
save_table(auto_rows, out / "07_auto", {**prov, "choice": {"decoder": choice.label, "backend": choice.backend,
                                                           "fused": choice.fused, "reason": choice.reason}},
           caption=f"--decoder auto on {cpu} for {small_model}: every candidate's predicted and (where decoded) "
                   f"measured time per code; chose {choice.label} through {choice.backend}"
                   + (", fused" if choice.fused else "") + (f"; {choice.oversubscribed}" if choice.oversubscribed
                                                             else ""))
fig = plots.plot_auto(auto_rows, chosen=(choice.label, choice.backend, choice.fused),
                      title=f"--decoder auto on {cpu}: {small_model}, what it decoded"
                            + (f"\n{choice.oversubscribed}: the times are pessimistic" if choice.oversubscribed
                               else ""))
save_figure(fig, out / "07_auto", prov)
plt.show()
decoded = [r for r in auto_rows if r.get("ms_per_code") is not None]  # what auto timed, of every candidate row
why = re.sub(r"; \d+ of \d+ candidates decoded through .*? \(\d+ frames x \d+ repeats\)", "", choice.reason)
why = why.split(": ", 1)[1] if why.startswith(choice.label) and ": " in why else why  # the label is said once
display(Markdown(f"**auto chose `{choice.label}`** through {choice.backend}"
                 + (", as the whole frame in one graph or C call" if choice.fused else ", stepped")
                 + f": {why}. It decoded {len(decoded)} of its {len(auto_rows)} candidate runners "
                 f"({sum(not r['fused'] for r in decoded)} stepped, its shortlist through each of "
                 f"{', '.join(dict.fromkeys(r['backend'] for r in auto_rows))}; {sum(bool(r['fused']) for r in decoded)} "
                 f"fused AR and chain frames), on up to {auto_frames} calibration frames."))

# %% [markdown]
# ## 5. The table to act on
#
# The table `rvqspec bench table` and `make bench` print (`bench.table.bench_table`), measured once per `make paper`,
# here: per model, per precision timed (the sentence under the parameters names them) and per backend, five rows,
# each timed in one interleaved run per (model, precision, backend): **stepped AR**; **fused AR** (the backend's whole
# AR frame); **best speculative**
# (the fastest of the table's own fixed set of stepped chains and calibrated trees, named under the table; the trees
# are the SHIPPED ones of section 4, the embedded model's for a timing replay); **fused
# speculative** (the fastest fused frame of the table's chains; a timing replay cannot drive one); **auto** (what
# `--decoder auto` picks there by its own short timing run, a shortlist of three decoded on a few frames once each,
# among the candidates of this table's backend and precision, stepped only on a timing replay; its pick is then timed
# again in this table's own run). auto chooses among more chain lengths and both kinds of calibrated tree than the
# table's set, so its row can be faster than best speculative; it keeps the least time per committed code of ITS run:
# with so few frames it can pick another chain length than section 4's choice, which times every backend together, and
# in this table its row can be slower than another row, AR's included. Columns: ms per frame, the **inner-loop RTF**
# (real-time factor of codes 1..15 alone: ms per frame over the 80 ms a frame of audio lasts; the talker's step and the
# codec are not in it, unlike notebook 06's whole-frame RTF), speedup over stepped AR, the frame over the fused AR
# frame's (`x_fused_ar`), the AR frame's floor (15 calls' weights at the measured bandwidth) and the frame over it
# (`x_floor_ar`). The public ports' published figures follow, quoted, never in a measured column.

# %%
t0 = time.perf_counter()
table = BT.bench_table(
    models=list(table_models), precisions=["float32"] if smoke else precisions,
    backends=[b for b in table_backends if available(b)[0]], repeats=table_repeats, warmup=0 if smoke else 1,
    chains=(4,) if smoke else BT.DEFAULT_CHAINS, budgets=(4,) if smoke else BT.DEFAULT_BUDGETS,
    auto_frames=2 if smoke else 4, n_contexts=2 if smoke else 8, seed=seed, progress=False,
    noise_target=noise_target)
timings["table_s"] = time.perf_counter() - t0
BT.save(table, out / "07_bench_table", prov)
print(BT.format_table(table).splitlines()[0])
frames_per_runner = (table["meta"]["repeats"] if not table["meta"].get("noise_target") else
                     span([n["repeats"] for n in table["meta"].get("noise") or []] or [table["meta"]["repeats"]], "d"))
display(Markdown(f"The header's target for the fused speculative frame ({BT.FUSED_TARGET} of the fused AR frame's time) "
                 "is the project's design goal, a speedup of at least 1.5x over fused AR at the same model, precision "
                 "and backend (1/1.5 rounded), not a measurement. Each row's time is a median of "
                 f"{frames_per_runner} timed frame(s) per runner, the frames drawn in turn from "
                 f"{table['meta'].get('n_contexts')} contexts."))
fig = plots.plot_bench_table(table, title=f"the table to act on: {cpu}, {table['meta']['threads']} thread(s)"
                             + ("\nOVERSUBSCRIBED: the times are pessimistic" if table["meta"]["oversubscribed"]
                                else ""))
save_figure(fig, out / "07_bench_table", {**prov, "meta": table["meta"]})
plt.show()
noise_runs = [n for n in table["meta"].get("noise", []) if n.get("rel_se_max") is not None]
worst_noise = max((n["rel_se_max"] for n in noise_runs), default=None)
if worst_noise is not None:
    capped = [n for n in noise_runs if noise_target is not None and n["rel_se_max"] > noise_target]
    display(Markdown(
        "**Timing noise.** Each (model, precision, backend) was timed "
        + (f"from {table['meta']['repeats']} frames per runner on, adding frames while a median's relative "
           f"standard error was above the {100 * noise_target:.0f}% target, up to a cap of "
           f"{span([n.get('max_repeats') or n['repeats'] for n in noise_runs], 'd')} frames; "
           if noise_target is not None else "a fixed number of times; ")
        + "the relative standard error of a run's worst median (sqrt(pi/2) x 1.4826 x MAD / sqrt(n) / median over "
          "its n timed frames, MAD the median absolute deviation) is "
        f"{span([100 * n['rel_se_max'] for n in noise_runs], '.0f')}%"
        + (f" ({len(capped)} of {len(noise_runs)} runs reached the cap because their worst median's error stayed "
           "above the target: the frame count in the header is that cap, not a sign the target was met)"
           if capped else "")
        + f". The **timing noise** below is the worst of these, {100 * worst_noise:.0f}%: two frames whose times "
        f"differ by less than about {200 * worst_noise:.0f}% of the time (twice the noise) are not told apart by "
        "this run, so times and ratios are shown to two decimals and read as rough where they are close."
        + (f" The AR floor of this table uses the read bandwidth measured around the table's own timing, "
           f"{table['meta']['bandwidth']['gb_per_s']:.1f} GB/s, not section 2's ({bw['gb_per_s']:.1f} GB/s for the "
           f"calls, {talker_res['bandwidth']['gb_per_s']:.1f} GB/s for the talker step): the same memory measured at "
           "another time of the run, apart by the measurement's own spread under other load."
           if table["meta"].get("bandwidth") else "")))
tb = pd.DataFrame(table["rows"])
key = ["model", "precision", "backend"]
by_row = tb.pivot_table(index=key, columns="row", values="ms_per_frame", aggfunc="first", sort=False)
by_row = by_row[[r for r in BT.ROWS if r in by_row.columns]].add_suffix(" ms")
decoders_of = tb[tb.row.isin(["best speculative", "fused speculative", "auto"])].pivot_table(
    index=key, columns="row", values="decoder", aggfunc="first", sort=False).add_suffix(": decoder")
display(Markdown(f"Milliseconds per frame of each row, per (model, precision, backend), and the decoders the "
                 f"speculative rows picked (every column, the speedups and floors among them: "
                 f"`{out.name}/07_bench_table.csv`):"))
with pd.option_context("display.max_columns", None, "display.max_rows", 200, "display.width", 250):
    display(by_row.join(decoders_of).round(2))
best_ms = {(r["model"], r["precision"], r["backend"], r["row"]): r["ms_per_frame"] for r in table["rows"]
           if r["row"] in ("best speculative", "fused speculative") and r["ms_per_frame"]}
auto_faster = [r for r in table["rows"] if r["row"] == "auto" and r["ms_per_frame"] and r["kind"] != "ar"
               and r["ms_per_frame"] < best_ms.get((r["model"], r["precision"], r["backend"],
                                                    "fused speculative" if r["fused"] else "best speculative"), 0)]
display(Markdown(
    f"**best speculative** is the fastest stepped decoder of the set this table times (chains of window "
    f"{', '.join(map(str, table['meta']['chains']))}: the root and one fewer drafts; calibrated trees of "
    f"{', '.join(map(str, table['meta']['budgets']))} nodes); **fused speculative** the fastest of those chains' "
    "fused frames. auto chooses among more "
    "(every chain length the calibration reaches, both kinds of calibrated tree)"
    + (f": its pick is faster than the table's row of the same kind (best speculative for a stepped pick, fused "
       f"speculative for a fused one) in {len(auto_faster)} (model, precision, backend) ("
       + "; ".join(f"{r['model']} {r['precision']} {r['backend']}: {r['decoder']}{' fused' if r['fused'] else ''}"
                   for r in auto_faster) + ")."
       if auto_faster else "; here its pick is never faster than the table's row of the same kind (best speculative "
       "for a stepped pick, fused speculative for a fused one).")))
display(Markdown("\n".join(f"* {line}" for line in table["footer"])))
fastest = BT.fastest_by_model(table)
rounds = BT.round_costs(table)
if rounds:
    save_table(rounds, out / "07_round_costs", {**prov, "meta": table["meta"]},
               caption=f"one fused speculative round in AR calls (tokens per call x its frame over the fused AR frame's) "
                       f"on {cpu}, from the table to act on; speculation wins when this is below its tokens per call")
    display(pd.DataFrame(rounds).round(2))
    below = [r for r in rounds if r["x_floor_ar"] is not None and r["x_floor_ar"] < 1]
    display(Markdown(
        "`round_over_ar_call`: one fused speculative round's cost in fused AR calls (its tokens per call x "
        "`x_fused_ar`); speculation wins where it is below `tokens_per_call`. `x_floor_ar`: the fused AR frame over "
        "15 calls' weight-streaming floor"
        + (f"; below 1 in {len(below)} of {len(rounds)} rows ("
           + ", ".join(f"{r['model']} {r['precision']} {r['backend']}: {r['x_floor_ar']:.3f}" for r in below)
           + "; the table rounds to two decimals): those frames read fewer bytes from memory than 15 calls' worth of weights (the weights can stay in "
             "the CPU's caches between calls), so the floor bounds only calls that stream their weights." if below
           else "; at or above 1 in every row here.")))
else:  # a timing replay has no fused speculative row: only a model with trained weights gives one
    skipped.append(not_here("07", "the round costs of fused speculative frames",
                            "no model of the table has trained weights: a timing replay drives no fused frame",
                            "07_metrics.json"))

# %% [markdown]
# ## 6. On a GPU (`rvqspec bench frames --device cuda`)
#
# The same frames on a CUDA GPU through the `compile` backend (CUDA graphs): AR, the fused AR frame, chains, fused
# chains and calibrated trees of the 0.6B architecture, one interleaved run, then the verify cost curve and the
# projection from notebook 04's calibration, written by `make bench-gpu` (`rvqspec bench frames --device cuda ...
# --json build/gpu_bench.json`) on a machine with a GPU. Shown when that file exists.

# %%
gpu_path = Path(gpu_json) if Path(gpu_json).is_absolute() else REPO_ROOT / gpu_json  # an input: read, not written
gpu = json.loads(gpu_path.read_text()) if gpu_path.is_file() else None
if gpu is None:
    display(Markdown(f"The GPU leg was not run: `{gpu_json}` does not exist."))
else:
    display(Markdown(f"GPU results from `{gpu_json}`: {gpu['device']}, {gpu['model']} in {gpu['precision']}, "
                     f"backend {', '.join(gpu['backends'])}{' (on the CPU)' if gpu['meta']['device'] == 'cpu' else ''}"
                     f"{' (RANDOM weights: timing only)' if gpu.get('random_weights') else ''}."))
    display(Markdown(BF.format_rows(gpu["summary"])))
    display(Markdown(BF.format_rows(gpu["rows"], ["decoder", "backend", "fused", "tokens_per_call",
                                                       "ms_per_frame", "speedup_vs_ar", "speedup_vs_fused"])))
    if gpu.get("projected"):
        display(Markdown("PROJECTION, not a measurement (E(N) of the calibration x the GPU's t(1)/t(N)):\n\n"
                         + BF.format_rows(gpu["projected"])))

# %% [markdown]
# ## What this notebook showed, and why

# %%
summary = {
    "cpu": cpu, "cpu_flags": flags, "native_precisions": list(native_precisions()), "precisions": precisions,
    "model": model, "random_weights": random_weights, "floor": call_rows, "floor_bandwidth": bw,
    "talker": talker_rows, "batches": batch_rows, "auto": {"decoder": choice.label, "backend": choice.backend,
                                                            "fused": choice.fused, "reason": choice.reason},
    "bench_table": table, "fastest_by_model": fastest, "round_costs": rounds, "gpu_json_present": gpu is not None,
    "timings_s": {**timings, "total": time.perf_counter() - t_start},
}
# what a reader most wants from this notebook (docs/results.md, generated): how close the call comes to its floor,
# what auto chose, and whether speculation wins a whole frame here
who = f"{model} ({weights_words})"
small_who = small_model + (" (small trained model)" if small_model == "embedded" else "")
first_precision = call_rows[0]["precision"] if call_rows else None
small_fast = next((f for f in fastest if f["model"] == small_model), None)
summary["headline"] = headline(
    *[entry(f"one code-predictor call (one query position) of {who} over its floor (weight bytes / read bandwidth), "
            f"{r['backend']}, {r['precision']}, on this CPU", r["t1_over_floor"], "x", "07_floor.md")
      for r in call_rows if r["precision"] == first_precision],
    entry(f"what --decoder auto chose for {small_who} on this CPU",
          f"{choice.label}, {choice.backend}" + (", fused" if choice.fused else ""), "", "07_auto.md"),
    entry(f"time a frame takes through the fastest AR of the table to act on, {small_who}, on this CPU",
          small_fast and small_fast["fastest_ar"] and small_fast["fastest_ar"]["ms_per_frame"], "ms",
          "07_bench_table.md"),
    entry(f"the fastest lossless speculative frame over the fastest AR frame (below 1: speculation wins), "
          f"{small_who}, on this CPU", small_fast and small_fast["speculative_over_ar"], "x", "07_bench_table.md"),
    *skipped,
)
save_json(summary, out / "07_metrics.json", prov)


def where(r):
    return f"{runner_label(r)}, {r['precision']}, the table's {r['row']} row"


key_of = lambda r: (r["model"], r["precision"], r["backend"])  # noqa: E731
noise_factor = M.noise_factor(worst_noise)  # times within it are not told apart (notebook_measures.read_gain)
bullets = []
for f in fastest:
    best, ar, spec = f["fastest"], f["fastest_ar"], f["fastest_speculative"]
    if best is None:
        continue
    replay = "" if best["weights"] == "trained" else " (a TIMING REPLAY: random weights, embedded acceptance)"
    text = (f"* **{f['model']}{replay}: the lowest median of a lossless loop here is {where(best)}**, "
            f"{best['ms_per_frame']:.2f} ms a frame (inner-loop RTF {best['rtf']:.3f})")
    if best["x_floor_ar"]:
        same_ar = next((r for r in table["rows"] if r["row"] == "fused AR" and key_of(r) == key_of(best)
                        and r["x_floor_ar"]), None)
        own = best["x_floor_ar"] * best["tokens_per_call"]  # against the floor of its own calls, 15 / tokens per call
        text += f", {best['x_floor_ar']:.2f}x the AR frame's weight-streaming floor"
        if best["decoder"] != "ar":
            text += (f" and {own:.2f}x the floor of its own calls (15 / {best['tokens_per_call']:.2f} tokens per call "
                     f"= {15 / best['tokens_per_call']:.1f} calls a frame)")
        if best["x_floor_ar"] < 1 and (best["decoder"] == "ar" or own < 1):
            text += (" (below 1: the weights stay in the CPU's caches between calls, and the floor counts reads from "
                     "memory" + (f"; the fused AR frame of the same model, precision and backend, which makes all 15 "
                                 f"calls, is itself at {same_ar['x_floor_ar']:.2f}x, so fewer calls is not the reason"
                                 if best["decoder"] != "ar" and same_ar and same_ar["x_floor_ar"] < 1 else "") + ")")
        elif best["x_floor_ar"] < 1:
            text += (" (below the AR floor but not below the floor of its own calls: it is below the AR floor because "
                     "it makes fewer calls" + (f"; the fused AR frame of the same model, precision and backend is at "
                                               f"{same_ar['x_floor_ar']:.2f}x, its weights partly in the CPU's caches"
                                               if same_ar and same_ar["x_floor_ar"] < 1 else "") + ")")
    if ar and spec:
        text += (f". The fastest AR, {where(ar)}, takes {ar['ms_per_frame']:.2f} ms; the fastest speculative, "
                 f"{where(spec)}, {spec['ms_per_frame']:.2f} ms ({f['speculative_over_ar']:.2f}x the AR's time"
                 + (f"; a median of {frames_per_runner} timed frame(s) per runner, so a rough reading"
                    if not table["meta"].get("noise_target") and table["meta"]["repeats"] < 3 else "") + ")")
        told = M.read_gain(ar["ms_per_frame"] / spec["ms_per_frame"], worst_noise)
        if told is not None:
            text += (f". By the noise rule above (times within a factor of {noise_factor:.2f} of each other are not "
                     "told apart), this run " + {"tie": "does not tell", "edge": "is at the edge of telling"}.get(
                         told, "tells") + " the fastest speculative frame apart from the fastest AR")
    if noise_factor is not None:
        close = [r for r in table["rows"] if r["model"] == f["model"] and r["ms_per_frame"] and r is not best
                 and r["ms_per_frame"] < best["ms_per_frame"] * noise_factor]
        text += (f"; {len(close)} other row(s) of this model are within that factor of the lowest median"
                 + " (" + "; ".join(f"{where(r)}: {r['ms_per_frame']:.2f} ms" for r in close) + ")"
                 + ", so which of them is fastest is not settled by this run" if close else
                 "; no other row of this model is within that factor of it")
    else:
        text += ("; this run timed too few frames to estimate its timing noise, so differences between its rows are "
                 "not told apart: 'lowest' here only orders the medians")
    bullets.append(text + ".")
fused_ar_ms = {key_of(r): r["ms_per_frame"] for r in table["rows"] if r["row"] == "fused AR" and r["ms_per_frame"]}
auto_fused = [r for r in table["rows"] if r["row"] == "auto" and r["fused"] and r["kind"] != "ar"
              and r["ms_per_frame"] and key_of(r) in fused_ar_ms]
auto_read = [M.read_gain(fused_ar_ms[key_of(r)] / r["ms_per_frame"], worst_noise) for r in auto_fused]
auto_wins, auto_losses, auto_edge = (auto_read.count(c) for c in ("faster", "slower", "edge"))
rounds_beyond = sum(M.read_gain(r["tokens_per_call"] / r["round_over_ar_call"], worst_noise) == "faster"
                    for r in rounds)  # fused speculative frames faster than fused AR beyond the noise
if rounds:
    lo, hi = min(rounds, key=lambda r: r["round_over_ar_call"]), max(rounds, key=lambda r: r["round_over_ar_call"])
    wins = [r for r in rounds if r["round_over_ar_call"] < r["tokens_per_call"]]
    bullets.append(
        f"* **Why (measured).** A fused speculative round commits {span([r['tokens_per_call'] for r in rounds])} "
        f"codes and costs {span([r['round_over_ar_call'] for r in rounds])} fused AR calls (fewest: {lo['model']} "
        f"{lo['precision']} {lo['backend']}; most: {hi['model']} {hi['precision']} {hi['backend']}): the wider verify "
        f"call, the drafts and the accept walk are work an AR step does not do. Speculation wins where a round costs "
        f"fewer AR calls than it commits codes: {len(wins)} of {len(rounds)} (model, precision, backend) here"
        + (" (" + ", ".join(" ".join((r["model"], r["precision"], r["backend"])) for r in wins) + ")" if wins
           else "")
        + f", counting the table's fused speculative row only (its chains of window "
          f"{', '.join(map(str, table['meta']['chains']))})"
        + ((f"; auto's fused picks, which the first bullets may name, beat the fused AR frame by more than the noise "
            f"factor {noise_factor:.2f} in {auto_wins} of {len(auto_fused)}, lose by more than it in "
            f"{auto_losses}" + (f", are at its edge (within {M.EDGE_SHARE * (noise_factor - 1):.3f} of it "
                                f"either side) in {auto_edge}" if auto_edge else "")
            + " and tie in the rest (" if noise_factor is not None else
            f"; auto's fused picks, which the first bullets may name, have a lower median than the fused AR frame in "
            f"{sum(r['ms_per_frame'] < fused_ar_ms[key_of(r)] for r in auto_fused)} of {len(auto_fused)}, but this "
            "run timed too few frames to estimate its noise, so these differences are not told apart (")
           + ", ".join(f"{r['model']} {r['precision']} {r['backend']}: {r['decoder']} "
                                            f"{r['ms_per_frame']:.2f} ms against {fused_ar_ms[key_of(r)]:.2f} ms"
                                            for r in auto_fused) + ")" if auto_fused else "")
        + (f"; by more than the same noise factor {noise_factor:.2f} (the fused speculative frame faster than the "
           f"fused AR frame beyond the factor, its edge band excluded: tokens per call over a round's cost in AR calls "
           f"is that speed ratio), "
           f"{rounds_beyond} of them"
           if noise_factor is not None else "")
        + ". This compares the FUSED speculative frame with the FUSED AR frame, in this notebook's table run; "
          "notebook 06 compares its best speculative frame with the fused AR frame in its own run, and where the "
          "two are within the noise it can find speculation slower at the same model and precision.")
fused_ar_rows = [r for r in table["rows"] if r["row"] == "fused AR" and r["x_floor_ar"]]
fused_below = [r for r in fused_ar_rows if r["x_floor_ar"] < 1]
if native_calls:
    ratios = [r["t1_over_floor"] for r in native_calls]
    bullets.append(
        f"* **The floor (measured).** Through the native forward one call of {model} runs at {span(ratios)}x its "
        f"weight-streaming floor"
        + (": a lone call costs about the time to read the weights once from memory, so it gets faster only by "
           "reading fewer bytes (a lower precision) or by finding them in the CPU's caches, and a speculative round "
           "must read them for more rows at once without paying more than the calls it saves." if max(ratios) < 1.5
           else ": above the floor, so part of each call is overhead a faster kernel could still remove.")
        + (f" The fused AR frame runs below 15 calls' floor in {len(fused_below)} of {len(fused_ar_rows)} (model, "
           f"precision, backend) of the table (`x_floor_ar`: "
           + ", ".join(f"{r['model']} {r['precision']} {r['backend']} {r['x_floor_ar']:.2f}" for r in fused_below)
           + "): its "
           "15 calls run back to back over the same weights, which can stay in the caches, so the floor bounds "
           "calls that stream their weights, not every frame." if fused_below else ""))
shrinks = [(dec, b) for (dec, b), g in spec_b.groupby(["decoder", "backend"], sort=False)
           if g.sort_values("batch").speedup_vs_ar.iloc[-1] < g.sort_values("batch").speedup_vs_ar.iloc[0]]
always_below = [(dec, b) for (dec, b), g in spec_b.groupby(["decoder", "backend"], sort=False)
                if (g.speedup_vs_ar < 1.0).all()]
bullets.append(
    f"* **Batches (measured, {small_model}).** " + "; ".join(lose) + ". "
    + (f"Stepped speculation is below stepped AR at every batch size for {len(always_below)} of {len(lose)} "
       f"stepped decoders here ({', '.join(f'{d} through {b}' for d, b in always_below)}): those have no gain to "
       "lose. " if always_below else "")
    + (f"Speculation's ratio to AR falls as B grows for {len(shrinks)} of {len(lose)} stepped decoders: a batched AR call reads "
       "the weights once for every row, so the calls speculation saves get cheaper." if shrinks else
       "Speculation's ratio to AR does not fall with B here."))
bullets.append(f"* **auto (measured).** On this CPU `--decoder auto` chose {choice.label} through {choice.backend}"
               + (", fused" if choice.fused else ", stepped") + ".")
ar_span = [(f["model"], [r["ms_per_frame"] for r in table["rows"] if r["model"] == f["model"] and r["kind"] == "ar"
                          and r["row"] in ("stepped AR", "fused AR") and r["ms_per_frame"]]) for f in fastest]
paper_n = [r["speedup"] for r in plots.PAPER_DEVICE_SPEEDUPS if r["nodes"] == PAPER_BUDGET]  # quoted
bullets.append(
    f"* **The paper (quoted) and this appendix.** The paper reports {min(paper_n):.2f}x-{max(paper_n):.2f}x over "
    f"AR at N = {PAPER_BUDGET} on Apple devices through Core ML, over AR on the same device. Here the AR frames of "
    "one model alone span "
    + "; ".join(f"{min(v):.2f}-{max(v):.2f} ms ({m})" for m, v in ar_span if v)
    + " across backends and precisions (measured): a speedup means little until it names the AR it is over, so "
      "the table puts every speculative frame beside the fastest AR measured with it.")
bullets.append(
    "* **Which run.** Every number above is this notebook's own run (its table, section 5: each runner's median "
    f"over {frames_per_runner} timed frame(s), drawn in turn from {table['meta'].get('n_contexts')} contexts of the "
    "evaluation split for trained weights"
    + (f"; the trees shipped beside {small_model} (`trees/heads.json`, calibrated on {small_trees_n:,} frames), "
       "whose acceptance the timing replay also uses" if small_trees_n else "")
    + "). Notebook 06 times the whole frame in another run and picks its own best speculative decoder per precision; "
      "candidates within the timing noise of each other can swap places between the two runs. Tokens per call "
      "differ too: auto (section 4) decodes its own calibration frames, this table its evaluation frames, and the "
      "stepped and fused rows of one decoder draw different codes, so with few frames the same decoder's value "
      "moves by its sampling noise.")
display(Markdown("\n".join(bullets)))
print(f"total {summary['timings_s']['total']:.0f} s")

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **`batch_sizes = (1, 32)`**: a larger batch; look at whether speculation's gain over AR survives when the batch
#   already fills the machine.
# * **`talker_contexts = (64, 2048)`**: a long utterance; the talker step's distance to its memory floor changes with
#   the KV cache it reads.
# * **`precisions = ("float32",)`**: one precision; compare the floor table with the committed one to see what the
#   lower precisions bought on this CPU.
