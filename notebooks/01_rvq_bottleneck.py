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
# # 01 — The RVQ bottleneck: 200 calls a second
#
# Qwen3-TTS (12 Hz models) generates speech with **two nested autoregressive loops**:
#
# * **Outer loop, the talker** (28 layers): one call per codec frame, at `frame_rate_hz` = 12.5 frames a second
#   (one frame = 80 ms of audio). Each call emits **code 0** of the frame (the first of 16 residual codebooks).
# * **Inner loop, the code predictor** (5 layers): emits **codes 1..15** of the same frame, **one sequential call
#   each** (a 2-position prefill gives code 1, then 14 single steps). Its KV cache restarts every frame.
#
# So one frame costs `1 + (n_code_groups - 1)` model calls, and real time needs
# `frame_rate_hz × n_code_groups` calls a second. The inner loop makes 15 of every 16 calls: it is the target of the
# lossless speculative decoding in this project, which drafts several codes and checks them in **one** verify call over
# `Q` query positions. Whether that pays depends on how the cost of a call grows with `Q` on a given device: the
# **verify cost curve** `t(Q) / t(1)` measured below, and how close one call comes to its **floor**, the time to read
# its weights once (the official forward and the native one, per precision).
#
# Everything here is computed by `rvqspec_lib` (`bench`, `plots`, `provenance`); the notebook only calls it and shows
# the results. Numbers are read from the model config, never typed in.

# %% tags=["parameters"]
model = "qwen3-tts-0.6b-random"  # real-size 0.6B architecture, RANDOM weights (timing only)
seed = 0  # seed of the random weights and of the random input embeddings
smoke = False  # True: tiny-random model, 2 repeats, Q up to 16 (headless test, < 60 s)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
repeats = 10  # the MINIMUM of timed calls per measurement (median reported; more until noise_target is met)
noise_target = 0.05  # each call is timed until the relative standard error of its median is at most this, or 4 x repeats
#                      (rvqspec_lib.eval.noise; None: exactly `repeats`). Smoke: None
warmup = 3  # untimed calls before each measurement
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
prefix_len = 8  # KV positions already in the code-predictor cache (a mid-frame verify)
talker_context = 64  # KV positions already in the talker cache (about 5 s of speech plus the text prompt)
compare_model = "embedded"  # timed the same way beside `model` ("" skips): the small trained model shipped here
own_tpc_frames = 100  # evaluation frames of `compare_model` decoded to measure this companion's own tokens per call

# %%
import json

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from rvqspec_lib.eval import bench
from rvqspec_lib.eval import plots
from rvqspec_lib.eval.acceptance import decoder_statistics
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.eval.inner_loop import default_sampling
from rvqspec_lib.models.configs import CONFIG_DIR, RANDOM_MODELS, loop_facts
from rvqspec_lib.models.tree_files import load_calibration, tree_file, tree_from_calibration
from rvqspec_lib.decoding.decoders import Chain
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table

# smoke: the tiny model (unless another model was asked for), few repeats, Q up to 16
run_model = "tiny-random" if smoke and model == "qwen3-tts-0.6b-random" else model
run_repeats = min(int(repeats), 2) if smoke else int(repeats)
run_noise_target = None if smoke else noise_target  # smoke: the fixed small count (fast)
run_warmup = min(int(warmup), 1) if smoke else int(warmup)
timing_attempts = 1 if smoke else 2  # an oversubscribed timing is re-measured once (smoke: its numbers mean nothing)
query_sizes = (1, 2, 4, 8, 16) if smoke else bench.DEFAULT_QUERY_SIZES
if threads:
    torch.set_num_threads(int(threads))
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
params = dict(model=run_model, seed=seed, smoke=bool(smoke), out_dir=str(out), repeats=run_repeats,
              warmup=run_warmup, threads=torch.get_num_threads(), prefix_len=prefix_len,
              talker_context=talker_context, query_sizes=list(query_sizes), compare_model=compare_model,
              noise_target=run_noise_target, notebook="01_rvq_bottleneck")
print(f"model {run_model}, outputs -> {out}")

# %% [markdown]
# ## The model and its config
# The real-size architecture is built from the released `config.json` (shipped in `data/configs/`) with random
# weights: latencies depend on the architecture, not on the weights, so they are real; its outputs mean nothing.

# %%
loaded = load_model(run_model, seed=seed)
info = loaded.describe()
pd.Series(info, name="value").to_frame()

# %% [markdown]
# ## The two loops (the paper's Figure 1, here)
# Drawn from the configs, never by hand: the layers of each loop, the codebooks per frame and the frame rate of every
# model this companion ships or builds (the embedded model and the released real-size configs in `data/configs/`),
# and the model calls a second each loop makes for real time.

# %%
loop_rows = [{"model": run_model, **{k: v for k, v in info.items() if k in (
    "talker_layers", "talker_hidden", "code_predictor_layers", "code_predictor_hidden", "n_code_groups",
    "frame_rate_hz")}}]
if run_model != "embedded":
    from rvqspec_lib.data.utterances import embedded_root

    loop_rows.append({"model": "embedded", **loop_facts(embedded_root("embedded") / "model")})
for name, folder in RANDOM_MODELS.items():
    if name != run_model:
        loop_rows.append({"model": name, **loop_facts(CONFIG_DIR / folder)})
for r in loop_rows:
    b = bench.call_budget(r["frame_rate_hz"], r["n_code_groups"])
    r.update(talker_calls_per_s=r["frame_rate_hz"], code_predictor_calls_per_s=r["frame_rate_hz"] * (
        r["n_code_groups"] - 1), calls_per_frame=b["calls_per_frame"], calls_per_s=b["calls_per_s"])
    r.pop("folder", None)
loops = pd.DataFrame(loop_rows)
prov = provenance(params, seed=seed)
save_table(loops, out / "01_two_loops", prov,
           caption="the two loops of each model, from its config.json (layers, codebooks, frame rate); calls per "
                   "second for real time = frame_rate_hz x (1 + (n_code_groups - 1))")
fig = plots.plot_two_loops(loop_rows, title="The two nested loops of Qwen3-TTS-class models, from their configs")
save_figure(fig, out / "01_two_loops", prov)
plt.show()
loops

# %% [markdown]
# ## Calls per second for real time (from the config)

# %%
frame_rate_hz = loaded.frame_rate_hz  # from speech_tokenizer/config.json: output_sample_rate / decode_upsample_rate
n_code_groups = loaded.n_code_groups  # talker_config.num_code_groups
ar = bench.call_budget(frame_rate_hz, n_code_groups)
display(Markdown(
    f"`frame_rate_hz` = {frame_rate_hz:g}, `n_code_groups` = {n_code_groups}: one frame = 1 talker call + "
    f"{n_code_groups - 1} code-predictor calls = {ar['calls_per_frame']:g} calls, so real time needs "
    f"**{ar['calls_per_s']:g} model calls a second** ({frame_rate_hz:g} × {n_code_groups}), "
    f"one every {1000 / ar['calls_per_s']:.1f} ms."))

# %% [markdown]
# A speculative inner loop that emits `tpc` codes per inner call on average (tokens per call, the prefill counted)
# needs `frame_rate_hz × (1 + (n_code_groups − 1) / tpc)` calls a second. 2.47 is the paper's reported value.

# %%
budget = pd.DataFrame(bench.budget_table(frame_rate_hz, n_code_groups, bench.DEFAULT_TOKENS_PER_CALL))
prov = provenance(params, seed=seed)
save_table(budget, out / "01_call_budget", prov)
budget

# %% [markdown]
# ## Measured latency: talker step vs code-predictor call with `Q` query positions
# One talker step (one new position after `talker_context` cached positions, plus `codec_head`) and one
# code-predictor call with `Q` query positions after a KV prefix of `prefix_len` positions (projection, 5 layers,
# one `lm_head` over the `Q` positions). Median of at least `repeats` calls after `warmup`
# (more until its relative standard error meets `noise_target`: the table's `n` and caption say how many); p10/p90
# show the spread.

# %%
# an oversubscribed CPU (other processes above bench.OTHER_CPU_LIMIT of its time) is re-measured once; if it still
# is, the figure's title and the table's caption say so
result, quiet = bench.measure_quietly(attempts=timing_attempts, measure=lambda: bench.bench_model(
    loaded, prefix_len=prefix_len, query_sizes=query_sizes, talker_context=talker_context, warmup=run_warmup,
    repeats=run_repeats, seed=seed, progress=True, noise_target=run_noise_target))
prov = {**provenance(params, seed=seed), "timing": quiet}  # after the run: the load average it ran under
latency = pd.DataFrame(bench.latency_rows(result))
save_table(latency, out / "01_latency", prov, caption="; ".join(filter(None, [bench.repeats_words(result),
                                                                               quiet["note"]])))
other = result["other_cpu_frac"]
display(Markdown("**" + plots.bench_title(result).replace("\n", " — ") + f"**, {bench.repeats_words(result)}" + (
    f". Other processes used {100 * other:.0f}% of the machine's {result['cpu_count']} CPUs during the timing"
    + (": **oversubscribed, the times are pessimistic; rerun on an idle machine or with fewer threads**."
       if result["cpu_oversubscribed"] else " (not oversubscribed).")
    if result["device"] == "cpu" and other is not None else "")))
latency

# %% [markdown]
# ## Inner-loop share of a frame (plain autoregressive decoding)

# %%
d = result["derived"]
display(Markdown(
    f"Per frame: talker step {d['t_talker_ms']:.1f} ms + {d['inner_calls_per_frame']} × "
    f"{d['t_inner_ms']:.1f} ms code-predictor calls = **{d['frame_ms_ar']:.1f} ms** for "
    f"{d['frame_budget_ms']:.0f} ms of audio (real-time factor {d['rtf_ar']:.2f}). "
    f"The inner loop takes **{100 * d['inner_share_ar']:.1f}%** of the frame's model time."))

# %% [markdown]
# ## The verify cost curve `t(Q) / t(1)`
# A verify call over `Q` nodes replaces up to `Q` sequential calls only if it costs much less than `Q` calls. The
# dotted line `y = Q` is a device with no parallelism left; the measured curve is what the node budget of a draft
# tree must be chosen against, per device.

# %%
fig = plots.plot_verify_cost(result)
save_figure(fig, out / "01_verify_cost", prov)
plt.show()

# %% [markdown]
# ## The call against its floor: the official forward and the native forward, per precision
# A code-predictor call with a few query rows reads every weight once and does a handful of multiply-adds with it:
# on a CPU its time is bound by streaming the weights. The **floor** is the bytes of weights one call reads over the
# machine's measured single-thread read bandwidth (docs/precision.md#the-floor). Every precision this CPU runs
# natively, two forwards of the same call timed in one interleaved run: the official module's and the native forward
# (one C call over packed weights, docs/precision.md#the-native-forward), each as t(1), t(Q)/t(1) and t(1) as a
# multiple of the floor. Smoke: float32 only, two repeats.

# %%
from rvqspec_lib.models.kernels import cpforward
from rvqspec_lib.models.precision import native_precisions

floor_forwards = ["official"] + (["native"] if cpforward.available() else [])
floor_precisions = ["float32"] if smoke else list(native_precisions())
floor_res, floor_quiet = bench.measure_quietly(attempts=timing_attempts, measure=lambda: bench.bench_precisions(
    loaded, floor_precisions, prefix_len=prefix_len, warmup=run_warmup, repeats=max(run_repeats, 2 if smoke else 15),
    seed=seed, progress=False, forwards=floor_forwards))
floor_rows = []
for pr in floor_res["precisions"]:
    by_q = {r["n_queries"]: r for r in pr["rows"]}
    floor_rows.append({"precision": pr["precision"], "forward": pr["forward"], "t1_ms": by_q[1]["median_ms"],
                       **{f"t{q}_over_t1": by_q[q]["ratio_to_1"] for q in by_q if q != 1},
                       "mb_per_call": pr["weight_bytes"]["bytes"] / 1e6, "floor_ms": pr["floor_ms"],
                       "t1_over_floor": pr["t1_over_floor"]})
floor_df = pd.DataFrame(floor_rows)
floor_caption = "; ".join(filter(None, [
    f"{run_model}{' (RANDOM weights: timing only)' if floor_res['random_weights'] else ''}, CPU "
    f"{floor_res['device_name']} (bf16 flags: {', '.join(floor_res['cpu_flags']['bf16']) or 'none'}; int8 "
    f"dot-product flags: {', '.join(floor_res['cpu_flags']['int8_dot']) or 'none'}), {floor_res['threads']} thread(s), "
    f"read bandwidth {floor_res['bandwidth']['gb_per_s']:.1f} GB/s, median of {floor_res['repeats']} interleaved "
    "rounds", floor_quiet["note"]]))
save_table(floor_df, out / "01_floor", {**prov, "meta": {k: v for k, v in floor_res.items() if k != "precisions"},
                                        "timing": floor_quiet}, caption=floor_caption)
fig, ax = plt.subplots(figsize=(7, 3.4))
xs = range(len(floor_precisions))
for i, fw in enumerate(floor_forwards):
    fd = floor_df[floor_df.forward == fw].set_index("precision").reindex(floor_precisions)
    ax.bar([x + 0.38 * (i - (len(floor_forwards) - 1) / 2) for x in xs], fd.t1_over_floor, width=0.36,
           label=f"{fw} forward")
ax.axhline(1.0, color="k", lw=0.8, label="the floor (weights read once)")
ax.axhline(1.5, color="0.5", ls=":", lw=0.8, label="1.5 x the floor")
ax.set_xticks(list(xs), floor_precisions)
ax.set_ylabel("t(1) / floor")
ax.set_title(f"{run_model}: one code-predictor call against its weight-streaming floor\n{floor_res['device_name']}, "
             f"{floor_res['threads']} thread(s), {floor_res['bandwidth']['gb_per_s']:.1f} GB/s", fontsize=9)
ax.legend(fontsize=7)
fig.tight_layout()
save_figure(fig, out / "01_floor", {**prov, "meta": {k: v for k, v in floor_res.items() if k != "precisions"}})
plt.show()
print(bench.format_precision_table(floor_res))

# %% [markdown]
# ## The embedded model's call budget beside the real-size architecture
# The later notebooks measure acceptance on `compare_model`, the small Qwen3-TTS-class model trained here
# (`data/embedded`, see its MODEL_CARD.md): same two loops, same 12.5 Hz × 16 codebooks, so the same **calls per
# second**, but much smaller layers, so each call is cheaper and the verify cost curve is flatter or steeper. Tokens
# per call transfer between the two (they count calls, not milliseconds); speed-ups in milliseconds do not.

# %%
compared = []
if compare_model:
    small = load_model(compare_model, seed=seed)
    small_result, small_quiet = bench.measure_quietly(attempts=timing_attempts, measure=lambda: bench.bench_model(
        small, prefix_len=prefix_len, query_sizes=query_sizes, talker_context=talker_context, warmup=run_warmup,
        repeats=run_repeats, seed=seed, progress=True, noise_target=run_noise_target))
    for lm_, res_ in ((loaded, result), (small, small_result)):
        desc, der = lm_.describe(), res_["derived"]
        rq = {r["n_queries"]: r["ratio_to_1"] for r in res_["code_predictor"]}
        qmax = max(q for q in rq if q <= 16)
        compared.append({
            "model": lm_.name, "random_weights": lm_.is_random,
            "talker_layers": desc["talker_layers"], "talker_hidden": desc["talker_hidden"],
            "code_predictor_layers": desc["code_predictor_layers"],
            "code_predictor_hidden": desc["code_predictor_hidden"],
            "params_talker_total": desc["params_talker_total"], "params_code_predictor": desc["params_code_predictor"],
            "frame_rate_hz": lm_.frame_rate_hz, "n_code_groups": lm_.n_code_groups,
            "calls_per_s_realtime": bench.call_budget(lm_.frame_rate_hz, lm_.n_code_groups)["calls_per_s"],
            "t_talker_ms": der["t_talker_ms"], "t_inner_ms": der["t_inner_ms"], "frame_ms_ar": der["frame_ms_ar"],
            "rtf_ar": der["rtf_ar"], "inner_share_ar": der["inner_share_ar"], f"t({qmax})/t(1)": rq[qmax],
        })
    compared_df = pd.DataFrame(compared)
    notes = "; ".join(f"{lm_.name}: {q['note']}" for lm_, q in ((loaded, quiet), (small, small_quiet)) if q["note"])
    save_table(compared_df, out / "01_models_compared",
               {**provenance(params, seed=seed), "timing": {loaded.name: quiet, small.name: small_quiet}},
               caption=notes or None)
    display(compared_df.set_index("model").T)

# %% [markdown]
# ## Calls per second at this companion's own tokens per call
# The budget above at the tokens per call the decoders reach **here**: `own_tpc_frames` evaluation frames of
# `compare_model` (trained weights: acceptance needs them) decoded by chains and by the shipped calibration's trees
# (`<model>/trees/heads.json`, notebook 03) at the paper's node budget and at half of it. The paper's value stands in
# its own labelled columns.

# %%
own = []
if compare_model:
    acc_lm = small
    n_own = min(int(own_tpc_frames), 8) if smoke else int(own_tpc_frames)
    own_frames = frames_from_shipped(acc_lm, "evaluation", max_frames=n_own, seed=seed)
    own_sampling = default_sampling(acc_lm)
    shipped_cal = load_calibration(tree_file(compare_model, "heads"), n_codes=acc_lm.n_code_groups - 1,
                                   codebook_size=acc_lm.codebook_size)
    own_decoders = {"chain 4": Chain(4), "chain 8": Chain(8)}
    for kind in ("point-mass", "sampled"):
        for n_nodes in (16, 32):
            own_decoders[f"calibrated {kind} tree, N {n_nodes}"] = tree_from_calibration(shipped_cal, kind, n_nodes)
    paper_budget = bench.call_budget(acc_lm.frame_rate_hz, acc_lm.n_code_groups, bench.PAPER_TOKENS_PER_CALL)
    for label, dec in own_decoders.items():
        st = decoder_statistics(acc_lm.code_predictor, ReusedHeads(), own_frames.context, dec, sampling=own_sampling,
                                seed=seed)
        b = bench.call_budget(acc_lm.frame_rate_hz, acc_lm.n_code_groups, st["tokens_per_call"])
        own.append({"decoder": label, "drafter": "reused heads", "model": acc_lm.name, "frames": len(own_frames),
                    "tokens_per_call": st["tokens_per_call"], "calls_per_s": b["calls_per_s"],
                    "reduction_vs_ar": b["reduction"],
                    "paper: tokens per call (Qwen3-TTS-0.6B, offsets, N 32)": bench.PAPER_TOKENS_PER_CALL,
                    "paper: calls per s": paper_budget["calls_per_s"]})
    own_df = pd.DataFrame(own)
    save_table(own_df, out / "01_calls_at_own_tpc", provenance(params, seed=seed),
               caption=f"tokens per call measured on {len(own_frames)} evaluation frames of {acc_lm.name} "
                       f"(sampling {own_sampling!r}), calls per second from the config; the paper's values in the "
                       f"columns marked 'paper', quoted")
    best_own = max(own, key=lambda r: r["tokens_per_call"])
    display(Markdown(
        f"Here ({acc_lm.name}, {len(own_frames)} evaluation frames): the best of these decoders, {best_own['decoder']}, "
        f"commits {best_own['tokens_per_call']:.2f} codes per call, so real time needs "
        f"**{best_own['calls_per_s']:.1f} calls a second** instead of {ar['calls_per_s']:g} (the paper: "
        f"{bench.PAPER_TOKENS_PER_CALL} codes per call, {paper_budget['calls_per_s']:.1f} calls a second)."))
    display(own_df)

# %%
ratios = {str(r["n_queries"]): r["ratio_to_1"] for r in result["code_predictor"]}
metrics = {
    "model": run_model,
    "random_weights": result["random_weights"],
    "frame_rate_hz": frame_rate_hz,
    "n_code_groups": n_code_groups,
    "calls_per_s_realtime": ar["calls_per_s"],
    "calls_per_s_at_paper_tpc": bench.call_budget(frame_rate_hz, n_code_groups,
                                                  bench.PAPER_TOKENS_PER_CALL)["calls_per_s"],
    "paper_tokens_per_call": bench.PAPER_TOKENS_PER_CALL,
    "t_talker_ms": d["t_talker_ms"],
    "t_inner_ms": d["t_inner_ms"],
    "frame_ms_ar": d["frame_ms_ar"],
    "rtf_ar": d["rtf_ar"],
    "inner_share": d["inner_share_ar"],
    "verify_cost_ratio": ratios,
    "device": result["device"],
    "device_name": result["device_name"],
    "dtype": result["dtype"],
    "threads": result["threads"],
    "load_avg_1m_before": result["load_avg_1m_before"],
    "load_avg_1m_after": result["load_avg_1m_after"],
    "other_cpu_frac": result["other_cpu_frac"],
    "cpu_oversubscribed": result["cpu_oversubscribed"],
    "compared": compared,
    "timing": quiet,
    "own_tokens_per_call": own,
    "two_loops": loop_rows,
    "floor": floor_rows,
}
save_json(metrics, out / "01_metrics.json", prov)
save_json(result, out / "01_bench.json", prov)
print(json.dumps({k: v for k, v in metrics.items() if k != "verify_cost_ratio"}, indent=1))
