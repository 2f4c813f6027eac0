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
# # 00 — The data behind the embedded model: corpus and codec
#
# No Qwen3-TTS weights and none of the paper's data sets (VoxPopuli, LibriSpeech, Fleurs) can be downloaded where
# this project is built. So the later notebooks measure speculative decoding on the **embedded model**: a small
# Qwen3-TTS-class model (the official model classes, fewer and narrower layers) trained here, from scratch, on speech
# rendered offline by the flite voices, and encoded by an offline codec with the real tokenizer's interface
# (24 kHz audio, 12.5 frames a second, **16 codebooks × 2048 entries** per frame). This notebook shows both inputs:
#
# 1. **the corpus**, as an analogue of the paper's Table 1 (which split is used for what, how much audio);
# 2. **the codec** (`rvqspec_lib.models.rvq_codec.RVQCodec`), what its residual codebooks carry, and how intelligible its
#    output is when only the first `k` of the 16 codebooks are used.
#
# All numbers are read from files or measured when the notebook runs; none is typed in.

# %% tags=["parameters"]
model = "embedded"  # the shipped model (data/embedded); or a build folder such as build/embedded-smoke
seed = 0  # seeds the choice of evaluation sentences (and nothing else: the codec decodes deterministically)
smoke = False  # True: 3 short sentences, codebooks (1, 16), 3 calibration and 1 multilingual sentence per language
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
n_sentences = 12  # held-out evaluation sentences for the codec measurements (section 3)
codebooks = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)  # k: decode with the first k codebooks
voices = ("slt", "kal16", "awb", "rms")  # flite English voices, used in turn
n_calibration = 0  # calibration sentences rendered for the table; 0: all shipped ones
n_multilingual = 0  # multilingual sentences per language rendered for the table; 0: all shipped ones
work_dir = ""  # where rendered audio goes; "": build/00_corpus (smoke: <out_dir>/00_work). Reruns reuse it.
asr = "auto"  # English recogniser: auto = whisper-tiny.en (Whisper offline); pocketsphinx, whisper:PATH, parakeet:PATH

# %%
import json
import random
import time
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from rvqspec_lib.eval import asr as asr_mod
from rvqspec_lib.eval.asr_models import check_asr_name, recogniser as make_recogniser
from rvqspec_lib.embedded import corpus
from rvqspec_lib.models.rvq_codec import RVQCodec
from rvqspec_lib.models.audio import load_wav
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.eval.inner_loop import score_conditions
from rvqspec_lib.common.provenance import REPO_ROOT, provenance, resolve_out_dir, save_figure, save_json, save_table

t_start = time.perf_counter()
check_asr_name(asr)  # a bad recogniser name or model folder: one line, before any work
if asr == "none":
    raise ValueError("this notebook measures WER and CER: choose a recogniser (asr = \"auto\")")
if threads:
    torch.set_num_threads(int(threads))
run_codebooks = tuple(int(k) for k in ((1, 16) if smoke else codebooks))
run_n_sentences = min(int(n_sentences), 3) if smoke else int(n_sentences)
run_n_calibration = 3 if smoke else int(n_calibration)
run_n_multilingual = 1 if smoke else int(n_multilingual)
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
work = resolve_out_dir(work_dir or (out / "00_work" if smoke else "build/00_corpus"), smoke=smoke)
try:
    root = embedded_root(model).resolve()
except FileNotFoundError:
    p_model = Path(str(model)).expanduser()
    if p_model.exists() and not (p_model / "config.json").is_file():
        raise  # a folder that is neither an embedded-model build nor a checkpoint: say so
    # a checkpoint folder (make paper MODEL=/path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice), a hub id or a timing model
    # (MODEL=qwen3-tts-1.7b-random): it ships no corpus and no offline codec, so the embedded model's are shown
    display(Markdown(f"**`{model}` is not an embedded-model build (it ships no corpus and no offline codec): this "
                     "notebook shows the shipped embedded model's corpus and codec (data/embedded).**"))
    root = embedded_root("embedded").resolve()
root_name = str(root.relative_to(REPO_ROOT)) if root.is_relative_to(REPO_ROOT) else str(root)
params = dict(model=str(model), root=root_name, seed=seed, smoke=bool(smoke), out_dir=str(out), work_dir=str(work),
              threads=torch.get_num_threads(), n_sentences=run_n_sentences, codebooks=list(run_codebooks),
              voices=list(voices), n_calibration=run_n_calibration, n_multilingual=run_n_multilingual,
              asr=str(asr), notebook="00_corpus_and_codec")
print(f"model data {root}\noutputs -> {out}\nrendered audio -> {work}")

# %% [markdown]
# ## 1. The corpus: a Table 1 analogue
#
# **Text.** Every English sentence comes from text that installs with Debian or Python packages, and every sentence
# records the file it came from (`rvqspec_lib.embedded.corpus.Sentence.origin`):
#
# * `fortunes`: Debian's `fortunes` and `fortunes-min` packages (fetched with `apt-get download`, unpacked, not
#   installed; ASCII art and stereotype-based joke files are left out);
# * `stdlib`: docstrings of the Python standard library (parsed, never imported);
# * `doc`: plain-text package documentation under `/usr/share/doc`.
#
# Sentences are filtered to speakable English (4-15 words, no acronyms or identifiers that a synthesiser would spell
# out) and deduplicated. **Splits** are a pure function of a hash of the normalised text, so a sentence can never be
# in two splits, whatever else was gathered. The calibration and evaluation sentences ship in `data/eval_texts/` so
# that every machine uses the same ones; the multilingual set (German, Spanish, Russian, Japanese, Mandarin) was
# written for this project and, as Fleurs in the paper, is evaluation only.
#
# **Audio.** The build (`scripts/build_embedded.py`) rendered each training, validation and evaluation sentence
# with one of the flite voices at 24 kHz; those rows are read from the build's record `eval.json`. The calibration
# split and the multilingual set are not used by the build; they are rendered here (flite for English, espeak-ng
# for the other languages), so their hours and frames are measured too. A frame is one 80 ms codec frame (12.5 Hz);
# each frame carries 16 codes.

# %%
eval_path = root / "eval.json"
if not eval_path.is_file():
    raise FileNotFoundError(f"no {eval_path}: the build's record is written by scripts/build_embedded.py stage "
                            f"'eval' (make embedded, or --out {root})")
build = json.loads(eval_path.read_text())
build_prov = build.get("provenance", {})

calibration = corpus.shipped_sentences("calibration", language="en")
if run_n_calibration:
    calibration = random.Random(seed).sample(calibration, min(run_n_calibration, len(calibration)))
multilingual = corpus.multilingual_sentences()
if run_n_multilingual:
    multilingual = [s for lang in sorted({s.language for s in multilingual})
                    for s in [m for m in multilingual if m.language == lang][:run_n_multilingual]]
ml_voices = [v for v in corpus.DEFAULT_VOICES if corpus.VOICES[v].language != "en"]
rows_cal = corpus.render_corpus(calibration, work / "calibration", voices=voices, one_voice_each=True)
rows_ml = corpus.render_corpus(multilingual, work / "multilingual", voices=ml_voices)


def table_rows(summary, measured_by):
    return [{"split": r["split"], "role": corpus.SPLIT_ROLES.get(r["split"], ""), "language": r["language"],
             "voices": r["voices"], "samples": r["samples"], "hours": r["hours"], "frames": r["frames"],
             "text sources": r.get("sources", ""), "measured by": measured_by} for r in summary]


order = {s: i for i, s in enumerate(corpus.SPLITS)}
table = table_rows(build["corpus"]["table"], f"build ({eval_path.name})") + \
    table_rows(corpus.corpus_table(rows_cal + rows_ml), "rendered here")
table.sort(key=lambda r: (order.get(r["split"], 99), r["language"] != "en", r["language"]))
prov = provenance(params, seed=seed)
prov_table = {**prov, "sources": {
    "build rows": {"file": f"{root_name}/{eval_path.name}", "key": "corpus.table",
                   "written_utc": build_prov.get("created_utc"), "git": build_prov.get("git"),
                   "build_params": {k: build.get("params", {}).get(k) for k in
                                    ("scale", "n_train", "n_val", "n_eval", "sources", "voices")}},
    "rendered rows": {"folder": str(work), "calibration": "data/eval_texts/en_calibration.tsv",
                      "multilingual": "data/eval_texts/multilingual.tsv"}}}
save_table(table, out / "00_corpus", prov_table)
pd.DataFrame(table)

# %%
# the calibration split's size, read from the data that ships it (the same sentence in notebooks 00, 03 and 04)
from rvqspec_lib.data.utterances import shipped_split_sizes

try:
    split = shipped_split_sizes(root)["calibration"]
    display(Markdown(
        f"The table's calibration row counts every calibration sentence of `data/eval_texts/en_calibration.tsv` "
        f"rendered here ({len(rows_cal)} rendered). The calibration split that ships as codes beside the model "
        f"(`{split['file']}`), which notebooks 03 and 04 calibrate the trees on: **{split['utterances']} utterances, "
        f"{split['frames']} frames**."))
except (FileNotFoundError, KeyError) as e:
    print(f"no shipped calibration split beside {root}: {e}")

# %% [markdown]
# Where the text of each source comes from, and how the shipped calibration and evaluation sentences divide among
# the sources (counted from `data/eval_texts/`):

# %%
shipped = {split: corpus.shipped_sentences(split) for split in ("calibration", "evaluation")}
src_counts = pd.DataFrame({split: Counter(s.source for s in sents) for split, sents in shipped.items()}).fillna(0)
src_counts = src_counts.astype(int)
src_counts.insert(0, "from", [corpus.SOURCE_DESCRIPTIONS.get(s, "") for s in src_counts.index])
src_counts

# %% [markdown]
# ## 2. The codec: residual vector quantisation (RVQ)
#
# The real Qwen3-TTS 12 Hz tokenizer and this project's stand-in share one interface: every 80 ms of 24 kHz audio
# becomes one **frame vector**, and the vector becomes **16 codes**, one per codebook of 2048 entries. RVQ chooses
# them one stage after the other:
#
# 1. stage 1 picks the codebook-1 entry nearest to the vector (**code 0**);
# 2. stage 2 picks the codebook-2 entry nearest to what is left over (the *residual*), and so on, 16 times.
#
# The decoder adds the 16 chosen entries. Each stage corrects the error the earlier ones left, so the first code
# carries the coarse shape of the frame and the later ones finer and finer detail: decoding with only the first `k`
# codes gives a coarser version of the same audio.
#
# **Why code 0 matters.** In Qwen3-TTS the 28-layer *talker* emits code 0 of every frame, one frame at a time; a
# 5-layer *code predictor* then fills in codes 1..15 given code 0. What is said, and how, is decided when code 0 is
# chosen; the inner loop adds detail to a frame whose coarse content is fixed. That is why the inner loop is
# predictable enough to draft ahead (the paper's speculation, and this project's), and why its errors cost less
# intelligibility than errors in code 0. The real tokenizer makes code 0 special by construction: its quantiser
# (`SplitResidualVectorQuantizer` in the official `qwen_tts` code, as in Mimi) has one separate *semantic* codebook
# for code 0 and a 15-stage residual quantiser for the acoustic detail, and the decoder adds the two. The stand-in
# here is plain residual k-means, so its code 0 is simply the best single-entry approximation of the frame.
#
# **The stand-in.** `RVQCodec`: frame vectors are 4 stacked 20 ms log-mel frames (80 mel bands); 16 stages of
# k-means fitted on the build's training audio; decoding inverts the mel filter bank (non-negative least squares)
# and estimates the phase with Griffin-Lim. It is not a neural codec: its audio is buzzy, and its deep stages carry
# little structure.
#
# **Two decoders.** Adding the chosen entries (the *table* decoder) is the best a frame can do with its TRUE codes,
# but the codes the code predictor samples are plausible and wrong, and their entries add up to spectral noise. The
# build therefore also trains a small **neural code decoder** (`rvqspec_lib.code_decoder`, stage `decoder` of
# `make embedded`): each codebook's entry through its own linear map, four dilated convolutions over about a second
# of frames, and a correction added to a learned weighting of the entries, trained on both true codes and the model's
# own inner-loop codes (as vocoders are fine-tuned on an acoustic model's predictions). When the build shipped one
# (`codec.decoder.safetensors` beside the codec), `RVQCodec.load` attaches it and the codec decodes with it; the
# table decoder is measured beside it below. Its geometry, as loaded:

# %%
codec = RVQCodec.load(root / "codec.safetensors")  # with the neural code decoder when one ships beside it
table_codec = codec.with_decoder(None)  # the same codebooks, decoded by adding the chosen entries
cfg = codec.config
bits = np.log2(cfg.codebook_size)
geometry = {"sample_rate_hz": cfg.sample_rate, "frame_rate_hz": cfg.frame_rate_hz, "frame_samples": cfg.frame_samples,
            "n_codebooks": cfg.n_codebooks, "codebook_size": cfg.codebook_size, "frame_vector_dim": cfg.dim,
            "n_mels": cfg.n_mels, "mel_frames_per_frame": cfg.stack, "griffin_lim_iters": cfg.griffin_lim_iters,
            "bits_per_code": bits, "bitrate_bps": cfg.frame_rate_hz * cfg.n_codebooks * bits,
            "decoder": codec.decoder_kind,
            "decoder_params": codec.code_decoder.n_parameters() if codec.code_decoder is not None else 0}
run_codebooks = tuple(k for k in run_codebooks if 1 <= k <= cfg.n_codebooks)
if not run_codebooks:
    raise ValueError(f"none of codebooks={codebooks} lies in [1, {cfg.n_codebooks}] for this codec")
params["codebooks"] = list(run_codebooks)
pd.Series(geometry, name="value").to_frame()

# %% [markdown]
# ### Held-out sentences rendered now
# The sentences below come from the shipped **evaluation** split: neither the codec nor the model saw them. Each is
# rendered with one of the English voices in turn (a seeded choice of sentences), at 24 kHz.

# %%
pool = corpus.shipped_sentences("evaluation", language="en")
if smoke:  # the 20 shortest: the recogniser's time grows with the audio's length
    pool = sorted(pool, key=lambda s: (len(s.text), s.text))[:20]
picked = random.Random(seed).sample(pool, min(run_n_sentences, len(pool)))
eval_items = []  # (sentence, voice, wav path)
for i, s in enumerate(picked):
    v = voices[i % len(voices)]
    eval_items.append((s, v, work / "evaluation" / "wav" / v / f"{corpus.utterance_id(s, v)}.wav"))
# reuses files rendered by an earlier run with the same recipe (corpus.RENDER_RECIPE), else renders them again
corpus.render_files([(s.text, v, p) for s, v, p in eval_items], work / "evaluation", progress=True,
                    desc="render evaluation")
refs = [s.text for s, _, _ in eval_items]
pd.DataFrame([{"voice": v, "text": s.text, "source": s.source, "origin": s.origin} for s, v, _ in eval_items])

# %% [markdown]
# ### Spectrograms: original, inversion alone, and the codec with `k` codebooks
# The log-mel spectrogram of the first sentence as the synthesiser said it, after the decoder's mel inversion and
# Griffin-Lim of its *unquantised* features (what the vocoder alone costs), and after encoding and decoding with the
# first `k` codebooks. Each panel is computed from the output audio (what a listener or the ASR gets), on one shared
# colour scale; the number beside each panel is its log-spectral distance to the original (dB, mean over 20 ms
# frames of the RMS difference over mel bands).

# %%
s0, v0, p0 = eval_items[0]
wav0 = load_wav(p0, cfg.sample_rate)
sweep0 = codec.codebook_sweep(wav0, run_codebooks)
panels = [(r["condition"], codec.unstack(codec.features(r["audio"])) * 10 / np.log(10), r["audio_lsd_db"])
          for r in sweep0]
vmax = max(float(p.max()) for _, p, _ in panels)
vmin = vmax - 80.0
fig, axes = plt.subplots(len(panels), 1, figsize=(9.0, 1.45 * len(panels) + 0.6), sharex=True,
                         constrained_layout=True)
hop_s = cfg.hop_samples / cfg.sample_rate
for ax, (name, db, lsd) in zip(np.atleast_1d(axes), panels):
    im = ax.imshow(db, origin="lower", aspect="auto", cmap="magma", vmin=vmin, vmax=vmax,
                   extent=(0, db.shape[1] * hop_s, 0, db.shape[0]))
    label = {"original": "original", "unquantised": "inversion only"}.get(
        name, f"codec ({codec.decoder_kind} decoder), {name}")
    ax.set_ylabel("mel band", fontsize=8)
    ax.set_title(f"{label}" + ("" if name == "original" else f"   (log-spectral distance {lsd:.1f} dB)"),
                 fontsize=9, loc="left")
np.atleast_1d(axes)[-1].set_xlabel("time (s)")
fig.colorbar(im, ax=axes, label="mel power (dB)", shrink=0.8)
fig.suptitle(f"voice {v0}: \"{s0.text}\"\ncodec {cfg.n_codebooks} x {cfg.codebook_size} from {root_name}",
             fontsize=9)
save_figure(fig, out / "00_spectrograms", prov)
plt.show()

# %% [markdown]
# ## 3. What each codebook adds: distance and word error rate
# For every held-out sentence, these conditions: the **original** rendering; the **inversion only** of its
# unquantised features (the ceiling of any `k`); and the codec with the first **`k`** codebooks, for each `k`.
# Two measures:
#
# * **log-spectral distance** to the original: of the decoder's input (`feature_lsd_db`, quantisation error alone)
#   and of the features of the output audio (`audio_lsd_db`, quantisation plus inversion);
# * **WER and CER** from PocketSphinx with its **default** general-English language model (open vocabulary; it does
#   not know the texts), so WER on the original audio is not 0: it is the recogniser's own floor on this synthetic
#   speech, the reference line for the others. Repetition outliers are counted in `wer` and left out in
#   `wer_without_outliers`.
#
# The difference between the `k` = 16 line and the inversion-only line is what quantisation costs; the difference
# between inversion only and the original is what the Griffin-Lim vocoder costs. Bits per second: `k` codes of
# log2(codebook size) bits, 12.5 times a second. With a neural code decoder, the `k` rows use it (codebooks past `k`
# marked absent, as in its training) and the `table k` rows add the entries as before.

# %%
conditions = ["original", "unquantised"] + [f"k={k}" for k in run_codebooks]
if codec.decoder_kind != "table":
    conditions += [f"table k={k}" for k in run_codebooks]
audio = {c: [] for c in conditions}
lsd = {c: {"feature_lsd_db": [], "audio_lsd_db": []} for c in conditions}
for i, (s, v, p) in enumerate(tqdm(eval_items, desc="codec sweep", unit="utt")):
    rows = sweep0 if i == 0 else codec.codebook_sweep(load_wav(p, cfg.sample_rate), run_codebooks)
    if codec.decoder_kind != "table":
        rows = rows + [{**r, "condition": f"table {r['condition']}"}
                       for r in table_codec.codebook_sweep(load_wav(p, cfg.sample_rate), run_codebooks,
                                                           unquantised=False)
                       if r["condition"] != "original"]
    for r in rows:
        audio[r["condition"]].append(r["audio"])
        lsd[r["condition"]]["feature_lsd_db"].append(r["feature_lsd_db"])
        lsd[r["condition"]]["audio_lsd_db"].append(r["audio_lsd_db"])
recogniser = make_recogniser(asr, "en", refs)  # default: Whisper tiny.en (open vocabulary, offline)
scores = score_conditions(audio, refs, recogniser, sample_rate=cfg.sample_rate, progress=True)
cers = {c: asr_mod.cer(refs, scores[c]["hypotheses"]) for c in conditions}
quality = []
for c in conditions:
    k = int(c.split("k=")[1]) if "k=" in c else None
    quality.append({"condition": {"original": "original", "unquantised": "inversion only"}.get(c, f"codec {c}"),
                    "decoder": ("table" if c.startswith("table") else codec.decoder_kind) if k else None,
                    "k": k, "bits_per_s": cfg.frame_rate_hz * k * bits if k else None,
                    "wer": scores[c]["wer"], "wer_without_outliers": scores[c]["wer_without_outliers"],
                    "outliers": scores[c]["outliers"], "cer": cers[c].rate,
                    "feature_lsd_db": float(np.mean(lsd[c]["feature_lsd_db"])),
                    "audio_lsd_db": float(np.mean(lsd[c]["audio_lsd_db"])), "n": len(refs)})
prov = provenance(params, seed=seed)  # after the measurement: the load recorded is the one it ran under
prov_q = {**prov, "asr": recogniser.name, "codec": f"{root_name}/codec.safetensors"}
save_table(quality, out / "00_codec_quality", prov_q)
pd.DataFrame(quality)

# %%
ks = list(run_codebooks)
k_ticks = [k for k in ks if k & (k - 1) == 0] or ks  # powers of two on the log axis
wer_k = [scores[f"k={k}"]["wer"] for k in ks]
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.4), constrained_layout=True)
ax0.plot(ks, wer_k, "o-", color="C0", label=f"codec, first k codebooks ({codec.decoder_kind} decoder)")
if codec.decoder_kind != "table":
    ax0.plot(ks, [scores[f"table k={k}"]["wer"] for k in ks], "^--", color="C3", label="codec, table decoder")
    wer_k = wer_k + [scores[f"table k={k}"]["wer"] for k in ks]
ax0.axhline(scores["original"]["wer"], color="k", ls="--", label="original audio")
ax0.axhline(scores["unquantised"]["wer"], color="C2", ls=":", label="inversion only (unquantised)")
ax0.set_xscale("log", base=2)
ax0.set_xticks(k_ticks, [str(k) for k in k_ticks])
ax0.set_xlabel("codebooks used, k")
ax0.set_ylabel(f"WER ({recogniser.name})")
ax0.set_ylim(0, max(1.05 * max(wer_k + [scores["original"]["wer"], scores["unquantised"]["wer"]]), 0.1))
ax0.legend(fontsize=8)
ax0.grid(alpha=0.3)
ax1.plot(ks, [np.mean(lsd[f"k={k}"]["feature_lsd_db"]) for k in ks], "o-", color="C1",
         label="decoder input vs features")
ax1.plot(ks, [np.mean(lsd[f"k={k}"]["audio_lsd_db"]) for k in ks], "s-", color="C0",
         label="output audio vs original")
ax1.axhline(np.mean(lsd["unquantised"]["audio_lsd_db"]), color="C2", ls=":", label="inversion only")
ax1.set_xscale("log", base=2)
ax1.set_xticks(k_ticks, [str(k) for k in k_ticks])
ax1.set_xlabel("codebooks used, k")
ax1.set_ylabel("log-spectral distance (dB)")
ax1.set_ylim(bottom=0)
ax1.legend(fontsize=8)
ax1.grid(alpha=0.3)
fig.suptitle(f"{len(refs)} held-out sentences, voices {', '.join(sorted(set(v for _, v, _ in eval_items)))}; "
             f"codec {cfg.n_codebooks} x {cfg.codebook_size} ({root_name})", fontsize=9)
save_figure(fig, out / "00_wer_by_codebooks", prov_q)
plt.show()

# %% [markdown]
# A few transcripts (reference, then what the recogniser heard in each condition):

# %%
examples = pd.DataFrame({"reference": [asr_mod.normalize_text(r) for r in refs[:3]],
                         **{c: scores[c]["hypotheses"][:3] for c in conditions}})
examples.T

# %%
metrics = {
    "model": str(model),
    "root": root_name,
    "codec": geometry,
    "n_sentences": len(refs),
    "codebooks": list(run_codebooks),
    "voices": sorted({v for _, v, _ in eval_items}),
    "asr": recogniser.name,
    "wer": {c: scores[c]["wer"] for c in conditions},
    "wer_without_outliers": {c: scores[c]["wer_without_outliers"] for c in conditions},
    "cer": {c: cers[c].rate for c in conditions},
    "feature_lsd_db": {c: float(np.mean(lsd[c]["feature_lsd_db"])) for c in conditions},
    "audio_lsd_db": {c: float(np.mean(lsd[c]["audio_lsd_db"])) for c in conditions},
    "corpus_table": table,
    "corpus_table_source": f"{root_name}/{eval_path.name}",
    "rendered": {"calibration": len(rows_cal), "multilingual": len(rows_ml), "evaluation": len(eval_items),
                 "languages": sorted({r["language"] for r in rows_ml})},
    "hypotheses": {c: scores[c]["hypotheses"] for c in conditions},
    "references": refs,
    "wall_s": time.perf_counter() - t_start,
}
save_json(metrics, out / "00_metrics.json", prov_q)
display(Markdown(f"WER / CER by condition ({len(refs)} sentences, {recogniser.name}): " + ", ".join(
    f"{c} {metrics['wer'][c]:.3f} / {metrics['cer'][c]:.3f}" for c in conditions)
    + f". Run time {metrics['wall_s']:.0f} s."))
