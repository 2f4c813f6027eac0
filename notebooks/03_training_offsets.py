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
# # 02 — Drafters: reused heads, Medusa heads and position-aware offsets (paper Table 2)
#
# Speculative decoding of the inner loop needs **drafts**: guesses of the codes at depths `k+1 .. k+K` made from the
# hidden state `H_k` that produced code `k`, *before* the code predictor has seen codes `k+1, ...`. One verify call
# then checks them all, and the committed codes follow the target distribution `p` whatever the drafts were
# (losslessness does not depend on the drafter; `tests/test_drafters.py` checks it with a G-test). A better drafter
# only means **more accepted codes per call**. The paper compares three drafters on a frozen code predictor:
#
# 1. **Reused LM heads** (row (i); also TensorRT-Edge-LLM's chain, seed 003): the code predictor owns one head per
#    depth, all reading the same residual stream, so `lm_head[k+j-1](H_k)` is a draft for depth `k+j`. **No new
#    parameters.** Its weakness: `H_k` is the state *for depth k*; the head for depth `k+j` was trained on `H_{k+j}`.
# 2. **Medusa heads** (row (ii), Cai et al. 2024): a fresh `Linear(hidden, vocab)` per (start depth, offset),
#    initialised from the reused head and trained. Flexible, but each head is as large as an LM head.
# 3. **Position-aware offsets** (row (iii), the paper's method): `K` learned vectors `b_1..b_K` of the hidden size,
#    shared by every start depth: draft for depth `k+j` = `lm_head[k+j-1](H_k + b_j)`. The offset moves `H_k` toward
#    where the head for depth `k+j` expects its input, "`j` steps later" in the residual stream. `K × hidden`
#    parameters; the unoffset path that emits the accepted code is untouched, so the verifier is unchanged.
#
# The offsets are trained with three losses: **CE** (cross-entropy to the ground-truth codes, the paper's), **KL** (to
# the verifier's *warped* distribution at the deployed temperature and top-k, which is what acceptance depends on) and
# **TV** (total variation to that warped distribution, i.e. one minus the exact acceptance of a sampled draft). Medusa
# heads are trained with CE and with TV. Which loss does best is printed from the results after the paired interval
# below, never typed here.
#
# **Data.** The embedded model (`data/embedded`, see its MODEL_CARD.md) ships codes and texts of real utterances in
# three disjoint splits: drafters train on `training` with early stopping on `validation`, and every number below is
# measured on `evaluation`. Contexts come from ONE teacher-forced talker pass per utterance (true code 0, true
# feedback), targets are the true codes 1..15 (`rvqspec_lib.data.frame_sources.frames_from_shipped`).
#
# **Caveat.** The embedded model is a small model trained offline on synthetic speech and a k-means codec, not the
# released Qwen3-TTS: its acceptance rates are its own. The paper's values appear only in a separate, labelled
# column.

# %% tags=["parameters"]
model = "embedded"  # the small trained model shipped in data/embedded (or a folder written by build_embedded.py)
seed = 0  # utterance order, batch order, decode generators
smoke = False  # True: ~100 frames, 2 epochs, no Medusa file (headless test, < 90 s)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
n_train_frames = 1200  # teacher-forced training frames (shipped training split, utterances in seeded random order)
n_val_frames = 150  # validation frames for early stopping (shipped validation split)
n_eval_frames = 200  # evaluation frames (sampled across the whole shipped evaluation split)
epochs = 12  # maximum epochs (early stopping on validation acceptance, best epoch kept)
patience = 2  # epochs without validation improvement before stopping
batch_size = 64  # frames per optimiser step (each frame gives 14 start depths x K offsets)
K = 3  # offsets drafted by the trained drafters (paper: 3)
train_kl = True  # also train offsets with the KL loss
train_tv = True  # also train offsets on one minus the exact acceptance rate (total variation, q warped as deployed)
train_medusa = True  # also train Medusa heads (CE)
medusa_lr = None  # Adam learning rate of the Medusa heads (None: the library default, Medusa-1's 1e-3)
train_medusa_tv = True  # also train Medusa heads on total variation (1 - acceptance), like offsets-tv
medusa_tv_lr = 1e-4  # its Adam learning rate (1e-3 overshoots 20 M parameters from 6,000 frames)
offsets_lrs = (1e-2, 1e-3, 3e-4)  # Adam learning rates tried for each offsets loss; the validation acceptance picks one
tree = "0;1;0,0;0,0,0"  # the small fixed Tree's rank paths (beside each drafter's own calibrated trees)
tree_budgets = (2, 4, 8, 16, 32, 64)  # node budgets of each drafter's OWN calibrated trees (32: the paper's)
n_calibration_frames = 100  # calibration-split frames each drafter's trees are calibrated on
headroom_frames = 50  # evaluation frames for the headroom of H_k-only drafters (Monte Carlo over continuations)
headroom_samples = 8  # sampled continuations per (frame, start depth)
save_to_model = False  # True (not smoke): also deploy the offsets beside the model (<model>/drafters/); `make paper`
#                        leaves the shipped model as it is, so the later notebooks read the committed drafters
medusa_dir = "build/drafters"  # Medusa heads are large (vocab x hidden per head): written here, not into git
dataset = ""  # real checkpoints: a local `datasets` folder (save_to_disk, VoxPopuli schema: audio + raw_text)
codec = ""  # with dataset: the codec that turns its audio into codes (e.g. the Qwen3-TTS-Tokenizer-12Hz folder)
dataset_splits = ("train", "validation", "test")  # its training / validation / evaluation splits

# %%
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from rvqspec_lib.eval import acceptance as A
from rvqspec_lib.eval import paper_decoder as PD
from rvqspec_lib.eval.calibration import calibrate, calibration_frames
from rvqspec_lib.models.tree_files import save_calibration, tree_from_calibration
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET
from rvqspec_lib.eval import headroom as H
from rvqspec_lib.eval import plots
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS, Chain, Tree
from rvqspec_lib.models.drafter_files import (
    make_drafter,
    model_drafter_dir,
    params_added_for_config,
    save_drafter,
)
from rvqspec_lib.eval.inner_loop import default_sampling
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.models.configs import CONFIG_DIR
from rvqspec_lib.models.loader import EMBEDDED_MODEL, OWN_MODEL_MARKER, load_model
from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.training.drafters import deploy_drafters, select_deployed, sweep_learning_rates
from rvqspec_lib.decoding.trees import parse_paths

t_start = time.perf_counter()
if smoke:
    n_train_frames, n_val_frames = min(n_train_frames, 128), min(n_val_frames, 32)
    n_eval_frames = min(n_eval_frames, 16)
    epochs, patience = min(epochs, 2), 1
    n_calibration_frames, tree_budgets = min(n_calibration_frames, 32), (8, 32)
if threads:  # two threads on a busy 2-core machine spin-wait
    torch.set_num_threads(int(threads))
torch.manual_seed(seed)  # nothing below draws from the global RNG; set for any library default that might
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
params = dict(model=model, seed=seed, smoke=bool(smoke), out_dir=str(out), threads=torch.get_num_threads(),
              n_train_frames=n_train_frames, n_val_frames=n_val_frames, n_eval_frames=n_eval_frames, epochs=epochs,
              patience=patience, batch_size=batch_size, K=K, train_kl=bool(train_kl), train_tv=bool(train_tv),
              train_medusa=bool(train_medusa), medusa_lr=medusa_lr, train_medusa_tv=bool(train_medusa_tv),
              medusa_tv_lr=medusa_tv_lr, headroom_frames=headroom_frames, headroom_samples=headroom_samples, tree=tree,
              tree_budgets=[int(b) for b in tree_budgets], n_calibration_frames=n_calibration_frames,
              save_to_model=bool(save_to_model),
              medusa_dir=medusa_dir, offsets_lrs=[float(x) for x in offsets_lrs],
              notebook="02_training_offsets")
timings = {}
# the model: "embedded", a model folder, or a build folder holding model/ and utterances.safetensors; a real
# checkpoint with `dataset` (+ `codec`); anything else (a random-weight timing model, a checkpoint without data)
# falls back to the embedded model, because acceptance needs trained weights and frames of real speech
params.update(dataset=dataset, codec=codec, dataset_splits=list(dataset_splits))
if dataset:
    if not codec:
        raise ValueError("dataset needs codec: the codec that encodes its audio (a folder or RVQ codec file)")
    root, run_model = None, model
else:
    try:
        root = embedded_root(model)
    except FileNotFoundError:
        display(Markdown(f"**`{model}` ships no utterances and no `dataset` was given: this notebook measures the "
                         "embedded model instead** (pass `-p dataset DIR -p codec C` for a real checkpoint)."))
        root = embedded_root(EMBEDDED_MODEL)
        model = EMBEDDED_MODEL
    run_model = model if model == EMBEDDED_MODEL or (Path(model) / OWN_MODEL_MARKER).is_file() else str(root / "model")
params["run_model"] = run_model
print(f"model {run_model} (frames from {root or dataset}), outputs -> {out}")

# %% [markdown]
# ## The model, its sampling, and the frames
# The deployed sampling of the inner loop is read from the model's `generation_config.json` (`subtalker_*` keys).
# Each split's contexts come from one teacher-forced talker pass per utterance.

# %%
lm = load_model(run_model)
cp = lm.code_predictor
info = lm.describe()
sampling = default_sampling(lm)
n_codes = lm.n_code_groups - 1
params_model = int(sum(p.numel() for p in lm.model.parameters()))
display(pd.Series({**info, "params_model_total": params_model, "sampling": repr(sampling)}, name="value").to_frame())
if lm.is_random:
    display(Markdown("**This model has RANDOM weights: the acceptance rates below mean nothing.**"))

# %%
t0 = time.perf_counter()
if dataset:
    from rvqspec_lib.models.speech_tokenizers import load_codec
    from rvqspec_lib.data.frame_sources import frames_from_dataset

    the_codec = load_codec(codec)
    tr_split, va_split, ev_split = dataset_splits
    train_frames = frames_from_dataset(dataset, lm, the_codec, split=tr_split, max_frames=n_train_frames, progress=True)
    val_frames = frames_from_dataset(dataset, lm, the_codec, split=va_split, max_frames=n_val_frames, progress=True)
    eval_all = frames_from_dataset(dataset, lm, the_codec, split=ev_split, max_frames=8 * n_eval_frames,
                                   progress=True)
else:
    train_frames = frames_from_shipped(lm, "training", max_frames=n_train_frames, seed=seed, progress=True)
    val_frames = frames_from_shipped(lm, "validation", max_frames=n_val_frames, seed=seed, progress=True)
    eval_all = frames_from_shipped(lm, "evaluation", max_frames=8 * n_eval_frames if smoke else None,
                                   seed=seed, progress=True)
pick = torch.randperm(len(eval_all), generator=torch.Generator().manual_seed(seed))[:n_eval_frames].sort().values
eval_frames = eval_all.subset(pick)  # frames sampled across every evaluation utterance
timings["frames_s"] = time.perf_counter() - t0
data_table = pd.DataFrame([
    {"split": name, "utterances": int(torch.unique(fr.utterance).numel()), "frames": len(fr),
     "of_split_utterances": fr.source.get("n_split_utterances")}
    for name, fr in (("training", train_frames), ("validation", val_frames), ("evaluation", eval_frames))])
prov = provenance(params, seed=seed)
save_table(data_table, out / "02_data", prov)
data_table

# %% [markdown]
# ## Training
# Only the drafter's own parameters move (Adam; code predictor frozen). Each epoch is followed by the validation
# loss and the **exact** one-step acceptance `E[Σ_x min(p(x), q(x))]` of the drafts per offset `j` (both `p` and `q`
# warped by the deployed sampling). Epoch 0 is the untrained drafter, which equals the reused heads (zero offsets,
# Medusa heads copied from the LM heads). Early stopping keeps the epoch with the highest mean validation acceptance
# (`train_drafter(select="acceptance")`: a lower loss does not always mean more accepted drafts; `select="loss"` is the
# alternative).

# %%
to_train = [("offsets-ce", "offsets", "ce")]
if train_kl:
    to_train.append(("offsets-kl", "offsets", "kl"))
if train_tv:
    to_train.append(("offsets-tv", "offsets", "tv"))
if train_medusa:
    to_train.append(("medusa", "medusa", "ce"))
if train_medusa_tv:
    to_train.append(("medusa-tv", "medusa", "tv"))
trained, curves, lr_rows = {}, {}, []
lrs_tried = list(offsets_lrs)[:1] if smoke else list(offsets_lrs)
for label, name, loss in to_train:
    t0 = time.perf_counter()
    lrs = lrs_tried if name == "offsets" else [medusa_tv_lr if loss == "tv" else medusa_lr]
    sweep = sweep_learning_rates(lambda name=name: make_drafter(name, cp, fresh=True, K=K), cp, train_frames,
                                 val_frames, lrs=lrs, label=label, loss=loss, sampling=sampling,
                                 batch_size=batch_size, max_epochs=epochs, patience=patience, seed=seed, progress=True)
    lr_rows += sweep.rows
    res = sweep.chosen
    res.drafter.provenance["model"] = run_model
    trained[label], curves[label] = res.drafter, res
    timings[f"train_{label}_s"] = time.perf_counter() - t0
    c0, cb = res.curve[0], res.curve[res.best_epoch]
    print(f"{label}: {res.drafter.params_added:,} parameters, lr {sweep.lr:g}, best epoch {res.best_epoch} of "
          f"{res.curve[-1]['epoch']}, validation acceptance {np.round(c0['val_acceptance_by_offset'], 3)} -> "
          f"{np.round(cb['val_acceptance_by_offset'], 3)}")

# %% [markdown]
# ### Learning rate, chosen on validation
# Each offsets loss is trained at every rate of `offsets_lrs`; the run with the highest mean validation acceptance
# (at its kept epoch) is the one kept (`rvqspec_lib.training.drafters.sweep_learning_rates`; `chosen` marks it). A
# too-large rate overshoots in the first epoch and early stopping then keeps epoch 0 (the reused heads), which would
# wrongly read as "this loss cannot help".

# %%
lr_table = pd.DataFrame(lr_rows)
prov = provenance(params, seed=seed)
save_table(lr_table, out / "02_lr_selection", prov)
lr_table

# %% [markdown]
# ### Training curves
# Top: training loss (mean over the epoch) and validation loss. Bottom: exact validation acceptance per offset `j`
# (dashed: the same at epoch 0, i.e. the reused heads). CE and KL losses are on different scales; compare shapes,
# and compare drafters by acceptance.

# %%
fig, axes = plt.subplots(2, len(curves), figsize=(4.2 * len(curves), 6.5), squeeze=False, sharex="col")
for col, (label, res) in enumerate(curves.items()):
    ep = [c["epoch"] for c in res.curve]
    ax = axes[0, col]
    ax.plot(ep[1:], [c["train_loss"] for c in res.curve[1:]], "o-", label="training")
    ax.plot(ep, [c["val_loss"] for c in res.curve], "s-", label="validation")
    ax.axvline(res.best_epoch, color="grey", lw=0.8, ls=":")
    ax.set_title(f"{label} ({res.drafter.provenance['loss']} loss)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    ax = axes[1, col]
    acc = np.array([c["val_acceptance_by_offset"] for c in res.curve])
    for j in range(acc.shape[1]):
        line, = ax.plot(ep, acc[:, j], "o-", label=f"j={j + 1}")
        ax.axhline(acc[0, j], color=line.get_color(), lw=0.8, ls="--")
    ax.axvline(res.best_epoch, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("epoch")
    ax.set_ylabel("exact acceptance (validation)")
    ax.legend(fontsize=8)
fig.suptitle(f"Drafter training on {run_model} ({len(train_frames)} training / {len(val_frames)} validation frames)")
fig.tight_layout()
prov = provenance(params, seed=seed)
save_figure(fig, out / "02_training_curves", prov)
plt.show()
curve_rows = [{"drafter": label, "epoch": c["epoch"], "train_loss": c["train_loss"], "val_loss": c["val_loss"],
               **{f"val_acceptance_j{j + 1}": a for j, a in enumerate(c["val_acceptance_by_offset"])},
               "wall_s": c["elapsed_s"]} for label, res in curves.items() for c in res.curve]
save_table(curve_rows, out / "02_training_curves", prov)

# %% [markdown]
# ### Saving the drafters
# Offsets are tiny and saved into the output folder; with `save_to_model=True` also beside the model, where
# `rvqspec eval-acceptance --model embedded --drafter offsets` and the later notebooks find them
# (`<model>/drafters/offsets.safetensors`; then remake their trees with `scripts/calibrate_trees.py`). `make paper`
# does not deploy: the shipped drafters and their trees (`<model>/trees/offsets.json`) stay the ones `make embedded`
# trained and calibrated, so every notebook of one run reads the same committed files. Which loss is deployed is
# decided on the **validation** acceptance (mean over offsets at the kept epoch), never on the evaluation split (`select_deployed`, written by
# `deploy_drafters`). Medusa heads hold one LM-head-sized matrix per (start depth, offset), so they go to
# `medusa_dir` (git-ignored), not into the repository.

# %%
files = {}
for label, d in trained.items():
    if d.name == "offsets":
        files[label] = save_drafter(d, out / "02_drafters" / f"{label}.safetensors")
    elif not smoke:  # Medusa heads: large, git-ignored folder; a smoke run does not write them
        files[label] = save_drafter(d, resolve_out_dir(medusa_dir, smoke=smoke) / str(run_model).strip("/").replace("/", "_")
                                    / f"{label}.safetensors")
deployed = select_deployed(trained, kind="offsets")  # the highest validation acceptance
model_dir = model_drafter_dir(run_model)
if not smoke and save_to_model and model_dir is not None:
    files.update(deploy_drafters(trained, deployed, model_dir, kind="offsets"))
display(Markdown(f"Deployed offsets (highest validation acceptance): **{deployed}**. Files: "
                 + ", ".join(f"`{p}`" for p in files.values())))

# %% [markdown]
# ## Evaluation under the deployed sampling
# Every drafter is run on the same evaluation frames with `decode_frame` for each decoder: `Chain(N)` for windows
# 2..8 (N-1 **sampled** drafts, `min(1, p/q)` acceptance, residual resample, bonus code) and the `Tree` (top-ranked
# drafts as rank paths, one masked verify call per round). **Tokens per call** = codes committed / code-predictor
# calls, the prefill call included (the paper's toks/step). The exact tables come from one teacher-forced pass over
# the codes the decoder committed (samples of `p`): acceptance per (start depth, offset) and the target mass of the
# rank-`r` draft, the inputs of the tree calibration.

# %%
tree_paths = parse_paths(tree)
decoders = [Chain(w) for w in CHAIN_WINDOWS] + [Tree(tree_paths)]
drafters = {"heads": make_drafter("heads", cp), **trained}
results = {}
t0 = time.perf_counter()
for label in tqdm(list(drafters), desc="evaluating drafters"):
    results[label] = A.evaluate_acceptance(cp, drafters[label], eval_frames, decoders=decoders, sampling=sampling,
                                           seed=seed)
timings["evaluate_s"] = time.perf_counter() - t0
prov = provenance(params, seed=seed)
save_json({label: r for label, r in results.items()}, out / "02_acceptance.json", prov)

# %% [markdown]
# ## Each drafter with its OWN calibrated tree (the paper's setting)
# A tree is calibrated FOR the drafter that proposes its codes (the ranks are the drafter's), so every drafter gets
# its own: `rvqspec_lib.eval.calibration.calibrate` on frames of the shipped **calibration** split (contexts
# teacher-forced on real speech, codes re-sampled from p; held out from training, validation and evaluation),
# point-mass rule (the paper's). Each drafter's point-mass tree is then decoded on the evaluation frames at the
# paper's node budget N = 32 and at the best budget here, the N of `tree_budgets` with the highest **predicted**
# tokens per call E(N) (`rvqspec_lib.eval.paper_decoder.best_budget`; E(N) of a greedy tree never falls as N grows,
# so this is the largest budget unless the gain stops: which N is fastest is notebook 03's question). The deployed
# offsets with their tree of N = 32 are **the paper's decoder** (`--decoder paper`).

# %%
t0 = time.perf_counter()
if dataset:  # a real checkpoint: the validation contexts, codes re-sampled from p
    from rvqspec_lib.data.frame_sources import frames_from_contexts

    cal_frames = frames_from_contexts(cp, val_frames.context[:n_calibration_frames], sampling=sampling, seed=seed)
else:
    cal_frames = calibration_frames(lm, max_frames=n_calibration_frames, seed=seed)
budgets_here = sorted({int(b) for b in tree_budgets} | {PAPER_BUDGET})
calibrations, own_tree = {}, {}
for label in tqdm(list(drafters), desc="calibrating each drafter's trees"):
    cal_d = calibrate(cp, drafters[label], cal_frames, sampling=sampling, budgets=budgets_here, seed=seed,
                      draws=1 if smoke else 2)
    calibrations[label] = cal_d
    save_calibration({**cal_d, "provenance": provenance(params, seed=seed)}, out / "02_trees" / f"{label}.json")
    n_best = PD.best_budget(cal_d, "point-mass", budgets_here)
    own_tree[label] = {"best_N": n_best}
    for key, n in (("N32", PAPER_BUDGET), ("best", n_best)):
        st = A.decoder_statistics(cp, drafters[label], eval_frames.context,
                                  tree_from_calibration(cal_d, "point-mass", n), sampling=sampling, seed=seed)
        own_tree[label][key] = {"N": n, "measured": st["tokens_per_call"],
                                "predicted": cal_d["point-mass"]["predicted_tokens_per_call"][str(n)]}
timings["own_trees_s"] = time.perf_counter() - t0
print(f"{len(calibrations)} drafters calibrated on {len(cal_frames)} frames and measured at N = {PAPER_BUDGET} and "
      f"their best N in {timings['own_trees_s']:.0f} s")

# %% [markdown]
# ## Table 2: tokens per call against added parameters
# `tokens_per_call_tree` / `tokens_per_call_chain4`: measured here on the evaluation frames. `added_params`: what
# the drafter adds to this model; `pct_code_predictor` / `pct_model`: as a share of the code predictor's and of the
# whole model's parameters. `added_params_at_0.6B`: the same drafter sized for the released 0.6B code predictor
# (counted from its `config.json`; our Medusa has 39 heads, one per (start depth, offset) with `k + j <= 15`, the
# paper counts 45). The paper's setting: `tree_N32_*` is each drafter's OWN calibrated point-mass tree of N = 32
# (measured on the evaluation frames, and predicted by its calibration), `tree_bestN_*` the same at the best N here
# (`best_N`, chosen by predicted E(N): `best_N_by`); `chain_best` is the best measured chain window. `decoder`
# names the N = 32 tree in the decoder grammar: the deployed offsets' is **the paper's decoder**.
# `tokens_per_call_tree` is the small fixed tree (`tree`) for comparison. The columns headed **`paper: ...`**
# hold the paper's own toks/step (Table 2 and §3.3 of the paper, measured on Qwen3-TTS-0.6B with its sparse tree
# of N = 32): the only typed numbers in this notebook, for reference only.
#
# How to read it: a drafter is better if it commits more codes per call for fewer added parameters. Offsets cost a
# vanishing share of the model; Medusa heads cost a large one. This model is not the released one, so compare rows
# with each other, not with the paper's column.

# %%
PAPER_REPORTED_TOKS_PER_STEP = {"heads": 1.70, "medusa": 2.60, "offsets-ce": 2.47}  # paper Table 2 / §3.3
PAPER_SOURCE = "paper Table 2 (§3.3): Qwen3-TTS-0.6B, sparse tree, toks/step"
cfg06 = CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "config.json"
names = {"heads": "reused LM heads (i)", "medusa": "Medusa heads (ii)",
         "offsets-ce": "position-aware offsets, CE (iii, paper's loss)",
         "offsets-kl": "position-aware offsets, KL to warped verifier",
         "offsets-tv": "position-aware offsets, total variation (1 - acceptance)",
         "medusa-tv": "Medusa heads, total variation (1 - acceptance)"}
params_cp = info["params_code_predictor"]
table2 = []
for label, r in results.items():
    kind = drafters[label].name
    own = own_tree[label]
    chain_best = max(CHAIN_WINDOWS, key=lambda w: r["tokens_per_call"][f"chain{w}"])
    table2.append({
        "drafter": names.get(label, label),
        "label": label,
        "decoder": (f"paper (deployed offsets {label} + own tree)" if label == deployed
                    else f"tree:calibrated-point-mass:{PAPER_BUDGET}" + ("" if label == "heads" else f"@{label}")),
        "tree_N32_tokens_per_call": own["N32"]["measured"],
        "tree_N32_predicted": own["N32"]["predicted"],
        "best_N": own["best_N"],
        "best_N_by": "predicted E(N)",
        "tree_bestN_tokens_per_call": own["best"]["measured"],
        "tree_bestN_predicted": own["best"]["predicted"],
        "chain_best": r["tokens_per_call"][f"chain{chain_best}"],
        "chain_best_window": chain_best,
        "tokens_per_call_tree": r["tokens_per_call"]["tree"],
        "tokens_per_call_chain4": r["tokens_per_call"]["chain4"],
        "predicted_tree": r["predicted_tokens_per_call"]["tree"],
        "added_params": r["params_added"],
        "pct_code_predictor": 100 * r["params_added"] / params_cp,
        "pct_model": 100 * r["params_added"] / params_model,
        "added_params_at_0.6B": params_added_for_config(kind, cfg06, K=K),
        "kept_epoch": trained[label].provenance["best_epoch"] if label in trained else None,
        "lr": trained[label].provenance.get("lr") if label in trained else None,
        "paper: toks/step (N 32 tree)": PAPER_REPORTED_TOKS_PER_STEP.get(label),
    })
prov = provenance(params, seed=seed)
save_table(table2, out / "02_table2", prov)  # a list of dicts: no paper value stays an empty cell, not NaN
display(Markdown(f"`paper: ...`: {PAPER_SOURCE}; every other column measured or counted on `{run_model}`. "
                 "`kept_epoch` is the epoch early stopping kept (highest validation acceptance); **0 means training "
                 "never beat the untrained drafter on validation, so that row equals the reused heads**: "
                 + (", ".join(lab for lab in trained if trained[lab].provenance["best_epoch"] == 0) or "none") + "."))
pd.DataFrame(table2)

# %%
# the paper's decoder against the reused heads, each with its own calibrated tree of N = 32 (written from the table)
t2 = {r["label"]: r for r in table2}
pap, hd = t2[deployed], t2["heads"]
display(Markdown(
    f"At the paper's setting (each drafter's own calibrated point-mass tree of N = {PAPER_BUDGET}): the paper's "
    f"decoder (deployed `{deployed}`) commits **{pap['tree_N32_tokens_per_call']:.3f}** tokens per call (predicted "
    f"{pap['tree_N32_predicted']:.3f}), the reused heads {hd['tree_N32_tokens_per_call']:.3f} (predicted "
    f"{hd['tree_N32_predicted']:.3f}); the paper reports {PAPER_REPORTED_TOKS_PER_STEP['offsets-ce']} and "
    f"{PAPER_REPORTED_TOKS_PER_STEP['heads']} on Qwen3-TTS-0.6B. At the best N here by predicted E(N) "
    f"(N = {pap['best_N']} for the paper's decoder, {hd['best_N']} for the heads): "
    f"{pap['tree_bestN_tokens_per_call']:.3f} vs {hd['tree_bestN_tokens_per_call']:.3f}. Best drafter at "
    f"N = {PAPER_BUDGET}: **{max(table2, key=lambda r: r['tree_N32_tokens_per_call'])['label']}**."))

# %% [markdown]
# ## Is the margin real? A paired interval over evaluation utterances
# Each trained drafter against the reused heads on the SAME evaluation frames: per frame, the exact acceptance of a
# sampled draft averaged over every (start depth `k`, offset `j <= K`); the difference is averaged within each
# utterance and a 95% Student-t interval is taken over utterances (frames of one utterance are not independent;
# `rvqspec_lib.eval.acceptance.paired_acceptance_difference`). No sampling noise enters: acceptance is computed from the
# probabilities. An interval that excludes 0 says the drafter's gain is not an accident of which frames were drawn;
# its size says whether the gain matters (the `chain4_gain` column converts it into tokens per call of a chain of 4).

# %%
margin_rows = []
for lab in trained:
    m = A.paired_acceptance_difference(cp, drafters["heads"], drafters[lab], eval_frames, n_ahead=K,
                                       sampling=sampling)
    margin_rows.append({"drafter": lab, "acceptance_heads": m["mean_a"], "acceptance_drafter": m["mean_b"],
                        "difference": m["difference"], "ci95_low": m["ci_low"], "ci95_high": m["ci_high"],
                        "p_value": m["p_value"], "n_utterances": m["n_utterances"], "n_frames": m["n_frames"],
                        **{f"difference_j{j + 1}": d for j, d in enumerate(m["difference_by_offset"])},
                        "chain4_gain": results[lab]["tokens_per_call"]["chain4"]
                        - results["heads"]["tokens_per_call"]["chain4"]})
margin = pd.DataFrame(margin_rows)
prov = provenance(params, seed=seed)
save_table(margin, out / "02_margin", prov)
margin

# %%
# which loss does best, and by how much: written from the margin table (nothing typed)
offsets_rows = margin[margin["drafter"].str.startswith("offsets")].sort_values("difference", ascending=False)
best_off = offsets_rows.iloc[0]
real = [r["drafter"] for _, r in margin.iterrows() if r["ci95_low"] > 0]
display(Markdown(
    f"Best offsets loss on these frames: **{best_off['drafter']}**, acceptance per draft "
    f"{best_off['acceptance_heads']:.4f} (reused heads) -> {best_off['acceptance_drafter']:.4f}, difference "
    f"{best_off['difference']:+.4f} [95% CI {best_off['ci95_low']:+.4f}, {best_off['ci95_high']:+.4f}], "
    f"{best_off['chain4_gain']:+.3f} tokens per call at chain 4. Offsets losses by difference: "
    + ", ".join(f"{r['drafter']} {r['difference']:+.4f}" for _, r in offsets_rows.iterrows())
    + f". Gains whose interval excludes 0: {', '.join(real) or 'none'}."))

# %% [markdown]
# ## How much room is there? The best any drafter from `H_k` could do
# Every drafter here (reused heads, offsets, Medusa heads, the paper's three) drafts depth `k + j` from `H_k` alone,
# before the codes `k .. k+j-1` are known. Its acceptance is therefore limited by how much the verifier's
# distribution for depth `k + j` changes with those codes. `rvqspec_lib.eval.headroom.drafter_headroom` measures it on
# the model itself: for each frame and start depth it samples continuations of the frame from the verifier (the
# deployed warping), keeps each one's `p` for depth `k + j`, and reports
#
# * **ceiling**: the acceptance of the best possible `q` for those continuations (exact maximisation of
#   `mean_s Σ_x min(p_s(x), q(x))`; an upper bound, slightly optimistic with few samples);
# * **marginal**: `q` = the mean of half the continuations' `p`, scored on the other half (what a drafter that had
#   learnt the marginal perfectly would get: an achievable value);
# * each drafter's acceptance on the same continuations.
#
# `captured` = (drafter - heads) / (marginal - heads): the share of the achievable gain a drafter realises
# (`rvqspec_lib.eval.headroom.captured_share`).

# %%
t0 = time.perf_counter()
n_head = min(len(eval_frames), 16 if smoke else headroom_frames)
pick = torch.randperm(len(eval_frames), generator=torch.Generator().manual_seed(seed))[:n_head]
headroom = H.drafter_headroom(cp, eval_frames.context[pick], eval_frames.codes[pick], drafters, n_ahead=K,
                              samples=4 if smoke else headroom_samples, sampling=sampling,
                              generator=torch.Generator().manual_seed(seed))
timings["headroom_s"] = time.perf_counter() - t0
headroom_table = pd.DataFrame(H.headroom_table(headroom, baseline="heads"))
prov = provenance(params, seed=seed)
save_table(headroom_table, out / "02_headroom", {**prov, "frames": n_head, "samples": headroom["samples"]})
headroom_table

# %% [markdown]
# ## Acceptance by depth
# Exact acceptance of a sampled draft, `E[Σ_x min(p, q)]`, for the draft of depth `k + j` made from `H_k`, one panel
# per offset `j` (x axis: the drafted depth `k + j`). Where offsets help, the gain should show at every depth, since
# one vector per offset is shared by all start depths.

# %%
shown = [lab for lab in ("heads", "offsets-ce", "offsets-kl", "offsets-tv", "medusa", "medusa-tv") if lab in results]
# distinct markers and widths: drafters that coincide (e.g. offsets that learned little) stay visible
style = {"heads": dict(marker="o", lw=3.0, alpha=0.6), "offsets-ce": dict(marker="s", lw=1.8),
         "offsets-kl": dict(marker="^", lw=1.2, ls="--"), "offsets-tv": dict(marker="v", lw=1.2, ls=":"),
         "medusa": dict(marker="D", lw=1.0), "medusa-tv": dict(marker="P", lw=1.6, ls="-.")}
fig, axes = plt.subplots(1, K, figsize=(4.2 * K, 3.6), squeeze=False, sharey=True)
for j in range(1, K + 1):
    ax = axes[0, j - 1]
    for lab in shown:
        alpha = np.array(results[lab]["exact"]["alpha"], dtype=float)  # (n-1, K_eval), NaN past the last depth
        k = np.arange(1, alpha.shape[0] + 1)
        ok = ~np.isnan(alpha[:, j - 1])
        ax.plot((k + j)[ok], alpha[ok, j - 1], ms=4, mfc="none", label=lab, **style[lab])
    ax.set_title(f"offset j = {j}")
    ax.set_xlabel("drafted depth k + j")
    ax.grid(alpha=0.3)
axes[0, 0].set_ylabel("exact acceptance")
axes[0, 0].legend(fontsize=8)
fig.suptitle(f"Acceptance by depth and offset ({run_model}, {len(eval_frames)} evaluation frames, {sampling!r})")
fig.tight_layout()
prov = provenance(params, seed=seed)
save_figure(fig, out / "02_acceptance_by_depth", prov)
plt.show()

# %% [markdown]
# Per drafted depth (offsets `j <= K` pooled) and per offset (all start depths pooled; offsets past `K` use the
# reused head for every drafter, so they coincide), exact acceptance:

# %%
by_depth = pd.DataFrame({lab: A.acceptance_by_depth(results[lab]["exact"]["alpha"], max_offset=K)[2:]
                         for lab in shown}, index=pd.Index(range(2, n_codes + 1), name="depth")).reset_index()
by_offset = pd.DataFrame({lab: np.array(results[lab]["exact"]["alpha_by_offset"], dtype=float) for lab in shown},
                         index=pd.Index(range(1, len(results["heads"]["exact"]["alpha_by_offset"]) + 1),
                                        name="offset_j")).reset_index()
prov = provenance(params, seed=seed)
save_table(by_depth, out / "02_acceptance_by_depth", prov)
save_table(by_offset, out / "02_acceptance_by_offset", prov)
display(by_depth)
by_offset

# %% [markdown]
# ## The offsets' effect (the paper's Figure 3, here)
# The paper's Figure 3 shows what an offset does: the draft for depth `k + j` made from `H_k + b_j` instead of `H_k`.
# Here, from the table above: exact acceptance by draft offset `j` for the reused heads and each offsets loss (left),
# and each one's gain over the reused heads (right). Past `K` every drafter falls back to the reused head.

# %%
fig = plots.plot_acceptance_by_offset(by_offset.to_dict("records"), max_offset=K,
                                      drafters=[lab for lab in shown if lab == "heads" or lab.startswith("offsets")],
                                      title=f"{run_model}: acceptance by draft offset, reused heads vs offsets "
                                            f"({len(eval_frames)} evaluation frames, {sampling!r})")
save_figure(fig, out / "02_offsets_effect", prov)
plt.show()

# %% [markdown]
# ### Rank-`r` acceptance (tree calibration input)
# `E[p(x_r)]`, the target probability of the draft's rank-`r` code at offset `j` (start depths pooled): the chance
# that a point-mass draft of rank `r` is the verified code. A tree's expected tokens per call is `1 +` the sum over
# its nodes of the product of these along the node's rank path (independence model), so this table is what
# notebook 03 calibrates trees from.

# %%
rank_rows = []
for lab in shown:
    mass = np.array(results[lab]["exact"]["rank_mass_by_offset"], dtype=float)  # (K_eval, R)
    for j in range(1, K + 1):
        rank_rows.append({"drafter": lab, "offset_j": j, **{f"rank{r}": mass[j - 1, r] for r in range(mass.shape[1])},
                          "top8_total": float(np.nansum(mass[j - 1]))})
rank_table = pd.DataFrame(rank_rows)
prov = provenance(params, seed=seed)
save_table(rank_table, out / "02_rank_acceptance", prov)
rank_table

# %% [markdown]
# ## Seed 003: a chain with sampled drafts, across windows
# TensorRT-Edge-LLM's `--cpSpecVerifySize N` drafts `N-1` codes **sampled** from the reused heads and verifies them
# in one call; its documentation says acceptance saturates once the window passes four depths. Below: tokens per
# call against the window for each drafter (solid: measured; dotted: predicted from the exact tables), and the
# smallest window within 2% of the best (`rvqspec_lib.eval.acceptance.saturation_window`). Tokens per call is not the
# speed-up: a wider verify call costs more (notebook 01's verify cost curve).

# %%
windows = list(CHAIN_WINDOWS)
chain_rows, saturation = [], {}
for lab in shown:
    tpc = results[lab]["tokens_per_call"]
    pred = results[lab]["predicted_tokens_per_call"]
    saturation[lab] = A.saturation_window(tpc)
    for w in windows:
        chain_rows.append({"drafter": lab, "window": w, "tokens_per_call": tpc[f"chain{w}"],
                           "predicted": pred[f"chain{w}"]})
chain_table = pd.DataFrame(chain_rows)
fig, ax = plt.subplots(figsize=(6.4, 4.2))
for lab in shown:
    sub = chain_table[chain_table.drafter == lab]
    line, = ax.plot(sub.window, sub.tokens_per_call, ms=6, mfc="none",
                    label=f"{lab} (saturates at N={saturation[lab]})", **style[lab])
    ax.plot(sub.window, sub.predicted, ":", color=line.get_color())
    ax.axvline(saturation[lab], color=line.get_color(), lw=0.6, ls="--")
ax.set_xlabel("chain window N (1 committed + N-1 sampled drafts)")
ax.set_ylabel("tokens per code-predictor call")
ax.set_title(f"Chain with sampled drafts ({run_model}, {len(eval_frames)} evaluation frames)")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
prov = provenance(params, seed=seed)
save_figure(fig, out / "02_chain_windows", prov)
save_table(chain_table, out / "02_chain_windows", prov)
plt.show()
display(Markdown("Saturation window (within 2% of the best): " + ", ".join(
    f"{lab} N={w}" for lab, w in saturation.items()) + "."))

# %%
timings["total_s"] = time.perf_counter() - t_start
metrics = {
    "model": model,
    "run_model": run_model,
    "random_weights": lm.is_random,
    "model_info": info,
    "params_model_total": params_model,
    "sampling": sampling.describe(),
    "n_train_frames": len(train_frames),
    "n_val_frames": len(val_frames),
    "n_eval_frames": len(eval_frames),
    "n_eval_utterances": int(torch.unique(eval_frames.utterance).numel()),
    "tokens_per_call": {lab: r["tokens_per_call"] for lab, r in results.items()},
    "predicted_tokens_per_call": {lab: r["predicted_tokens_per_call"] for lab, r in results.items()},
    "params_added": {lab: r["params_added"] for lab, r in results.items()},
    "own_tree": own_tree,
    "calibration_frames": len(cal_frames),
    "paper_decoder": {"drafter": deployed, "N": PAPER_BUDGET, **own_tree[deployed]["N32"]},
    "acceptance_by_offset": {lab: r["exact"]["alpha_by_offset"] for lab, r in results.items()},
    "saturation_window": saturation,
    "margin_vs_heads": {r["drafter"]: {k: v for k, v in r.items() if k != "drafter"} for r in margin_rows},
    "headroom": headroom,
    "training": {lab: {"best_epoch": res.best_epoch, "epochs_run": res.curve[-1]["epoch"],
                       "stopped_early": res.stopped_early, "loss": res.drafter.provenance["loss"],
                       "val_acceptance_by_offset_init": res.curve[0]["val_acceptance_by_offset"],
                       "val_acceptance_by_offset_best": res.curve[res.best_epoch]["val_acceptance_by_offset"]}
                 for lab, res in curves.items()},
    "deployed_offsets": deployed,
    "drafter_files": {k: str(v) for k, v in files.items()},
    "paper_reported_toks_per_step": PAPER_REPORTED_TOKS_PER_STEP,
    "paper_source": PAPER_SOURCE,
    "timings_s": timings,
}
prov = provenance(params, seed=seed)
save_json(metrics, out / "02_metrics.json", prov)
print(json.dumps({k: metrics[k] for k in ("tokens_per_call", "saturation_window", "deployed_offsets", "timings_s")},
                 indent=1))
