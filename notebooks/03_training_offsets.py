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
# # 03 — Drafters: reused heads, Medusa heads and position-aware offsets (paper Table 2, Figure 3)
#
# Notebook 02 showed that the lossless rule keeps the committed codes distributed exactly as plain decoding would,
# **whatever the guesses are**. What the guesses decide is speed: how many codes one call of the code predictor
# commits, the **tokens per call**. This notebook asks the paper's Table 2 question: **which drafter gives the most
# tokens per call for the fewest added parameters?** The words in bold are defined where they first appear;
# [the glossary](../docs/glossary.md) collects them all.
#
# **Drafts from `H_s`.** The code predictor emits the codes of **depths** j = 1..15 of a frame one call each. After the
# call that produced the code of the **start depth** s (the last committed code), its hidden state at that position,
# **`H_s`**, is all a **drafter** sees: from it, the drafter gives a draft distribution **q** for each later depth
# s + t, where t = 1..K is the **draft offset** (K = 3 in the paper; letters as in
# [the glossary](../docs/glossary.md#speculative-decoding)). Three words sound alike: **offset t** is always that
# integer distance; the learned vector of the paper's drafter (below) is the **offset vector b_t**; and **offsets**
# (as in `offsets-tv`) names the drafter made of those vectors. One verify call then checks the drafts against the
# verifier's distribution **p**. Two kinds of draft are kept with two different probabilities
# ([methods.md](../docs/methods.md#accept-and-reject-rules)):
#
# * a **sampled** draft (a code drawn from q) is kept with probability Σ_x min(p(x), q(x)), the **sampled acceptance**
#   (one minus the total variation between p and q);
# * a **point-mass** draft (the top-ranked code x of q, as in the paper's tree) is kept with the target mass p(x) of
#   its code, the **point-mass acceptance**.
#
# Where this notebook writes "acceptance" alone it means the sampled acceptance (the drafters are trained and
# compared on it); the point-mass acceptance is always named so (section 4's toy, the `rank0` column of section 8).
#
# **The three drafters of Table 2** ([methods.md](../docs/methods.md#reused-heads)):
#
# 1. **Reused heads** (row (i)): the code predictor owns one output head per depth, all reading the same residual
#    stream (the transformer's hidden state; not the RVQ residual of notebook 00), so `lm_head[s+t-1](H_s)` is a
#    draft for depth s + t. No parameter is added. Its weakness: that head was trained on `H_{s+t}`, not on `H_s`.
# 2. **Medusa heads** (row (ii), Cai et al. 2024): a fresh head per (start depth s, offset t), `head[s, t](H_s)`,
#    initialised from the reused head and trained. Flexible, but each is as large as an LM head.
# 3. **Position-aware offsets** (row (iii), the paper's method): K learned vectors b_1..b_K of the hidden size, shared
#    by every start depth: the draft for depth s + t is `lm_head[s+t-1](H_s + b_t)`. The offset vector moves `H_s`
#    towards where the head of depth s + t expects its input; the verifier's own path is untouched. Since a head is a
#    linear map W_{s+t}, the draft is q' = softmax(W_{s+t}(H_s + b_t)) = softmax(W_{s+t} H_s + W_{s+t} b_t): the
#    reused head's logits plus the fixed vector W_{s+t} b_t, the same shift in every state (section 4 works it by
#    hand).
#
# The paper reports (its Table 2, Qwen3-TTS-0.6B, a calibrated tree at its node budget) that the offsets recover most of
# Medusa's gain over the reused heads for a vanishing share of Medusa's parameters; its values stand in the columns
# labelled `paper: ...` of section 5 and are rendered in sections 5 and 11. Here the same comparison runs on the shipped
# **embedded model**, a small Qwen3-TTS-class model trained offline on synthetic speech with a k-means codec: its
# numbers are its own, and the paper's values appear only in columns and panels labelled as the paper's.
#
# The sections:
#
# 1. the model, its sampling and the frames;
# 2. training the drafters, with three losses, the learning rate chosen on validation;
# 3. which offsets are deployed, and which loss trained the offsets shipped beside the model;
# 4. acceptance by draft offset and by depth (the paper's Figure 3, here), and an offset worked by hand;
# 5. Table 2: each drafter with its own calibrated tree;
# 6. is the margin over the reused heads real? a paired interval;
# 7. how much room is there? the best any drafter from `H_s` could do;
# 8. point-mass or sampled drafts: which does better on this model, and why;
# 9. a chain of sampled drafts across windows;
# 10. when point-mass trees beat sampled children, on a synthetic code predictor whose peak and drift are set;
# 11. what this notebook showed, and why.

# %% tags=["parameters"]
model = "embedded"  # the small trained model shipped in data/embedded (or a folder written by build_embedded.py)
seed = 0  # utterance order, batch order, decode generators, headroom draws
smoke = False  # True: a few frames, two epochs, one learning rate (headless test, about two minutes)
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
device = "auto"  # where the model runs and the drafters train: auto (CUDA, then Apple's MPS, then the CPU), cpu, cuda
#                  or mps
n_train_frames = 1200  # teacher-forced training frames (shipped training split, utterances in seeded random order)
n_val_frames = 150  # validation frames: early stopping, the learning rate and the deployed loss are chosen on them
n_eval_frames = 200  # evaluation frames (sampled across the whole shipped evaluation split)
epochs = 12  # maximum epochs (early stopping on validation acceptance, best epoch kept)
patience = 2  # epochs without validation improvement before stopping
batch_size = 64  # frames per optimiser step (each frame gives 14 start depths x K offsets: of the 15 depths,
# s = 1..14 have a later depth to draft, offsets t >= 1; pairs with s + t > 15 drop out)
K = 3  # offsets drafted by the trained drafters (paper: 3)
train_kl = True  # also train offsets with the KL loss
train_tv = True  # also train offsets on one minus the exact acceptance (total variation, q warped as deployed)
train_medusa = True  # also train Medusa heads (cross-entropy, Medusa-1's loss)
medusa_lr = None  # Adam learning rate of the Medusa heads (None: the library default, Medusa-1's 1e-3)
train_medusa_tv = True  # also train Medusa heads on total variation, like offsets-tv
medusa_tv_lr = 1e-4  # its Adam learning rate (below Medusa-1's: LM-head-sized heads, a small training split)
offsets_lrs = (1e-2, 1e-3, 3e-4)  # Adam learning rates tried for each offsets loss; the validation acceptance picks one
tree_budgets = (2, 4, 8, 16, 32, 64)  # node budgets of each drafter's own calibrated trees (32: the paper's)
n_calibration_frames = 100  # calibration-split frames each drafter's trees are calibrated on
calibration_draws = 1  # Monte Carlo draws of the sampled children per calibration row (the sampled trees' table)
headroom_frames = 50  # evaluation frames for the headroom of H_s-only drafters (Monte Carlo over continuations)
headroom_samples = 8  # sampled continuations per (frame, start depth)
save_to_model = False  # True (not smoke): also deploy the offsets beside the model (<model>/drafters/); `make paper`
#                        leaves the shipped model as it is, so the later notebooks read the committed drafters
medusa_dir = "build/drafters"  # Medusa heads are large (vocab x hidden per head): written here, not into git
cpu_sizes = {"n_train_frames": 400, "n_val_frames": 100, "n_eval_frames": 40, "epochs": 6, "offsets_lrs": (1e-2, 1e-3),
             "n_calibration_frames": 64, "tree_budgets": (8, 16, 32), "headroom_frames": 24, "headroom_samples": 4}
#            a full run on a real-size checkpoint on the CPU: these in place of the sizes above (numbers: the smaller),
#            so that `make paper` fits 90 minutes on 2 cores; None or {}: the sizes above (paper.checkpoint.cpu_sized)
dataset = ""  # real checkpoints: a local `datasets` folder (save_to_disk, VoxPopuli schema: audio + raw_text)
codec = ""  # with dataset: the codec that turns its audio into codes (e.g. the Qwen3-TTS-Tokenizer-12Hz folder)
dataset_splits = ("train", "validation", "test")  # its training / validation / evaluation splits

# %%
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from matplotlib.ticker import MaxNLocator

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_figure, save_json, save_table
from tools.results_doc import entry, headline
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.data.utterances import embedded_root
from paper.checkpoint import cpu_sized, is_checkpoint, not_here, prepare_checkpoint, takes_cpu_sizes
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET
from paper import drafter_table as T
from rvqspec_lib.eval.calibration import calibration_frames
from rvqspec_lib.models.frame import inner_sampling
from paper.plots import DECODER_COLORS, drafter_style, plot_acceptance_by_offset, sampling_words
from rvqspec_lib.models.drafter_files import (
    drafter_path,
    make_drafter,
    model_drafter_dir,
    read_description,
    save_drafter,
)
from rvqspec_lib.common.machine import resolve_device
from rvqspec_lib.models.loader import EMBEDDED_MODEL, OWN_MODEL_MARKER, load_model
from rvqspec_lib.models.tree_files import save_calibration
from rvqspec_lib.models.named_decoders import resolve
from rvqspec_lib.eval.acceptance import decoder_statistics
from paper.drafter_training import TABLE2_DRAFTERS, deploy_drafters, select_deployed, train_drafters

t_start = time.perf_counter()
pd.set_option("display.max_columns", 40)  # Table 2 is wide: show every column
if smoke:
    n_train_frames, n_val_frames = min(n_train_frames, 128), min(n_val_frames, 32)
    n_eval_frames = min(n_eval_frames, 16)
    epochs, patience = min(epochs, 2), 1
    n_calibration_frames, tree_budgets = min(n_calibration_frames, 32), (8, 32)
    headroom_frames, headroom_samples = min(headroom_frames, 16), min(headroom_samples, 4)
    offsets_lrs = tuple(offsets_lrs)[:1]
if threads:  # two threads on a busy 2-core machine spin-wait
    torch.set_num_threads(int(threads))
torch.manual_seed(seed)  # nothing below draws from the global RNG; set for any library default that might
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
device = resolve_device(device)  # a device not present: one line, before loading
cpu_run = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes, device=device)  # real size on the CPU
(n_train_frames, n_val_frames, n_eval_frames, epochs, offsets_lrs, n_calibration_frames, tree_budgets,
 headroom_frames, headroom_samples) = cpu_sized("03", dict(
    n_train_frames=n_train_frames, n_val_frames=n_val_frames, n_eval_frames=n_eval_frames, epochs=epochs,
    offsets_lrs=offsets_lrs, n_calibration_frames=n_calibration_frames, tree_budgets=tree_budgets,
    headroom_frames=headroom_frames, headroom_samples=headroom_samples), cpu_sizes, applies=cpu_run).values()
params = dict(notebook="03_training_offsets", model=model, seed=seed, smoke=bool(smoke), out_dir=str(out),
              device=device,
              threads=torch.get_num_threads(), n_train_frames=n_train_frames, n_val_frames=n_val_frames,
              n_eval_frames=n_eval_frames, epochs=epochs, patience=patience, batch_size=batch_size, K=K,
              train_kl=bool(train_kl), train_tv=bool(train_tv), train_medusa=bool(train_medusa), medusa_lr=medusa_lr,
              train_medusa_tv=bool(train_medusa_tv), medusa_tv_lr=medusa_tv_lr,
              offsets_lrs=[float(x) for x in offsets_lrs], tree_budgets=[int(b) for b in tree_budgets],
              n_calibration_frames=n_calibration_frames, calibration_draws=calibration_draws,
              headroom_frames=headroom_frames, headroom_samples=headroom_samples, save_to_model=bool(save_to_model),
              medusa_dir=medusa_dir, dataset=dataset, codec=codec, dataset_splits=list(dataset_splits),
              cpu_sized=cpu_run)
timings = {}



# the model: "embedded", a model folder, or a build folder holding model/ and utterances.safetensors; a real
# checkpoint with `dataset` (+ `codec`), or without one: then it speaks its own frames (paper.checkpoint); a
# random-weight timing model built in memory falls back to the embedded model (said on the console), because
# acceptance needs trained weights and frames of speech
if dataset:
    if not codec:
        raise ValueError("dataset needs codec: the codec that encodes its audio (a folder or RVQ codec file)")
    root, run_model = None, model
else:
    if is_checkpoint(model):  # a released checkpoint: it speaks its own frames (rvqspec prepare's stages)
        prepare_checkpoint(model, smoke=smoke, notebook="03", out_dir=out, seed=seed, cpu_sizes=cpu_sizes,
                           device=device)
    try:
        root = embedded_root(model)
    except FileNotFoundError:
        not_here("03", f"offsets trained on {model}", "random weights built in memory, no dataset given: the "
                 "embedded model is measured instead", "03_metrics.json")
        display(Markdown(f"**`{model}` ships no utterances and no `dataset` was given: this notebook measures the "
                         "embedded model instead** (pass `-p dataset DIR -p codec C` for a real checkpoint)."))
        root = embedded_root(EMBEDDED_MODEL)
        model = EMBEDDED_MODEL
    run_model = model if model == EMBEDDED_MODEL or is_checkpoint(model) or (Path(model) / OWN_MODEL_MARKER).is_file() \
        else str(root / "model")
params["run_model"] = run_model
prov = provenance(params, seed=seed)
print(f"model {run_model} (frames from {root or dataset}), outputs -> {out}")

# %% [markdown]
# ## 1. The model, its sampling, and the frames
#
# **What is sampled.** Acceptance depends on the distributions the verifier really samples from, so p and q are both
# taken after the deployed **warpers** (temperature, then top-k), read from the model's `generation_config.json`
# (`subtalker_*` keys). **The data.** The embedded model ships the codes of real utterances in disjoint splits
# (`data/embedded/MODEL_CARD.md`): drafters train on `training`, every choice (early stopping, learning rate, which
# offsets to deploy) is made on `validation`, every number reported is measured on `evaluation`, and the trees are
# calibrated on a fourth split, `calibration`. A frame's **context** comes from one teacher-forced talker pass per
# utterance (true code 0, true feedback); its targets are the true codes 1..15
# (`rvqspec_lib.data.frame_sources.frames_from_shipped`).

# %%
lm = load_model(run_model, device=device, dtype="float32")
cp = lm.code_predictor
info = lm.describe()
sampling = inner_sampling(lm)
n_codes = lm.n_code_groups - 1
params_model = int(sum(p.numel() for p in lm.model.parameters()))
display(pd.Series({**info, "params_model_total": params_model, "sampling": sampling_words(sampling)},
                  name="value").to_frame())
if info["params_talker_total"] == params_model:
    display(Markdown(
        f"`params_talker_total` counts the talker together with the code predictor it holds as a submodule, hence "
        f"the whole model here (`params_model_total`); the talker without it has "
        f"{info['params_talker_total'] - info['params_code_predictor']:,} parameters."))
if lm.is_random:
    display(Markdown("**This model has RANDOM weights: the acceptance rates below mean nothing.**"))

t0 = time.perf_counter()
if dataset:
    from rvqspec_lib.data.frame_sources import frames_from_dataset
    from rvqspec_lib.models.speech_tokenizers import load_codec

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
save_table(data_table, out / "03_data", prov)
display(Markdown(
    "Columns: `frames` the frames taken from a split, `utterances` how many utterances those frames come from, "
    "`of_split_utterances` how many utterances the split holds in all"
    + (" (empty: frames read from a dataset, whose splits are not counted here)"
       if data_table["of_split_utterances"].isna().any() else "")
    + ". Training and validation frames are taken utterance by utterance"
    + ("" if dataset else ", in a seeded random order,")
    + " up to the frame limit; the evaluation frames are drawn at random from "
    + (f"the first {len(eval_all)} frames read" if smoke or dataset else "all the split's frames") + "."))
data_table

# %% [markdown]
# ## 2. Training the drafters
#
# **Question:** can a drafter learn to guess depth s + t from `H_s` better than the reused heads? **How:** only the
# drafter's own parameters move (Adam; the code predictor is frozen), on teacher-forced hidden states and the true
# codes that follow, as in the paper ([methods.md](../docs/methods.md#position-aware-offsets)). Three losses, because
# they reward different things:
#
# * **CE**, cross-entropy to the true codes: the paper's loss. It rewards putting mass on the code that was spoken.
# * **KL**, to the verifier's warped distribution p: it rewards matching what the verifier samples from.
# * **TV**, total variation to that warped p, which is exactly one minus the acceptance of a sampled draft: it
#   rewards what speculative decoding pays for, and nothing else.
#
# The offsets are trained with all three; Medusa heads with CE (Medusa-1's) and with TV. **Epoch 0** is the
# untrained drafter, which IS the reused heads (zero offsets; Medusa heads copied from the LM heads). After every
# epoch, the exact sampled acceptance on the validation frames is measured per offset t; training keeps the epoch
# with the highest mean (a lower loss does not always mean more accepted drafts). Each offsets loss is trained at every
# rate of `offsets_lrs` and the validation acceptance picks the rate: too large a rate overshoots in the first epoch,
# early stopping then keeps epoch 0, and that would wrongly read as "this loss cannot help"
# (`paper.drafter_training.train_drafters`).

# %%
flags = {"offsets-kl": train_kl, "offsets-tv": train_tv, "medusa": train_medusa, "medusa-tv": train_medusa_tv}
plan = {label: spec for label, spec in TABLE2_DRAFTERS.items() if flags.get(label, True)}
lrs = {label: (list(offsets_lrs) if kind == "offsets" else [medusa_tv_lr if loss == "tv" else medusa_lr])
       for label, (kind, loss) in plan.items()}
t0 = time.perf_counter()
run = train_drafters(cp, plan, train_frames, val_frames, K=K, lrs=lrs, sampling=sampling, batch_size=batch_size,
                     max_epochs=epochs, patience=patience, seed=seed, progress=True)
timings["training_s"] = time.perf_counter() - t0
trained = run.drafters
for d in trained.values():
    d.provenance["model"] = run_model
lr_table = pd.DataFrame(run.lr_rows)
save_table(lr_table, out / "03_lr_selection", prov)
display(Markdown(
    "Columns: one row per (drafter, learning rate) trained; `best_epoch` the epoch kept by early stopping; "
    "`val_acceptance_mean` the mean exact validation acceptance at that epoch, `val_acceptance_init` the same "
    "before training (the reused heads); `chosen` marks the learning rate kept for that drafter, the highest "
    "`val_acceptance_mean` of its rows"
    + (" (True in every row here: one learning rate was tried per drafter)."
       if all(lr_table["chosen"]) else ".")))
lr_table

# %% [markdown]
# **Training curves.** Left: the mean exact validation acceptance per epoch, every drafter on one axis (epoch 0 is
# the reused heads for all; the filled marker is the epoch kept). Right: the validation loss relative to its value at
# epoch 0, since CE, KL and TV live on different scales. One colour per drafter family (reused heads, offsets in the
# paper's purple, Medusa heads), one marker and line style per loss.

# %%
curve_rows = run.curve_rows()
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
for label, res in run.results.items():
    ep = [c["epoch"] for c in res.curve]
    acc = [c["val_acceptance"] for c in res.curve]
    rel = [c["val_loss"] / res.curve[0]["val_loss"] for c in res.curve]
    style = drafter_style(label)
    ax0.plot(ep, acc, ms=5, mfc="none", label=label, **style)
    ax0.plot([res.best_epoch], [acc[res.best_epoch]], marker=style["marker"], color=style["color"], ms=7, ls="none")
    ax1.plot(ep, rel, ms=5, mfc="none", label=label, **style)
first = next(iter(run.results.values())).curve[0]  # epoch 0 of every run: the reused heads
ax0.axhline(first["val_acceptance"], label="heads (epoch 0)", **{**drafter_style("heads"), "lw": 1.0, "marker": None})
for ax in (ax0, ax1):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch (0: untrained, the reused heads)")
    ax.grid(alpha=0.3)
ax0.set_ylabel("validation acceptance (mean over offsets)")
ax0.set_title("acceptance of a sampled draft, validation split", fontsize=9)
ax1.set_ylabel("validation loss / its value at epoch 0")
ax1.set_title("each drafter's own loss, relative", fontsize=9)
ax0.legend(fontsize=7)
fig.suptitle(f"Training the drafters on {run_model}: {len(train_frames):,} training and {len(val_frames):,} "
             f"validation frames, sampling {sampling_words(sampling)}", fontsize=10)
save_figure(fig, out / "03_training_curves", prov)
save_table(curve_rows, out / "03_training_curves", prov)
plt.show()

# %% [markdown]
# ## 3. Which offsets are deployed, and which loss trained the shipped ones
#
# **Question:** of the three offsets losses, which one should the paper's method use? **How:** the one with the
# highest validation acceptance at its kept epoch (`select_deployed`), never chosen on the evaluation split. This
# run's deployed offsets with their own calibrated point-mass tree of N nodes follow the paper's recipe; this notebook
# calls them "this run's offsets" and never `paper:N`. They keep their own names here
# (`tree:calibrated-point-mass:N@offsets-tv` and the like): the name `paper:N` always means the offsets shipped
# beside the model with their shipped tree, which `--decoder paper` and notebooks 04 to 07 use
# ([glossary](../docs/glossary.md#drafters)). In the same way `tree:calibrated-point-mass:N` (with or without
# `@drafter`) means, in this notebook, a tree calibrated here, in section 5, on this notebook's own calibration frames
# (section 5 says how many), not the trees shipped beside the model (`<model>/trees/`) that notebooks 01, 06 and 07
# read under the same name. Offsets are tiny and saved into the output folder; Medusa heads hold one
# LM-head-sized matrix per (start depth, offset), so they go to `medusa_dir` (git-ignored). `make paper` does not
# deploy: the offsets shipped beside the model (`<model>/drafters/offsets.safetensors`, with their trees in
# `<model>/trees/offsets.json`) stay the ones the model's build trained, so every notebook of one run reads the same
# files. Which loss trained those is read from the file's own description below.

# %%
files = {}
for label, d in trained.items():
    if d.name == "offsets":
        files[label] = save_drafter(d, out / "03_drafters" / f"{label}.safetensors")
    elif not smoke:  # Medusa heads: large, git-ignored folder; a smoke run does not write them
        files[label] = save_drafter(d, resolve_out_dir(medusa_dir, smoke=smoke)
                                    / str(run_model).strip("/").replace("/", "_") / f"{label}.safetensors")
deployed = select_deployed(trained, kind="offsets")  # the highest validation acceptance
model_dir = model_drafter_dir(run_model)
if not smoke and save_to_model and model_dir is not None:
    files.update(deploy_drafters(trained, deployed, model_dir, kind="offsets"))
shipped_file = drafter_path(model_dir, "offsets") if model_dir is not None else None
shipped = read_description(shipped_file)["provenance"] if shipped_file is not None and shipped_file.is_file() else None
LOSS_WORDS = {"ce": "cross-entropy (the paper's loss)", "kl": "KL to the warped verifier",
              "tv": "total variation, one minus the exact acceptance"}
display(Markdown(
    f"Deployed in this run (highest validation acceptance): **{deployed}**. Files written: "
    + ", ".join(f"`{p}`" for p in files.values()) + ".\n\n"
    + (f"The offsets shipped beside `{run_model}` (`{shipped_file}`), which the later notebooks' `paper` decoder "
       f"uses, were trained with **{LOSS_WORDS.get(shipped['loss'], shipped['loss'])}**"
       + ("" if shipped["loss"] == "ce" else ", not the paper's cross-entropy")
       + f": learning rate {shipped['lr']:g}, {shipped['n_train_frames']:,} training frames, epoch "
       f"{shipped['best_epoch']} of {shipped['epochs_run']} kept, validation acceptance by offset "
       f"{', '.join(f'{a:.3f}' for a in shipped['val_acceptance_at_init'])} untrained and "
       f"{', '.join(f'{a:.3f}' for a in shipped['val_acceptance_by_offset'])} trained. The same validation rule "
       f"chose that loss when the model was built; this run repeats the choice on its own frames."
       if shipped else f"`{run_model}` ships no offsets file: the later notebooks' `paper` decoder needs one.")))

# %% [markdown]
# ## 4. Acceptance by draft offset and by depth (the paper's Figure 3, here)
#
# **Question:** where do the drafters differ? **How:** on the evaluation frames, every drafter is run with the same
# decoders (chains of windows 2..8 and a small fixed tree) by `decode_frame`, and one teacher-forced pass over the
# codes a decoder committed (samples of p) gives the exact tables: for every start depth s and offset t, the
# sampled acceptance E[Σ_x min(p, q)] and the target mass of the draft's rank-r code, E[p(x_r)], the point-mass
# acceptance of a rank-r draft (`paper.drafter_table.evaluate_drafters`). The tables are exact given the committed
# codes (computed from the probabilities, no draws over drafts), but each drafter's tables are taken on the codes its
# own decoders sampled, so they still carry the noise of which codes were sampled: the sentence under the table
# measures it. **Acceptance** in this section and the next three is the **sampled acceptance**; the paper's tree
# keeps a point-mass draft with its point-mass acceptance, the target mass of its code, far less on this model (the
# `rank0` column of section 8; the sentence under the table gives it). The paper's Figure 3 shows what an offset vector
# does: the draft for depth s + t made from `H_s + b_t` instead of `H_s`. Below, the acceptance by offset t for the
# reused heads and each offsets loss (left) and each one's gain over the reused heads (right). Past K every drafter
# drafts with the reused head itself; the sentence under the table says how far the rows still differ there, and why.

# %%
t0 = time.perf_counter()
drafters = {"heads": make_drafter("heads", cp), **trained}
results = T.evaluate_drafters(cp, drafters, eval_frames, sampling=sampling, seed=seed, progress=True)
timings["evaluate_s"] = time.perf_counter() - t0
save_json(results, out / "03_acceptance.json", prov)
tables = T.acceptance_tables(results, K=K)
save_table(tables["by_depth"], out / "03_acceptance_by_depth", prov)
save_table(tables["by_offset"], out / "03_acceptance_by_offset", prov)
save_table(tables["rank"], out / "03_rank_acceptance", prov)
offsets_labels = [lab for lab in drafters if lab == "heads" or T.drafter_family(lab) == "offsets"]
fig = plot_acceptance_by_offset(tables["by_offset"], max_offset=K, drafters=offsets_labels,
                                title=f"Acceptance by draft offset: reused heads vs position-aware offsets "
                                      f"({run_model}, {len(eval_frames)} evaluation frames, "
                                      f"{sampling_words(sampling)})")
save_figure(fig, out / "03_offsets_effect", prov)
plt.show()
pd.DataFrame(tables["by_offset"])

# %%
past_k = [r for r in tables["by_offset"] if r["offset_t"] > K]
# the spread among ALL rows at one offset t > K (largest minus smallest), its largest value over those offsets
spread_by_t = {r["offset_t"]: max(r[lab] for lab in drafters) - min(r[lab] for lab in drafters) for r in past_k}
spread_t = max(spread_by_t, key=spread_by_t.get) if spread_by_t else None
spread = spread_by_t[spread_t] if spread_by_t else 0.0
row_t = next((r for r in past_k if r["offset_t"] == spread_t), None)
spread_hi, spread_lo = ((max(drafters, key=lambda lab: row_t[lab]), min(drafters, key=lambda lab: row_t[lab]))
                        if row_t else (None, None))
within_k = max((r[lab] - r["heads"] for r in tables["by_offset"] if r["offset_t"] <= K for lab in offsets_labels),
               default=0.0)
gains_k = [(lab, r["offset_t"], r[lab] - r["heads"]) for r in tables["by_offset"] if r["offset_t"] <= K
           for lab in drafters if lab != "heads"]
# digits enough that every gain printed below reads on the same side of the spread as its value
nd = next((d for d in range(4, 9) if all(f"{g:.{d}f}" != f"{spread:.{d}f}" for _, _, g in gains_k if g != spread)),
          9)
by_lab = lambda keep: [  # noqa: E731
    f"{lab} (" + ", ".join(f"t = {t}: {g:+.{nd}f}" for l2, t, g in gains_k if l2 == lab and keep(g)) + ")"
    for lab in drafters if any(l2 == lab and keep(g) for l2, t, g in gains_k)]
in_noise, above, below = (by_lab(lambda g: abs(g) <= spread), by_lab(lambda g: g > spread),
                          by_lab(lambda g: g < -spread))
rank0_heads = [r["rank0"] for r in tables["rank"] if r["drafter"] == "heads"]
display(Markdown(
    f"Past K = {K} every drafter drafts with the reused head, yet the rows differ there: the spread among all rows "
    f"at one offset (largest value minus smallest) reaches {spread:.{nd}f}"
    + (f" (at t = {spread_t}: {spread_hi} {row_t[spread_hi]:.{nd}f} against {spread_lo} {row_t[spread_lo]:.{nd}f})"
       if row_t else "") + ". "
    f"Each drafter's exact tables (computed from the probabilities p and q, not from counted acceptances) are "
    f"measured on the codes its own decoders committed, and different drafts consume the random stream differently, "
    f"so each drafter meets other frames' codes. That {spread:.{nd}f} is this table's **cross-drafter spread** (a "
    f"noise level of the table, not the WER floor of notebook 00 nor the weight-streaming floor of notebooks 06 and "
    f"07); the largest gain of an offsets row over the heads at t ≤ K is {within_k:+.{nd}f}"
    + (", no larger than that spread." if within_k <= spread else ".")
    + " Gains over the heads at t ≤ K within that spread, so not shown by this table: "
    + (", ".join(in_noise) or "none") + "; above it: " + (", ".join(above) or "none")
    + ("; below minus the spread (a loss beyond the noise): " + ", ".join(below) if below else "") + ". "
    f"All these are sampled acceptances; the point-mass acceptance of the reused heads' top-ranked draft (the chance "
    f"it is the verified code) is {min(rank0_heads):.3f} to {max(rank0_heads):.3f} at offsets 1..{K} (section 8)."))

# %% [markdown]
# ### An offset by hand
#
# What does `b_t` do to a reused head's draft? A toy with two hidden dimensions and four codes, small enough to check
# with a pencil. The head of depth s + t is a matrix W (4 × 2); the verifier applies it to the state it was trained
# on, `H_{s+t}`, and gets p = softmax(W H_{s+t}). The drafter only has `H_s`, which here differs from `H_{s+t}` by a
# step along the second dimension (the position the state sits at): the reused head drafts q = softmax(W H_s). The
# offset b_t adds that step back, q' = softmax(W (H_s + b_t)).
#
# **An offset is a fixed logit shift.** The head is linear, so W (H_s + b_t) = W H_s + W b_t: the offset adds the
# vector W b_t, one number per code, to the reused head's logits, and that vector does not depend on the state. On
# the code predictor alike, q' = softmax(W_{s+t}(H_s + b_t)) = softmax(W_{s+t} H_s + W_{s+t} b_t), with W_{s+t} the
# head of depth s + t. So one b_t can cancel a mismatch whose logit error is the same in every state, and nothing
# else.
#
# The library's `PositionOffsets` computes the draft (its `logits` argument stands in for the code predictor's head);
# the sampled acceptance is Σ_x min(p, q), the point-mass acceptance p(argmax q).

# %%
from rvqspec_lib.decoding.drafters import PositionOffsets

W_toy = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-1.0, 1.0], [0.0, -2.0]])  # head of depth s+t: 4 codes x 2 dims
toy_head = lambda h, head: h @ W_toy.T  # noqa: E731  (every depth's head is W here)
toy_off = PositionOffsets(K=1, hidden_size=2)
toy_rows = []
for b_t in ((0.0, 0.0), (0.0, 1.0)):
    with torch.no_grad():
        toy_off.offsets[0] = torch.tensor(b_t)
    for H_s in ((1.0, 0.0), (-1.0, 0.0)):  # two states; each one's H_{s+t} is H_s + (0, 1)
        h = torch.tensor([H_s])
        p_toy = torch.softmax(W_toy @ (h[0] + torch.tensor([0.0, 1.0])), -1)
        with torch.no_grad():
            q_toy = torch.softmax(toy_off.draft_logits(None, h, torch.tensor([1]), 1, logits=toy_head)[0, 0], -1)
        toy_rows.append({"b_t": str(b_t), "H_s": str(H_s), "p": np.round(p_toy.numpy(), 3).tolist(),
                         "q": np.round(q_toy.numpy(), 3).tolist(),
                         "sampled_acceptance": round(float(torch.minimum(p_toy, q_toy).sum()), 3),
                         "point_mass_acceptance": round(float(p_toy[q_toy.argmax()]), 3)})
toy_table = pd.DataFrame(toy_rows)
display(Markdown(
    f"With b_t = 0 (the reused head) the sampled draft is kept with "
    f"{toy_rows[0]['sampled_acceptance']:.3f} and {toy_rows[1]['sampled_acceptance']:.3f} in the two states; with "
    f"b_t = (0, 1) the draft IS p in both (sampled acceptance {toy_rows[2]['sampled_acceptance']:.3f}, "
    f"{toy_rows[3]['sampled_acceptance']:.3f}): one vector undoes a shift that every state shares. In logits, that "
    f"b_t adds W b_t = ({', '.join(f'{v:g}' for v in (W_toy @ torch.tensor((0.0, 1.0))).tolist())}) to the reused "
    "head's logits of either state, exactly the difference between p's logits and q's. A mismatch that "
    "differed from state to state (say `H_{s+t}` = H_s + (0, 1) in one state and H_s - (0, 1) in the other) could not "
    "be undone by one b_t: that is what section 7's headroom and the Medusa heads measure. A point-mass draft "
    f"(the paper's kind) is kept with its point-mass acceptance, p of q's top code: "
    f"{toy_rows[0]['point_mass_acceptance']:.3f} and {toy_rows[2]['point_mass_acceptance']:.3f} in the first state "
    "without and with b_t. An offset vector raises the point-mass acceptance only where it changes WHICH code q ranks "
    "first; moving q's probabilities without changing its order leaves a point-mass draft where it was, which is why "
    "the offsets' gain can show in the sampled acceptance and not in a point-mass tree's tokens per call."))
toy_table

# %% [markdown]
# By drafted depth j = s + t (offsets t ≤ K pooled), every drafter. One shared vector per offset moves every depth
# alike, so a gain could show at every depth; whether it does is read against the cross-drafter spread of the table
# above (the sentence under the figure counts the depths where it does).

# %%
fig, ax = plt.subplots(figsize=(7, 3.8), constrained_layout=True)
depth = [r["depth"] for r in tables["by_depth"]]
for lab in drafters:
    ax.plot(depth, [r[lab] for r in tables["by_depth"]], ms=4, mfc="none", label=lab, **drafter_style(lab))
ax.set_xticks(depth)
ax.set_xlabel("drafted depth j = s + t")
ax.set_ylabel("exact acceptance of a sampled draft")
ax.grid(alpha=0.3)
ax.legend(fontsize=7, ncol=2)
ax.set_title(f"Acceptance by drafted depth, offsets 1..{K} pooled ({run_model}, {len(eval_frames)} evaluation "
             f"frames)", fontsize=9)
save_figure(fig, out / "03_acceptance_by_depth", prov)
plt.show()
n_above = {lab: sum(r[lab] - r["heads"] > spread for r in tables["by_depth"])
           for lab in offsets_labels if lab != "heads"}
display(Markdown(
    f"Depths (of {len(depth)}) where an offsets drafter's sampled acceptance beats the reused heads' by more than "
    f"the cross-drafter spread {spread:.{nd}f} (section 4's largest spread among all rows past K): "
    + ", ".join(f"{lab} {n}" for lab, n in n_above.items()) + "."))

# %% [markdown]
# ## 5. Table 2: each drafter with its own calibrated tree
#
# **Question:** the paper's Table 2, tokens per call against added parameters. **How:** in the paper each drafter is
# verified through a **calibrated sparse tree**: top-ranked drafts (point-mass children), the tree shape chosen
# greedily from acceptance tables measured on calibration data, pruned to a **node budget** N, the query positions
# of one verify call ([methods.md](../docs/methods.md#sparse-point-mass-tree)). A tree is calibrated FOR the drafter
# that proposes its codes, since the ranks are that drafter's, so every drafter gets its own
# (`paper.drafter_table.calibrate_drafters`, on the calibration split: contexts from real speech, codes
# re-sampled from p). The calibration predicts the tokens per call E(N) of its tree at every budget
# ([methods.md](../docs/methods.md#expected-tokens-per-call)); each drafter's own point-mass tree of the paper's
# N = 32 is then decoded on the evaluation frames and measured (`own_tree_rows`). The deployed offsets' tree (this
# run's offsets, section 3) is the paper's recipe as trained in this run; it keeps its own name, since `paper:32`
# names the shipped offsets. Beside it: the prediction at the budget with the highest predicted E(N)
# (`best_N`; E(N) of a greedy tree never falls as N grows, and which N is fastest is notebook 04's question), the
# calibration's prediction for the same drafter's **sampled** tree of N = 32 (children drawn from q, section 8),
# the best chain measured (section 9), and the parameters added, as a share of this model and counted for the
# released 0.6B code predictor (our Medusa has one head per (start depth, offset) with s + t ≤ 15; the paper's count,
# one per depth and offset, is slightly larger). The columns headed `paper: ...` quote the paper's Table 2; every
# other column is measured or counted here.

# %%
t0 = time.perf_counter()
if dataset:  # a real checkpoint: the validation contexts, codes re-sampled from p
    from rvqspec_lib.data.frame_sources import frames_from_contexts

    cal_frames = frames_from_contexts(cp, val_frames.context[:n_calibration_frames], sampling=sampling, seed=seed)
else:
    cal_frames = calibration_frames(lm, max_frames=n_calibration_frames, seed=seed)
calibrations = T.calibrate_drafters(cp, drafters, cal_frames, sampling=sampling, budgets=tree_budgets, seed=seed,
                                    draws=calibration_draws, progress=True)
for label, cal in calibrations.items():
    save_calibration({**cal, "provenance": prov}, out / "03_trees" / f"{label}.json")
own_rows = T.own_tree_rows(cp, drafters, calibrations, eval_frames, sampling=sampling, seed=seed,
                           progress=True)
timings["own_trees_s"] = time.perf_counter() - t0
save_table(own_rows, out / "03_own_trees", prov)
predicted = T.predicted_by_budget(calibrations)
save_table(predicted, out / "03_predicted_by_budget", prov)
table2 = T.table2(results, own_rows, calibrations, drafters, params_code_predictor=info["params_code_predictor"],
                  params_model=params_model, K=K)
save_table(table2, out / "03_table2", prov, caption=f"paper: ... columns quoted from the {T.PAPER_SOURCE}; every "
           f"other column measured or counted on {run_model}")
t2 = {r["label"]: r for r in table2}
display(Markdown(
    f"`paper: ...` columns: quoted from the {T.PAPER_SOURCE}; every other column measured or counted on "
    f"`{run_model}`. `kept_epoch` 0 means training never beat the untrained drafter on validation, so that row IS "
    f"the reused heads: " + (", ".join(lab for lab, r in t2.items() if r["kept_epoch"] == 0) or "none") + "."
    + "".join(
        f" `{lab}` was trained at {'one learning rate' if len(rates) == 1 else f'{len(rates)} learning rates'} "
        f"({', '.join(f'{v:g}' for v in rates)}) and kept epoch 0, as section 2 warns can happen: its row is the "
        f"reused heads again, not a trained drafter"
        + (f", so it says nothing about the paper's value beside it ({T.PAPER_TOKS_PER_STEP[lab]:.2f}, quoted)"
           if lab in T.PAPER_TOKS_PER_STEP else "") + "."
        for lab, r in t2.items() if r["kept_epoch"] == 0 and lab != "heads"
        for rates in [[row["lr"] for row in run.lr_rows if row["drafter"] == lab]])))
small_tpc = sorted({round(r["small_tree_tokens_per_call"], 9) for r in table2
                    if r["small_tree_tokens_per_call"] is not None})
display(Markdown(
    f"`decoder` names each drafter's own tree. In this notebook `tree:calibrated-point-mass:{PAPER_BUDGET}` (with or "
    f"without `@drafter`) is a tree calibrated here, on {len(cal_frames)} frames "
    + ("of the dataset's validation contexts" if dataset else "of the model's calibration split")
    + " with codes re-sampled from p; notebooks 01, 06 and 07 read the same name as the trees shipped beside the "
      "model (`<model>/trees/`), calibrated when the model was built.\n\n"
    f"Columns: `tree_N32_*` is the drafter's own calibrated point-mass tree of N = {PAPER_BUDGET}, measured on the "
    f"evaluation frames or predicted by its calibration (`sampled_tree_N32_predicted`: the tree with sampled "
    f"children instead); `best_N` is the budget of highest predicted E(N) and `tree_bestN_predicted` that E(N), the "
    f"calibration's prediction for the drafter's point-mass tree of `best_N` nodes (not measured); `chain_best` is "
    f"the best chain of sampled drafts over the windows tried, at `chain_best_window`; `chain4_tokens_per_call` is "
    f"the chain of window "
    f"{T.MARGIN_CHAIN}; `small_tree_tokens_per_call` is one small fixed point-mass tree, `{T.EVAL_DECODERS[-1]}` "
    f"(the same shape for every drafter, not calibrated), "
    + ("equal in every row here: on these frames each drafter's fixed tree kept the same number of drafts, so this "
       "column does not tell the drafters apart; "
       if len(small_tpc) == 1 else
       f"from {small_tpc[0]:.4f} to {small_tpc[-1]:.4f} across the rows; ")
    + "`added_params` are the parameters a drafter adds, `pct_code_predictor` and `pct_model` the same as a "
      "percentage of the code predictor's and of the whole model's parameters (above 100% where a drafter adds more "
      "parameters than the code predictor has: "
    + (", ".join(f"`{r['label']}`" for r in table2 if r["pct_code_predictor"] > 100) or "no row here")
    + "); `added_params_at_0.6B` the count at the released 0.6B model's size; `loss`, `kept_epoch` and `lr` how "
      "the kept drafter was trained."))
with pd.option_context("display.max_colwidth", None):  # the drafter names in full
    display(pd.DataFrame(table2))

# %% [markdown]
# **Table 2 as a figure.** Tokens per call of each drafter's own point-mass tree of N = 32 against the parameters it
# adds (log scale; the reused heads add none). Left: measured here. Right: the paper's quoted values, on the released
# 0.6B model, in a panel of their own.

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True, sharey=True)
for r in table2:
    st = drafter_style(r["label"])
    ax0.plot([max(r["added_params"], 1)], [r["tree_N32_tokens_per_call"]], marker=st["marker"], color=st["color"],
             ms=8, mfc="none" if r["label"] != deployed else st["color"], ls="none",
             label=r["label"] + (" (deployed)" if r["label"] == deployed else ""))
for lab, v in T.PAPER_TOKS_PER_STEP.items():
    st = drafter_style(lab)
    x = {"heads": 1, "offsets-ce": 3072, "medusa": 94e6}[lab]  # the paper's counts (heads: none, drawn at 1)
    ax1.plot([x], [v], marker=st["marker"], color=st["color"], ms=8, ls="none", label=f"{lab} (paper)")
for ax, title in ((ax0, f"measured on {run_model}: own point-mass tree, N = {PAPER_BUDGET}"),
                  (ax1, "quoted: the paper's Table 2, Qwen3-TTS-0.6B, N = 32")):
    ax.set_xscale("log")
    ax.set_xlabel("parameters added (log; the reused heads add none, drawn at 1)")
    ax.set_ylabel("tokens per call")
    ax.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8, ls="--")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.suptitle("Table 2: tokens per call against parameters added (dashed: AR, one code per call)", fontsize=10)
save_figure(fig, out / "03_table2", prov)
plt.show()
pap, hd = t2[deployed], t2["heads"]


def frame_calls(label: str) -> torch.Tensor:
    """Calls of each evaluation frame under ``label``'s own point-mass tree of N = PAPER_BUDGET, decoded as
    ``T.own_tree_rows`` decodes it (``decoder_statistics``, same seed: the same calls, whose total gives the table's
    tokens per call)."""
    nd = resolve(T.own_tree_name(label, PAPER_BUDGET), None, calibrations=calibrations,
                 drafters={lab: d for lab, d in drafters.items() if lab != "heads"})
    return decoder_statistics(cp, nd.drafter, eval_frames.context, nd.decoder, sampling=sampling,
                              seed=seed)["calls"].double()


# are the two rows with the most tokens per call told apart? Their calls per frame, paired over the same frames; the
# difference averaged within each utterance and a 95% Student t interval over utterances, as section 6 does
ranked = sorted(table2, key=lambda r: -r["tree_N32_tokens_per_call"])
top_words = ""
if len(ranked) >= 2:
    first, second = ranked[0], ranked[1]
    calls_1, calls_2 = frame_calls(first["label"]), frame_calls(second["label"])
    utt_ids = torch.unique(eval_frames.utterance)
    per_utt = np.array([float((calls_2 - calls_1)[eval_frames.utterance == u].mean()) for u in utt_ids])
    top_words = (f"Most tokens per call at N = {PAPER_BUDGET}: {first['label']} "
                 f"({first['tree_N32_tokens_per_call']:.4f}), then {second['label']} "
                 f"({second['tree_N32_tokens_per_call']:.4f}). On the same {len(eval_frames)} frames a frame takes "
                 f"{float(calls_1.mean()):.3f} calls with {first['label']}'s tree and {float(calls_2.mean()):.3f} with "
                 f"{second['label']}'s. ")
    if len(per_utt) >= 2:
        from scipy import stats

        d_mean, d_se = float(per_utt.mean()), float(per_utt.std(ddof=1) / np.sqrt(len(per_utt)))
        d_half = float(stats.t.ppf(0.975, len(per_utt) - 1)) * d_se
        apart = d_half < abs(d_mean)  # the 95% interval excludes 0
        top_words += (
            f"The difference ({second['label']} minus {first['label']}, each utterance's mean, then over the "
            f"{len(per_utt)} utterances) is {d_mean:+.3f} calls a frame [95% CI {d_mean - d_half:+.3f}, "
            f"{d_mean + d_half:+.3f}]"
            + (f": the interval excludes 0, so {(first if d_mean > 0 else second)['label']}'s tree takes fewer "
               "calls a frame on these frames, a difference beyond the draw of frames. " if apart else
               ": the interval includes 0, so at this sample size the top two rows are not told apart; "
               f"{first['label']} comes first by this run's draw, not by a shown margin. "))
    else:
        top_words += "These frames come from one utterance, too few for an interval: the two are not told apart. "
best_pred = max(table2, key=lambda r: r["tree_bestN_predicted"])
# digits enough that the largest prediction reads above every smaller one
top_pred = best_pred["tree_bestN_predicted"]
pd_ = next((d for d in range(3, 7) if all(f"{r['tree_bestN_predicted']:.{d}f}" != f"{top_pred:.{d}f}"
                                          for r in table2 if r["tree_bestN_predicted"] < top_pred)), 7)
display(Markdown(
    f"At the paper's setting (each drafter's own point-mass tree of N = {PAPER_BUDGET}), the paper's recipe as "
    f"trained in this run, this run's deployed {deployed} with its own tree (`{pap['decoder']}`), commits "
    f"**{pap['tree_N32_tokens_per_call']:.3f}** tokens per call (predicted {pap['tree_N32_predicted']:.3f}), the "
    f"reused heads **{hd['tree_N32_tokens_per_call']:.3f}** (predicted {hd['tree_N32_predicted']:.3f}). These are not "
    f"the shipped offsets: `paper:{PAPER_BUDGET}` and `--decoder paper` in the other notebooks use the offsets "
    f"shipped beside the model with their shipped tree (section 3). " + top_words
    + f"Predicted, not measured (`tree_bestN_predicted`, each drafter at its own `best_N`): this run's "
    f"{deployed} {pap['tree_bestN_predicted']:.{pd_}f} at N = {pap['best_N']}, the heads "
    f"{hd['tree_bestN_predicted']:.{pd_}f} at N = {hd['best_N']}; the largest over all drafters is "
    f"{best_pred['label']}'s ({best_pred['tree_bestN_predicted']:.{pd_}f} at N = {best_pred['best_N']}). The paper "
    f"reports "
    f"{T.PAPER_TOKS_PER_STEP['offsets-ce']:.2f} and "
    f"{T.PAPER_TOKS_PER_STEP['heads']:.2f} (offsets and reused heads, quoted) on Qwen3-TTS-0.6B."))

# %% [markdown]
# ## 6. Is the margin real? A paired interval over evaluation utterances
#
# **Question:** is a drafter's gain over the reused heads more than an accident of which frames were drawn? **How:**
# on the SAME evaluation frames, per frame, the exact acceptance of a sampled draft averaged over every (start depth
# s, offset t ≤ K), for the drafter and for the reused heads; the difference is averaged within each utterance and a
# 95% Student t interval is taken over utterances, since frames of one utterance are not independent
# (`paper.drafter_table.margin_rows`). The acceptance is computed from the probabilities, so no sampling
# noise enters. An interval that excludes 0 says the gain is real; its size says whether it matters, and
# `chain4_gain` turns it into tokens per call of a chain of window 4, measured. Two things to read with care: the
# two acceptance columns are means over frames, while `difference` is the mean over utterances of each utterance's
# mean difference, so it need not equal their subtraction exactly; and `chain4_gain` is one decoding run without an
# interval, of a chain that uses offsets 1..3 from one start, so a small gain averaged over every offset can show
# there with either sign.

# %%
margin = T.margin_rows(cp, drafters, eval_frames, n_ahead=K, sampling=sampling, results=results)
save_table(margin, out / "03_margin", prov)
m_by = {r["drafter"]: r for r in margin}
real = [r["drafter"] for r in margin if r["ci95_low"] > 0]
off_rows = sorted((r for r in margin if T.drafter_family(r["drafter"]) == "offsets"), key=lambda r: -r["difference"])
best_off = off_rows[0]
display(Markdown(
    f"Best offsets loss on these frames: **{best_off['drafter']}**, acceptance per draft "
    f"{best_off['acceptance_heads']:.4f} (reused heads) -> {best_off['acceptance_drafter']:.4f}, difference "
    f"{best_off['difference']:+.4f} [95% CI {best_off['ci95_low']:+.4f}, {best_off['ci95_high']:+.4f}], "
    f"{best_off['chain4_gain']:+.3f} tokens per call at chain 4. All drafters by difference: "
    + ", ".join(f"{r['drafter']} {r['difference']:+.4f}" for r in sorted(margin, key=lambda r: -r["difference"]))
    + f". Gains whose interval excludes 0: {', '.join(real) or 'none'}. These acceptances are teacher-forced on "
    f"the evaluation frames' own codes (the shipped split's), each frame's mean over every start depth and offset "
    f"1..{K}; section 4's table takes the same quantity on the codes the decoders sampled and pools by offset, so "
    f"its reused heads (mean over offsets 1..{K}: "
    f"{np.mean([r['heads'] for r in tables['by_offset'] if r['offset_t'] <= K]):.4f}) differ from the "
    f"{best_off['acceptance_heads']:.4f} here by as much as those codes and that weighting do. Columns: "
    f"`p_value` is the two-sided Student t test of a zero mean difference over the `n_utterances` utterances (the "
    f"same test as the interval); `difference_t1` .. `difference_t{K}` are the mean differences at each offset "
    f"alone, over the same frames."))
pd.DataFrame(margin)

# %% [markdown]
# ## 7. How much room is there? The best any drafter from `H_s` could do
#
# **Question:** is the offsets' gain small because they are weak, or because no drafter could do much better?
# **How:** every drafter here (and all three of the paper's) drafts depth s + t from `H_s` alone, before codes
# s..s+t-1 exist, so it is limited by how much the verifier's p for depth s + t changes with those codes.
# `paper.headroom.drafter_headroom` measures that on the model itself: for each frame and start depth it
# samples continuations from the verifier (deployed warping) and keeps each one's p for depth s + t. Then:
#
# * **ceiling**: the acceptance of the best possible q for those continuations (an exact maximisation; an upper
#   bound, slightly optimistic with few samples);
# * **marginal**: q = the mean of half the continuations' p, scored on the other half: what a drafter that had
#   learnt the marginal perfectly would get, an achievable value;
# * each drafter's acceptance on the same continuations, and `captured` = (drafter - heads) / (marginal - heads),
#   the share of the achievable gain it realises.

# %%
t0 = time.perf_counter()
headroom, headroom_table = T.headroom_rows(cp, drafters, eval_frames, n_frames=headroom_frames,
                                           samples=headroom_samples, n_ahead=K, sampling=sampling, seed=seed)
timings["headroom_s"] = time.perf_counter() - t0
save_table(headroom_table, out / "03_headroom", {**prov, "frames": headroom["n_frames"],
                                                 "samples": headroom["samples"]})
pd.DataFrame(headroom_table)

# %% [markdown]
# ## 8. Point-mass or sampled drafts on this model
#
# **Question:** does a tree of top-ranked drafts at the paper's node budget commit more or fewer codes per call here
# than a chain of a few sampled ones, and why? **How:** a point-mass child of rank r is kept with its point-mass
# acceptance, the target mass of its code, E[p(x_r)]; a sampled draft is kept with its sampled acceptance,
# Σ_x min(p, q), flat p or sharp (a sum set by how close q is to p)
# ([glossary](../docs/glossary.md#speculative-decoding)). The table puts them side by side, per offset, for the reused
# heads and the deployed offsets: `sampled` is the sampled acceptance of one draft, `rank0`.. the point-mass acceptance
# of the rank-r draft (the chance it is the verified code), and `top_ranks_total` their sum over the tabulated ranks,
# the most that many point-mass children of one node could catch. Left panel: the same for the reused heads. Right
# panel: what the calibrations predict for whole trees, E(N) at every budget, for point-mass children (the paper's) and
# for sampled children drawn from q without replacement ([methods.md](../docs/methods.md#sampled-trees)), with the
# point-mass trees of N = 32 measured in section 5 (filled markers).

# %%
rank_shown = [r for r in tables["rank"] if r["drafter"] in ("heads", deployed)]
n_ranks = len([k for k in tables["rank"][0] if k.startswith("rank")])
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
OFFSET_LOOK = [dict(marker="o", ls="-"), dict(marker="s", ls="--"), dict(marker="^", ls=":")]  # offsets 1, 2, 3
for r in (r for r in tables["rank"] if r["drafter"] == "heads"):
    look = OFFSET_LOOK[(r["offset_t"] - 1) % len(OFFSET_LOOK)]
    ax0.plot(range(n_ranks), [r[f"rank{i}"] for i in range(n_ranks)], ms=4, mfc="none", lw=1.2,
             color=DECODER_COLORS["tree-point-mass"], label=f"offset {r['offset_t']}: rank-r draft, E[p(x_r)]", **look)
    ax0.axhline(r["sampled"], color=DECODER_COLORS["tree-sampled"], ls=look["ls"], lw=1.2,
                label=f"offset {r['offset_t']}: one sampled draft, Σ min(p, q)")
ax0.set_xticks(range(n_ranks))
ax0.set_xlabel("rank r of the drafted code in q (0: its most likely code)")
ax0.set_ylabel("probability the draft is kept")
ax0.set_ylim(0, 1)
ax0.legend(fontsize=6, ncol=2)
ax0.set_title("reused heads: one point-mass draft (orange) vs one sampled draft (green)", fontsize=9)
for lab, marker in (("heads", "o"), (deployed, "v")):
    for kind in ("point-mass", "sampled"):
        sub = sorted((r for r in predicted if r["drafter"] == lab and r["kind"] == kind), key=lambda r: r["nodes"])
        ax1.plot([r["nodes"] for r in sub], [r["predicted"] for r in sub], marker=marker, mfc="none", ms=5,
                 color=DECODER_COLORS[f"tree-{kind}"], ls="-" if lab == "heads" else ":",
                 label=f"{lab}: {kind} tree, predicted")
    meas = next(r for r in own_rows if r["drafter"] == lab and r["nodes"] == PAPER_BUDGET)
    ax1.plot([PAPER_BUDGET], [meas["tokens_per_call"]], marker=marker, ms=8, ls="none",
             color=DECODER_COLORS["tree-point-mass"], label=f"{meas['decoder']}, measured")
budgets_drawn = sorted({r["nodes"] for r in predicted})
ax1.set_xscale("log", base=2)
ax1.set_xticks(budgets_drawn, [str(b) for b in budgets_drawn])
ax1.minorticks_off()
ax1.axhline(1.0, color=DECODER_COLORS["ar"], lw=0.8, ls="--")
ax1.set_xlabel("node budget N (query positions of one verify call)")
ax1.set_ylabel("tokens per call")
ax1.legend(fontsize=6)
ax1.set_title("whole trees: calibrated E(N), point-mass vs sampled children", fontsize=9)
for ax in (ax0, ax1):
    ax.grid(alpha=0.3)
fig.suptitle(f"Top-ranked against sampled drafts on {run_model} ({len(eval_frames)} evaluation frames, "
             f"{len(cal_frames)} calibration frames, {sampling_words(sampling)})", fontsize=10)
save_figure(fig, out / "03_point_mass_vs_sampled", prov)
plt.show()
pd.DataFrame(rank_shown)

# %% [markdown]
# ## 9. A chain of sampled drafts across windows
#
# **Question:** how far can plain sampled drafts go? NVIDIA's TensorRT-Edge-LLM ships a training-free chain
# (`--cpSpecVerifySize N`): N - 1 drafts **sampled** from the reused heads, verified in one call of N positions
# ([methods.md](../docs/methods.md#chain-with-sampled-drafts)); its documentation says acceptance stops improving past
# about four depths. **How:** tokens per call against the window, for every drafter (solid: measured; dotted:
# predicted from the exact tables), and the smallest window within 2% of the best
# (`paper.drafter_table.chain_window_rows`). Tokens per call is not the speedup: a wider verify call costs
# more (notebook 01's verify cost curve, notebook 04's timings).

# %%
chain_rows, saturation = T.chain_window_rows(results)
save_table(chain_rows, out / "03_chain_windows", prov)
fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
for lab in drafters:
    sub = [r for r in chain_rows if r["drafter"] == lab]
    st = drafter_style(lab)
    ax.plot([r["window"] for r in sub], [r["tokens_per_call"] for r in sub], ms=5, mfc="none",
            label=f"{lab} (saturates at window {saturation[lab]})", **st)
    ax.plot([r["window"] for r in sub], [r["predicted"] for r in sub], color=st["color"], ls=":", lw=0.8)
ax.set_xticks(sorted({r["window"] for r in chain_rows}))
ax.set_xlabel("chain window N (the committed code + N - 1 sampled drafts)")
ax.set_ylabel("tokens per code-predictor call")
ax.set_title(f"Chain with sampled drafts ({run_model}, {len(eval_frames)} evaluation frames; dotted: predicted)",
             fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
save_figure(fig, out / "03_chain_windows", prov)
plt.show()
widest = max(r["window"] for r in chain_rows)
at_widest = [lab for lab, w in saturation.items() if w == widest]
display(Markdown("Saturation window (within 2% of the best window): " + ", ".join(
    f"{lab} {w}" for lab, w in saturation.items()) + "."
    + (f" {'Every drafter' if len(at_widest) == len(saturation) else ', '.join(at_widest)} saturates only at "
       f"window {widest}, the widest tried: no smaller window comes within 2% of it, so on these frames "
       f"{'their' if len(at_widest) > 1 else 'its'} acceptance shows no saturation up to {widest} (a wider window "
       "might still gain)." if at_widest else "")))

# %% [markdown]
# ## 10. When point-mass trees beat sampled children: a synthetic code predictor
#
# Sections 5 to 8 measure the embedded model: how its point-mass trees fare against sampled drafts and what its
# offsets add. To see how that outcome depends on how peaked p is, and where the paper's reported figure would sit,
# this section builds a code predictor
# whose structure is set by two numbers (`paper.regime.SyntheticPredictor`, no download, seconds to run) and runs it
# through the library's own decode loop, accept rule and tree calibration:
#
# * **peak**, the swept quantity: a frame draws evidence x_d ~ N(0, I) over its V = 16 codes for every depth d, and
#   the target is p_d = softmax(peak · x_d) (`peak = 0`: uniform p; the larger the peak, the more of p its top code
#   carries: the sweep's table says how much).
# * **drift**: the reused head of depth s + t, applied to `H_s`, adds a fixed logit vector t · drift · g (g ~ N(0, I),
#   the same in every frame): the shift the offsets exist to correct. Here b_t = t along the state's position
#   coordinate removes it exactly (`exact_offsets`; `regime_rows(offsets="trained")` trains them instead with the
#   library's `train_drafter` on the TV loss, tens of seconds a peak: compare its curve with the exact one).
# * **foresight** `0.5`: `H_s` holds code s + t's evidence at weight `0.5^t`, so a draft is flatter than p (it knows
#   less), as drafts made from an earlier state are.
#
# Each drafter gets its own calibrated point-mass and sampled tree of N = 32 (`rvqspec_lib.eval.calibration
# .calibrate`), decoded by `decode_frame` on held-out frames. The sweep is written to `03_regime.csv`.

# %%
from paper import regime as RG

regime_peaks = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)  # the swept peak of p
regime_drift = 1.0  # the reused heads' shift per offset (0: offsets and heads draft alike)
regime_frames = (256, 256)  # calibration and evaluation frames per peak
if smoke:
    regime_peaks, regime_frames = (0.0, 16.0), (48, 48)
t0 = time.perf_counter()
regime = RG.regime_rows(regime_peaks, drift=regime_drift, nodes=PAPER_BUDGET, n_calibration=regime_frames[0],
                        n_eval=regime_frames[1], seed=seed)
timings["regime_s"] = time.perf_counter() - t0
save_table(regime, out / "03_regime", prov)
# where this run's model sits: its deployed offsets' tree measured above, and its own p's mean top probability (the
# peak's meaning)
from rvqspec_lib.data.frame_sources import frames_from_contexts
from rvqspec_lib.data.teacher import teacher_forced_hidden, verifier_logits

# max p at depths 2..15 (where an offset-1 draft lands), on the evaluation contexts with codes sampled from p: the
# same states section 8's rank0 at offset 1 averages p(q's top code) over, so rank0 can be at most this (up to which
# codes were sampled)
p_top_frames = frames_from_contexts(cp, eval_frames.context, sampling=sampling, seed=seed)
with torch.no_grad():
    emb_p_top = float(sampling.probs(verifier_logits(cp, teacher_forced_hidden(
        cp, p_top_frames.context, p_top_frames.codes)))[:, 1:].amax(-1).mean())
    # the same two quantities on the calibration frames (codes: p's own samples), the kind of frames notebook 04 uses
    cal_p_top = float(sampling.probs(verifier_logits(cp, teacher_forced_hidden(
        cp, cal_frames.context, cal_frames.codes)))[:, 1:].amax(-1).mean())
emb_rank0 = next(r["rank0"] for r in tables["rank"] if r["drafter"] == "heads" and r["offset_t"] == 1)
cal_rank0 = float(calibrations["heads"]["point-mass"]["table"][0][0]) if "heads" in calibrations else None
emb_tpc = float(pap["tree_N32_tokens_per_call"])
marks = {f"{run_model}: {pap['decoder']} measured above ({emb_tpc:.2f})": emb_tpc,
         f"the paper's reported figure, quoted ({RG.PAPER_TOKENS_PER_CALL:.2f})": RG.PAPER_TOKENS_PER_CALL}
fig = RG.plot_regime(regime, marks=marks, title=f"Synthetic code predictor (V = 16, 15 codes, drift {regime_drift:g}"
                     f", foresight 0.5), trees of N = {PAPER_BUDGET}, {regime_frames[1]} frames a point")
save_figure(fig, out / "03_regime", prov)
plt.show()
rg = {(r["peak"], r["drafter"], r["tree"]): r for r in regime}
top = max(regime_peaks)
low = min(r["tokens_per_call"] for r in regime if r["drafter"] == "offsets" and r["tree"] == "point-mass")
at_emb, at_paper = (RG.where_on_curve(regime, v) for v in (emb_tpc, RG.PAPER_TOKENS_PER_CALL))
peaks_sorted = sorted(regime_peaks)
# per drafter and swept peak: which tree commits more, a tie where the two differ by at most twice the standard
# error of their difference; the crossover: the smallest peak from which point-mass is ahead at every larger one
verdicts = {d: RG.tree_verdicts(regime, d) for d in ("heads", "offsets")}
pm_wins = {pk: v == "point-mass" for pk, v in verdicts["offsets"].items()}
cross = RG.point_mass_from(verdicts["offsets"])


def crossover_words(drafter: str) -> str:
    """Where ``drafter``'s point-mass tree is ahead of its sampled one on the sweep, with the ties named."""
    v, start = verdicts[drafter], RG.point_mass_from(verdicts[drafter])
    ties = [pk for pk in peaks_sorted if v[pk] == "tie"]
    words = (f"from peak {start:g} on" if start is not None else "at no peak up to the largest")
    return words + "".join(
        f" (a tie at {pk:g}: {rg[(pk, drafter, 'point-mass')]['tokens_per_call']:.2f} against "
        f"{rg[(pk, drafter, 'sampled')]['tokens_per_call']:.2f})" for pk in ties)
curve = lambda tree: [rg[(pk, "offsets", tree)]["tokens_per_call"] for pk in peaks_sorted]  # noqa: E731


def where(peak, v):
    """Where the value v sits on the offsets' point-mass curve, with the swept peaks it is interpolated between."""
    if peak is None:
        return "below the curve's flattest point" if v < low else "above the curve's most peaked point"
    lo = max((pk for pk in peaks_sorted if pk <= peak), default=peaks_sorted[0])
    hi = min((pk for pk in peaks_sorted if pk >= peak), default=peaks_sorted[-1])
    return (f"at peak {peak:g}" if lo == hi else
            f"at peak ≈ {peak:.1f} (a straight line between the swept peaks {lo:g} and {hi:g})")


if at_paper is not None:  # both trees at the peak where the quoted figure sits (interpolated between swept peaks)
    paper_pm, paper_sampled = (float(np.interp(at_paper, peaks_sorted, curve(tree))) for tree in ("point-mass",
                                                                                                   "sampled"))
    paper_words = (
        f" At that peak the offsets' sampled tree commits {paper_sampled:.2f} (interpolated between the swept peaks), "
        + (f"more than the point-mass tree's {paper_pm:.2f}: on this curve, the paper's figure sits where sampled "
           f"children still win, so that figure alone does not place a model where point-mass trees are the better "
           f"choice." if paper_sampled > paper_pm else
           f"less than the point-mass tree's {paper_pm:.2f}: on this curve, the paper's figure sits where point-mass "
           f"trees win."))
else:
    paper_words = " The paper's figure lies off this curve, so the sweep says nothing about which tree wins there."
display(Markdown(
    f"At the most peaked setting (peak {top:g}, p's top-code mass "
    f"{rg[(top, 'offsets', 'point-mass')]['p_top']:.2f}), the offsets' point-mass tree commits "
    f"{rg[(top, 'offsets', 'point-mass')]['tokens_per_call']:.2f} tokens per call against the heads' "
    f"{rg[(top, 'heads', 'point-mass')]['tokens_per_call']:.2f}, and "
    f"{rg[(top, 'offsets', 'sampled')]['tokens_per_call']:.2f} with sampled children; at uniform p (peak "
    f"{min(regime_peaks):g}) sampled children give {rg[(min(regime_peaks), 'offsets', 'sampled')]['tokens_per_call']:.2f}"
    f" and the point-mass tree {rg[(min(regime_peaks), 'offsets', 'point-mass')]['tokens_per_call']:.2f}. "
    + "Read with a tie rule (two trees within twice the standard error of their difference commit the same): "
    + (f"the offsets' point-mass tree beats sampled children from peak {cross:g} on (there "
       f"{rg[(cross, 'offsets', 'point-mass')]['tokens_per_call']:.2f} against "
       f"{rg[(cross, 'offsets', 'sampled')]['tokens_per_call']:.2f} tokens per call)"
       + ("".join(
           f"; below it, at the swept peak{'s' if len(g) > 1 else ''} {', '.join(f'{pk:g}' for pk in g)}, {who_wins}"
           for g, who_wins in (([pk for pk in peaks_sorted if pk < cross and verdicts["offsets"][pk] == "sampled"],
                                "sampled children commit more"),
                               ([pk for pk in peaks_sorted if pk < cross and verdicts["offsets"][pk] == "tie"],
                                "the two trees tie"),
                               ([pk for pk in peaks_sorted if pk < cross and pm_wins[pk]],
                                "the point-mass tree is ahead, but not at every larger peak")) if g) + ".")
       if cross is not None else
       "on this sweep the offsets' point-mass tree does not stay ahead of sampled children up to the largest peak.")
    + f" The reused heads' point-mass tree is ahead of their sampled children {crossover_words('heads')}."
    + f" On the offsets' point-mass curve, the paper's reported {RG.PAPER_TOKENS_PER_CALL:.2f} (quoted, "
    f"Qwen3-TTS-0.6B) sits {where(at_paper, RG.PAPER_TOKENS_PER_CALL)}." + paper_words
    + f" This run's {pap['decoder']} ({emb_tpc:.2f} tokens per call) sits {where(at_emb, emb_tpc)}. "
    f"**Two top-code masses.** p's top-code mass is max_x p(x), the probability of p's own most likely code (the "
    f"`p_top` column); the `rank0` column of section 8 is another quantity, p's mass on q's top code, the chance a "
    f"rank-0 point-mass draft is kept. On the {len(eval_frames)} evaluation frames' contexts, codes sampled from p, "
    f"{run_model}'s p has a top-code mass of {emb_p_top:.3f} on average at depths 2..{n_codes} (over a "
    f"codebook of {int(cp.config.vocab_size)} codes, after the deployed warpers), against "
    f"{rg[(min(regime_peaks), 'offsets', 'point-mass')]['p_top']:.2f} for the synthetic uniform p over 16 codes (not "
    f"one scale: the codebook sizes differ). On those contexts the reused heads' `rank0` at offset 1 (same depths, "
    f"the decoders' own samples of the codes) is {emb_rank0:.3f}"
    + (", below it, as p's mass on q's top code must be: no code holds more than p's top code. "
       if emb_rank0 <= emb_p_top else ", above it only because the two are averaged over different samples of the "
       "codes: on one state no code holds more than p's top code. ")
    + (f"Both depend on the frames: on this notebook's {len(cal_frames)} calibration frames (codes sampled from "
       f"p, the kind of frames notebook 04 calibrates on) p's top-code mass is {cal_p_top:.3f} and the reused "
       f"heads' `rank0` at offset 1 is {cal_rank0:.3f}, against {emb_p_top:.3f} and {emb_rank0:.3f} on the "
       f"evaluation frames. " if cal_rank0 is not None else "")
    + "Notebook 04 reports the same `rank0` quantity (offset 1, reused heads, deployed warpers) over its own "
      "calibration frames (their own count), so its value is close to this notebook's calibration-frame "
      "value only as far as those frames resemble these; how sharp p is varies from utterance to utterance, so a "
      "few frames of few utterances can put the mean well away from another set's."))
display(Markdown("Columns: `tokens_per_call` is measured on the synthetic predictor's frames (codes over calls), "
                 "`se` the standard error of the per-frame mean, `predicted_tokens_per_call` the E(N) the tree's "
                 "calibration predicts for it."))
pd.DataFrame(regime)[["peak", "p_top", "drafter", "tree", "tokens_per_call", "se", "predicted_tokens_per_call"]]

# %% [markdown]
# ## 11. What this notebook showed, and why

# %%
timings["total_s"] = time.perf_counter() - t_start
metrics = {
    "model": model, "run_model": run_model, "random_weights": lm.is_random, "model_info": info,
    "params_model_total": params_model, "sampling": sampling.describe(),
    "n_train_frames": len(train_frames), "n_val_frames": len(val_frames), "n_eval_frames": len(eval_frames),
    "n_eval_utterances": int(torch.unique(eval_frames.utterance).numel()), "calibration_frames": len(cal_frames),
    "tokens_per_call": {lab: r["tokens_per_call"] for lab, r in results.items()},
    "predicted_tokens_per_call": {lab: r["predicted_tokens_per_call"] for lab, r in results.items()},
    "params_added": {lab: r["params_added"] for lab, r in results.items()},
    "own_trees": own_rows,
    "deployed_decoder": next(r for r in own_rows if r["drafter"] == deployed and r["nodes"] == PAPER_BUDGET),
    "acceptance_by_offset": {lab: r["exact"]["alpha_by_offset"] for lab, r in results.items()},
    "saturation_window": saturation,
    "margin_vs_heads": {r["drafter"]: {k: v for k, v in r.items() if k != "drafter"} for r in margin},
    "headroom": headroom,
    "training": {lab: {"best_epoch": res.best_epoch, "epochs_run": res.curve[-1]["epoch"],
                       "stopped_early": res.stopped_early, "loss": res.drafter.provenance["loss"],
                       "lr": res.drafter.provenance["lr"],
                       "val_acceptance_by_offset_init": res.curve[0]["val_acceptance_by_offset"],
                       "val_acceptance_by_offset_best": res.curve[res.best_epoch]["val_acceptance_by_offset"]}
                 for lab, res in run.results.items()},
    "deployed_offsets": deployed,
    "shipped_offsets": None if shipped is None else {k: shipped.get(k) for k in (
        "loss", "lr", "n_train_frames", "best_epoch", "epochs_run", "val_acceptance_at_init",
        "val_acceptance_by_offset")},
    "drafter_files": {k: str(v) for k, v in files.items()},
    "paper_reported_toks_per_step": T.PAPER_TOKS_PER_STEP,
    "paper_source": T.PAPER_SOURCE,
    "timings_s": timings,
}
# what a reader most wants from this notebook (docs/results.md, generated): Table 2 on this model, the paper's
# decoder (the deployed offsets' own point-mass tree) against the reused heads
who = lm.name + (" (RANDOM weights)" if lm.is_random else " (small trained model)" if lm.name == "embedded" else "")
who += f", {len(eval_frames)} evaluation frames"
gain = m_by.get(deployed)
metrics["headline"] = headline(
    entry(f"tokens per code-predictor call of the paper's method trained in this run (this run's offsets {deployed} "
          f"with their own point-mass tree of N = {PAPER_BUDGET}, {pap['decoder']}; `--decoder paper` uses the offsets "
          f"shipped beside the model), {who}", pap["tree_N32_tokens_per_call"],
          "", "03_table2.md", glance=True),
    entry(f"tokens per call of the reused heads with their own point-mass tree of N = {PAPER_BUDGET}, {who}",
          hd["tree_N32_tokens_per_call"], "", "03_table2.md"),
    entry(f"parameters the trained offsets {deployed} add to the code predictor", pap["added_params"], "",
          "03_table2.md"),
    entry(f"acceptance of one sampled draft, the offsets {deployed} minus the reused heads (mean over every start "
          f"depth and offset, paired over evaluation utterances)", gain["difference"] if gain else None, "",
          "03_margin.md"),
    entry("the same difference's 95% interval, low end (above 0: the gain is real)",
          gain["ci95_low"] if gain else None, "", "03_margin.md"),
)
save_json(metrics, out / "03_metrics.json", prov)

# the sentences below are written from the results above; every claim is conditional on what they say
heads_rank = {r["offset_t"]: r for r in tables["rank"] if r["drafter"] == "heads"}
top1 = [heads_rank[j]["rank0"] for j in sorted(heads_rank)]
samp = [heads_rank[j]["sampled"] for j in sorted(heads_rank)]
chain_beats_tree = pap["chain_best"] > pap["tree_N32_tokens_per_call"]  # the deployed drafter: the paper's tree
hr_rows = {r["offset_t"]: r for r in headroom_table}
capt = {lab: [hr_rows[j].get(f"{lab}_captured") for j in sorted(hr_rows)] for lab in drafters if lab != "heads"}
best_capt = max(capt, key=lambda lab: np.nanmean(np.array(capt[lab], dtype=float)))
off_capt = max((lab for lab in capt if T.drafter_family(lab) == "offsets"),
               key=lambda lab: np.nanmean(np.array(capt[lab], dtype=float)))
pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
mean_capt = lambda lab: float(np.nanmean(np.array(capt[lab], dtype=float)))  # noqa: E731
offsets_small = mean_capt(off_capt) < 0.5  # less than half of the achievable gain
tv_best = best_off["drafter"] == "offsets-tv"
lines = [
    "**Measured here** (the embedded model; every number from the tables above):",
    f"* **Point-mass vs sampled drafts.** The point-mass acceptance of the reused heads' most likely draft (the "
    f"chance it is the verified code) is {', '.join(f'{v:.3f}' for v in top1)} at offsets 1..{K} (`rank0`), while "
    f"the sampled acceptance of one sampled draft is {', '.join(f'{v:.3f}' for v in samp)}. Each drafter's own "
    f"point-mass tree of N = {PAPER_BUDGET} commits "
    f"{min(r['tree_N32_tokens_per_call'] for r in table2):.3f} to "
    f"{max(r['tree_N32_tokens_per_call'] for r in table2):.3f} tokens per call, the best chain of sampled drafts "
    f"{min(r['chain_best'] for r in table2):.3f} to {max(r['chain_best'] for r in table2):.3f}, and the calibrations "
    f"predict {min(r['sampled_tree_N32_predicted'] for r in table2):.3f} to "
    f"{max(r['sampled_tree_N32_predicted'] for r in table2):.3f} for trees of N = {PAPER_BUDGET} with sampled "
    f"children"
    + (f": on this model the point-mass tree of the paper's recipe (this run's {deployed}) loses to sampled "
       "drafts." if chain_beats_tree else
       ": on this model the point-mass tree is not beaten by the chain."),
    f"* **The offsets capture {'little' if offsets_small else 'much'} of the room.** The best offsets loss on the "
    f"evaluation frames, {best_off['drafter']}, changes the sampled acceptance by "
    f"{best_off['difference']:+.4f} [95% CI {best_off['ci95_low']:+.4f}, {best_off['ci95_high']:+.4f}] with "
    f"{t2[best_off['drafter']]['added_params']:,} parameters; at N = {PAPER_BUDGET} its own tree commits "
    f"{t2[best_off['drafter']]['tree_N32_tokens_per_call']:.3f} against the heads' "
    f"{hd['tree_N32_tokens_per_call']:.3f}. Of the gain a drafter from `H_s` could achieve (the marginal), the "
    f"best offsets ({off_capt}) capture {', '.join(pct(v) for v in capt[off_capt])} by offset; the drafter that "
    f"captures most is {best_capt} ({', '.join(pct(v) for v in capt[best_capt])}, "
    f"{t2[best_capt]['added_params']:,} parameters).",
    f"* **The loss.** Deployed by validation acceptance in this run: {deployed}; on the evaluation frames the "
    f"largest offsets gain came from {best_off['drafter']}"
    + (", the loss that is one minus the acceptance itself." if tv_best else ".")
    + (f" The offsets shipped beside the model were trained with {LOSS_WORDS.get(shipped['loss'], shipped['loss'])}."
       if shipped else ""),
    "",
    "**Why.** "
    + ("A point-mass child is worth the target mass of one code: when p is flat, as the `rank0` column shows here, "
       "no single code carries much, so even a tree of many top-ranked children catches little, while a sampled "
       "draft from an equally flat q matches p in distribution and is kept most of the time. "
       if chain_beats_tree else
       "A point-mass child is worth the target mass of one code, so top-ranked drafts pay when p is peaked. ")
    + "The offsets drafter adds the same offset vector b_t to `H_s` at every start depth and in every state: it can "
      "undo a mismatch that is a shared shift, not a correction that depends on the state. "
    + (f"That the offsets capture little of the room here while {best_capt}, with a head per (start depth, offset) "
       "that sees the whole state, captures several times as much, says this model's mismatch is mostly "
       "state-dependent. " if offsets_small and mean_capt(best_capt) >= max(0.3, 2 * mean_capt(off_capt)) else "")
    + "The losses pull q towards different targets: CE towards the codes of the data, which the model's warped p "
      "only approximates; KL towards that warped p; TV rewards exactly the acceptance a sampled draft pays out. "
      "Which one serves decoding best is an empirical question on each model, which is why the notebook trains all "
      "three and lets the validation split choose.",
    "",
    f"**On the released checkpoint.** *The paper's values* (Qwen3-TTS-0.6B, point-mass tree of N = 32): reused "
    f"heads {T.PAPER_TOKS_PER_STEP['heads']:.2f}, Medusa heads {T.PAPER_TOKS_PER_STEP['medusa']:.2f}, offsets "
    f"{T.PAPER_TOKS_PER_STEP['offsets-ce']:.2f} tokens per call. *Inference, not measured here:* over whole frames "
    f"the paper's offsets tree commits {T.PAPER_TOKS_PER_STEP['offsets-ce']:.2f} codes per call, this run's "
    f"{pap['tree_N32_tokens_per_call']:.2f} (both tokens per call over whole frames, the frame's end included). "
    f"Within one call a point-mass tree commits 1 plus the sum of its nodes' path masses (less where the frame "
    f"ends), so the larger figure needs larger path masses"
    + (": the released model's top-ranked drafts carry more of p than this model's do. "
       if T.PAPER_TOKS_PER_STEP["offsets-ce"] > pap["tree_N32_tokens_per_call"] else ". ")
    + "Whether sampled children would commit even more there, the paper's figure does not say: "
    + (f"on section 10's synthetic curve it sits {where(at_paper, RG.PAPER_TOKENS_PER_CALL)}, where sampled "
       "children commit "
       + ("more than the point-mass tree" if paper_sampled > paper_pm else "less than the point-mass tree")
       + f"{', and' if paper_sampled > paper_pm else ';'} of the swept peaks "
         f"({', '.join(f'{pk:g}' for pk in peaks_sorted)}), beyond twice the standard error of the difference, the "
         f"offsets' point-mass tree is ahead of sampled children {crossover_words('offsets')}, the reused heads' "
         f"{crossover_words('heads')}"
       + ". " if at_paper is not None else "it lies off section 10's synthetic curve. ")
    + f"Its step from {T.PAPER_TOKS_PER_STEP['heads']:.2f} to {T.PAPER_TOKS_PER_STEP['offsets-ce']:.2f} suggests "
      "that much of the released model's mismatch is a shared shift that one offset vector per offset t can undo. "
    + ("On the embedded model p is flat and the offsets capture little of the room (the measured bullets above), "
       "so its small offsets gain says nothing against the paper's. " if chain_beats_tree and offsets_small else "")
    + "To measure them on a checkpoint, run this notebook with `model=<checkpoint> dataset=<saved dataset> "
      "codec=<its speech tokenizer>`: the same tables, headroom included.",
]
display(Markdown("\n".join(lines)))
print(f"deployed offsets: {deployed}; saturation windows: "
      + ", ".join(f"{lab} {w}" for lab, w in saturation.items())
      + f"; total {timings['total_s']:.0f} s (training {timings['training_s']:.0f} s); every number in "
      f"{out / '03_metrics.json'}")

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **In section 10, `regime_drift = 0.0`**: the reused heads no longer drift, and the `heads` and `offsets` curves
#   fall on each other (the exact offsets, the b_t that remove the drift analytically, then change nothing the heads
#   read); the point-mass against sampled gap stays, since that one is about how peaked p is.
# * **In section 10, `regime_peaks = (0.0, 32.0, 64.0)`**: push p further; look at whether the point-mass trees keep
#   their lead over sampled children as p approaches a point mass (a sampled draft from a peaked q becomes the top
#   code too).
# * **`offsets_lrs = (1e-1,)`**: a large rate for the offsets; look at whether the first epoch overshoots and early
#   stopping keeps epoch 0, the reused heads, as section 2 warns.
