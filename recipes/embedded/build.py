"""Build the embedded model from scratch: texts -> audio -> codec -> codes -> training -> evaluation -> model dir.

    nice -n 19 .venv/bin/python -m recipes.embedded.build --scale smoke --out build/embedded-smoke   # < 3 min
    nice -n 19 .venv/bin/python -m recipes.embedded.build --scale full                              # about 3.8 h, CPU

Every stage skips when its output exists, so an interrupted run resumes where it stopped (``--redo STAGE,...``
reruns stages; a stage's output is written under its final name only when complete). Stages and outputs
(``--work`` holds the bulky intermediates, ``--out`` the deliverable):

  1. texts   <work>/texts.tsv          English sentences (rvqspec_lib.corpus): ``--n-train`` of the ``training``
                                        split and ``--n-val`` of ``validation`` from ``--sources``, ``--n-eval`` of
                                        the shipped held-out ``evaluation`` sentences (data/eval_texts)
  2. render  <work>/corpus/manifest.jsonl   each sentence with one of ``--voices`` (24 kHz wav)
  3. codec   <out>/codec.safetensors   RVQCodec (``--n-codebooks`` x ``--codebook-size``) fitted on training audio
  4. codes   <work>/codes.safetensors  every utterance encoded
  4b. ship   <out>/utterances.safetensors + utterances.jsonl   the codes and texts that ship with the model (a
                                        seeded ``--ship-train`` of the training split, all validation and evaluation
                                        utterances): drafter training and acceptance notebooks run on them offline
  5. train   <work>/train/model.safetensors   recipes.embedded.train.train (``--minutes`` or ``--steps``); curve.json
  5b. cp     <work>/cp/model.safetensors      the code predictor alone on the frozen talker's teacher-forced states
                                        of every training frame (recipes.embedded.train.train_code_predictor,
                                        ``--cp-minutes`` or ``--cp-steps``; ``--cp-steps 0`` skips it); cp_curve.json
  6. model   <out>/model/              the checkpoint (``load_model(<out>/model)``) + a copy of the codec
  6b. decoder <out>/codec.decoder.safetensors   the neural code decoder (rvqspec_lib.code_decoder) trained on the
                                        true and the inner-loop codes of ``--decoder-n-train`` training utterances
                                        (``--decoder-minutes`` or ``--decoder-steps``; ``--decoder-steps 0`` skips
                                        it and the codec decodes by table); pairs cached in <work>/decoder/
  7. eval    <out>/eval.json           held-out WER of original / codec / inner loop only / free running
                                        (PocketSphinx, default LM), free-running utterances that never ended,
                                        train vs held-out teacher-forced accuracies
  8. card    <out>/MODEL_CARD.md (also copied into <out>/model/)

Presets (``--scale``; any flag given explicitly wins):

* ``smoke``: 34 + 4 + 2 sentences from the standard-library docstrings, flite slt, a 16 x 32 codec, a 1 x 64 / 1 x 32
  model, 40 steps: under 3 minutes on one core (the test suite runs it).
* ``full``: the documented CPU recipe (about 3.8 h on 2 cores, one torch thread; figures in brackets measured on
  2026-11-30 on a 2-core AMD EPYC that other jobs shared, so an idle machine is faster):
  15,000 training sentences (fortunes + stdlib + /usr/share/doc, all gathered offline) rendered with the four flite
  English voices (15.0 h of audio, 598 s); a 16 x 2048 codec (the real tokenizer's geometry) fitted on 60k vectors
  (812 s); encoding 15,300 utterances (682,855 frames, 46 min with the other core busy); shipping 1,800 utterances'
  codes (2.7 MB); the 4 x 256 talker / 5 x 256 code predictor (docs/offline.md#template-sentences) trained 35 minutes at batch 16 with
  cp_fraction 1/8 (0.60 steps/s: 1,236 steps, 1.3 epochs) on espeak-ng phonemes; weights stored in float16 (47 MB),
  the codec in float16 (21 MB); then the code predictor alone for 50 minutes on the talker states of all 669,804
  training frames (256 frames a step); the neural code decoder: features and inner-loop codes of 3,000 training
  utterances (132,746 frames, about 11 min) then 20 minutes of training (1,908 steps of 32 x 64 frames, 6 MB in
  float16); evaluation on 100 held-out sentences with the inner-loop diagnostics and the table decoder beside the
  neural one (the stages' times are in eval.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for a run without the install

from recipes.embedded import corpus  # noqa: E402

from rvqspec_lib.data import voices
from recipes.embedded.codes import encode_manifest  # noqa: E402
from recipes.embedded.model_card import model_card  # noqa: E402
from recipes.embedded.codes import inner_loop_codes  # noqa: E402
from rvqspec_lib.common.files import json_text  # noqa: E402
from rvqspec_lib.eval.inner_loop import codes_to_audio, free_running_codes, score_conditions  # noqa: E402
from rvqspec_lib.data.utterances import (  # noqa: E402
    load_codes,
    save_codes,
    utterances_from_manifest,
    write_shipped_utterances,
)

def calibration_sentences(n: int, seed: int) -> list:
    """The calibration split (tree calibration, notebook 04): a seeded sample of ``data/eval_texts/en_calibration.tsv``
    (scripts/ship_calibration.py adds the same sentences to an existing build)."""
    pool = voices.shipped_sentences("calibration", language="en")
    return random.Random(seed + 3).sample(pool, min(n, len(pool)))


STAGES = ("texts", "render", "codec", "codes", "ship", "train", "cp", "model", "decoder", "eval", "card")

PRESETS = {
    "smoke": dict(sources="stdlib", max_source_files=80, n_train=34, n_val=4, n_eval=2, n_calib=2, voices="slt",
                  n_codebooks=16, codebook_size=32, max_vectors=20_000, kmeans_iters=5,
                  talker_layers=1, talker_hidden=64, cp_layers=1, cp_hidden=32, n_heads=2, n_kv_heads=1,
                  head_dim=32, text_hidden=64, frontend="phonemes", steps=40, minutes=None, batch_size=8, lr=3e-3,
                  warmup_steps=5, cp_fraction=0.5, eval_every=0, max_frames=80, processes=2, ship_train=30,
                  cp_steps=5, cp_minutes=None, cp_batch_frames=64, cp_lr=1e-3, cp_eval_every=0,
                  decoder_n_train=20, decoder_steps=6, decoder_minutes=None, decoder_eval_every=3),
    "full": dict(sources="fortunes,stdlib,doc", max_source_files=None, n_train=15_000, n_val=200, n_eval=100, n_calib=100,
                 voices="slt,kal16,awb,rms", n_codebooks=16, codebook_size=2048, max_vectors=60_000,
                 kmeans_iters=10, talker_layers=4, talker_hidden=256, cp_layers=5, cp_hidden=256, n_heads=4,
                 n_kv_heads=2, head_dim=64, text_hidden=256, frontend="phonemes", steps=None, minutes=35.0,
                 batch_size=16, lr=1e-3, warmup_steps=100, cp_fraction=0.125, eval_every=500, max_frames=300,
                 processes=2, ship_train=1500,
                 cp_steps=None, cp_minutes=50.0, cp_batch_frames=256, cp_lr=5e-4, cp_eval_every=300,
                 decoder_n_train=3000, decoder_steps=None, decoder_minutes=20.0, decoder_eval_every=200),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", default=None, help="deliverable dir (default data/embedded; smoke: build/embedded-smoke)")
    ap.add_argument("--work", default=None, help="intermediates (default <out>/work for smoke, build/embedded for "
                                                 "full)")
    ap.add_argument("--redo", default="", help=f"comma-separated stages to rerun ({','.join(STAGES)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    g = ap.add_argument_group("preset overrides")
    g.add_argument("--sources", help="text sources: fortunes,stdlib,doc")
    g.add_argument("--max-source-files", type=int)
    g.add_argument("--n-train", type=int)
    g.add_argument("--n-val", type=int)
    g.add_argument("--n-eval", type=int)
    g.add_argument("--n-calib", type=int, help="calibration sentences (tree calibration, notebook 04)")
    g.add_argument("--voices", help=f"comma-separated English voices of {sorted(voices.VOICES)}")
    g.add_argument("--processes", type=int, help="synthesiser processes")
    g.add_argument("--n-codebooks", type=int)
    g.add_argument("--codebook-size", type=int)
    g.add_argument("--max-vectors", type=int)
    g.add_argument("--kmeans-iters", type=int)
    for name in ("talker-layers", "talker-hidden", "cp-layers", "cp-hidden", "n-heads", "n-kv-heads", "head-dim",
                 "text-hidden"):
        g.add_argument(f"--{name}", type=int)
    g.add_argument("--frontend", choices=["bytes", "phonemes"])
    g.add_argument("--steps", type=int, help="training budget in steps (clears --minutes)")
    g.add_argument("--minutes", type=float, help="training budget in minutes (clears --steps)")
    g.add_argument("--batch-size", type=int)
    g.add_argument("--lr", type=float)
    g.add_argument("--warmup-steps", type=int)
    g.add_argument("--cp-fraction", type=float)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--max-frames", type=int, help="free-running frame cap")
    g.add_argument("--ship-train", type=int, help="training utterances whose codes ship under <out> (drafters)")
    g.add_argument("--cp-steps", type=int, help="code-predictor stage budget in steps (clears --cp-minutes; 0 skips "
                                                "the stage)")
    g.add_argument("--cp-minutes", type=float, help="code-predictor stage budget in minutes (clears --cp-steps)")
    g.add_argument("--cp-batch-frames", type=int, help="frames per code-predictor step")
    g.add_argument("--cp-lr", type=float, help="code-predictor stage peak learning rate")
    g.add_argument("--cp-eval-every", type=int, help="code-predictor steps between validation evaluations")
    g.add_argument("--decoder-n-train", type=int, help="training utterances the neural code decoder learns from")
    g.add_argument("--decoder-steps", type=int, help="code-decoder budget in steps (clears --decoder-minutes; 0 "
                                                     "skips the stage: the codec decodes by table)")
    g.add_argument("--decoder-minutes", type=float, help="code-decoder budget in minutes (clears --decoder-steps)")
    g.add_argument("--decoder-eval-every", type=int, help="code-decoder steps between validation evaluations")
    args = ap.parse_args(argv)
    preset = dict(PRESETS[args.scale])
    if args.decoder_steps is not None:
        preset["decoder_minutes"] = None
    if args.decoder_minutes is not None:
        preset["decoder_steps"] = None
    if args.steps is not None:
        preset["minutes"] = None
    if args.minutes is not None:
        preset["steps"] = None
    if args.cp_steps is not None:
        preset["cp_minutes"] = None
    if args.cp_minutes is not None:
        preset["cp_steps"] = None
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.out is None:
        args.out = "data/embedded" if args.scale == "full" else "build/embedded-smoke"
    if args.work is None:
        args.work = "build/embedded" if args.scale == "full" else str(Path(args.out) / "work")
    args.redo = {s for s in args.redo.split(",") if s}
    if args.redo - set(STAGES):
        ap.error(f"unknown stage(s) {sorted(args.redo - set(STAGES))}: choose from {','.join(STAGES)}")
    return args


class Builder:
    """The stages; each returns quickly when its output exists (unless named in ``--redo``)."""

    def __init__(self, args):
        from rvqspec_lib.common.provenance import resolve_out_dir

        self.a = args
        self.out = resolve_out_dir(args.out)
        self.work = resolve_out_dir(args.work)
        self.progress = not args.quiet
        self.voices = [v for v in args.voices.split(",") if v]
        self.timings: dict[str, float] = {}
        self.skipped: set[str] = set()
        self.t0 = time.perf_counter()

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {msg}", flush=True)

    def done(self, stage: str, path: Path) -> bool:
        if path.exists() and stage not in self.a.redo:
            self.log(f"{stage}: exists, skipped ({path})")
            self.skipped.add(stage)
            return True
        return False

    def timed(self, stage: str, fn):
        t = time.perf_counter()
        r = fn()
        if stage in self.skipped:
            return r
        self.timings[stage] = round(time.perf_counter() - t, 2)
        tp = self.work / "timings.json"
        old = json.loads(tp.read_text()) if tp.is_file() else {}
        tp.write_text(json_text({**old, **self.timings}))
        return r

    # ------------------------------------------------------------------ 1. texts
    def texts(self) -> Path:
        p = self.work / "texts.tsv"
        if self.done("texts", p):
            return p
        a = self.a
        sources = [s for s in a.sources.split(",") if s]
        pool: list[voices.Sentence] = []
        for name in sources:
            if name == "fortunes":
                pool += corpus.fortune_sentences()
            elif name == "stdlib":
                pool += corpus.stdlib_sentences(max_files=a.max_source_files)
            elif name == "doc":
                pool += corpus.doc_sentences(max_files=a.max_source_files)
            else:
                raise SystemExit(f"unknown source {name!r}: choose from fortunes, stdlib, doc")
        pool = corpus.dedupe(pool)
        rng = random.Random(a.seed)
        by_split = corpus.assign_splits(pool)
        train = rng.sample(by_split["training"], min(a.n_train, len(by_split["training"])))
        val = rng.sample(by_split["validation"], min(a.n_val, len(by_split["validation"])))
        evals = voices.shipped_sentences("evaluation", language="en")
        evals = random.Random(a.seed + 1).sample(evals, min(a.n_eval, len(evals)))
        calib = calibration_sentences(a.n_calib, a.seed)
        keys = {voices.sentence_key(s.text) for s in train}
        assert not keys & {voices.sentence_key(s.text) for s in evals + val + calib}, "held-out sentence in training"
        corpus.save_sentences(train + val + calib + evals, p.with_suffix(".tmp"))
        os.replace(p.with_suffix(".tmp"), p)
        self.log(f"texts: {len(train)} training, {len(val)} validation, {len(calib)} calibration, {len(evals)} "
                 f"evaluation sentences (pool {len(pool)} from {','.join(sources)})")
        return p

    # ------------------------------------------------------------------ 2. render
    def render(self) -> Path:
        p = self.work / "corpus" / "manifest.jsonl"
        if self.done("render", p):
            return p
        sents = voices.load_sentences(self.work / "texts.tsv")
        rows = voices.render_corpus(sents, self.work / "corpus", voices=self.voices, one_voice_each=True,
                                    processes=self.a.processes, progress=self.progress)
        hours = sum(r["seconds"] for r in rows) / 3600
        self.log(f"render: {len(rows)} utterances, {hours:.3f} h with {','.join(self.voices)}")
        return p

    def rows(self) -> list[dict]:
        return corpus.read_manifest(self.work / "corpus")

    # ------------------------------------------------------------------ 3. codec
    def codec(self) -> Path:
        from recipes.embedded.codec_fit import fit_codec

        p = self.out / "codec.safetensors"
        if self.done("codec", p):
            return p
        a = self.a
        paths = [r["path"] for r in self.rows() if r["split"] == "training"]
        codec = fit_codec(paths, n_codebooks=a.n_codebooks, codebook_size=a.codebook_size,
                             max_vectors=a.max_vectors, n_iter=a.kmeans_iters, seed=a.seed, progress=self.progress)
        tmp = codec.save(self.work / "codec.tmp.safetensors")
        shutil.move(str(tmp.with_suffix(".json")), str(p.with_suffix(".json")))
        os.replace(tmp, p)
        self.log(f"codec: {a.n_codebooks} x {a.codebook_size} fitted on {len(paths)} training utterances")
        return p

    # ------------------------------------------------------------------ 4. codes
    def codes(self) -> Path:
        from rvqspec_lib.models.rvq_codec import RVQCodec

        p = self.work / "codes.safetensors"
        if self.done("codes", p):
            return p
        codes = encode_manifest(self.rows(), RVQCodec.load(self.out / "codec.safetensors"), progress=self.progress)
        save_codes(codes, p)
        self.log(f"codes: {len(codes)} utterances, {sum(len(c) for c in codes.values())} frames")
        return p

    # ------------------------------------------------------------------ 4b. ship
    def ship(self) -> Path:
        p = self.out / "utterances.safetensors"
        if self.done("ship", p):
            return p
        rows = self.rows()
        codes = load_codes(self.work / "codes.safetensors")
        rows = [r for r in rows if r["id"] in codes and len(codes[r["id"]])]
        train = [r for r in rows if r["split"] == "training"]
        keep = random.Random(self.a.seed + 2).sample(train, min(self.a.ship_train, len(train)))
        keep += [r for r in rows if r["split"] != "training"]
        write_shipped_utterances(keep, codes, p)
        self.log(f"ship: {len(keep)} utterances' codes and texts -> {p.name} + {p.with_suffix('.jsonl').name}")
        return p

    # ------------------------------------------------------------------ 5. train
    def build_lm(self):
        from recipes.embedded.train import small_config_dict
        from rvqspec_lib.models.configs import build_from_config
        from rvqspec_lib.models.frontend import PhonemeTokenizer
        from rvqspec_lib.models.loader import LoadedModel
        from rvqspec_lib.models.rvq_codec import RVQCodec
        from rvqspec_lib.models.frontend import ByteTokenizer

        a = self.a
        cc = RVQCodec.load(self.out / "codec.safetensors").config
        cfg = small_config_dict(talker_layers=a.talker_layers, talker_hidden=a.talker_hidden,
                                code_predictor_layers=a.cp_layers, code_predictor_hidden=a.cp_hidden,
                                n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
                                text_hidden=a.text_hidden, speakers=self.voices, n_code_groups=cc.n_codebooks,
                                codebook_size=cc.codebook_size)
        ids = (cfg["im_start_token_id"], cfg["im_end_token_id"], cfg["assistant_token_id"])
        tok = PhonemeTokenizer(*ids, voice="en-us") if a.frontend == "phonemes" else ByteTokenizer(*ids)
        return LoadedModel(f"embedded-{a.scale}", "checkpoint", build_from_config(cfg, seed=a.seed), tok)

    def utterances(self, splits):
        return utterances_from_manifest(self.rows(), load_codes(self.work / "codes.safetensors"), splits=splits)

    def train(self) -> Path:
        from recipes.embedded.train import train

        p = self.work / "train" / "model.safetensors"
        if self.done("train", p):
            return p
        a = self.a
        lm = self.build_lm()
        data, val = self.utterances(["training"]), self.utterances(["validation"])
        budget = f"{a.steps} steps" if a.steps is not None else f"{a.minutes} min"
        self.log(f"train: {len(data)} utterances ({len(val)} validation), {budget}, batch {a.batch_size}")
        r = train(lm, data, val_dataset=val or None, steps=a.steps, minutes=a.minutes, lr=a.lr,
                  batch_size=a.batch_size, cp_fraction=a.cp_fraction, seed=a.seed, eval_every=a.eval_every,
                  warmup_steps=a.warmup_steps, out_dir=self.work / "train", progress=self.progress)
        last = r["curve"][-1]
        self.log(f"train: {r['steps']} steps in {r['wall_s']:.0f} s ({r['steps_per_s']:.2f} steps/s); "
                 f"train code-0 acc {last['train_code0_acc']:.3f}"
                 + (f", validation {last['val_code0_acc']:.3f}" if val else ""))
        return p

    # ------------------------------------------------------------------ 5b. code predictor alone
    def cp_enabled(self) -> bool:
        return bool(self.a.cp_steps) or bool(self.a.cp_minutes)

    def trained_dir(self) -> Path:
        """The checkpoint the model stage ships: after the code-predictor stage when it runs, else the joint one."""
        return self.work / ("cp" if self.cp_enabled() else "train")

    def cp(self) -> Path | None:
        from recipes.embedded.train import (
            code_predictor_states,
            train_code_predictor,
        )
        from rvqspec_lib.models.loader import load_model, save_checkpoint

        if not self.cp_enabled():
            self.log("cp: no budget (--cp-steps 0), the jointly trained code predictor ships")
            self.skipped.add("cp")
            return None
        p = self.work / "cp" / "model.safetensors"
        if self.done("cp", p):
            return p
        a = self.a
        lm = load_model(str(self.work / "train"))
        data, val = self.utterances(["training"]), self.utterances(["validation"])
        self.log(f"cp: talker states of {len(data)} training and {len(val)} validation utterances")
        tr_states = code_predictor_states(lm, data, batch_size=a.batch_size, progress=self.progress)
        val_states = code_predictor_states(lm, val, batch_size=a.batch_size, progress=self.progress) if val else None
        budget = f"{a.cp_steps} steps" if a.cp_steps else f"{a.cp_minutes} min"
        self.log(f"cp: {len(tr_states)} frames, {budget}, {a.cp_batch_frames} frames a step")
        tmp = self.work / "cp.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        r = train_code_predictor(lm, tr_states, val_states, steps=a.cp_steps or None, minutes=a.cp_minutes,
                                 lr=a.cp_lr, batch_frames=a.cp_batch_frames, eval_every=a.cp_eval_every,
                                 seed=a.seed, out_dir=tmp, progress=self.progress)
        marker = json.loads((self.work / "train" / "rvqspec_model.json").read_text())
        cp_meta = json.loads((tmp / "cp_curve.json").read_text())["meta"]
        save_checkpoint(lm, tmp, extra={**marker.get("training", {}), "code_predictor_stage": cp_meta})
        shutil.copy2(self.work / "train" / "curve.json", tmp / "curve.json")  # the joint stage's curve
        shutil.rmtree(self.work / "cp", ignore_errors=True)
        os.replace(tmp, self.work / "cp")
        best = r["best"] or {}
        self.log(f"cp: {r['steps']} steps, {r['frames_seen']} frames in {r['wall_s']:.0f} s; kept step "
                 f"{r['best_step']}" + (f", validation code 1..15 accuracy {best['cp_acc']:.3f}" if best else ""))
        return p

    # ------------------------------------------------------------------ 6. model dir
    def model(self) -> Path:
        from rvqspec_lib.models.rvq_codec import RVQCodec

        d = self.out / "model"
        if self.done("model", d / "rvqspec_model.json"):
            return d
        src = self.trained_dir()
        tmp = self.out / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in ("config.json", "generation_config.json", "curve.json", "cp_curve.json"):
            if (src / f).is_file():
                shutil.copy2(src / f, tmp / f)
        # shipped in float16 (half the bytes; the repository stays lean); evaluated below as shipped, loaded in fp32
        from safetensors.torch import load_file, save_file

        w = load_file(str(src / "model.safetensors"))
        save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in w.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt", "stored_dtype": "float16"})
        # the codec ships once, beside model/, in float16 (half of 16 x 2048 x 320 float32); the marker points at it
        RVQCodec.load(self.out / "codec.safetensors").save(self.out / "codec.safetensors", dtype=torch.float16)
        marker = json.loads((src / "rvqspec_model.json").read_text())
        marker["languages"] = ["english"]  # trained on English only: --language german etc. are refused
        marker["codec"] = "../codec.safetensors"  # relative to the model folder
        # the marker last: it means complete
        (tmp / "rvqspec_model.json").write_text(json_text(marker) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
        self.log(f"model: {d}")
        return d

    # ------------------------------------------------------------------ 6b. decoder
    def decoder_enabled(self) -> bool:
        return bool(self.a.decoder_steps) or bool(self.a.decoder_minutes)

    def decoder(self) -> Path | None:
        """The neural code decoder (rvqspec_lib.code_decoder) trained on true and inner-loop codes of
        ``--decoder-n-train`` training utterances -> <out>/codec.decoder.safetensors (RVQCodec.load attaches it)."""
        from recipes.embedded.code_decoder_training import (
            DecoderPairs,
            decoder_pairs,
            decoder_rows,
            train_code_decoder,
        )
        from rvqspec_lib.models.loader import load_model
        from rvqspec_lib.models.rvq_codec import RVQCodec, decoder_file

        p = decoder_file(self.out / "codec.safetensors")
        if not self.decoder_enabled():
            self.log("decoder: no budget (--decoder-steps 0), the codec decodes by table")
            self.skipped.add("decoder")
            return None
        if self.done("decoder", p):
            return p
        a = self.a
        codec = RVQCodec.load(self.out / "codec.safetensors", decoder="table")  # as shipped (float16 tables)
        lm = load_model(str(self.out / "model"))
        codes = load_codes(self.work / "codes.safetensors")
        tr_rows, va_rows = decoder_rows(self.rows(), a.decoder_n_train, seed=a.seed)
        pairs = {}
        for name, rows, seed in (("val", va_rows, a.seed + 1), ("train", tr_rows, a.seed)):
            f = self.work / "decoder" / f"pairs_{name}.safetensors"  # the inner-loop codes are the slow part: kept
            kept = DecoderPairs.load(f) if f.is_file() and "decoder" not in a.redo else None
            if kept is None or kept.ids != [r["id"] for r in rows]:
                self.log(f"decoder: features and inner-loop codes of {len(rows)} {name} utterances")
                kept = decoder_pairs(lm, codec, rows, codes, generator=torch.Generator().manual_seed(seed),
                                     progress=self.progress)
                kept.save(f)
            pairs[name] = kept
        budget = f"{a.decoder_steps} steps" if a.decoder_steps else f"{a.decoder_minutes} min"
        self.log(f"decoder: training on {len(pairs['train'])} utterances, {budget}")
        dec, log = train_code_decoder(codec.codebooks, pairs["train"], pairs["val"], steps=a.decoder_steps or None,
                                      minutes=a.decoder_minutes, eval_every=a.decoder_eval_every, seed=a.seed,
                                      progress=self.progress)
        (self.work / "decoder" / "curve.json").write_text(json_text(log) + "\n")
        dec.save(p, meta=log["meta"], dtype=torch.float16)  # stored like the model and the codec; eval uses it
        last = log["curve"][-1]
        self.log(f"decoder: {log['meta']['steps']} steps, kept {log['meta']['best_step']}; validation L1 true codes "
                 f"{last['val_true_l1']:.3f} (table {last['val_table_l1']:.3f}), inner-loop codes "
                 f"{last['val_generated_l1']:.3f}")
        return p

    def decoder_summary(self) -> dict | None:
        f = self.work / "decoder" / "curve.json"
        if not self.decoder_enabled() or not f.is_file():
            return None
        return json.loads(f.read_text())

    # ------------------------------------------------------------------ 7. eval
    def eval(self) -> Path:
        from rvqspec_lib.common.provenance import provenance, save_json
        from recipes.embedded.train import (
            code_predictor_metrics,
            code_predictor_states,
            evaluate,
        )
        from rvqspec_lib.eval.asr import PocketSphinxASR
        from rvqspec_lib.models.audio import load_wav
        from rvqspec_lib.models.loader import load_model
        from rvqspec_lib.models.rvq_codec import RVQCodec
        from rvqspec_lib.decoding.sampling import Sampling

        p = self.out / "eval.json"
        if self.done("eval", p):
            return p
        a = self.a
        codec = RVQCodec.load(self.out / "codec.safetensors")  # with the neural code decoder when the stage ran
        table = codec.with_decoder(None)
        lm = load_model(str(self.out / "model"))
        rows = self.rows()
        codes = load_codes(self.work / "codes.safetensors")
        ev_rows = [r for r in rows if r["split"] == "evaluation" and r["id"] in codes]
        ev = utterances_from_manifest(ev_rows, codes)
        tr = self.utterances(["training"])[:64]
        refs = [r["text"] for r in ev_rows]
        self.log(f"eval: {len(ev)} held-out utterances")
        acc = {"train": evaluate(lm, tr, batch_size=a.batch_size), "held_out": evaluate(lm, ev, batch_size=a.batch_size)}
        gen = torch.Generator().manual_seed(a.seed)
        audio = {"original": [], "codec": [], "inner_loop": [], "free_running": []}
        from tqdm.auto import tqdm

        # diagnostics: where the inner loop loses intelligibility (same sentences, same ASR), reported apart
        diag = {"codec_1_codebook": [], "codec_4_codebooks": [], "inner_loop_4_codebooks": [], "inner_loop_greedy": []}
        if codec.decoder_kind != "table":  # the same codes through the table decoder (sum of centroids)
            diag.update({"codec_table_decoder": [], "inner_loop_table_decoder": [], "free_running_table_decoder": []})
        k4 = min(4, codec.config.n_codebooks)
        for r, u in tqdm(list(zip(ev_rows, ev)), desc="inner loop", unit="utt", disable=not self.progress):
            wav = load_wav(r["path"])
            audio["original"].append(wav)
            audio["codec"].append(codes_to_audio(codec, u.codes.numpy())[: wav.size])
            inner = inner_loop_codes(lm, u, generator=gen).numpy()
            audio["inner_loop"].append(codes_to_audio(codec, inner))
            diag["codec_1_codebook"].append(codec.decode(u.codes.numpy(), n_codebooks=1)[: wav.size])
            diag["codec_4_codebooks"].append(codec.decode(u.codes.numpy(), n_codebooks=k4)[: wav.size])
            diag["inner_loop_4_codebooks"].append(codec.decode(inner, n_codebooks=k4))
            greedy = inner_loop_codes(lm, u, sampling=Sampling(greedy=True)).numpy()
            diag["inner_loop_greedy"].append(codes_to_audio(codec, greedy))
            if "codec_table_decoder" in diag:
                diag["codec_table_decoder"].append(codes_to_audio(table, u.codes.numpy())[: wav.size])
                diag["inner_loop_table_decoder"].append(codes_to_audio(table, inner))
        fr = free_running_codes(lm, ev, max_frames=a.max_frames, seed=a.seed, progress=self.progress)
        audio["free_running"] = [codes_to_audio(codec, f["codes"].numpy()) for f in fr]
        if "free_running_table_decoder" in diag:
            diag["free_running_table_decoder"] = [codes_to_audio(table, f["codes"].numpy()) for f in fr]
        asr = PocketSphinxASR()
        scores = score_conditions(audio, refs, asr, progress=self.progress)
        diag_scores = score_conditions(diag, refs, asr, progress=self.progress)
        cp_held_out = code_predictor_metrics(lm, code_predictor_states(lm, ev, batch_size=a.batch_size,
                                                                       progress=False))
        t = json.loads((self.work / "train" / "curve.json").read_text())["meta"]
        desc = lm.describe()
        marker = json.loads((self.out / "model" / "rvqspec_model.json").read_text())
        train_hours = sum(r["seconds"] for r in rows if r["split"] == "training") / 3600
        params = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(a).items()}
        params["sources"] = a.sources.split(",")
        params["voices"] = self.voices
        result = {
            "params": params,
            "model": {**desc, "tokenizer": marker.get("tokenizer"), "speakers": self.voices},
            "codec": {"n_codebooks": codec.config.n_codebooks, "codebook_size": codec.config.codebook_size,
                      "vectors": a.max_vectors, "decoder": codec.decoder_kind,
                      "decoder_params": (codec.code_decoder.n_parameters() if codec.code_decoder else 0)},
            "code_decoder": self.decoder_summary(),
            "corpus": {"n_train": sum(r["split"] == "training" for r in rows),
                       "n_val": sum(r["split"] == "validation" for r in rows), "n_eval": len(ev),
                       "hours_train": train_hours, "table": corpus.corpus_table(rows)},
            "training": {"steps": t.get("steps"), "wall_s": t.get("wall_s"), "train_s": t.get("train_s"),
                         "steps_per_s": (t.get("steps") or 0) / max(1e-9, t.get("train_s") or 0)},
            "accuracy": acc,
            "curve": [{k: r.get(k) for k in ("step", "elapsed_s", "train_code0_acc", "val_code0_acc", "train_cp_acc",
                                             "val_cp_acc", "train_loss", "val_loss")}
                      for r in json.loads((self.work / "train" / "curve.json").read_text())["curve"]],
            "code_predictor_stage": self.cp_summary(),
            "asr": "pocketsphinx default LM",
            "wer": scores,
            "wer_diagnostics": diag_scores,
            "cp_held_out": cp_held_out,
            "free_running": {"n": len(fr), "not_ended": sum(not f["ended"] for f in fr),
                             "frames": [f["frames"] for f in fr], "true_frames": [len(u.codes) for u in ev],
                             "max_frames": a.max_frames, "frame_factor": 2.0},
            "references": refs,
            "timings_s": {**(json.loads((self.work / "timings.json").read_text())
                             if (self.work / "timings.json").is_file() else {})},
        }
        save_json(result, p.with_suffix(".tmp"), provenance(params=params, seed=a.seed))
        os.replace(p.with_suffix(".tmp"), p)
        self.log("eval: code-0 accuracy train {:.3f} / held-out {:.3f}".format(
            acc["train"]["code0_acc"], acc["held_out"]["code0_acc"]))
        for name, s in {**scores, **diag_scores}.items():
            self.log(f"eval: WER {name:22s} {s['wer']:.3f}")
        self.log(f"eval: free running, {result['free_running']['not_ended']} of {len(fr)} did not end by themselves")
        return p

    def cp_summary(self) -> dict | None:
        """The code-predictor stage's budget, kept step and validation curve (None when it did not run)."""
        f = self.trained_dir() / "cp_curve.json"
        if not self.cp_enabled() or not f.is_file():
            return None
        d = json.loads(f.read_text())
        keys = ("step", "elapsed_s", "frames_seen", "train_run_cp_loss", "val_cp_loss", "val_cp_acc",
                "val_cp_acc_by_depth")
        return {"meta": d["meta"], "curve": [{k: r.get(k) for k in keys} for r in d["curve"]]}

    # ------------------------------------------------------------------ 8. card
    def card(self) -> Path:
        p = self.out / "MODEL_CARD.md"
        if self.done("card", p):
            return p
        text = model_card(json.loads((self.out / "eval.json").read_text()))
        p.write_text(text)
        (self.out / "model" / "MODEL_CARD.md").write_text(text)
        self.log(f"card: {p}")
        return p

    def run(self) -> dict:
        for stage in STAGES:
            self.timed(stage, getattr(self, stage))
        self.log(f"done: {self.out}")
        return json.loads((self.out / "eval.json").read_text())


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    np.random.seed(args.seed)
    return Builder(args).run()


if __name__ == "__main__":
    main()
