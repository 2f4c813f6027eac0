"""Command line: ``rvqspec synth`` (speak a text with any inner-loop decoder), ``rvqspec bench`` (per-call latency),
``rvqspec train-drafter`` and ``rvqspec eval-acceptance`` (drafters of paper Table 2).

Examples::

    rvqspec synth --model tiny-random --text "Hello world." --out out.wav --decoder tree --tree "0;1;0,0;0,0,0"
    rvqspec synth --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --text "Hello." --out hello.wav --decoder chain --window 4
    rvqspec bench --model qwen3-tts-0.6b-random --json bench.json
    rvqspec train-drafter --model ./Qwen3-TTS-12Hz-0.6B-CustomVoice --drafter offsets --frames-file train.safetensors
    rvqspec eval-acceptance --model ./Qwen3-TTS-12Hz-0.6B-CustomVoice --drafter offsets --json acceptance.json
    rvqspec train-drafter --model embedded --drafter offsets     # shipped training / validation utterances,
    rvqspec eval-acceptance --model embedded --drafter offsets   # -> data/embedded/model/drafters/; evaluation split
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np


def _die(msg: str) -> int:
    print(f"rvqspec: error: {msg}", file=sys.stderr)
    return 2


OUTPUT_FLAGS = {"out": "--out", "json": "--json", "json_path": "--json", "curve_json": "--curve-json"}


def check_output_path(path: str, flag: str) -> str | None:
    """Why an output path cannot be written, or ``None`` if it can. Checked BEFORE any work, so no run is lost."""
    import os

    if path is None:
        return None
    if not str(path).strip():
        return f"{flag} is an empty path: give a file name"
    p = Path(path)
    if p.is_dir() or not p.name or p.name in (".", ".."):
        return f"{flag} {path} is a folder: give a file name inside it"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        return f"output folder {parent} does not exist: create it or choose another {flag}"
    existed = p.exists()
    try:  # a real probe: permissions, read-only mounts and pseudo file systems all show up here
        with open(p, "a"):
            pass
    except OSError as e:
        return f"{flag} {path} is not writable ({e.strerror}): choose another location"
    if not existed:
        os.remove(p)
    return None


def _decoder_from_args(args):
    from rvqspec_lib.spec.decoders import AR, Chain, Tree
    from rvqspec_lib.spec.trees import parse_paths

    if args.decoder != "chain" and args.window is not None:
        raise ValueError("--window is for --decoder chain; drop it or add --decoder chain")
    if args.decoder != "tree" and args.tree is not None:
        raise ValueError("--tree is for --decoder tree; drop it or add --decoder tree")
    if args.decoder == "ar":
        return AR()
    if args.decoder == "chain":
        return Chain(window=4 if args.window is None else args.window)
    return Tree(paths=parse_paths(DEFAULT_TREE if args.tree is None else args.tree))


DEFAULT_TREE = "0;1;0,0;0,0,0"
#: Audio formats ``synth --out`` writes (soundfile, by extension).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")


def add_synth_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="embedded, tiny-random, qwen3-tts-0.6b-random, "
                                                  "qwen3-tts-1.7b-random, a hub id or a checkpoint dir")
    p.add_argument("--text", required=True, help="sentence to speak")
    p.add_argument("--out", required=True, help="output audio: .wav, .flac or .ogg (the codes always go to "
                                                "<out without its extension>.npy beside it)")
    p.add_argument("--decoder", choices=["ar", "chain", "tree"], default="ar", help="inner-loop decoder")
    p.add_argument("--window", type=int, default=None,
                   help="chain window N (2..8, default 4): committed code + N-1 drafts")
    p.add_argument("--tree", default=None,
                   help="tree rank paths: ';' between paths, ',' between ranks (default 0;1;0,0;0,0,0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the explicit generator")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--json", help="write statistics (frames, calls, tokens per call, wall time, codes) here")
    p.add_argument("--max-frames", type=int, default=200, help="frame cap (12.5 frames = 1 s)")
    p.add_argument("--language", default="auto", help="auto, english, german, ...")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    p.add_argument("--codes-to-audio", default="auto", choices=["auto", "neural", "table"],
                   help="models with the offline codec (embedded): 'auto' decodes with the neural code decoder shipped "
                        "beside the codec (codec.decoder.safetensors) when there is one, 'neural' requires it, "
                        "'table' sums the codebook entries")


def run_synth(args) -> int:
    import torch

    from rvqspec_lib.models.frame import synthesize
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.spec.sampling import Sampling

    if not args.text or not args.text.strip():
        return _die("--text is empty: give the sentence to speak")
    out = Path(args.out)
    if out.suffix.lower() not in AUDIO_SUFFIXES:
        return _die(f"--out {out} must end in {', '.join(AUDIO_SUFFIXES)} (the audio file; the codes go to "
                    f"{out.with_suffix('.npy').name} beside it)")
    if args.json and Path(args.json).resolve() in (out.resolve(), out.with_suffix(".npy").resolve()):
        return _die(f"--json {args.json} is the audio or codes file of --out: give it its own name")
    try:
        decoder = _decoder_from_args(args)
        lm = load_model(args.model, dtype=args.dtype)
    except ValueError as e:
        return _die(str(e))
    codec = getattr(lm.speech_tokenizer, "codec", None)
    if args.codes_to_audio != "auto":
        if codec is None or not hasattr(codec, "decoder_kind"):
            return _die(f"--codes-to-audio {args.codes_to_audio}: {args.model} has no offline codec to choose a "
                        "decoder for (only models built by `make embedded` do); leave it at auto")
        if args.codes_to_audio == "neural" and codec.code_decoder is None:
            return _die(f"--codes-to-audio neural: {args.model}'s codec has no neural code decoder beside it "
                        "(codec.decoder.safetensors); use auto or table, or train one (`make embedded`)")
    gen = lm.generation or {}
    sampling = Sampling.from_generation_config(gen, loop="code_predictor", greedy=args.greedy)
    talker_sampling = Sampling.from_generation_config(gen, loop="talker", greedy=args.greedy)
    if lm.is_random:
        print(f"note: {args.model} has RANDOM weights (timing only): the audio and acceptance mean nothing",
              file=sys.stderr)
    langs = set(lm.model.config.talker_config.codec_language_id or {})
    if langs == {"english"} and any(ch.isalpha() and ord(ch) > 0x24F for ch in args.text):
        print(f"note: {args.model} was trained on English only: letters outside the Latin script go through its "
              "English front end and will not sound like that language", file=sys.stderr)
    try:
        res = synthesize(lm, [args.text], decoder=decoder, sampling=sampling, talker_sampling=talker_sampling,
                         generator=torch.Generator().manual_seed(args.seed), max_frames=args.max_frames,
                         language=args.language, speaker=args.speaker, progress=sys.stderr.isatty())
    except ValueError as e:
        return _die(str(e))
    codes = res.codes[0].numpy().astype(np.int64)  # (frames, 16)
    audio_path = None
    if lm.speech_tokenizer is not None and codes.shape[0] > 0:
        import soundfile as sf

        tokenizer = lm.speech_tokenizer
        if args.codes_to_audio == "table" and getattr(codec, "code_decoder", None) is not None:
            tokenizer = type(tokenizer)(codec.with_decoder(None))
        wavs, sr = tokenizer.decode([{"audio_codes": res.codes[0]}])
        wav = np.asarray(wavs[0], dtype=np.float32)
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        if peak > 0.99:  # a 16-bit wav clips at full scale: scale down instead of distorting (reported below)
            wav = wav * (0.99 / peak)
        sf.write(out, wav, sr)
        audio_path = str(out)
    npy = out.with_suffix(".npy")
    np.save(npy, codes)
    stats = {
        "model": args.model,
        "random_weights": lm.is_random,
        "decoder": repr(decoder),
        "audio_scaled_by": round(0.99 / peak, 4) if audio_path and peak > 0.99 else 1.0,
        "codes_to_audio": (getattr(getattr(tokenizer, "codec", None), "decoder_kind", "official")
                           if audio_path else None),
        "text": args.text,
        "seed": args.seed,
        "greedy": args.greedy,
        "frames": int(res.frames[0]),
        "ended_by_itself": bool(res.ended[0]),
        "frame_rate_hz": lm.frame_rate_hz,
        "audio_s": float(res.frames[0]) / lm.frame_rate_hz,
        "code_predictor_calls": int(res.code_predictor_calls[0]),
        "talker_calls": int(res.talker_calls),
        "tokens_per_call": float(res.tokens_per_call[0]),
        "wall_s": res.wall_s,
        "talker_s": res.talker_s,
        "inner_loop_s": res.inner_s,
        "wav": audio_path,
        "codes_npy": str(npy),
        "codes": codes.tolist(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(stats, indent=1))
    msg = (f"{stats['frames']} frames ({stats['audio_s']:.2f} s of audio), {stats['code_predictor_calls']} "
           f"code-predictor calls, {stats['tokens_per_call']:.2f} tokens/call, {res.wall_s:.2f} s wall")
    print(msg)
    if not stats["ended_by_itself"]:
        print(f"note: stopped at --max-frames {args.max_frames} before the model ended the utterance (raise "
              "--max-frames for the rest)", file=sys.stderr)
    if audio_path is None:
        print(f"no codec weights for {args.model}: codes written to {npy} (frames x {codes.shape[1]})")
    else:
        print(f"wrote {audio_path} and {npy}")
    return 0


# --------------------------------------------------------------------------------------------------------------------
# drafters: train-drafter, eval-acceptance
# --------------------------------------------------------------------------------------------------------------------
def _add_frame_source_args(p: argparse.ArgumentParser, default_frames: int) -> None:
    p.add_argument("--frames-file", help="frames saved by Frames.save (.safetensors); default: the utterances that "
                                         "ship with the model (the embedded model), else the model speaks texts")
    p.add_argument("--dataset", help="a local datasets folder (save_to_disk) of audio + text, VoxPopuli schema")
    p.add_argument("--codec", help="with --dataset: codec file or folder (rvqspec_lib.models.speech_tokenizers.load_codec)")
    p.add_argument("--language", default="auto", help="with --dataset: prompt language (auto, english, ...)")
    p.add_argument("--texts-file", help="texts to speak, one a line (default: a few built-in sentences)")
    p.add_argument("--frames", type=int, default=default_frames, help="number of frames to use")
    p.add_argument("--seed", type=int, default=0, help="seed of every explicit generator")


def _check_frame_source_args(args) -> None:
    """One frame source at most, and no flag that the chosen source does not read (a silently ignored flag would
    make a user believe a run used data it did not)."""
    given = [f"--{n.replace('_', '-')}" for n in ("frames_file", "dataset", "texts_file") if getattr(args, n)]
    if len(given) > 1:
        raise ValueError(f"give one frame source, not {' and '.join(given)}")
    if not args.dataset:
        if args.codec:
            raise ValueError("--codec is used only with --dataset (it turns the dataset's audio into codes)")
        if args.language != "auto":
            raise ValueError("--language is used only with --dataset (the prompt language of its utterances)")


def _shipped_root(model: str) -> Path | None:
    """Where the model's shipped utterances are (``embedded``, or a local folder written by build_embedded.py),
    ``None`` for models without them (tiny-random, hub ids, checkpoints without utterances.safetensors)."""
    from rvqspec_lib.models.drafter_files import model_drafter_dir
    from rvqspec_lib.models.loader import EMBEDDED_MODEL
    from rvqspec_lib.models.utterances import embedded_root

    if model_drafter_dir(model) is None:
        return None
    try:
        return embedded_root(model)
    except FileNotFoundError:
        if str(model) == EMBEDDED_MODEL:  # the shipped model must have its data: never fall back silently
            raise
        return None


def _uses_shipped(args) -> bool:
    """No other frame source was given and the model ships utterances."""
    return not (args.frames_file or args.dataset or args.texts_file) and _shipped_root(args.model) is not None


def _frames_from_args(args, lm, split: str = "training", max_frames: int | None = None):
    """Frames from --frames-file, --dataset + --codec, --texts-file, else the model's shipped utterances (split
    ``split``: training for train-drafter, evaluation for eval-acceptance), else the model speaking built-in texts;
    the first ``max_frames`` (default --frames) of them."""
    import torch

    from rvqspec_lib.eval.frame_sources import (
        DEFAULT_TEXTS,
        frames_from_model,
        frames_from_shipped,
    )
    from rvqspec_lib.eval.frames import Frames

    limit = args.frames if max_frames is None else max_frames
    if limit < 1:
        raise ValueError(f"--frames must be >= 1, got {limit}")
    if args.frames_file:
        fr = Frames.load(args.frames_file)
    elif args.dataset:
        from rvqspec_lib.eval.frame_sources import frames_from_dataset
        from rvqspec_lib.models.speech_tokenizers import load_codec

        if not args.codec:
            raise ValueError("--dataset needs --codec (the codec that turns its audio into codes)")
        fr = frames_from_dataset(args.dataset, lm, load_codec(args.codec), language=args.language,
                                 max_frames=limit, progress=sys.stderr.isatty())
    elif _uses_shipped(args):
        fr = frames_from_shipped(lm, args.model, split, max_frames=limit, seed=args.seed,
                                 progress=sys.stderr.isatty())
    else:
        if args.texts_file:
            path = Path(args.texts_file)
            if not path.is_file():
                raise ValueError(f"--texts-file {path} does not exist")
            texts = [t.strip() for t in path.read_text().splitlines() if t.strip()]
            if not texts:
                raise ValueError(f"--texts-file {path} has no text: one sentence a line")
        else:
            texts = list(DEFAULT_TEXTS)
        parts, have, i = [], 0, 0
        while have < limit:
            text = texts[i % len(texts)]
            fr = frames_from_model(lm, [text], seed=args.seed + i, max_frames=min(200, limit - have))
            fr.utterance[:] = i
            parts.append(fr)
            have += len(fr)
            i += 1
        fr = Frames.cat(parts)
    if len(fr) > limit:
        fr = fr.subset(torch.arange(limit))
    return fr


def _note_fewer_frames(frames, asked: int) -> None:
    if len(frames) < asked:
        print(f"note: --frames {asked} asked, the source has {len(frames)}: using them all", file=sys.stderr)


def _drafter_model_dir(model: str) -> Path | None:
    from rvqspec_lib.models.drafter_files import model_drafter_dir

    return model_drafter_dir(model)


def add_train_drafter_args(p: argparse.ArgumentParser) -> None:
    from rvqspec_lib.spec.drafters import DEFAULT_K

    p.add_argument("--model", required=True, help="embedded, tiny-random, a checkpoint dir or a hub id")
    p.add_argument("--drafter", required=True, choices=["offsets", "medusa"], help="what to train")
    p.add_argument("--out", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors; embedded: "
                                 "data/embedded/model/drafters/)")
    p.add_argument("--loss", choices=["ce", "kl", "tv"], default="ce",
                   help="ce: ground-truth codes (paper); kl: the verifier's warped distribution (T 0.9, top-k 50); "
                        "tv: one minus the exact acceptance rate, q warped as deployed")
    p.add_argument("--K", type=int, default=DEFAULT_K, help="offsets drafted (paper: 3)")
    p.add_argument("--epochs", type=int, default=20, help="maximum epochs (early stopping on validation acceptance)")
    p.add_argument("--patience", type=int, default=3, help="epochs without validation improvement before stopping")
    p.add_argument("--batch-size", type=int, default=64, help="frames per step")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate (default per drafter)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="utterances held out for early stopping (default 0.1; models without a shipped validation "
                        "split)")
    p.add_argument("--val-frames", type=int, default=None,
                   help="validation frames for early stopping, from the shipped validation split (default 500; "
                        "embedded models)")
    p.add_argument("--curve-json", help="training curve (default: the drafter file with .curve.json)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing drafter file (e.g. the one shipped beside the embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    _add_frame_source_args(p, default_frames=2000)


def run_train_drafter(args) -> int:
    from rvqspec_lib.models.drafter_files import (
        drafter_path,
        make_drafter,
        save_drafter,
    )
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.spec.sampling import Sampling
    from rvqspec_lib.training.drafters import train_drafter

    try:
        _check_frame_source_args(args)
        for flag, value, ok, need in (("--lr", args.lr, args.lr is None or args.lr > 0, "> 0"),
                                      ("--epochs", args.epochs, args.epochs >= 1, ">= 1"),
                                      ("--patience", args.patience, args.patience >= 0, ">= 0"),
                                      ("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1"),
                                      ("--frames", args.frames, args.frames >= 1, ">= 1"),
                                      ("--val-frames", args.val_frames, args.val_frames is None or args.val_frames >= 1,
                                       ">= 1"),
                                      ("--val-fraction", args.val_fraction,
                                       args.val_fraction is None or 0 < args.val_fraction < 1, "in (0, 1)")):
            if not ok:
                raise ValueError(f"{flag} must be {need}, got {value}")
        if args.out and Path(args.out).suffix != ".safetensors":
            raise ValueError(f"--out must end in .safetensors, got {args.out}")
        if args.out and Path(args.out).exists() and not args.force:
            raise ValueError(f"--out {args.out} exists: pass --force to replace it, or choose another --out")
        shipped = _uses_shipped(args)
        if shipped and args.val_fraction is not None:
            raise ValueError("--val-fraction is not used here: validation frames come from the shipped validation "
                             "split (set their number with --val-frames)")
        if not shipped and args.val_frames is not None:
            raise ValueError("--val-frames is used only with the shipped utterances of an embedded model; here "
                             "validation is --val-fraction of the utterances")
        val_fraction = 0.1 if args.val_fraction is None else args.val_fraction
        val_frames = 500 if args.val_frames is None else args.val_frames
        lm = load_model(args.model, dtype=args.dtype)
        n_codes = int(lm.code_predictor.config.num_code_groups) - 1
        if not 1 <= args.K <= n_codes - 1:
            raise ValueError(f"K={args.K} is out of range for a code predictor of {n_codes} codes: --K 1..{n_codes - 1} "
                             "(the paper uses 3)")
        out = Path(args.out) if args.out else None
        if out is None:
            d = _drafter_model_dir(args.model)
            if d is None:
                return _die("--out is required when --model is not a local checkpoint directory")
            out = drafter_path(d, args.drafter)
            if out.exists() and not args.force:
                return _die(f"{out} exists (the drafter shipped or trained before beside {args.model}): pass --force "
                            "to replace it, or write elsewhere with --out new.safetensors")
        if lm.is_random:
            print(f"note: {args.model} has RANDOM weights: the drafter learns nothing meaningful", file=sys.stderr)
        frames = _frames_from_args(args, lm, "training")
        _note_fewer_frames(frames, args.frames)
        val = _frames_from_args(args, lm, "validation", val_frames) if shipped else None
        if val is not None:
            _note_fewer_frames(val, val_frames)
        drafter = make_drafter(args.drafter, lm.code_predictor, fresh=True, K=args.K)
        curve = Path(args.curve_json) if args.curve_json else out.with_suffix(".curve.json")
        sampling = Sampling.from_generation_config(lm.generation or {}, loop="code_predictor")
        res = train_drafter(drafter, lm.code_predictor, frames, val, loss=args.loss, sampling=sampling, lr=args.lr,
                            batch_size=args.batch_size,
                            max_epochs=args.epochs, patience=args.patience, val_fraction=val_fraction,
                            seed=args.seed, progress=sys.stderr.isatty(), curve_path=curve)
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e))
    res.drafter.provenance["model"] = args.model
    save_drafter(res.drafter, out)
    c0, cb = res.curve[0], res.curve[res.best_epoch]
    print(f"{args.drafter} ({res.drafter.params_added:,} parameters, loss {args.loss}): validation loss "
          f"{c0['val_loss']:.4f} -> {cb['val_loss']:.4f}, exact acceptance by offset "
          f"{[round(a, 3) for a in c0['val_acceptance_by_offset']]} -> "
          f"{[round(a, 3) for a in cb['val_acceptance_by_offset']]} (epoch {res.best_epoch})")
    print(f"wrote {out}, {out.with_suffix('.json')} and {curve}")
    return 0


def add_eval_acceptance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="embedded, tiny-random, a checkpoint dir or a hub id")
    p.add_argument("--drafter", default="heads", choices=["heads", "offsets", "medusa"], help="drafter to evaluate (default heads: the reused LM heads, nothing to load)")
    p.add_argument("--drafter-path", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors; "
                                          "embedded: data/embedded/model/drafters/)")
    p.add_argument("--decoder", choices=["chain", "tree"], help="one decoder (default: chain windows 2..8 and tree)")
    p.add_argument("--window", type=int, default=None, help="chain window N (2..8, default 4), with --decoder chain")
    p.add_argument("--tree", default=None, help="tree rank paths (';' between paths, ',' between ranks; default "
                                                f"{DEFAULT_TREE}); with --decoder tree or no --decoder")
    p.add_argument("--max-rank", type=int, default=8, help="ranks tabulated for the tree calibration")
    p.add_argument("--teacher-codes", choices=["decoded", "frames"], default="decoded",
                   help="codes the exact tables teacher-force: decoded (samples of p) or the frames' own")
    p.add_argument("--json", help="write every statistic here")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    _add_frame_source_args(p, default_frames=200)


def run_eval_acceptance(args) -> int:
    from rvqspec_lib.common.provenance import provenance
    from rvqspec_lib.eval.acceptance import evaluate_acceptance
    from rvqspec_lib.models.drafter_files import make_drafter
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.spec.decoders import Chain, Tree
    from rvqspec_lib.spec.sampling import Sampling
    from rvqspec_lib.spec.trees import parse_paths

    try:
        _check_frame_source_args(args)
        if args.window is not None and args.decoder != "chain":
            raise ValueError("--window is used only with --decoder chain (without --decoder, windows 2..8 are all run)")
        if args.tree is not None and args.decoder == "chain":
            raise ValueError("--tree is not used with --decoder chain: drop it, or use --decoder tree")
        if args.drafter == "heads" and args.drafter_path:
            raise ValueError("--drafter-path is not used with --drafter heads (reused heads have no file)")
        if args.max_rank < 1:
            raise ValueError(f"--max-rank must be >= 1, got {args.max_rank}")
        tree = parse_paths(DEFAULT_TREE if args.tree is None else args.tree)
        if args.decoder == "chain":
            decoders = [Chain(window=4 if args.window is None else args.window)]
        elif args.decoder == "tree":
            decoders = [Tree(paths=tree)]
        else:
            decoders = [Chain(w) for w in range(2, 9)] + [Tree(paths=tree)]
        lm = load_model(args.model, dtype=args.dtype)
        if args.max_rank > lm.codebook_size:
            raise ValueError(f"--max-rank {args.max_rank} exceeds the codebook ({lm.codebook_size} codes)")
        path = args.drafter_path or _drafter_model_dir(args.model)
        drafter = make_drafter(args.drafter, lm.code_predictor, path)
        frames = _frames_from_args(args, lm, "evaluation")
        _note_fewer_frames(frames, args.frames)
        sampling = Sampling.from_generation_config(lm.generation or {}, loop="code_predictor")
        res = evaluate_acceptance(lm.code_predictor, drafter, frames, decoders=decoders, sampling=sampling,
                                  seed=args.seed, max_rank=args.max_rank, teacher_codes=args.teacher_codes)
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e))
    if lm.is_random:
        print(f"note: {args.model} has RANDOM weights: acceptance rates mean nothing", file=sys.stderr)
    res = {"model": args.model, "random_weights": lm.is_random, **res, "frames": frames.source,
           "provenance": provenance(vars(args), seed=args.seed)}
    print(f"drafter {args.drafter}: {res['params_added']:,} parameters added, {res['n_frames']} frames")
    for label, tpc in res["tokens_per_call"].items():
        pred = res["predicted_tokens_per_call"][label]
        print(f"  {label:7s} {tpc:.3f} tokens/call (predicted from the exact tables {pred:.3f})")
    alpha = res["exact"]["alpha_by_offset"]
    shown = ", ".join(f"j={j + 1} {a:.3f}" for j, a in enumerate(alpha) if a is not None)
    print(f"  exact acceptance by offset: {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rvqspec`` console script. Returns the exit status (2 on bad input)."""
    from rvqspec_lib.eval import bench

    parser = argparse.ArgumentParser(prog="rvqspec", description="rvqspec: lossless speculative decoding of the "
                                     "RVQ inner loop of Qwen3-TTS (synth, bench, train-drafter, eval-acceptance)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a small shared machine more threads spin-wait and run "
                             "several times slower; 0 keeps torch's default)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_synth_args(sub.add_parser("synth", help="speak a text with a chosen inner-loop decoder"))
    bench.add_bench_args(sub.add_parser("bench", help="per-call latency of the talker and the code predictor"))
    add_train_drafter_args(sub.add_parser("train-drafter", help="train position-aware offsets or Medusa heads"))
    add_eval_acceptance_args(sub.add_parser("eval-acceptance", help="tokens per call and acceptance of a drafter"))
    args = parser.parse_args(argv)
    if args.threads is None:  # `bench --threads` defaults to None: one thread here too, as the README's tables
        args.threads = 1
    if args.threads < 0:
        return _die(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for attr, flag in OUTPUT_FLAGS.items():
        if args.cmd == "train-drafter" and attr == "out" and args.out is None:
            continue  # the default file may go into a new drafters/ folder beside the model: train-drafter makes it
        problem = check_output_path(getattr(args, attr, None), flag)
        if problem:
            return _die(problem)
    from safetensors import SafetensorError

    try:
        if args.cmd == "synth":
            return run_synth(args)
        if args.cmd == "train-drafter":
            return run_train_drafter(args)
        if args.cmd == "eval-acceptance":
            return run_eval_acceptance(args)
        return bench.run_bench(args)
    except SafetensorError as e:  # a file that is not safetensors (or truncated): name it, no traceback
        return _die(f"cannot read a .safetensors file ({e}): check the --model / --drafter-path / --frames-file "
                    "files, or rebuild them (make embedded, rvqspec train-drafter)")
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        return _die(str(e))


if __name__ == "__main__":
    sys.exit(main())
