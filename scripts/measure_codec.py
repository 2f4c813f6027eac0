"""Measure the offline RVQ codec: render a corpus, fit a codec, WER of original vs resynthesised speech.

    nice -n 19 .venv/bin/python scripts/measure_codec.py                       # the full run (about 15 min, 1 core)
    nice -n 19 .venv/bin/python scripts/measure_codec.py --n-train 40 --n-eval 5 --codebook-size 64 --out build/smoke

Steps (all seeded):
  1. gather English sentences (recipes.embedded.corpus.gather_sentences), take ``--n-train`` of the ``training`` split
     and ``--n-eval`` of the shipped ``evaluation`` split (data/eval_texts/en_evaluation.tsv);
  2. render both with ``--voice`` (flite slt) to 24 kHz;
  3. fit an ``--n-codebooks`` x ``--codebook-size`` RVQCodec on the training audio; save it;
  4. for every evaluation utterance: the original audio, Griffin-Lim of the UNQUANTISED features (what the
     vocoder alone costs), and the codec resynthesis with the first k = 1, 2, 4, 8, 16 codebooks;
  5. WER of each condition with PocketSphinx, default LM (open vocabulary) and prompt-bigram LM (PROMPT-INFORMED:
     an LM built from the evaluation texts, near 0 on clean speech; it measures intelligibility given the text).

Writes ``<out>/measure_codec.json`` (figures, timings, provenance), ``<out>/codec.safetensors``, the corpus under
``<out>/corpus`` and a few example wavs under ``<out>/examples``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_json  # noqa: E402
from recipes.embedded import corpus  # noqa: E402
from rvqspec_lib.data import voices
from recipes.embedded.codec_fit import fit_codec  # noqa: E402
from rvqspec_lib.eval import asr as asr_mod  # noqa: E402
from rvqspec_lib.models.audio import load_wav


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/measure_codec")
    ap.add_argument("--voice", default="slt")
    ap.add_argument("--n-train", type=int, default=1500, help="training sentences rendered for the codec fit")
    ap.add_argument("--n-eval", type=int, default=40, help="held-out evaluation sentences")
    ap.add_argument("--n-codebooks", type=int, default=16)
    ap.add_argument("--codebook-size", type=int, default=2048)
    ap.add_argument("--max-vectors", type=int, default=60_000)
    ap.add_argument("--n-iter", type=int, default=10)
    ap.add_argument("--stages", default="1,2,4,8,16", help="codebook counts to resynthesise with")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=2, help="synthesiser processes while rendering")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = resolve_out_dir(args.out)
    result: dict = {"params": vars(args), "timings_s": {}}
    t_all = time.perf_counter()

    # 1. text
    t0 = time.perf_counter()
    sents = corpus.gather_sentences(multilingual=False)
    train_pool = [s for s in sents if s.split == "training"]
    train = random.Random(args.seed).sample(train_pool, min(args.n_train, len(train_pool)))
    eval_pool = voices.shipped_sentences("evaluation", language="en")
    evals = random.Random(args.seed + 1).sample(eval_pool, min(args.n_eval, len(eval_pool)))
    assert not {voices.sentence_key(s.text) for s in train} & {voices.sentence_key(s.text) for s in evals}
    result["timings_s"]["gather"] = time.perf_counter() - t0
    result["sentences"] = {"gathered": len(sents), "training_pool": len(train_pool), "train": len(train),
                           "eval": len(evals)}

    # 2. audio
    t0 = time.perf_counter()
    rows = voices.render_corpus(train + evals, out / "corpus", voices=[args.voice], processes=args.processes)
    result["timings_s"]["render"] = time.perf_counter() - t0
    result["corpus_table"] = corpus.corpus_table(rows)
    by_key = {voices.sentence_key(r["text"]): r for r in corpus.read_manifest(out / "corpus")}
    train_paths = [by_key[voices.sentence_key(s.text)]["path"] for s in train]
    eval_rows = [by_key[voices.sentence_key(s.text)] for s in evals]
    result["hours_rendered"] = sum(r["seconds"] for r in rows) / 3600
    result["hours_train"] = sum(by_key[voices.sentence_key(s.text)]["seconds"] for s in train) / 3600
    print(f"rendered {result['hours_rendered']:.2f} h in {result['timings_s']['render']:.0f} s", flush=True)

    # 3. codec
    t0 = time.perf_counter()
    codec = fit_codec(train_paths, n_codebooks=args.n_codebooks, codebook_size=args.codebook_size,
                         max_vectors=args.max_vectors, n_iter=args.n_iter, seed=args.seed, progress=True)
    result["timings_s"]["fit"] = time.perf_counter() - t0
    codec.save(out / "codec.safetensors")
    print(f"fitted {args.n_codebooks} x {args.codebook_size} in {result['timings_s']['fit']:.0f} s", flush=True)

    # 4. conditions
    stages = [k for k in (int(x) for x in args.stages.split(",")) if k <= args.n_codebooks]
    conditions = ["original", "griffin-lim (unquantised)"] + [f"rvq k={k}" for k in stages]
    audio: dict[str, list[np.ndarray]] = {c: [] for c in conditions}
    t_enc = t_dec = 0.0
    feat_err = {k: [] for k in stages}
    (out / "examples").mkdir(exist_ok=True)
    for i, r in enumerate(eval_rows):
        wav = load_wav(r["path"])
        audio["original"].append(wav)
        feats = codec.features(wav)
        audio["griffin-lim (unquantised)"].append(codec.vectors_to_audio(feats)[: wav.size])
        t1 = time.perf_counter()
        codes = codec.encode(wav)
        t_enc += time.perf_counter() - t1
        for k in stages:
            v = codec.dequantize(codes, k)
            feat_err[k].append(float(((v - feats) ** 2).mean()))
            t1 = time.perf_counter()
            y = codec.vectors_to_audio(v)[: wav.size]
            t_dec += time.perf_counter() - t1
            audio[f"rvq k={k}"].append(y)
        if i < 3:
            for c in conditions:
                sf.write(out / "examples" / f"{i}-{c.replace(' ', '_').replace('(', '').replace(')', '')}.wav",
                         audio[c][-1], 24000)
    eval_seconds = sum(r["seconds"] for r in eval_rows)
    result["timings_s"]["encode_per_audio_s"] = t_enc / eval_seconds
    result["timings_s"]["decode_per_audio_s"] = t_dec / (eval_seconds * len(stages))
    result["feature_mse_by_k"] = {k: float(np.mean(v)) for k, v in feat_err.items()}

    # 5. WER
    refs = [r["text"] for r in eval_rows]
    recognisers = {"default-lm": asr_mod.PocketSphinxASR(),
                   "prompt-informed-bigram-lm": asr_mod.PocketSphinxASR.from_texts(refs, workdir=out / "lm")}
    result["wer"] = {}
    t0 = time.perf_counter()
    for lm_name, rec in recognisers.items():
        result["wer"][lm_name] = {}
        for c in conditions:
            hyps = [rec.transcribe(w, 24000) for w in audio[c]]
            er = asr_mod.wer(refs, hyps)
            result["wer"][lm_name][c] = {**er.summary(), "examples": er.utterances[:3]}
            print(f"{lm_name:17s} {c:26s} WER {er.rate:.3f} (without {len(er.outliers)} outliers "
                  f"{er.rate_without_outliers:.3f})", flush=True)
    result["timings_s"]["asr"] = time.perf_counter() - t0
    result["timings_s"]["total"] = time.perf_counter() - t_all
    prov = provenance(params=vars(args), seed=args.seed)
    prov["hardware_note"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads " \
                            f"{torch.get_num_threads()}, nice {os.nice(0)}"
    path = save_json(result, out / "measure_codec.json", prov)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
