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
# **What this notebook answers.** The later notebooks' acceptance and word-error measurements are taken on one trained
# model, the embedded model below (notebook 02's toy needs no model; timings also use a random-weights stand-in, and
# notebook 03 adds a synthetic code predictor, each said where used). Those measurements mean something only once you
# know what that model was trained on and what its codes carry. So, before any speculation: *what data is there, and
# what does each of the 16 codes of a frame contribute to the audio?*
#
# **Why the embedded model.** No Qwen3-TTS weights and none of the paper's data sets (VoxPopuli, LibriSpeech, Fleurs)
# can be downloaded where this project is built. The later notebooks therefore measure speculation on the
# **embedded model**: a small Qwen3-TTS-class model (the official model classes, fewer and narrower layers) trained
# here, from scratch, on speech rendered offline by the flite voices and encoded by an offline codec with the real
# tokenizer's interface (24 kHz audio, 12.5 frames a second, 16 codebooks of 2048 entries). Its numbers are its own,
# not the released checkpoint's; the last section says what we expect of the released codec instead, and marks it
# as inference.
#
# **Terms** (all in [the glossary](../docs/glossary.md)). A **frame** is 80 ms of audio, described by 16 **codes**,
# one per **codebook** of the residual vector quantiser (RVQ). Codes are counted from 0 and codebooks from 1: **code i
# comes from codebook i + 1** (code 0 from codebook 1, code 15 from codebook 16). The large **talker** emits code 0
# of each frame; the small **code predictor** then emits codes 1..15, one call each: that inner loop is what the
# paper speeds up. It speeds it up by **speculation**: a cheap **draft** distribution q guesses several codes ahead,
# the code predictor's own distribution p (the **target**) **verifies** them all in one call, and the share of drafts
# kept is the **acceptance**; the drafts are laid out as a **tree** (several guesses per depth) whose shape is
# **calibrated** on a split of data, and the paper's draft reuses the code predictor's heads shifted by learned
# **offsets**. Here these words appear only as the jobs of the data splits; notebook 02 defines draft, target and
# acceptance, 03 the offsets and 04 the tree and its calibration.
#
# The sections:
#
# 1. **the corpus**, as an analogue of the paper's Table 1 (which split is used for what, how much audio);
# 2. **the codec** and how RVQ builds a frame from its codes, beside the released tokenizer's configuration;
# 3. **seeing and hearing** the codebooks: one held-out sentence decoded from its first 1, 4 and 16 codes;
# 4. **what each stage removes**: the variance left after k stages, against what any quantiser could remove from
#    structureless noise (why the deep stages of this codec add little);
# 5. **distance and word error rate** by number of codebooks, over several held-out sentences;
# 6. **changes no one can hear**: how many codes of each codebook survive them (why a model cannot predict the deep
#    codes of this codec sharply);
#
# and, to end, what this notebook showed, and why.
#
# All numbers are read from files or measured when the notebook runs; none is typed in.

# %% tags=["parameters"]
model = "embedded"  # the shipped model (data/embedded); or a build folder such as build/embedded-smoke
seed = 0  # seeds the choice of evaluation sentences and the noise of section 6 (the codec decodes deterministically)
smoke = False  # True: 3 short sentences, codebooks (1, 4, 16), 3 calibration and 1 multilingual sentence per language
out_dir = "figures"  # relative paths resolve against the repository root (smoke: figures/ -> build/smoke_figures/)
threads = 1  # torch.set_num_threads (1, as `make paper` and the committed figures); 0 keeps torch's default
n_sentences = 12  # held-out evaluation sentences for the codec measurements (sections 4 and 5)
codebooks = (1, 2, 3, 4, 6, 8, 12, 16)  # k: decode with the first k codebooks (section 5; section 4 takes every stage)
listen_codebooks = (1, 4, 16)  # section 3: the first held-out sentence decoded with the first k codebooks
voices = ("slt", "kal16", "awb", "rms")  # flite English voices, used in turn
n_calibration = 0  # calibration sentences rendered for the table; 0 means all shipped ones
n_multilingual = 0  # multilingual sentences per language rendered for the table; 0 means all shipped ones
work_dir = ""  # where rendered audio goes; "" means build/00_corpus (smoke, <out_dir>/00_work). Reruns reuse it.
asr = "auto"  # English recogniser (auto is Whisper tiny.en offline; or pocketsphinx, whisper PATH, parakeet PATH)
cpu_sizes = {"n_sentences": 4}  # a full run on a real-size checkpoint on a machine with no GPU: these in place of
#                                 the sizes above (the smaller), and the checkpoint's smaller evaluation split, so
#                                 that `make paper` fits 90 minutes on 2 cores; None or {}: the full sizes

# %%
import json
import random
import time
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter, PercentFormatter
import pandas as pd
import torch
from IPython.display import Audio, Markdown, display

from rvqspec_lib.common.provenance import (REPO_ROOT, provenance, resolve_out_dir, save_audio, save_figure, save_json,
                                           save_table)
from tools.results_doc import entry, headline
from rvqspec_lib.data.utterances import embedded_root
from paper.notebook_measures import log_mel_db, shipped_split_sizes
from recipes.embedded import corpus
from rvqspec_lib.data import voices as speech
from rvqspec_lib.eval import asr as asr_mod
from paper import codec_quality as cq
from rvqspec_lib.eval.asr_models import check_asr_name, recogniser as make_recogniser
from paper.plots import plot_spectrograms
from rvqspec_lib.models.audio import load_wav
from rvqspec_lib.models.configs import CODEC_CONFIG, codec_decoder_config_dict
from rvqspec_lib.models.rvq_codec import RVQCodec
from rvqspec_lib.models.speech_tokenizers import Qwen12HzCodec
from rvqspec_lib.data.utterances import load_shipped_utterances
from paper.checkpoint import cpu_sized, is_checkpoint, not_here, prepare_checkpoint, round_trip, takes_cpu_sizes

t_start = time.perf_counter()
check_asr_name(asr)  # a bad recogniser name or model folder: one line, before any work
if asr == "none":
    raise ValueError("this notebook measures WER and CER: choose a recogniser (asr = \"auto\")")
if threads:
    torch.set_num_threads(int(threads))
run_codebooks = tuple(int(k) for k in ((1, 4, 16) if smoke else codebooks))
run_n_sentences = min(int(n_sentences), 3) if smoke else int(n_sentences)
run_n_calibration = 3 if smoke else int(n_calibration)
run_n_multilingual = 1 if smoke else int(n_multilingual)
out = resolve_out_dir(out_dir, smoke=smoke)  # a smoke run never writes into the committed figures/
work = resolve_out_dir(work_dir or (out / "00_work" if smoke else "build/00_corpus"), smoke=smoke)
on_checkpoint = is_checkpoint(model)  # a released checkpoint: its own speech and 12 Hz codec (the next section)
cpu_run = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes)  # real size, no GPU here: the CPU sizes
run_n_sentences = cpu_sized("00", {"n_sentences": run_n_sentences}, cpu_sizes, applies=cpu_run)["n_sentences"]
if on_checkpoint:
    root = prepare_checkpoint(model, smoke=smoke, notebook="00", out_dir=out, seed=seed, cpu_sizes=cpu_sizes).resolve()
else:
    try:
        root = embedded_root(model).resolve()
    except FileNotFoundError:
        p_model = Path(str(model)).expanduser()
        if p_model.exists() and not (p_model / "config.json").is_file():
            raise  # a folder that is neither an embedded-model build nor a checkpoint: say so
        # a timing model (MODEL=qwen3-tts-1.7b-random): random weights, no speech of its own, no codec
        not_here("00", f"corpus and codec of {model}", "random weights built in memory: no corpus, no codec; "
                 "the embedded model's are shown", "00_metrics.json")
        display(Markdown(f"**`{model}` is not an embedded-model build (it ships no corpus and no offline codec): "
                         "this notebook shows the shipped embedded model's corpus and codec (data/embedded).**"))
        root = embedded_root("embedded").resolve()
root_name = str(root.relative_to(REPO_ROOT)) if root.is_relative_to(REPO_ROOT) else str(root)
params = dict(model=str(model), root=root_name, seed=seed, smoke=bool(smoke), out_dir=str(out), work_dir=str(work),
              threads=torch.get_num_threads(), n_sentences=run_n_sentences, codebooks=list(run_codebooks),
              listen_codebooks=[int(k) for k in listen_codebooks], voices=list(voices),
              n_calibration=run_n_calibration, n_multilingual=run_n_multilingual, asr=str(asr),
              notebook="00_corpus_and_codec", cpu_sized=cpu_run)
print(f"model data {root}\noutputs -> {out}\nrendered audio -> {work}")

# %% [markdown]
# ## On a released checkpoint: its own 12 Hz codec
#
# **Only when `model` is a released checkpoint** (a folder in the release's layout or a hub id; otherwise this section
# prints nothing). A checkpoint ships no corpus: the sections after this one need the embedded model's (the flite
# texts, its offline codec and the build's record) and are skipped, on the console and in `docs/results.md`. What
# this section measures instead is the checkpoint's own speech tokenizer on the checkpoint's own speech: the model
# speaks held-out texts (its evaluation split, `paper.checkpoint.prepare_checkpoint`), the codes are decoded to audio
# by its tokenizer and the audio encoded again. **Kept by the round trip**: the share of frames whose first k codes
# all come back, for every k, and the share of each codebook's codes that come back; and the log-spectral distance
# of the re-decoded audio to the first decoding. A codec whose deep codebooks carry little lets them drift on a
# round trip while the first ones stay; with random weights (a test checkpoint) the numbers mean nothing.

# %%
if on_checkpoint:
    ck_rows, ck_utts = load_shipped_utterances(root / "utterances.safetensors", splits=["evaluation"])
    ck_utts = ck_utts[:run_n_sentences]
    st_dir = Path(str(model)).expanduser() / "speech_tokenizer"
    ck_codec = Qwen12HzCodec(st_dir if st_dir.is_dir() else str(model))
    trip = round_trip(ck_codec, ck_utts)
    prov = provenance(params, seed=seed)
    save_table(trip["rows"], out / "00_codec_round_trip", prov,
               caption=f"{model}: its own speech ({len(ck_utts)} evaluation utterances, {trip['frames']} frames) "
                       "through its 12 Hz tokenizer and back")
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(9.0, 3.4), layout="constrained")
    a0.plot([r["k"] for r in trip["rows"]], [r["prefix_kept"] for r in trip["rows"]], "o-")
    a0.set_xlabel("first k codebooks")
    a0.set_ylabel("frames whose first k codes come back")
    a1.bar([r["codebook"] for r in trip["per_codebook"]], [r["kept"] for r in trip["per_codebook"]])
    a1.set_xlabel("codebook")
    a1.set_ylabel("codes that come back")
    for ax in (a0, a1):
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{model}: decode then encode its own speech ({trip['frames']} frames); log-spectral distance of "
                 f"the re-decoded audio {trip['lsd_db']:.2f} dB", fontsize=9)
    save_figure(fig, out / "00_codec_round_trip", prov)
    plt.show()
    lm_random = (Path(str(model)).expanduser() / "RANDOM_WEIGHTS").is_file()
    display(Markdown(
        f"All {len(trip['per_codebook'])} codes of a frame come back in {trip['rows'][-1]['prefix_kept']:.1%} of the "
        f"frames, code 0 alone in {trip['rows'][0]['prefix_kept']:.1%}; the re-decoded audio is "
        f"{trip['lsd_db']:.2f} dB from the first decoding."
        + (" **Random weights: these numbers mean nothing; the path runs.**" if lm_random else "")))
    skipped = [not_here("00", what, "needs the embedded model's corpus and offline codec", "00_metrics.json")
               for what in ("the corpus table (flite texts, calibration and multilingual renderings)",
                            "the codec's geometry, listening examples and residual variance by RVQ stage",
                            "WER and spectral distance of flite speech by codebooks decoded")]
    display(Markdown("**Skipped on this checkpoint** (they need the embedded model's corpus and offline codec): "
                     + "; ".join(e["text"] for e in skipped) + "."))
    metrics = {"model": str(model), "root": str(root), "round_trip": trip, "n_sentences": len(ck_utts),
               "texts": [r["text"] for r in ck_rows[:len(ck_utts)]], "wall_s": time.perf_counter() - t_start}
    metrics["headline"] = [
        entry(f"frames of {model}'s own speech whose 16 codes all survive its 12 Hz codec's round trip",
              100 * trip["rows"][-1]["prefix_kept"], "%", "00_codec_round_trip.md"),
        entry(f"log-spectral distance of {model}'s re-decoded speech to its first decoding", trip["lsd_db"], "dB",
              "00_codec_round_trip.md"), *skipped]
    save_json(metrics, out / "00_metrics.json", prov)

# %% [markdown]
# ## 1. The corpus: a Table 1 analogue
#
# **The question.** The paper's Table 1 lists which data each step of its method used: what trained the drafter,
# what calibrated the tree, what measured WER. The same question here, for the embedded model: which sentences, in
# which split, how many hours and frames.
#
# **Text.** Every English sentence comes from text that installs with Debian or Python packages, and every sentence
# records the file it came from (`rvqspec_lib.data.voices.Sentence.origin`):
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
# **Audio.** The build (`recipes/embedded/build.py`) rendered each training, validation and evaluation sentence
# with one of the flite voices at 24 kHz; those rows are read from the build's record `eval.json`. The calibration
# split and the multilingual set are not in that record (the build ships the calibration split's codes beside the
# model, but trains nothing on them); they are rendered here (flite for English, espeak-ng for the other languages),
# so their hours and frames are measured too, at this run's size. A frame is one 80 ms codec frame.

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    eval_path = root / "eval.json"
    if not eval_path.is_file():
        raise FileNotFoundError(f"no {eval_path}: the build's record is written by recipes/embedded/build.py stage "
                                f"'eval' (make embedded, or --out {root})")
    build = json.loads(eval_path.read_text())
    build_prov = build.get("provenance", {})

    calibration = speech.shipped_sentences("calibration", language="en")
    if run_n_calibration:
        calibration = random.Random(seed).sample(calibration, min(run_n_calibration, len(calibration)))
    multilingual = speech.multilingual_sentences()
    if run_n_multilingual:
        multilingual = [s for lang in sorted({s.language for s in multilingual})
                        for s in [m for m in multilingual if m.language == lang][:run_n_multilingual]]
    ml_voices = [v for v in speech.DEFAULT_VOICES if speech.VOICES[v].language != "en"]
    rows_cal = speech.render_corpus(calibration, work / "calibration", voices=voices, one_voice_each=True)
    rows_ml = speech.render_corpus(multilingual, work / "multilingual", voices=ml_voices)


    def table_rows(summary, measured_by):
        return [{"split": r["split"], "role": corpus.SPLIT_ROLES.get(r["split"], ""), "language": r["language"],
                 "voices": r["voices"], "samples": r["samples"], "hours": r["hours"], "frames": r["frames"],
                 "text sources": r.get("sources", ""), "measured by": measured_by} for r in summary]


    order = {s: i for i, s in enumerate(speech.SPLITS)}
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
    with pd.option_context("display.max_colwidth", None, "display.width", 250):  # every string whole
        display(pd.DataFrame(table))

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    # the calibration split's size, read from the data that ships it (the same sentence in notebooks 00, 03 and 04)
    try:
        shipped_sizes = shipped_split_sizes(root)
        split = shipped_sizes["calibration"]
        split_file = Path(split["file"])
        split_file = split_file.relative_to(REPO_ROOT) if split_file.is_relative_to(REPO_ROOT) else split_file
        in_table = {r["split"]: r for r in table if r["language"] == "en"}
        heads_file = root / "model" / "trees" / "heads.json"
        heads_note = (f", calibrated on {json.loads(heads_file.read_text())['n_frames']:,} of its frames"
                      if heads_file.is_file() else "")
        shipped_lines = "; ".join(
            f"{name} **{d['utterances']:,} utterances, {d['frames']:,} frames**"
            + (f" (of the table's {in_table[name]['samples']:,})" if name in in_table
               and in_table[name]["samples"] > d["utterances"] else "")
            for name, d in sorted(shipped_sizes.items(), key=lambda kv: order.get(kv[0], 99)))
        display(Markdown(
            f"The table's calibration row counts the calibration sentences of `data/eval_texts/en_calibration.tsv` "
            f"rendered here: {len(rows_cal)} of its {len(speech.shipped_sentences('calibration'))}"
            + (" (`n_calibration` limits them)" if len(rows_cal) < len(speech.shipped_sentences("calibration"))
               else "") + f". What ships as codes beside the model (`{split_file}`), the "
            f"only speech the later notebooks read: {shipped_lines}. The shipped training and calibration splits are "
            f"seeded samples of theirs (the build's `--ship-train` for training; the calibration sentences of "
            f"`data/eval_texts/`): enough frames to train and calibrate drafters, small enough to ship. Notebooks "
            f"03 to 07 then take **subsets** of these shipped splits (their parameters cells set how many frames: "
            f"03 trains on part of the shipped training split, 04 and 05 calibrate on part of the calibration split, "
            f"06 and 07 read the trees calibrated once on it, `trees/heads.json` beside the model{heads_note}), "
            f"because on two CPU cores measuring every frame would take hours; each says its frames where it quotes "
            f"a result."))
    except (FileNotFoundError, KeyError) as e:
        print(f"no shipped calibration split beside {root}: {e}")

# %% [markdown]
# Where the text of each source comes from, and how the calibration and evaluation sentences of `data/eval_texts/`
# divide among the sources (every sentence of those files; the codes beside the model cover the seeded sample of them
# counted in the sentence above):

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    shipped = {split: speech.shipped_sentences(split) for split in ("calibration", "evaluation")}
    src_counts = pd.DataFrame({split: Counter(s.source for s in sents) for split, sents in shipped.items()}).fillna(0)
    src_counts = src_counts.astype(int)
    src_counts.insert(0, "from", [corpus.SOURCE_DESCRIPTIONS.get(s, "") for s in src_counts.index])
    with pd.option_context("display.max_colwidth", None, "display.width", 250):  # every string whole
        display(src_counts)
    en_eval = {r["split"]: r["samples"] for r in table if r["language"] == "en"}.get("evaluation")
    n_eval_file = len(speech.shipped_sentences("evaluation", language="en"))
    if en_eval is not None and en_eval < n_eval_file:
        display(Markdown(
            f"These columns count the whole files. The build evaluated a seeded sample of the English evaluation "
            f"file: the corpus table's {en_eval:,} sentences of its {n_eval_file:,} (the build's `n_eval`); the rest "
            f"are held out too, and a larger evaluation can read them."))

# %% [markdown]
# ## 2. The codec: residual vector quantisation (RVQ)
#
# **The question.** What is a code? Every 80 ms of 24 kHz audio becomes one **frame vector**, and the vector becomes
# 16 codes, one per codebook of 2048 entries. RVQ chooses them one stage after the other (stage k uses codebook k and
# gives code k − 1: codes are counted from 0, codebooks from 1):
#
# 1. stage 1 picks the codebook-1 entry nearest to the vector (**code 0**);
# 2. stage 2 picks the codebook-2 entry nearest to what is left over (the **RVQ residual**; notebook 02's
#    residual, a distribution a rejected draft's code is drawn from, is another thing), giving code 1, and so on,
#    16 times, up to code 15 from codebook 16.
#
# The decoder adds the chosen entries. Each stage corrects the error the earlier ones left, so the first code
# carries the coarse shape of the frame and the later ones finer and finer detail: decoding with only the first `k`
# codes gives a coarser version of the same audio.
#
# **Why code 0 matters.** In Qwen3-TTS the talker emits code 0 of every frame; the code predictor then fills in
# codes 1..15 given code 0 ([docs/model.md](../docs/model.md#two-nested-loops)). What is said, and how, is largely
# decided when code 0 is chosen; the inner loop adds detail to a frame whose coarse content is fixed. That is why the
# inner loop is predictable enough to draft ahead (the paper's speculation), and why its errors cost less
# intelligibility than errors in code 0. The real tokenizer makes code 0 special by construction: its quantiser
# (`SplitResidualVectorQuantizer` in the official `qwen_tts` code, as in Mimi) has one separate *semantic* codebook
# for code 0 and a residual quantiser for the acoustic detail, and the decoder adds the two. The stand-in here is
# plain residual k-means, so its code 0 is simply the best single-entry approximation of the frame.
#
# **The stand-in.** `RVQCodec`: frame vectors are 4 stacked 20 ms log-mel frames (80 mel bands); 16 stages of
# k-means fitted on the build's training audio; decoding inverts the mel filter bank (non-negative least squares)
# and estimates the phase with Griffin-Lim. It is not a neural codec: its audio is buzzy.
#
# **Two decoders.** Adding the chosen entries (the **table decoder**) reads the true codes exactly as the quantiser
# chose them, but the codes the code predictor samples are plausible and wrong, and their entries add up to spectral
# noise. The build therefore also trains a small **neural code decoder** (`rvqspec_lib.models.code_decoder`, stage
# `decoder` of `make embedded`): each codebook's entry through its own linear map, four dilated convolutions over
# about a second of frames, and a correction added to a learned weighting of the entries, trained on both true codes
# and the model's own inner-loop codes (as vocoders are fine-tuned on an acoustic model's predictions). When the build
# shipped one (`codec.decoder.safetensors` beside the codec), `RVQCodec.load` attaches it and the codec decodes with
# it; the table decoder is measured beside it in section 5, which says at which k each decoder does better.
#
# The table below sets the stand-in's geometry, as loaded, beside the released 12 Hz tokenizer's, read from its
# configuration (`data/configs/Qwen3-TTS-Tokenizer-12Hz/config.json`, shipped; its weights are not).

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
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
    released = codec_decoder_config_dict("released")
    released_geometry = {"n_codebooks": released["num_quantizers"],
                         "semantic_codebooks": released["num_semantic_quantizers"],
                         "codebook_size": released["codebook_size"], "code_vector_dim": released["codebook_dim"],
                         "decoder_transformer_layers": released["num_hidden_layers"],
                         "decoder_attention_window_frames": released["sliding_window"]}
    run_codebooks = tuple(k for k in run_codebooks if 1 <= k <= cfg.n_codebooks)
    run_listen = tuple(int(k) for k in listen_codebooks if 1 <= int(k) <= cfg.n_codebooks)
    if not run_codebooks or not run_listen:
        raise ValueError(f"codebooks={codebooks} and listen_codebooks={listen_codebooks} must lie in "
                         f"[1, {cfg.n_codebooks}] for this codec")
    params.update(codebooks=list(run_codebooks), listen_codebooks=list(run_listen))
    geometry_rows = [
        {"quantity": "codebooks", "embedded (offline stand-in)": cfg.n_codebooks,
         f"released ({CODEC_CONFIG}, config only)": released_geometry["n_codebooks"]},
        {"quantity": "of which semantic (code 0 only)", "embedded (offline stand-in)": 0,
         f"released ({CODEC_CONFIG}, config only)": released_geometry["semantic_codebooks"]},
        {"quantity": "entries per codebook", "embedded (offline stand-in)": cfg.codebook_size,
         f"released ({CODEC_CONFIG}, config only)": released_geometry["codebook_size"]},
        {"quantity": "dimension of the quantised vector", "embedded (offline stand-in)": cfg.dim,
         f"released ({CODEC_CONFIG}, config only)": released_geometry["code_vector_dim"]},
        {"quantity": "what is quantised", "embedded (offline stand-in)": f"{cfg.stack} stacked log-mel frames",
         f"released ({CODEC_CONFIG}, config only)": "a learned latent"},
        {"quantity": "codes to audio", "embedded (offline stand-in)":
            f"{codec.decoder_kind} code decoder, mel inversion, Griffin-Lim",
         f"released ({CODEC_CONFIG}, config only)":
            f"{released_geometry['decoder_transformer_layers']}-layer transformer and upsampling convolutions"},
    ]
    display(pd.DataFrame(geometry_rows).set_index("quantity"))

# %% [markdown]
# ### Held-out sentences rendered now
# The sentences below come from the shipped **evaluation** split: neither the codec nor the model saw them. Each is
# rendered with one of the English voices in turn (a seeded choice of sentences), at 24 kHz.

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    pool = speech.shipped_sentences("evaluation", language="en")
    if smoke:  # the 20 shortest: the recogniser's time grows with the audio's length
        pool = sorted(pool, key=lambda s: (len(s.text), s.text))[:20]
    picked = random.Random(seed).sample(pool, min(run_n_sentences, len(pool)))
    eval_items = []  # (sentence, voice, wav path)
    for i, s in enumerate(picked):
        v = voices[i % len(voices)]
        eval_items.append((s, v, work / "evaluation" / "wav" / v / f"{speech.utterance_id(s, v)}.wav"))
    # reuses files rendered by an earlier run with the same recipe (speech.RENDER_RECIPE), else renders them again
    speech.render_files([(s.text, v, p) for s, v, p in eval_items], work / "evaluation", progress=True,
                        desc="render evaluation")
    refs = [s.text for s, _, _ in eval_items]
    wavs = [load_wav(p, cfg.sample_rate) for _, _, p in eval_items]
    with pd.option_context("display.max_colwidth", None, "display.width", 250):  # every string whole
        display(pd.DataFrame([{"voice": v, "text": s.text, "source": s.source, "origin": s.origin}
                              for s, v, _ in eval_items]))

# %% [markdown]
# ## 3. Seeing and hearing the codebooks
#
# **The question.** What does a listener get from the first `k` codes of each frame? One held-out sentence (one
# draw: section 5 gives the mean over all held-out sentences, and says how this one compares), five versions: the
# **original** rendering; the **inversion only** of its unquantised features (mel inversion and Griffin-Lim with no
# quantisation: what the vocoder alone costs, the best any `k` can reach); and the codec with the first `k` codebooks
# for each `k` of `listen_codebooks`, through the shipped code decoder (codebooks past `k` marked absent, as in its
# training).
#
# **How.** Each spectrogram is computed from the output audio (what a listener or the recogniser gets), on one shared
# colour scale, so equal colours mean equal power across panels; beside each panel, its **log-spectral distance** to
# the original (dB: for every 20 ms mel frame the RMS over the mel bands of the difference in dB, then the mean
# over frames). The same five versions are written as WAV files and played below.

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    s0, v0, _ = eval_items[0]
    listen = cq.sweep_codebooks(codec, [wavs[0]], run_listen)
    titles = {"original": "original", "inversion": "inversion only (no quantisation)"}
    stems = {"original": "00_original", "inversion": "00_inversion"}
    panels, listening = [], []
    hop_s = cfg.hop_samples / cfg.sample_rate
    for c in listen["conditions"]:
        lab, wav = c["label"], listen["audio"][c["label"]][0]
        if c["k"] is None:  # the original and the inversion only
            title, stem = titles[c["condition"]], stems[c["condition"]]
        else:
            title = f"codec, first {c['k']} codebook{'s' if c['k'] > 1 else ''} ({c['decoder']} decoder)"
            stem = f"00_codebooks_{c['k']}"
        dist = None if c["condition"] == "original" else listen["audio_lsd_db"][lab][0]
        panels.append((title, log_mel_db(codec, wav), dist))
        listening.append({"label": title, "condition": c["condition"], "k": c["k"], "audio_lsd_db": dist,
                          "path": save_audio(wav, cfg.sample_rate, out / "audio" / stem, prov)})
    fig = plot_spectrograms(panels, hop_s=hop_s, title=f"What the first k codes of each frame keep: voice {v0}, "
                            f"\"{s0.text}\"")
    save_figure(fig, out / "00_spectrograms", prov)
    plt.show()

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    for item in listening:
        display(Markdown(f"**{item['label']}**" + ("" if item["audio_lsd_db"] is None else
                                                    f": {item['audio_lsd_db']:.1f} dB from the original")))
        display(Audio(filename=str(item["path"])))

# %% [markdown]
# ## 4. What each stage removes, and why the deep stages add little
#
# **The question.** Each RVQ stage quantises what the earlier stages left. How much of the frame vectors' variance
# does each stage remove, and is what the deep stages quantise still structure, or noise?
#
# **How.** Over the frames of all held-out sentences, the table decoder's reconstruction from the first `k` codebooks
# is compared with the frame vectors: the **variance left** is the mean squared residual over the frames' variance
# about their mean (`paper.codec_quality.residual_variance`). The yardstick is information theory: a
# stage is one choice among the codebook's entries, b = log2(codebook size) bits (section 2 prints both for this
# codec), spread over every dimension of the frame vector. If the residual had no structure left (an isotropic
# Gaussian), even the best possible quantiser of b bits could shrink its variance only by the factor 2^(−2b/d) for a
# d-dimensional vector (Shannon's distortion-rate function;
# `unstructured_stage_factor`). A stage that removes about that share is quantising noise; a stage that removes much
# more has found structure.

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    rv = cq.residual_variance(table_codec, wavs)
    save_table(rv, out / "00_residual_variance", prov,
               caption=f"variance of the frame vectors left after the first k RVQ stages (table decoder), "
                       f"{rv[0]['frames']} frames of {len(wavs)} held-out sentences; unstructured_factor: the best "
                       f"factor any {bits:g}-bit quantiser achieves on an isotropic Gaussian of dimension {cfg.dim}")
    ks_all = [r["k"] for r in rv]
    ref_removed = 1 - rv[0]["unstructured_factor"]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(9.0, 3.3), constrained_layout=True)
    left = [r["variance_left"] for r in rv]
    a0.plot(ks_all, left, "o-", color="C0")
    a0.set_yscale("log")
    a0.set_yticks([t for t in (0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0)
                   if min(left) / 1.1 <= t <= max(left) * 1.1])
    a0.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{100 * v:g}%"))
    a0.yaxis.set_minor_formatter(NullFormatter())
    a0.set_xticks(ks_all, [str(k) for k in ks_all], fontsize=7)
    a0.set_xlabel("codebooks used, k")
    a0.set_ylabel("share of variance left")
    a0.set_title("variance of the frame vectors left after k stages", fontsize=9)
    a0.grid(alpha=0.3, which="both")
    a1.bar(ks_all[1:], [1 - r["stage_factor"] for r in rv[1:]], color="C0", alpha=0.7,
           label="measured: share of the remaining variance the stage removes")
    a1.axhline(ref_removed, color="k", ls="--", lw=1,
               label=f"the most any {bits:g}-bit stage removes from structureless noise")
    a1.set_xticks(ks_all[1:], [str(k) for k in ks_all[1:]], fontsize=7)
    a1.set_xlabel("stage k")
    a1.set_ylabel("share of the remaining variance")
    a1.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    a1.set_ylim(0, 1.6 * max(1 - r["stage_factor"] for r in rv[1:]))
    a1.set_title("what stages 2 and later remove from what is left", fontsize=9)
    a1.legend(fontsize=7, loc="upper right")
    a1.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Residual vector quantisation of {rv[0]['frames']} held-out frames: each stage quantises what the "
                 f"earlier ones left", fontsize=9)
    save_figure(fig, out / "00_residual_variance", prov)
    plt.show()
    display(Markdown(
        f"Stage 1 alone removes **{1 - rv[0]['variance_left']:.1%}** of the variance; after {len(rv)} stages "
        f"{rv[-1]['variance_left']:.2%} is left. An unstructured residual could lose at most {ref_removed:.1%} of its "
        f"variance per stage."))

# %% [markdown]
# ## 5. What each codebook adds: distance and word error rate
#
# **The question.** Does the spectral improvement of each stage make the speech more intelligible? For every
# held-out sentence, these conditions: the original; the inversion only of its unquantised features (the ceiling of
# any `k`); and the codec with the first `k` codebooks, for each `k`, through the shipped code decoder (`k=…` rows)
# and through the table decoder (`table k=…` rows). Two measures
# (`paper.codec_quality.codec_quality`):
#
# * **log-spectral distance** to the original: of the decoder's output frame vectors to the unquantised features
#   (`feature_lsd_db`, what the codes and the code decoder lose) and of the output audio's features to the
#   original's (`audio_lsd_db`, the same plus the inversion);
# * **word and character error rates** (WER, CER) of a speech recogniser, named below from the recogniser itself.
#   It does not know the texts, so WER on the original audio is not zero: it is the recogniser's own **WER floor** on
#   this synthetic speech, the reference line for the others. Two other floors appear in later notebooks and are not
#   this one: notebook 05's **true-code floor**, the WER of the codec on the true codes through the table decoder
#   (here the `table k=16` row; notebook 05 measures it on other sentences), and the **weight-streaming floor** of a
#   model call's time (the time to read its weights once from memory) in notebooks 04, 06 and 07. Repetition
#   outliers are counted in `wer` and left out in `wer_without_outliers`
#   ([methods.md](../docs/methods.md#reporting-wer)).
#
# The gap between the `k` = 16 line and the inversion-only line is what quantisation costs; the gap between the
# inversion only and the original is what the vocoder costs. Bits per second: `k` codes of log2(codebook size) bits,
# 12.5 times a second.

# %%
DB_TIE = 0.05  # dB: two mean distances closer than this are not told apart


def words_told_apart(a: int, b: int) -> bool:
    """Whether word-error counts a and b differ beyond a rough 95% interval for two counts of rare events."""
    return abs(a - b) > 2 * (a + b) ** 0.5


if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    recogniser = make_recogniser(asr, "en", refs)  # default Whisper tiny.en (open vocabulary, offline)
    quality = cq.codec_quality(codec, wavs, refs, run_codebooks, recogniser,
                               table_codec=table_codec if codec.decoder_kind != "table" else None, progress=True)
    rows = {r["label"]: r for r in quality["rows"]}
    prov = provenance(params, seed=seed)  # after the measurement: the load recorded is the one it ran under
    prov_q = {**prov, "asr": quality["asr"], "codec": f"{root_name}/codec.safetensors"}
    table_q = [{k: v for k, v in r.items() if k != "table"} for r in quality["rows"]]
    save_table(table_q, out / "00_codec_quality", prov_q,
               caption=f"{len(refs)} held-out sentences; recogniser {quality['asr']}; distances in dB")
    display(Markdown(f"Recogniser: **{quality['asr']}**" + (
        " (given a language model of the reference texts: prompt-informed, its WER is optimistic)"
        if asr == "pocketsphinx-prompt" else ", which does not know the texts") +
        f"; {rows['original']['ref_words']} reference words, so one word is {1 / rows['original']['ref_words']:.1%} of "
        f"the WER. Columns: `n` is the number of sentences, `errors` the word errors (substitutions, deletions and "
        f"insertions) summed over them, `ref_words` their reference words, so `wer` = `errors` / `ref_words`."))
    with pd.option_context("display.max_columns", None, "display.width", 250):  # every column, no "..."
        display(pd.DataFrame(table_q).set_index("label"))
    if codec.decoder_kind != "table":  # which decoder does better at each k, from the rows above
        measures = (("wer", "WER"), ("feature_lsd_db", "feature distance"), ("audio_lsd_db", "audio distance"))

        def lower(a, b, key):
            """+1 when row a is lower than row b beyond the noise rule on measure key, -1 when higher, 0: a tie."""
            x, y = (a["errors"], b["errors"]) if key == "wer" else (a[key], b[key])
            told = words_told_apart(x, y) if key == "wer" else abs(x - y) > DB_TIE
            return 0 if not told else (1 if x < y else -1)

        sign = {k: {name: lower(rows[f"k={k}"], rows[f"table k={k}"], key) for key, name in measures}
                for k in run_codebooks}
        better = {k: [n for n, v in sign[k].items() if v > 0] for k in run_codebooks}
        worse = {k: [n for n, v in sign[k].items() if v < 0] for k in run_codebooks}
        tied = {k: [n for n, v in sign[k].items() if v == 0] for k in run_codebooks}
        all_neural = [k for k in run_codebooks if len(better[k]) == len(measures)]
        all_table = [k for k in run_codebooks if len(worse[k]) == len(measures)]
        untold = [k for k in run_codebooks if len(tied[k]) == len(measures)]
        mixed = [k for k in run_codebooks if k not in all_neural + all_table + untold]
        parts = ([f"the {codec.decoder_kind} decoder at k = {', '.join(map(str, all_neural))}"] if all_neural else []) \
            + ([f"the table decoder at k = {', '.join(map(str, all_table))}"] if all_table else [])
        display(Markdown(
            "**The two decoders, k by k** (lower is better on each measure: WER, feature distance, audio distance). "
            f"A difference counts only beyond the noise: word errors a and b differ when |a − b| > 2√(a + b) (a "
            f"rough 95% interval for two counts of rare events), distances when they differ by more than "
            f"{DB_TIE:g} dB; anything smaller is not told apart. "
            + (f"Better on all three: {'; '.join(parts)}. " if parts else "Neither is better on all three at any k. ")
            + (f"Not told apart on any measure: k = {', '.join(map(str, untold))}. " if untold else "")
            + ("Split: " + "; ".join(f"k = {k} ({codec.decoder_kind} better on {' and '.join(better[k]) or 'none'}, "
                                     f"table on {' and '.join(worse[k]) or 'none'}, not told apart on "
                                     f"{' and '.join(tied[k]) or 'none'})" for k in mixed) + ". "
               if mixed else "")
            + ("Neither reading of the true codes is best at every k."
               if len(all_neural) < len(run_codebooks) and len(all_table) < len(run_codebooks) else "")))
    k_top = max(run_listen)
    if f"k={k_top}" in rows:  # section 3's one sentence against the mean over every sentence
        one = {c["label"]: listen["audio_lsd_db"][c["label"]][0] for c in listen["conditions"]}
        display(Markdown(
            f"Section 3's one sentence was {one['unquantised']:.2f} dB from the original after the inversion only "
            f"and {one[f'k={k_top}']:.2f} dB with {k_top} codebooks; over all {len(refs)} sentences the means are "
            f"{rows['unquantised']['audio_lsd_db']:.2f} dB and {rows[f'k={k_top}']['audio_lsd_db']:.2f} dB. One "
            f"sentence is one draw: its distances differ from the mean by "
            f"{one['unquantised'] - rows['unquantised']['audio_lsd_db']:+.2f} dB and "
            f"{one[f'k={k_top}'] - rows[f'k={k_top}']['audio_lsd_db']:+.2f} dB."))

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    ks = list(run_codebooks)
    k_ticks = ks if len(ks) <= 8 else [k for k in ks if k & (k - 1) == 0] or ks  # few: all; else powers of two
    series = [("k", f"codec, {codec.decoder_kind} decoder", "o-", "C0")]
    if codec.decoder_kind != "table":
        series.append(("table k", "codec, table decoder", "^--", "C3"))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.6), layout="constrained")
    for prefix, label, style, color in series:
        ax0.plot(ks, [rows[f"{prefix}={k}"]["wer"] for k in ks], style, color=color, label=label)
    ax0.axhline(rows["original"]["wer"], color="k", ls="--", label="original audio")
    ax0.axhline(rows["unquantised"]["wer"], color="C2", ls=":", label="inversion only (no quantisation)")
    ax0.set_ylabel(f"word error rate ({quality['asr']})")
    ax0.set_ylim(0, max(0.1, 1.1 * max(r["wer"] for r in quality["rows"])))
    ax0.set_title("intelligibility by codebooks decoded", fontsize=9)
    for prefix, label, style, color in series:
        ax1.plot(ks, [rows[f"{prefix}={k}"]["audio_lsd_db"] for k in ks], style, color=color, label=label)
    ax1.axhline(rows["unquantised"]["audio_lsd_db"], color="C2", ls=":", label="inversion only (no quantisation)")
    ax1.set_ylabel("log-spectral distance to the original (dB)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("distance of the output audio by codebooks decoded", fontsize=9)
    for ax in (ax0, ax1):
        ax.set_xscale("log", base=2)
        ax.set_xticks(k_ticks, [str(k) for k in k_ticks])
        ax.minorticks_off()
        ax.set_xlabel("codebooks used, k")
        ax.grid(alpha=0.3)
    legend = dict(zip(*ax0.get_legend_handles_labels()[::-1]))  # one legend for both panels: the same lines
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=len(legend), fontsize=7)
    fig.suptitle(f"{len(refs)} held-out sentences, voices {', '.join(sorted(set(v for _, v, _ in eval_items)))}; "
                 f"codec {cfg.n_codebooks} x {cfg.codebook_size} ({root_name})", fontsize=9)
    save_figure(fig, out / "00_wer_by_codebooks", prov_q)
    plt.show()

# %% [markdown]
# A few transcripts (reference, then what the recogniser heard in a few of the conditions; every condition's
# transcripts are in `00_metrics.json`, key `hypotheses`):

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    conditions = [c["label"] for c in quality["sweep"]["conditions"]]
    k_show = sorted({min(run_codebooks), 4, max(run_codebooks)} & set(run_codebooks))
    shown = ["original", "unquantised"] + [f"{p}k={k}" for p in ("", "table ") for k in k_show
                                           if f"{p}k={k}" in conditions]
    display(Markdown("\n\n".join(
        f"**Sentence {i + 1}**, reference: *{asr_mod.normalize_text(refs[i])}*\n\n"
        + "\n".join(f"* `{c}`: {quality['hypotheses'][c][i]}" for c in shown)
        for i in range(min(3, len(refs))))))

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    metrics = {
        "model": str(model),
        "root": root_name,
        "codec": geometry,
        "released_codec_config": {"file": f"data/configs/{CODEC_CONFIG}/config.json", **released_geometry},
        "n_sentences": len(refs),
        "codebooks": list(run_codebooks),
        "listen_codebooks": list(run_listen),
        "voices": sorted({v for _, v, _ in eval_items}),
        "asr": quality["asr"],
        **{key: {c: rows[c][key] for c in conditions}
           for key in ("wer", "wer_without_outliers", "cer", "feature_lsd_db", "audio_lsd_db")},
        "ref_words": rows["original"]["ref_words"],
        "residual_variance": rv,
        "listening": [{**{k: v for k, v in item.items() if k != "path"},
                       "file": str(item["path"].relative_to(out))} for item in listening],
        "corpus_table": table,
        "corpus_table_source": f"{root_name}/{eval_path.name}",
        "rendered": {"calibration": len(rows_cal), "multilingual": len(rows_ml), "evaluation": len(eval_items),
                     "languages": sorted({r["language"] for r in rows_ml})},
        "hypotheses": quality["hypotheses"],
        "references": refs,
        "wall_s": time.perf_counter() - t_start,
    }
    # what a reader most wants from this notebook (docs/results.md, generated): the embedded model's codec, heard by the
    # recogniser, with few codebooks and with all of them, beside the original audio's floor
    _wer = lambda label: 100 * rows[label]["wer"] if label in rows else None  # noqa: E731 (a k not swept is left out)
    metrics["headline"] = headline(
        entry(f"WER of the original audio ({quality['asr']}, {len(refs)} held-out sentences of the embedded model's "
              "corpus): the recogniser's own floor", _wer("original"), "%", "00_codec_quality.md"),
        *[entry(f"WER of the embedded model's codec decoding {k} of its {cfg.n_codebooks} codebooks "
                f"({quality['asr']}, {len(refs)} held-out sentences)", _wer(f"k={k}"), "%", "00_codec_quality.md",
                glance=k == cfg.n_codebooks)
          for k in sorted({1, 4, cfg.n_codebooks})],
        entry("share of the frame vectors' variance left after the embedded codec's first RVQ stage (table decoder)",
              100 * rv[0]["variance_left"], "%", "00_residual_variance.md"),
    )
    save_json(metrics, out / "00_metrics.json", prov_q)
    print(f"run time {metrics['wall_s']:.0f} s")

# %% [markdown]
# ## 6. Do the codes survive changes no one can hear?
#
# **The question.** A talker and a code predictor can only learn codes that follow from what is heard. Each held-out
# sentence is changed in three ways no listener hears (the names below say how much: a small gain change, a delay of
# one sample, white noise far under the signal) and encoded again; the figure shows, for each codebook, the share of
# codes that stay the same (`recipes.embedded.codec_probe.robustness`). A codec whose codes a model can learn keeps
# nearly all of them; the dashed line is the share a codec for this project's small models must keep under the first two
# (`recipes.embedded.codec_probe.MIN_UNCHANGED`; `python -m recipes.embedded.codec_probe` runs this and the other
# checks of a codec on more sentences). The figure's x axis and the saved table's columns (`codebook 0` ..
# `codebook 15`) number the codebooks by the code they hold, from 0: `codebook 0` there is code 0, codebook 1 in
# the numbering of section 2.

# %%
if not on_checkpoint:  # the embedded codec (a checkpoint: its round trip, in the section above)
    from recipes.embedded.codec_probe import GATED, MIN_UNCHANGED, robustness

    rob = robustness(codec, wavs, seed=seed)
    table_rob = [{"perturbation": name, "frames": r["frames"], "all codes unchanged": r["all_unchanged"],
                  **{f"codebook {k}": x for k, x in enumerate(r["unchanged"])}} for name, r in rob.items()]
    save_table(table_rob, out / "00_codec_robustness", prov,
               caption=f"share of codes unchanged per codebook, {len(wavs)} held-out sentences, all frames")
    fig, ax = plt.subplots(figsize=(7, 3))
    for name, r in rob.items():
        ax.plot(range(len(r["unchanged"])), r["unchanged"], marker="o", ms=3, label=name)
    ax.axhline(MIN_UNCHANGED, color="k", lw=0.8, ls="--", label=f"needed under {' and '.join(GATED)}")
    ax.set_xlabel("codebook (0: the talker's code)")
    ax.set_ylabel("codes unchanged")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{len(wavs)} held-out sentences, {rob[GATED[0]]['frames']} frames: re-encoded after an inaudible "
                 "change", fontsize=9)
    save_figure(fig, out / "00_codec_robustness", prov)
    plt.show()
    display(Markdown("Fewest codes unchanged at any codebook (code i: codebook i + 1): " + "; ".join(
        f"{name} **{min(r['unchanged']):.0%}** (at code {int(np.argmin(r['unchanged']))})" for name, r in rob.items()) +
        f". Frames with all {len(rob[GATED[0]]['unchanged'])} codes unchanged under {GATED[0]}: "
        f"**{rob[GATED[0]]['all_unchanged']:.0%}**."))

# %% [markdown]
# ## What this notebook showed, and why
#
# Below, **measured here** marks numbers of this run (the embedded model's offline codec, these held-out sentences,
# this recogniser); **config** marks facts read from the released tokenizer's configuration; **inference** marks
# what we expect of the released codec and did not measure (its weights cannot be downloaded here).

# %%
if not on_checkpoint:  # the embedded data (a checkpoint: the section above)
    first, last = rv[0], rv[-1]
    four = rv[min(4, len(rv)) - 1]
    deep = [r for r in rv if r["k"] > len(rv) // 2]  # the second half of the stages
    deep_removed = float(np.median([1 - r["stage_factor"] for r in deep]))
    k_lo, k_hi = min(run_codebooks), max(run_codebooks)
    wer = {c: rows[c]["wer"] for c in conditions}
    k4 = four["k"]
    w4 = wer.get(f"k={k4}")  # None when the sweep skipped k = 4
    # word errors with k4 and with all codebooks, through each decoder run (the codec's own; the table decoder beside
    # a neural one), and the verdict from those counts: a change counts only beyond words_told_apart (section 5)
    by_decoder = [(f"{codec.decoder_kind} decoder", "")] + (
        [("table decoder", "table ")] if f"table k={k_hi}" in rows and f"table k={k4}" in rows else [])
    moves = [(name, rows[f"{pre}k={k4}"]["errors"], rows[f"{pre}k={k_hi}"]["errors"]) for name, pre in by_decoder
             if f"{pre}k={k4}" in rows and f"{pre}k={k_hi}" in rows and k4 != k_hi]
    past_k4_words = "" if not moves else (
        f"Word errors with {k4} codebooks and with {k_hi}, of {rows['original']['ref_words']} words: "
        + "; ".join(f"{a} and {b} through the {name} ({abs(b - a)} {'fewer' if b < a else 'more'})" if a != b
                    else f"{a} and {b} through the {name} (no change)" for name, a, b in moves)
        + ". "
        + ("Past the first {k4} codebooks the word errors do not change by more than this measure tells apart "
           "(|a − b| > 2√(a + b), section 5).".format(k4=k4) if not any(words_told_apart(a, b) for _, a, b in moves)
           else
           "The stages past the first {k4} each remove a sliver of the variance, ".format(k4=k4)
           + ("but together they carry detail the recogniser uses"
              + (" (through the " + " and the ".join(n for n, a, b in moves if b < a and words_told_apart(a, b))
                 + ")" if len(moves) > 1 else "") + "."
              if any(b < a and words_told_apart(a, b) for _, a, b in moves) else
              "and adding them made the recogniser's job harder here."))
        + (" The decoders differ here: what the deep codes are worth to a recogniser depends on the decoder "
           "that reads them." if len({words_told_apart(a, b) * (1 if b < a else -1) for _, a, b in moves}) > 1
           else ""))
    lines = [
        f"* **The corpus (measured here and read from the build's record).** The embedded model was trained on "
        f"{sum(r['hours'] for r in table if r['split'] == 'training'):.1f} hours of English rendered by "
        f"{len({v for r in table if r['split'] == 'training' for v in r['voices'].split(',')})} flite voices; "
        f"the trees of the later notebooks are calibrated on a split no training step saw, and acceptance and WER are "
        f"measured on held-out evaluation sentences.",
        f"* **What each codebook adds (measured here).** Stage 1 alone removes {1 - first['variance_left']:.1%} of the "
        f"frame vectors' variance: it picks the nearest of {cfg.codebook_size} typical frames, the frame's overall "
        f"spectral envelope, which is most of what varies between frames (silence or speech, which sound, how loud). "
        f"The first {k4} stages together leave {four['variance_left']:.1%}, all {last['k']} leave "
        f"{last['variance_left']:.2%}. The spectral distance of the "
        f"decoded frames falls from {rows[f'k={k_lo}']['feature_lsd_db']:.2f} dB with {k_lo} codebook"
        f"{'s' if k_lo > 1 else ''} to {rows[f'k={k_hi}']['feature_lsd_db']:.2f} dB with {k_hi}.",
        f"* **Why each deep stage adds little in this codec (measured here, against a bound).** Stages "
        f"{deep[0]['k']}..{deep[-1]['k']} each remove a median {deep_removed:.1%} of the variance still left; the most an "
        f"{bits:g}-bit stage can remove from a structureless {cfg.dim}-dimensional residual is {ref_removed:.1%}. "
        + ("The deep stages work at about that rate: in variance, what they quantise is close to noise around the "
           "envelope the first stages chose ("
           + ("the WER table above shows they still carry some detail a recogniser uses"
              if any(b < a and words_told_apart(a, b) for _, a, b in moves) else
              "whether they carry detail a recogniser uses, the WER table above cannot tell apart from its noise")
           + "). The codebooks are k-means fits to log-mel residuals, not to what a listener or a "
           f"recogniser uses, and one {bits:g}-bit choice spread over {cfg.dim} spectral values can only shave a "
           "sliver off a diffuse error."
           if deep_removed < 1.5 * ref_removed else
           "The deep stages still remove clearly more than that: their residual has structure left.")
        + f" The vocoder bounds what they could show anyway: the inversion of the unquantised features alone is "
          f"{rows['unquantised']['audio_lsd_db']:.2f} dB from the original.",
        f"* **Intelligibility (measured here, {quality['asr']}, {len(refs)} sentences, "
        f"{rows['original']['ref_words']} words).** WER is {wer['original']:.3f} on the original, "
        f"{wer['unquantised']:.3f} after the inversion only, and through the {codec.decoder_kind} decoder "
        + ", ".join(f"{wer[f'k={k}']:.3f} with {k}" for k in run_codebooks if k in (k_lo, k4, k_hi))
        + " codebooks. "
        + past_k4_words
        + f" With {rows['original']['ref_words']} words, differences smaller than that rule are within the noise "
          f"of the measure.",
        f"* **What to expect on the released 12 Hz codec (config, then inference).** Its configuration describes "
        f"another quantiser: {released_geometry['semantic_codebooks']} semantic codebook for code 0 and "
        f"{released_geometry['n_codebooks'] - released_geometry['semantic_codebooks']} acoustic stages of "
        f"{released_geometry['codebook_size']} entries over a {released_geometry['code_vector_dim']}-dimensional "
        f"learned latent, decoded by a transformer of {released_geometry['decoder_transformer_layers']} layers and "
        f"upsampling convolutions. *Inference, not measured:* because its stages are learned together with the decoder "
        f"that reads them, rather than fitted to log-mel residuals and inverted by Griffin-Lim, we expect its deep "
        f"stages to carry audible detail (timbre, breath, fine pitch structure) and its per-stage share to stay above "
        f"the structureless rate for longer than here; and because code 0 is a separate semantic codebook, we expect "
        f"more of the words to be fixed by code 0 alone than by this codec's first stage.",
        f"* **Inaudible changes move the deep codes (measured here).** Under {GATED[0]} "
        f"{rob[GATED[0]]['unchanged'][-1]:.0%} of the last codebook's codes (code "
        f"{len(rob[GATED[0]]['unchanged']) - 1}) stay the same against "
        f"{rob[GATED[0]]['unchanged'][0]:.0%} of code 0's, and {rob[GATED[0]]['all_unchanged']:.0%} of frames keep all "
        f"{len(rob[GATED[0]]['unchanged'])} codes: a deep code that flips under a change no one hears cannot be predicted "
        "sharply by any model. This notebook measures the codes, not p, the code predictor's distribution over a code "
        "(the target a draft is checked against, next bullet): that is a reason to expect p to be flat for "
        "the deep codes, which notebooks 03 and 04 measure.",
        "* **Why it matters for speculation (inference; notebooks 01, 03 and 04 measure it).** The inner loop drafts "
        "codes 1..15: a drafter guesses a later code from a draft distribution **q**, and the code predictor checks it "
        "against its own distribution for that code, the target **p**; TV(p, q) is their total-variation distance, "
        "half the summed absolute difference. A **point-mass** draft takes q's top code and is kept with probability "
        "p of that code; a **sampled** draft is drawn from q and kept with probability 1 − TV(p, q) "
        "([glossary](../docs/glossary.md#speculative-decoding), point-mass vs sampled children). "
        + ("Where the deep codes are close to noise, as the bound above says of this codec's, p for them is flat: a "
           "top-ranked draft is right only rarely, while a draft sampled from a similarly flat q can still be kept "
           "often. On the released codec, if its deep codes carry more structure, p is sharper and top-ranked drafts "
           "fare better."
           if deep_removed < 1.5 * ref_removed else
           "This codec's deep stages still remove clearly more than the structureless bound, so the bound alone does "
           "not say that p is flat for them; notebooks 03 and 04 measure how point-mass and sampled drafts fare."),
    ]
    display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Try this
#
# Change one parameter (the parameters cell at the top, or the cell named) and rerun:
#
# * **`codebooks = (1, 2, 4, 16)`** and **`n_sentences = 4`**: the WER curve by codebooks redraws in a minute; look at
#   where the WER stops falling, and compare that depth with notebook 03's acceptance by depth.
# * **`listen_codebooks = (1, 8, 16)`**: listen to section 3's players, one per k, and name the first k at which you stop
#   hearing a difference.
# * **`voices = ("awb",)`**: one voice instead of four; compare the codec's quality table with the committed one to
#   see how much of it is the voice.
