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
# # 01 — The RVQ bottleneck: where a frame's time goes
#
# **What this notebook answers.** Before speeding anything up: where does the time of one 80 ms frame go, and what
# would speculation have to buy for real time? This is the paper's motivation (its Section 1 and Figure 1), measured
# here.
#
# **The two loops** ([glossary](../docs/glossary.md), [docs/model.md](../docs/model.md#two-nested-loops)).
# Qwen3-TTS (12 Hz models) generates speech with two nested autoregressive loops:
#
# * the outer loop, the **talker** (the deep model: the released 0.6B config's 28 layers,
#   [model.md](../docs/model.md#two-nested-loops); section 1 prints the loaded model's): one call per codec
#   **frame**, 12.5 frames a second (one frame is 80 ms of audio). Each call emits **code 0** of the frame, the
#   first of its 16 residual codebooks;
# * the inner loop, the **code predictor** (the released config's 5 layers): emits **codes 1..15** of the same
#   frame, **one sequential call each** (a 2-position prefill gives code 1, then one call per further code). Its
#   cache restarts every frame.
#
# So one frame costs one talker call plus fifteen code-predictor calls, and real time needs
# `frame_rate_hz × n_code_groups` sequential model calls a second. The inner loop makes fifteen of every sixteen
# calls: it is what the paper speeds up, by drafting several codes and checking them in **one verify call** over
# `N` query positions, root included: the **node budget** N, the last committed code plus N − 1 drafts
# ([glossary](../docs/glossary.md#speculative-decoding), [methods.md](../docs/methods.md#reporting-speed)). Whether
# that pays depends on how the cost of one call grows with `N` on a given device, the **verify cost curve**
# `t(N) / t(1)`, and on how many codes a call commits on average, the **tokens per call**.
#
# The sections:
#
# 1. the model and its config;
# 2. the two loops, drawn from the configs (Figure 1's analogue);
# 3. calls per second for real time, from the config, at a given tokens per call;
# 4. measured latency of a talker step and of a code-predictor call of `N` positions on the real-size 0.6B
#    architecture, through the official modules and the native forward;
# 5. the inner loop's share of a frame, measured and predicted from the bytes each call reads;
# 6. the verify cost curve;
# 7. the small trained model of this companion beside the real-size architecture;
# 8. calls per second at the tokens per call the decoders reach **here**, beside the paper's;
# 9. what this notebook showed, and why.
#
# **Random weights.** The real-size architectures are built from the released `config.json` (shipped in
# `data/configs/`) with **random weights**: latencies depend on the architecture, not on the weights, so they are
# real; their outputs mean nothing, and every table and figure that times them says so. Acceptance (tokens per call)
# needs trained weights: section 8 measures it on the embedded model. Every number is read from a config or measured
# when the notebook runs; none is typed in.

# %% tags=["parameters"]
model = "qwen3-tts-0.6b-random"  # real-size 0.6B architecture, RANDOM weights (timing only)
seed = 0  # seed of the random weights and of the random input embeddings
smoke = False  # True: tiny-random model, 2 repeats, N up to 16 (headless test)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
repeats = 10  # the MINIMUM of timed calls per measurement (median reported; more until noise_target is met)
noise_target = 0.05  # time each call until its median's relative standard error is at most this, or 4 x repeats
#                      (rvqspec_lib.eval.noise; None: exactly `repeats`). Smoke: None
warmup = 3  # untimed calls before each measurement
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
device = "auto"  # where the models run: auto (CUDA, then Apple's MPS, then the CPU), cpu, cuda or mps; the native pair
#                  runs on the CPU only, so it is timed only when the models run there (the committed figures: cpu)
prefix_len = 8  # KV positions already in the code-predictor cache (a mid-frame verify)
talker_context = 64  # KV positions already in the talker cache (about 5 s of speech plus the text prompt)
native = True  # also time the native pair (talker step and code-predictor call as one C call each) where it runs
compare_model = "embedded"  # timed the same way beside `model` ("" skips): the small trained model shipped here
own_tpc_frames = 100  # evaluation frames of `compare_model` decoded to measure this companion's own tokens per call
own_decoders = ("chain:4", "chain:8", "tree:calibrated-point-mass:16", "tree:calibrated-point-mass:32",
                "tree:calibrated-sampled:16", "tree:calibrated-sampled:32", "paper:16", "paper:32")
cpu_sizes = {"own_tpc_frames": 24}  # a full run on a real-size checkpoint on the CPU: these in place of the sizes
#                                     above (the smaller), so that `make paper` fits 90 minutes on 2 cores; None or
#                                     {}: the sizes above (paper.checkpoint.cpu_sized)

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from tools.results_doc import entry, headline
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.data.utterances import embedded_root
from paper.checkpoint import cpu_sized, is_checkpoint, prepare_checkpoint, takes_cpu_sizes
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET, parse_decoder_name
from bench import latency
from paper import plots
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.timing import measure_quietly
from rvqspec_lib.models.backends import available
from rvqspec_lib.models.configs import CONFIG_DIR, RANDOM_MODELS
from paper.notebook_measures import cost_growth_words, loop_facts
from rvqspec_lib.common.machine import resolve_device
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.models.named_decoders import drafter_calibration, has_paper_decoder

# smoke: the tiny model (unless another model was asked for), few repeats, N up to 16
run_model = "tiny-random" if smoke and model == "qwen3-tts-0.6b-random" else model
run_repeats = min(int(repeats), 2) if smoke else int(repeats)
run_noise_target = None if smoke else noise_target  # smoke: the fixed small count (fast)
run_warmup = min(int(warmup), 1) if smoke else int(warmup)
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
query_sizes = (1, 2, 4, 8, 16) if smoke else latency.QUERY_SIZES
if threads:
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
device = resolve_device(device)  # a device not present: one line, before loading
on_checkpoint = is_checkpoint(run_model)  # a released checkpoint: its own frames give section 8's tokens per call
cpu_run = takes_cpu_sizes(run_model, smoke=smoke, cpu_sizes=cpu_sizes, device=device)  # real size on the CPU: its sizes
own_tpc_frames = cpu_sized("01", {"own_tpc_frames": own_tpc_frames}, cpu_sizes, applies=cpu_run)["own_tpc_frames"]
if on_checkpoint:
    prepare_checkpoint(run_model, smoke=smoke, notebook="01", out_dir=out, seed=seed, cpu_sizes=cpu_sizes,
                       device=device)
    if compare_model == "embedded":  # the default: the checkpoint alone, no other model timed beside it
        compare_model = ""
params = dict(model=run_model, seed=seed, smoke=bool(smoke), out_dir=str(out), repeats=run_repeats, device=device,
              warmup=run_warmup, threads=torch.get_num_threads(), prefix_len=prefix_len,
              talker_context=talker_context, query_sizes=list(query_sizes), native=bool(native),
              compare_model=compare_model, own_decoders=list(own_decoders), noise_target=run_noise_target,
              own_tpc_frames=own_tpc_frames, notebook="01_rvq_bottleneck", cpu_sized=cpu_run)
print(f"model {run_model}, outputs -> {out}")
if run_model != model:  # a smoke run: the prose below describes the real-size model it stands in for
    display(Markdown(f"**Smoke run:** `{run_model}` runs in place of `{model}`; where the text says real-size or 0.6B, read `{run_model}`, and read every number as a check that the code runs, not a measurement."))

# %% [markdown]
# ## 1. The model and its config
# The model's geometry as loaded: layers and widths of both loops, parameters, codebooks and frame rate.

# %%
loaded = load_model(run_model, seed=seed, device=device, dtype="float32")
info = loaded.describe()
run_native = bool(native) and available("native", device="cpu")[0] and \
    next(loaded.talker.parameters()).device.type == "cpu"
if native and not run_native:
    print(f"the native forward is absent here ({available('native')[1]}): timing the official modules only")
cp_inside = ({id(p) for p in loaded.code_predictor.parameters()}
             <= {id(p) for p in loaded.model.talker.parameters()})  # is the code predictor a submodule of the talker?
display(Markdown(
    "`params_talker_total` counts every parameter of the talker module"
    + (f", the code predictor's **included** (the talker holds it as a submodule): do not add "
       f"`params_code_predictor` to it; the talker without its code predictor has "
       f"{info['params_talker_total'] - info['params_code_predictor']:,} parameters." if cp_inside else
       "; the code predictor's, `params_code_predictor`, are not among them.")))
pd.Series(info, name="value").to_frame()

# %% [markdown]
# ## 2. The two loops (the paper's Figure 1, here)
# **The question.** How many sequential model calls does one frame make, in each loop, for every model this
# companion ships or builds? **How.** Read from the configs, never drawn by hand: the layers of each loop, the
# codebooks per frame (`n_code_groups`) and the frame rate of the embedded model and of the released real-size
# configs in `data/configs/`, and the calls a second each loop must make for real time.

# %%
loop_rows = [{"model": run_model, **{k: v for k, v in info.items() if k in (
    "talker_layers", "talker_hidden", "code_predictor_layers", "code_predictor_hidden", "n_code_groups",
    "frame_rate_hz")}}]
if run_model != "embedded":
    loop_rows.append({"model": "embedded", **loop_facts(embedded_root("embedded") / "model")})
for name, folder in RANDOM_MODELS.items():
    if name != run_model:
        loop_rows.append({"model": name, **loop_facts(CONFIG_DIR / folder)})
for r in loop_rows:
    b = latency.call_budget(r["frame_rate_hz"], r["n_code_groups"])
    r.update(talker_calls_per_s=r["frame_rate_hz"], code_predictor_calls_per_s=r["frame_rate_hz"] * (
        r["n_code_groups"] - 1), calls_per_frame=b["calls_per_frame"], calls_per_s=b["calls_per_s"])
    r.pop("folder", None)
loops = pd.DataFrame(loop_rows)
prov = provenance(params, seed=seed)
save_table(loops, out / "01_two_loops", prov,
           caption="the two loops of each model, from its config.json (layers, codebooks, frame rate); calls per "
                   "second for real time = frame_rate_hz x (1 + (n_code_groups - 1))")
fig = plots.plot_two_loops(loop_rows, title="The two nested loops of Qwen3-TTS-class models, from their configs",
                           figsize=(10.0, 3.4))
save_figure(fig, out / "01_two_loops", prov)
plt.show()
display(Markdown(
    "Columns beyond the config's: `talker_calls_per_s` = `frame_rate_hz` (one talker call a frame); "
    "`code_predictor_calls_per_s` = `frame_rate_hz` × (`n_code_groups` − 1); `calls_per_frame` = `n_code_groups` "
    "(1 talker + `n_code_groups` − 1 code-predictor calls in plain autoregressive decoding); `calls_per_s` = "
    "`frame_rate_hz` × `calls_per_frame`, the sequential calls a second real time needs."))
loops

# %% [markdown]
# ## 3. Calls per second for real time
# **The question.** How many sequential calls a second must a device sustain? **How.** From the config: one frame is
# one talker call and `n_code_groups − 1` inner calls, `frame_rate_hz` frames a second
# (`bench.latency.call_budget`).

# %%
frame_rate_hz = loaded.frame_rate_hz  # from speech_tokenizer/config.json: output_sample_rate / decode_upsample_rate
n_code_groups = loaded.n_code_groups  # talker_config.num_code_groups
ar = latency.call_budget(frame_rate_hz, n_code_groups)
display(Markdown(
    f"`frame_rate_hz` = {frame_rate_hz:g}, `n_code_groups` = {n_code_groups}: one frame = 1 talker call + "
    f"{n_code_groups - 1} code-predictor calls = {ar['calls_per_frame']:g} calls, so real time needs "
    f"**{ar['calls_per_s']:g} model calls a second** ({frame_rate_hz:g} × {n_code_groups}), "
    f"one every {1000 / ar['calls_per_s']:.1f} ms."))

# %% [markdown]
# A speculative inner loop that commits `tpc` codes per inner call on average (its **tokens per call**, also written
# codes per call, the prefill call counted) needs `frame_rate_hz × (1 + (n_code_groups − 1) / tpc)` calls a second.
# The table runs a few values of `tpc`; the paper's reported value is one of them, labelled as the paper's (the
# caption renders it). Columns: `tokens_per_call` is the `tpc` of the row; `inner_calls_per_frame` =
# (n_code_groups − 1) / `tpc`, the code-predictor calls of one frame; `calls_per_s` = frame_rate_hz ×
# (1 + `inner_calls_per_frame`), the talker's calls included; `reduction` = plain AR's calls a second over the
# row's, how many times fewer sequential calls real time needs; `note` labels plain AR and the paper's value.

# %%
budget = pd.DataFrame(latency.budget_table(frame_rate_hz, n_code_groups, latency.DEFAULT_TOKENS_PER_CALL))
save_table(budget, out / "01_call_budget", prov,
           caption=f"calls per second for real time at a given tokens per call, from the config; "
                   f"{latency.PAPER_TOKENS_PER_CALL} is the paper's reported value (quoted), the others are settings")
budget

# %% [markdown]
# ## 4. Measured latency: a talker step against a code-predictor call of `N` positions
# **The question.** How long does each call take on this CPU, and how much more does a code-predictor call cost
# when it carries `N` query positions (the verify call of a tree of `N` − 1 drafted nodes and the root) instead
# of one?
#
# **How** (`bench.latency.bench_model`). One talker step (one new position after `talker_context` cached
# positions, then `codec_head`) and one code-predictor call of `N` query positions after a cache of `prefix_len`
# positions (projection, its layers, one head over the `N` positions), every call one condition of ONE interleaved
# run, so that a change of machine load hits all of them alike ([style.md](../docs/style.md#benchmarks)). Each
# pair is timed twice over: through the **official** modules, and through the **native** forward (the talker step
# and the code-predictor call each one C call over packed copies of the weights,
# [precision.md](../docs/precision.md#the-native-forward)) where this CPU runs it. The median of at least
# `repeats` calls after `warmup` (more until its relative standard error meets `noise_target`); p10 and p90 show
# the spread. A CPU shared with other processes is re-measured once, and a timing that stays oversubscribed says so
# in its caption.

# %%
result, quiet = measure_quietly(lambda: latency.bench_model(
    loaded, prefix_len=prefix_len, query_sizes=query_sizes, talker_context=talker_context, native=run_native,
    warmup=run_warmup, repeats=run_repeats, seed=seed, progress=True, noise_target=run_noise_target),
    attempts=timing_attempts)
prov = {**provenance(params, seed=seed), "timing": quiet}  # after the run: the load average it ran under
latency_df = pd.DataFrame(latency.latency_rows(result))
weights_words = "RANDOM weights, timing only" if result["random_weights"] else "trained weights"
save_table(latency_df, out / "01_latency", prov, caption="; ".join(filter(None, [
    f"{run_model} ({weights_words}), {result['device_name']}, {result['threads']} thread(s)", noise_words(result),
    quiet["note"]])))
other = result["other_cpu_frac"]
latency_words = ("**" + plots.bench_title(result).replace("\n", " — ") + f"**, {noise_words(result)}" + (
    f". Other processes used {100 * other:.0f}% of the machine's {result['cpu_count']} CPUs during the timing"
    + (": **oversubscribed, the times are pessimistic; rerun on an idle machine or with fewer threads**."
       if result["cpu_oversubscribed"] else " (not oversubscribed).")
    if result["device"] == "cpu" and other is not None else ""))
display(Markdown(
    latency_words + ("" if latency_words.endswith(".") else ".")
    + " The relative standard error of a row's median is sqrt(π/2) × 1.4826 × MAD / √n / median, MAD being the "
      "median absolute deviation of its `n` timed calls from their median (`rvqspec_lib.eval.noise`; the calls "
      "themselves are not printed)."
    + " Columns: `call` is the talker step or a code-predictor call; `forward` is the code that ran it (official "
      "modules or native); `n_queries` is the number of positions the call carries; `n` is the number of timed calls "
      "of that row; `median_ms`, `p10_ms`, `p90_ms` and `min_ms` are "
      "their median, 10th and 90th percentiles and fastest call; `ratio_to_1` is the row's median over the same "
      "forward's one-position code-predictor call."))
latency_df

# %% [markdown]
# ## 5. The inner loop's share of a frame
# **The question.** In plain autoregressive decoding (AR: one code per call), what share of a frame's model time do
# the fifteen code-predictor calls take? **How.** From the medians above: frame time = one talker step + fifteen
# code-predictor calls of one position, for each pair. Beside it, a prediction with no clock at all: a call of a
# few rows reads every weight once and does a handful of multiply-adds with it, so on a CPU its time is set by the
# bytes it streams; its **weight-streaming floor** is the time to read its weights once from memory
# ([precision.md](../docs/precision.md#the-floor)). If both calls ran at the same bandwidth, the
# share would be fifteen code-predictor calls' bytes over the frame's bytes
# (`bench.latency.inner_share_from_bytes`).

# %%
pairs = {"official": result} | ({"native": result["native"]} if "native" in result else {})
by_bytes = latency.inner_share_from_bytes(loaded, talker_context=talker_context)
share_keys = ("t_talker_ms", "t_inner_ms", "inner_calls_per_frame", "frame_ms_ar", "frame_budget_ms", "rtf_ar",
              "inner_share_ar")
share_rows = [{"forward": name, **{k: p["derived"][k] for k in share_keys}} for name, p in pairs.items()]
share_rows.append({"forward": "bytes read (no timing)", "inner_calls_per_frame": by_bytes["inner_calls_per_frame"],
                   "inner_share_ar": by_bytes["inner_share"]})
save_table(share_rows, out / "01_inner_share", prov, caption=(
    f"{run_model} ({weights_words}); AR frame = talker step + {by_bytes['inner_calls_per_frame']} code-predictor "
    f"calls of one position; the last row: the share predicted from the bytes each call reads (talker "
    f"{by_bytes['talker_step_bytes'] / 1e6:.0f} MB of weights + {by_bytes['talker_kv_bytes'] / 1e6:.1f} MB of KV "
    f"cache, code predictor {by_bytes['code_predictor_call_bytes'] / 1e6:.0f} MB)"
    + (f"; {quiet['note']}" if quiet["note"] else "")))
display(Markdown("\n".join(
    f"* **{r['forward']}**: talker step {r['t_talker_ms']:.1f} ms + {r['inner_calls_per_frame']} × "
    f"{r['t_inner_ms']:.2f} ms = **{r['frame_ms_ar']:.1f} ms** for {r['frame_budget_ms']:.0f} ms of audio "
    f"(model-only real-time factor `rtf_ar` {r['rtf_ar']:.2f}); the inner loop takes "
    f"**{r['inner_share_ar']:.1%}** of it."
    for r in share_rows if "t_talker_ms" in r)
    + f"\n* **bytes read**: a talker step streams {by_bytes['talker_step_bytes']:,} bytes of weights and "
      f"{by_bytes['talker_kv_bytes']:,} bytes of cache, a code-predictor call "
      f"{by_bytes['code_predictor_call_bytes']:,} bytes: at equal bandwidth the inner loop would take "
      f"{by_bytes['inner_calls_per_frame']} × {by_bytes['code_predictor_call_bytes']:,} / "
      f"({by_bytes['talker_step_bytes']:,} + {by_bytes['talker_kv_bytes']:,} + "
      f"{by_bytes['inner_calls_per_frame']} × {by_bytes['code_predictor_call_bytes']:,}) = "
      f"**{by_bytes['inner_share']:.1%}** of the frame."
    + "\n\nColumns: `t_talker_ms` and `t_inner_ms` are the median times of one talker step and one code-predictor "
      "call; `frame_ms_ar` = talker step + `inner_calls_per_frame` code-predictor calls (no codec); "
      "`frame_budget_ms` is the audio one frame carries; `rtf_ar` (the model-only AR real-time factor) = "
      "`frame_ms_ar` / `frame_budget_ms`, the talker and the inner loop with no codec, unlike notebook 06's "
      "whole-frame real-time factor, which adds the codec; `inner_share_ar` = the inner loop's part of "
      "`frame_ms_ar`; `forward` names the row, the last one predicted from the bytes alone (no timing, so only "
      "its share). The table below is saved as `01_inner_share`, whose caption rounds the bytes to MB; the exact "
      "counts are above."))
pd.DataFrame(share_rows).set_index("forward")

# %% [markdown]
# ## 6. The verify cost curve `t(N) / t(1)`
# **The question.** A verify call over `N` positions replaces up to `N` sequential calls only if it costs much less
# than `N` calls. How does its cost grow? **How.** The medians of section 4, each over the same pair's `t(1)`. The
# dotted line `y = N` is a device with no parallelism left; a flat curve means the extra positions ride along with the
# weights the call streams anyway. The node budget of a draft tree must be chosen against this curve, per device
# (notebook 04 does it).

# %%
fig = plots.plot_verify_cost(result, figsize=(9.0, 3.4))
save_figure(fig, out / "01_verify_cost", prov)
plt.show()

# %% [markdown]
# ## 7. The embedded model beside the real-size architecture
# **The question.** The later notebooks measure acceptance on `compare_model`, the small Qwen3-TTS-class model
# trained here (`data/embedded`, see its MODEL_CARD.md). How do its calls compare? **How.** The same timing on it:
# same two loops, same frame rate and codebooks, so the same calls a second, but layers of another size, so each call
# costs what the table below shows (the real-size architecture's layers are much larger than the embedded model's;
# a smoke run's stand-in, `tiny-random`, is smaller still, so there the embedded model is the slower one). Its
# milliseconds do not transfer to the real model; its tokens per call are its own too (section 8). Its `t(16)/t(1)` rows time the whole call as section 4 does (input
# projection, layers and one head, in a run interleaved with talker steps); notebook 04 times the backend's forward
# alone in its own run, so its ratios for the same model differ.

# %%
compared = [latency.model_row(result)]
small, small_quiet = None, None
if compare_model:
    small = load_model(compare_model, seed=seed, device=device, dtype="float32")
    small_result, small_quiet = measure_quietly(lambda: latency.bench_model(
        small, prefix_len=prefix_len, query_sizes=query_sizes, talker_context=talker_context, native=run_native,
        warmup=run_warmup, repeats=run_repeats, seed=seed, progress=True, noise_target=run_noise_target),
        attempts=timing_attempts)
    compared.append(latency.model_row(small_result))
    notes = "; ".join(f"{name}: {q['note']}" for name, q in ((loaded.name, quiet), (small.name, small_quiet))
                      if q["note"])
    save_table(compared, out / "01_models_compared",
               {**provenance(params, seed=seed), "timing": {loaded.name: quiet, small.name: small_quiet}},
               caption=notes or None)
compared_df = pd.DataFrame(compared).set_index("model").T
q_cmp = next((k for k in compared[0] if k.startswith("t(")), "t(N)/t(1)")
display(Markdown(
    "Rows: the geometry as in section 1 (`params_talker_total` **includes** `params_code_predictor`, see there); "
    "`calls_per_s_realtime` is section 3's AR call budget; `t_talker_ms`, `t_inner_ms`, `frame_ms_ar`, `rtf_ar` "
    f"and `inner_share_ar` as in section 5; `{q_cmp}` is section 6's cost ratio at that N; rows prefixed "
    "`native_` are the same through the native forward."))
compared_df

# %% [markdown]
# ## 8. Calls per second at this companion's own tokens per call
# **The question.** The call budget of section 3 at the tokens per call the decoders actually reach **here**.
# **How** (`bench.latency.calls_at_tokens_per_call`). `own_tpc_frames` held-out evaluation frames of `compare_model`
# (trained weights: acceptance needs them) decoded by each decoder of `own_decoders`, built by name through the
# resolver: chains of sampled drafts, the reused heads' calibrated trees with **point-mass** children (top-ranked
# drafts, the paper's kind) and with **sampled** children, and the paper's decoder `paper:N` (the position-aware offsets
# shipped beside the model, trained and calibrated when the model was built, with their own calibrated point-mass tree)
# where the model ships it. In one line each ([glossary](../docs/glossary.md#speculative-decoding),
# [drafters](../docs/glossary.md#drafters)): the **reused heads** draft a later depth by applying the code predictor's
# own head of that depth to the current hidden state; the **offsets** add a small learned vector per offset (how far
# past the last committed depth the draft reaches) before that head (notebook 03 shows how they are trained; `paper:N`
# uses the shipped ones); a **calibrated tree** is the tree of node budget N (N query positions: the root and N − 1
# drafted nodes) grown greedily, drafted node by drafted node, from acceptance tables measured on a calibration split
# (notebook 04); a **point-mass** child is a top-ranked draft, kept with the target's probability of its code, a
# **sampled** child is drawn from q, the first one kept with min(1, p/q) and later siblings tried against what is left
# of p; `paper:N` is the offsets drafter with its own calibrated point-mass tree of node budget N. The paper's value
# stands in its own labelled columns. One colour per decoder family, as in every figure of the companion.
#
# **Which trees.** Here every calibrated name (`tree:calibrated-point-mass:N`, `tree:calibrated-sampled:N`,
# `paper:N`) reads the trees shipped beside the model, calibrated once when it was built (the cell below says on how
# many frames). Notebooks 03, 04 and 05 calibrate their own trees on their own frames, so the same name there means
# another calibration, and can commit another number of codes per call.

# %%
own, own_meta = [], {}
tpc_lm = loaded if on_checkpoint else small  # whose frames: the checkpoint's own, else the small trained model's
if tpc_lm is not None:
    n_own = min(int(own_tpc_frames), 8) if smoke else int(own_tpc_frames)
    own_frames = frames_from_shipped(tpc_lm, "evaluation", max_frames=n_own, seed=seed)
    own_sampling = inner_sampling(tpc_lm)
    names = [n for n in own_decoders if not n.startswith("paper") or has_paper_decoder(tpc_lm)]
    if len(names) < len(own_decoders):
        print(f"{tpc_lm.name} ships no offsets drafter with its calibration: the paper's decoder is left out")
    own = latency.calls_at_tokens_per_call(tpc_lm, names, own_frames.context, sampling=own_sampling, seed=seed)
    paper_budget = latency.call_budget(tpc_lm.frame_rate_hz, tpc_lm.n_code_groups, latency.PAPER_TOKENS_PER_CALL)
    for r in own:
        r.update({"paper: tokens per call (Qwen3-TTS-0.6B, offsets, N 32)": latency.PAPER_TOKENS_PER_CALL,
                  "paper: calls per s": paper_budget["calls_per_s"]})
    own_meta = {"frames": len(own_frames), "sampling": own_sampling.describe(), "model": tpc_lm.name}
    save_table(own, out / "01_calls_at_own_tpc", provenance(params, seed=seed),
               caption=f"tokens per call measured on {len(own_frames)} evaluation frames of {tpc_lm.name} "
                       f"(sampling {own_sampling.describe()}), calls per second from the config; the paper's "
                       f"values in the columns marked 'paper', quoted")

    fig, ax = plt.subplots(figsize=(8.0, 3.4), constrained_layout=True)
    xs = range(len(own))
    ax.bar(list(xs), [r["calls_per_s"] for r in own], color=[plots.decoder_color(r) for r in own])
    for x, r in zip(xs, own):  # each bar's measured tokens per call, inside its top
        ax.text(x, r["calls_per_s"] * 0.97, f"{r['tokens_per_call']:.2f}", ha="center", va="top", fontsize=7,
                color="w")
    ax.axhline(ar["calls_per_s"], color=plots.decoder_color("ar"), ls="-", lw=1,
               label=f"AR: {ar['calls_per_s']:g} calls/s (from the config)")
    ax.axhline(paper_budget["calls_per_s"], color="k", ls=":", lw=1,
               label=f"the paper's {latency.PAPER_TOKENS_PER_CALL} codes/call (quoted): "
                     f"{paper_budget['calls_per_s']:.1f} calls/s")
    ax.set_xticks(list(xs), [r["decoder"] for r in own], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("calls per second for real time")
    ax.set_ylim(0, 1.3 * ar["calls_per_s"])
    ax.set_title(f"Calls a second for real time at the codes per call measured on {tpc_lm.name} (in the bars)\n"
                 f"{len(own_frames)} held-out frames, {'RANDOM' if tpc_lm.is_random else 'trained'} weights",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, out / "01_calls_at_own_tpc", provenance(params, seed=seed))
    plt.show()
    # the trees the calibrated names read: the ones shipped beside the model (its build's calibration)
    shipped_trees = {dr: drafter_calibration(tpc_lm, dr) for dr in sorted(
        {parse_decoder_name(n).drafter for n in names if "calibration" in parse_decoder_name(n).needs})}

    def on_what(cal):
        """How many frames (and utterances of which split) a shipped calibration was made on."""
        src = cal.get("source") if isinstance(cal.get("source"), dict) else {}
        return f"{cal['n_frames']:,} frames" + (
            f" of {src['n_utterances']:,} utterances of the model's {src['split']} split"
            if {"n_utterances", "split"} <= set(src) else "")
    by_what = {}  # the drafters whose trees were calibrated on the same frames, together
    for dr, cal in shipped_trees.items():
        if cal:
            by_what.setdefault(on_what(cal), []).append(
                f"`trees/{dr}.json` ({'the reused heads' if dr == 'heads' else 'the ' + dr})")
    trees_words = "; ".join(" and ".join(files) + (", each" if len(files) > 1 else "") + f" calibrated on {what}"
                            for what, files in by_what.items())
    if trees_words:
        display(Markdown(
            f"**The calibrated trees here** are the ones shipped beside `{tpc_lm.name}`: {trees_words} (notebooks 06 "
            "and 07 read the same files). Notebooks 03, 04 and 05 calibrate their own trees on their own frames: the "
            "same decoder name there is another calibration."))
    display(Markdown("Columns: `kind` is the decoder family of the name (`ar`, `chain`, `calibrated`, `paper`, "
                     "...); `drafter` is what drafts the codes (`heads`: the reused heads, `offsets`: the paper's "
                     "offsets before those heads); `nodes` is the query positions of one verify call, the root "
                     "included (so N − 1 drafted nodes); `lossy` is True only for a decoder that may change the "
                     "output distribution ("
                     + (", ".join(f"`{r['decoder']}`" for r in own if r["lossy"]) or "none of these")
                     + "); `sampled` says whether drafts are drawn from q rather than top-ranked; `model` and "
                     "`frames` are whose held-out frames were decoded, and how many; `tokens_per_call` is codes "
                     "committed per code-predictor call on these frames (one run, no interval); "
                     "`inner_calls_per_frame` = (n_code_groups − 1) / `tokens_per_call`; `calls_per_s` is the "
                     "sequential calls a second real time then needs, and `reduction_vs_ar` plain AR's calls a "
                     "second over it (section 3's `reduction`); the columns headed `paper:` repeat the paper's "
                     "reported tokens per call (quoted) and the calls a second it would need."))
    display(pd.DataFrame(own).set_index("decoder"))

# %%
ratios = {str(r["n_queries"]): r["ratio_to_1"] for r in result["code_predictor"]}
d = result["derived"]
metrics = {
    "model": run_model,
    "random_weights": result["random_weights"],
    "frame_rate_hz": frame_rate_hz,
    "n_code_groups": n_code_groups,
    "calls_per_s_realtime": ar["calls_per_s"],
    "calls_per_s_at_paper_tpc": latency.call_budget(frame_rate_hz, n_code_groups,
                                                    latency.PAPER_TOKENS_PER_CALL)["calls_per_s"],
    "paper_tokens_per_call": latency.PAPER_TOKENS_PER_CALL,
    "t_talker_ms": d["t_talker_ms"],
    "t_inner_ms": d["t_inner_ms"],
    "frame_ms_ar": d["frame_ms_ar"],
    "rtf_ar": d["rtf_ar"],
    "inner_share": d["inner_share_ar"],
    "inner_share_rows": share_rows,
    "inner_share_from_bytes": by_bytes,
    "verify_cost_ratio": ratios,
    "native": ({"verify_cost_ratio": {str(r["n_queries"]): r["ratio_to_1"] for r in result["native"]["code_predictor"]},
                **result["native"]["derived"]} if "native" in result else None),
    "device": result["device"],
    "device_name": result["device_name"],
    "dtype": result["dtype"],
    "threads": result["threads"],
    "load_avg_1min_before": result["load_avg_1min_before"],
    "load_avg_1min_after": result["load_avg_1min_after"],
    "other_cpu_frac": result["other_cpu_frac"],
    "cpu_oversubscribed": result["cpu_oversubscribed"],
    "compared": compared,
    "timing": quiet,
    "own_tokens_per_call": own,
    "own_tokens_per_call_meta": own_meta,
    "two_loops": loop_rows,
}
# what a reader most wants from this notebook (docs/results.md, generated)
who = run_model + (" (RANDOM weights: timing only)" if result["random_weights"] else "")
paper_rows = [r for r in own if str(r["decoder"]).startswith("paper:")]
small_who = (small.name + (" (small trained model)" if small.name == "embedded" else "")) if small else ""
metrics["headline"] = headline(
    entry(f"model calls a second for real time, autoregressive ({frame_rate_hz:g} frames a second x "
          f"{n_code_groups} codebooks, from {run_model}'s config)", ar["calls_per_s"], "", "01_call_budget.md"),
    entry(f"share of an autoregressive frame spent in the inner (code-predictor) loop, {who}, timed on this CPU",
          100 * d["inner_share_ar"], "%", "01_inner_share.md", glance=True),
    entry(f"share of an autoregressive frame spent in the inner loop, {small_who}, timed on this CPU",
          100 * compared[1]["inner_share_ar"] if len(compared) > 1 else None, "%", "01_models_compared.md"),
    entry(f"model calls a second for real time at the tokens per call the paper's decoder "
          f"({paper_rows[-1]['decoder']}) reaches on {who if on_checkpoint else small_who}, from the config"
          if paper_rows else "",
          paper_rows[-1]["calls_per_s"] if paper_rows else None, "", "01_calls_at_own_tpc.md"),
)
save_json(metrics, out / "01_metrics.json", prov)
save_json(result, out / "01_bench.json", prov)

# %% [markdown]
# ## What this notebook showed, and why
#
# Below, **config** marks what is read from a model's configuration, **measured here** what this run timed or
# decoded (this CPU, these threads; random weights for the real-size architecture, trained weights for the embedded
# model), **paper** what the paper reports (quoted, not reproduced), and **inference** what we expect and did not
# measure.

# %%
n_inner = by_bytes["inner_calls_per_frame"]


BOUND_TOL = 1.25  # time ratio within this factor of the bytes ratio: the calls follow their bytes


def share_words(name, derived):
    """One sentence: does a forward's talker-step / code-predictor-call time ratio follow the ratio of their bytes?"""
    bytes_ratio = ((by_bytes["talker_step_bytes"] + by_bytes["talker_kv_bytes"])
                   / by_bytes["code_predictor_call_bytes"])
    time_ratio = derived["t_talker_ms"] / derived["t_inner_ms"]
    head = (f"The {name} forward's inner share is {derived['inner_share_ar']:.1%} against "
            f"{by_bytes['inner_share']:.1%} from bytes; a talker step takes {time_ratio:.2f} times a code-predictor "
            f"call, and reads {bytes_ratio:.2f} times its bytes")
    if 1 / BOUND_TOL <= time_ratio / bytes_ratio <= BOUND_TOL:
        return head + f": within a factor {BOUND_TOL:g}, so its calls are bound by the bytes they stream."
    if time_ratio < bytes_ratio:
        return (head + f": more than a factor {BOUND_TOL:g} apart, its calls cost about the same whatever they "
                "read, so a per-call overhead, not the bytes, sets their time, and the frame pays it "
                f"{n_inner} times.")
    return (head + f": more than a factor {BOUND_TOL:g} apart, the talker step costs more than its bytes, or the "
            "code predictor's weights partly stay in the CPU's caches.")


off = result["derived"]
nat = result["native"]["derived"] if "native" in result else None
q_hi = max(q for q in (int(k) for k in ratios) if q <= 16)
growth = {name: cost_growth_words({r['n_queries']: r['ratio_to_1'] for r in pr['code_predictor']})
          for name, pr in pairs.items()}
nat_ratio = metrics["native"]["verify_cost_ratio"].get(str(q_hi)) if nat else None
lines = [
    f"* **The two loops (config).** A frame is 1 talker call and {n_inner} code-predictor calls; at "
    f"{frame_rate_hz:g} frames a second real time needs {ar['calls_per_s']:g} sequential calls a second, "
    f"{ar['calls_per_s'] - frame_rate_hz:g} of them in the inner loop. At the paper's "
    f"{latency.PAPER_TOKENS_PER_CALL} tokens per call (paper) it would need "
    f"{metrics['calls_per_s_at_paper_tpc']:.1f}.",
    f"* **Where the time goes (measured here, {run_model}, {weights_words}).** Through the official modules a "
    f"talker step takes {off['t_talker_ms']:.1f} ms and a code-predictor call {off['t_inner_ms']:.2f} ms, so the "
    f"{n_inner} inner calls take {off['inner_share_ar']:.1%} of an AR frame of {off['frame_ms_ar']:.1f} ms"
    + (f"; through the native forward {nat['t_talker_ms']:.1f} ms and {nat['t_inner_ms']:.2f} ms, "
       f"{nat['inner_share_ar']:.1%} of {nat['frame_ms_ar']:.1f} ms" if nat else "")
    + f". Counting only the bytes each call reads, the inner loop would take {by_bytes['inner_share']:.1%}.",
    f"* **Why (mechanism).** A call that carries one or a few positions reads every weight once and does little "
    f"arithmetic with each, so its time follows the bytes it streams; the code predictor is small, but it is called "
    f"{n_inner} times a frame, the talker once. "
    + " ".join(share_words(name, p["derived"]) for name, p in pairs.items())
    + " Other implementations quoted in [methods.md](../docs/methods.md#headline-numbers-reported-by-others) put "
      "the inner loop's share between roughly two fifths and nearly all of a step (reported), depending on how "
      "much fixed cost each call pays.",
    f"* **Real time on this CPU (measured here, {result['threads']} thread{'' if result['threads'] == 1 else 's'}).** "
    + "; ".join(f"{'T' if i == 0 else 't'}hrough the {name} forward an AR frame takes "
                f"{p['derived']['frame_ms_ar']:.1f} ms for {p['derived']['frame_budget_ms']:.0f} ms of audio, "
                f"model-only real-time factor `rtf_ar` {p['derived']['rtf_ar']:.2f} "
                f"({'faster' if p['derived']['rtf_ar'] < 1 else 'slower'} than real time)"
                for i, (name, p) in enumerate(pairs.items()))
    + ". This frame already holds the talker and the inner loop; notebook 06 adds the codec decoder, which turns "
      "codes into audio, and times that whole frame through the fastest forwards.",
    f"* **The verify cost curve (measured here, {run_model}, the whole call after {prefix_len} committed slots).** A "
    f"call of {q_hi} positions costs "
    f"{ratios[str(q_hi)]:.2f} times a call of one (official)"
    + (f", {nat_ratio:.2f} times (native)" if nat_ratio else "")
    + (f": far below {q_hi}, so one verify call of many positions can replace several sequential calls"
       if max(ratios[str(q_hi)], nat_ratio or 0) < q_hi / 2 else
       f": below {q_hi}, but not by much, so wide verify calls buy little here"
       if max(ratios[str(q_hi)], nat_ratio or 0) < q_hi else
       f": no cheaper than {q_hi} sequential calls, so wide verify calls buy nothing here")
    + (f". How it grows: {next(iter(growth.values()))}" if len(growth) == 1 else
       f". How it grows is the same for both forwards: {next(iter(growth.values()))}"
       if len(set(growth.values())) == 1 else
       ". How it grows differs by forward: " + "; ".join(f"{name}, {g}" for name, g in growth.items()))
    + ". The best node budget of a device is the N where E(N) / (t(N)/t(1)) peaks, E(N) being the tokens per call "
      "a tree of N nodes is expected to commit per frame (defined and computed in notebook 04), so each forward "
      "has its own; notebook 04 times the forward alone in its own run, so its ratios differ from these.",
]
if own:
    best = max(own, key=lambda r: r["tokens_per_call"])
    pm = [r for r in own if r["kind"] == "calibrated" and not r["sampled"]]
    sp = [r for r in own if r["kind"] == "calibrated" and r["sampled"]]
    pap = [r for r in own if r["kind"] == "paper"]
    best_pm = max(pm, key=lambda r: r["tokens_per_call"]) if pm else None
    best_sp = max(sp, key=lambda r: r["tokens_per_call"]) if sp else None
    best_pap = next((r for r in pap if r["nodes"] == PAPER_BUDGET), pap[-1] if pap else None)  # the paper's N
    parts = [f"* **Tokens per call do not transfer between models (measured here, {own_meta['model']}, "
             f"{own_meta['frames']} held-out frames).** "]
    if best_pap:
        parts.append(f"The paper's decoder here, `{best_pap['decoder']}`, commits {best_pap['tokens_per_call']:.2f} "
                     f"codes per call (real time at {best_pap['calls_per_s']:.1f} calls a second); the paper reports "
                     f"{latency.PAPER_TOKENS_PER_CALL} (quoted) for the same method, its own offsets with a point-mass "
                     f"tree of N = {PAPER_BUDGET}, on its own model, Qwen3-TTS-0.6B. ")
    if best_pm:
        parts.append(f"The reused heads' best point-mass tree, `{best_pm['decoder']}`, commits "
                     f"{best_pm['tokens_per_call']:.2f}. ")
    same_n = [(p, h) for p in pap for h in pm if h["nodes"] == p["nodes"]]
    if same_n:
        p_, h_ = max(same_n, key=lambda ph: ph[0]["nodes"])
        parts.append(f"At the same node budget (N {p_['nodes']}) the offsets drafter's tokens per call differ from "
                     f"the reused heads' by {p_['tokens_per_call'] - h_['tokens_per_call']:+.2f} here, on one small "
                     f"sample of {own_meta['frames']} frames with no interval, so neither the size nor the sign is a "
                     f"finding: notebook 03 (section 6) tests the drafters against each other with paired "
                     f"intervals, and notebook 05 (section 6) puts a paired interval over utterances, per language, "
                     f"on this difference at the paper's node budget. ")
    if best_sp:
        parts.append(f"Trees with sampled children reach {best_sp['tokens_per_call']:.2f} (`{best_sp['decoder']}`"
                     + (", the most codes per call of any decoder here). " if best is best_sp else "). "))
    if best is not best_sp:
        parts.append(f"The most codes per call here: `{best['decoder']}`, {best['tokens_per_call']:.2f} "
                     f"({best['calls_per_s']:.1f} calls a second). ")
    parts.append(f"Every value here is one run over the same {own_meta['frames']} frames, without an interval, and "
                 f"counts codes per call, not speed: a call of N positions costs t(N)/t(1) times a call of one "
                 f"(section 6), and notebook 04 sets the two against each other. These are this small model's "
                 f"numbers: they depend on how predictable the model's codes are, and this model's are not the "
                 f"released model's.")
    lines.append("".join(parts))
    if best_pm and best_sp:
        lines.append(
            "* **Why point-mass trees do "
            + ("worse" if best_pm["tokens_per_call"] < best_sp["tokens_per_call"] else "better")
            + " here than sampled ones (mechanism, with inference).** A point-mass child is kept with the target's "
            "probability of its one code, p(x); a sampled child with 1 − TV(p, q), whatever p is (a value set by "
            "how close q is to p, not by p being sharp) "
            "([glossary](../docs/glossary.md#speculative-decoding)). Notebook 00 (section 4) tests whether this "
            "companion's codec leaves its deep codes close to noise; where it does, the code predictor's targets "
            "for them are flat and no single code carries much mass, and "
            + ("the ordering measured here is what that predicts: top-ranked drafts are rarely right, while sampled "
               "drafts from a similarly flat q are often kept. "
               if best_pm["tokens_per_call"] < best_sp["tokens_per_call"] else
               "the ordering measured here says the top-ranked drafts are right often enough anyway. ")
            + "*Inference:* on the released model, whose codec is learned end to end, the targets should be sharper "
              "and point-mass trees should fare much better than here, as the paper's reported value suggests (it "
              "says that much, not that they beat sampled trees there: notebook 03, section 10); notebooks 03 and 04 "
              "measure acceptance by depth and rank on this model.")
lines.append(
    f"* **What to expect on the released checkpoint.** The latencies of sections 4 to 6 were measured on the model "
    f"this run used, `{run_model}`"
    + (": the real-size architecture, so they hold for its released weights on this CPU (timing depends on the "
       "architecture, not on the weights). " if run_model == "qwen3-tts-0.6b-random" else
       f", standing in for `{model}` in this smoke run: its milliseconds say that the code runs, not what the "
       "released model costs. " if run_model != model else
       ": they hold for that architecture on this CPU, not for the released model's. ")
    + f"The tokens per call of section 8 do not transfer: on the released 0.6B model the paper reports "
    f"{latency.PAPER_TOKENS_PER_CALL} for its decoder (paper), which would turn the {n_inner} sequential inner "
    f"calls of a frame into {n_inner / latency.PAPER_TOKENS_PER_CALL:.1f} wider verify calls (arithmetic on the "
    f"paper's value); what each wider call costs is the verify cost curve of section 6, and notebooks 04 and 06 "
    f"put the two together.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **`prefix_len = 1`** and **`prefix_len = 14`**: the cost of one code-predictor call at the start and at the end of
#   a frame; look at how much the verify cost curve moves.
# * **`talker_context = 512`**: a longer utterance; look at the inner loop's share of a frame as the talker step
#   grows, and with it what any inner-loop speedup can buy end to end.
# * **`own_decoders = ("chain:2", "chain:8")`**: the calls per frame at the companion's own tokens per call; a wider
#   chain commits more per call but each call is wider.
