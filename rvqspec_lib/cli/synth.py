"""``rvqspec synth``: speak a text with a chosen inner-loop decoder; write the audio, the codes and statistics.

Order of work (README "Command line"): every flag, the text and every output path are checked first, the model's
config is read without its weights (:func:`rvqspec_lib.models.loader.model_facts`: language, speaker, tree ranks),
THEN the model loads (seconds), the frame loop runs (:func:`rvqspec_lib.models.frame.synthesize`), the codes become
audio, and the outputs are written atomically (all of them or none, also on Ctrl-C).

Timing fields (JSON and the printed line): ``load_s`` (loading the model), ``synth_s`` (the frame loop: prompt,
talker and inner loop), ``decode_s`` (codes to audio), ``startup_s`` (imports of torch and transformers, and the
checks, before loading), ``total_s`` (from the command's start to the outputs being ready: startup + load + synth +
decode + writing), ``audio_s`` and ``rtf = total_s / audio_s`` (below 1 is faster than real time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rvqspec_lib.cli.common import (
    TREE_HELP,
    WINDOW_HELP,
    PendingDecoder,
    add_threads_arg,
    apply_threads,
    chain_from_flag,
    check_calibration_exists,
    check_outputs,
    check_seed,
    check_tree_ranks,
    check_utf8,
    note,
    resolve_decoder,
    threads_text,
    tree_from_flag,
)

#: Audio formats ``synth --out`` writes (soundfile, by extension).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")

#: Below this many seconds of audio per word of text (words = whitespace-separated), an utterance that ENDED BY
#: ITSELF is reported as probably not speaking the whole text. Speech runs at 2-3 words a second (0.33-0.5 s a word)
#: and even fast read speech stays under 5 (0.2 s a word); 0.15 s a word (6.7 words a second) is faster than anyone
#: speaks, so audio that short cannot hold the whole text: the model ended early, typically on a long text (the
#: embedded model was trained on sentences and stops after a sentence or two).
MIN_AUDIO_S_PER_WORD = 0.15


def add_args(p: argparse.ArgumentParser) -> None:
    """The ``synth`` flags."""
    p.add_argument("--model", required=True, help="embedded, tiny-random, qwen3-tts-0.6b-random, "
                                                  "qwen3-tts-1.7b-random, a hub id or a checkpoint dir")
    p.add_argument("--text", required=True, help="sentence to speak (long texts: one sentence per call)")
    p.add_argument("--out", required=True, help="output audio: .wav, .flac or .ogg (the codes always go to "
                                                "<out without its extension>.npy beside it)")
    p.add_argument("--decoder", choices=["ar", "chain", "tree", "auto"], default="ar",
                   help="inner-loop decoder; auto: the fastest on this device among AR, chains and the model's "
                        "calibrated trees, timed once and cached (needs the model's calibrated trees, notebook 03)")
    p.add_argument("--window", type=int, default=None, help=WINDOW_HELP + "; with --decoder chain")
    p.add_argument("--tree", default=None, help=TREE_HELP + ", or calibrated:N / calibrated-sampled:N / "
                   "calibrated-point-mass:N (N = 2..64 nodes, from the model's calibrated trees); with --decoder tree")
    p.add_argument("--seed", type=int, default=0, help="seed of the explicit generator (0..2**63-1)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--json", help="write statistics (frames, calls, tokens per call, timings, RTF, codes) here")
    p.add_argument("--max-frames", type=int, default=200, help="frame cap, >= 1 (12.5 frames = 1 s; default 200)")
    p.add_argument("--language", default="auto", help="auto, english, german, ... (the model's config lists them)")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "int8", "int8-dynamic"],
                   help="int8: int8 weights in the code predictor, bfloat16 elsewhere; int8-dynamic: int8 weights and "
                        "per-row int8 activations in the code predictor, float32 elsewhere (docs/precision.md); "
                        "bfloat16 and int8 need AVX512-BF16 or AMX, int8-dynamic VNNI or AMX")
    p.add_argument("--codes-to-audio", default="auto", choices=["auto", "neural", "table"],
                   help="models with the offline codec (embedded): 'auto' decodes with the neural code decoder shipped "
                        "beside the codec (codec.decoder.safetensors) when there is one, 'neural' requires it, "
                        "'table' sums the codebook entries")
    add_threads_arg(p)


def decoder_from_args(args):
    """``AR()``, ``Chain(window)`` or ``Tree(paths)`` from --decoder / --window / --tree.

    Raises:
        ValueError: a flag the chosen decoder does not use, a window outside 2..8, a malformed tree.
    """
    from rvqspec_lib.spec.decoders import AR

    if args.decoder != "chain" and args.window is not None:
        raise ValueError("--window is for --decoder chain; drop it or add --decoder chain")
    if args.decoder != "tree" and args.tree is not None:
        raise ValueError("--tree is for --decoder tree; drop it or add --decoder tree")
    if args.decoder == "auto":
        return PendingDecoder("auto", "auto")
    if args.decoder == "ar":
        return AR()
    if args.decoder == "chain":
        return chain_from_flag(args.window)
    return tree_from_flag(args.tree)


def check_args(args) -> Path:
    """Every check that needs no model: text, seed, frame cap, output paths, decoder flags. Returns the codes path.

    Raises:
        ValueError: the first problem, in one line naming the flag.
    """
    if not args.text or not args.text.strip():
        raise ValueError("--text is empty: give the sentence to speak")
    check_utf8(args.text, "--text")
    check_seed(args.seed)
    if args.max_frames < 1:
        raise ValueError(f"--max-frames must be >= 1 (frames of 80 ms; 12.5 frames = 1 s), got {args.max_frames}")
    out = Path(args.out)
    if out.suffix.lower() not in AUDIO_SUFFIXES:
        raise ValueError(f"--out {out} must end in {', '.join(AUDIO_SUFFIXES)} (the audio file; the codes go to "
                         f"{out.with_suffix('.npy').name} beside it)")
    npy = out.with_suffix(".npy")
    if args.json and Path(args.json).resolve() in (out.resolve(), npy.resolve()):
        raise ValueError(f"--json {args.json} is the audio or codes file of --out: give it its own name")
    check_outputs([(out, "--out"), (npy, "--out (its codes file)"), (args.json, "--json")])
    args.decoder_obj = decoder_from_args(args)
    if args.dtype in ("bfloat16", "int8", "int8-dynamic"):
        from rvqspec_lib.models.precision import check_precision

        check_precision(args.dtype)  # a precision this CPU cannot run natively: one line naming the fix
    return npy


def check_against_model(args, facts) -> None:
    """Checks that need the model's config (:class:`rvqspec_lib.models.loader.ModelFacts`), before loading it.

    Raises:
        ValueError: a language or speaker the model does not have, a tree rank outside its codebook, a
            --codes-to-audio choice for a model without the offline codec.
    """
    if args.language.lower() != "auto" and args.language.lower() not in facts.languages:
        raise ValueError(f"unsupported language {args.language!r}: use 'auto' or one of {', '.join(facts.languages)}")
    if args.speaker is not None and args.speaker.lower() not in facts.speakers:
        raise ValueError(f"unknown speaker {args.speaker!r}: this model's speakers are "
                         f"{', '.join(facts.speakers) or '(none)'}")
    check_tree_ranks([args.decoder_obj], facts.codebook_size)
    check_calibration_exists(args.decoder_obj, args.model)
    if args.codes_to_audio != "auto" and not facts.offline_codec:
        raise ValueError(f"--codes-to-audio {args.codes_to_audio}: {args.model} has no offline codec to choose a "
                         "decoder for (only models built by `make embedded` do); leave it at auto")


def run(args, threads: int) -> int:
    """Run ``synth`` on parsed flags (``threads``: the torch thread count in use). Returns the exit status.

    Raises:
        ValueError, FileNotFoundError: bad input (``main`` prints them in one line, exit status 2).
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    npy = check_args(args)
    out = Path(args.out)

    from rvqspec_lib.models.loader import load_model, model_facts

    facts = model_facts(args.model)  # config only: milliseconds; None for a hub id not in the cache
    if facts is not None:
        check_against_model(args, facts)

    threads = apply_threads(threads)  # after the cheap checks: torch loads here
    import numpy as np
    import torch

    from rvqspec_lib.common.files import atomic_outputs
    from rvqspec_lib.models.frame import synthesize
    from rvqspec_lib.models.text_language import english_only_note
    from rvqspec_lib.spec.sampling import Sampling

    t = time.perf_counter()
    startup_s = t - started  # interpreter imports (torch, transformers) and the checks
    lm = load_model(args.model, dtype={"int8": "bfloat16", "int8-dynamic": "float32"}.get(args.dtype, args.dtype))
    if args.dtype in ("int8", "int8-dynamic"):
        from rvqspec_lib.models.precision import apply_precision

        apply_precision(lm.code_predictor, args.dtype)  # AR and speculation alike run the int8 code predictor
    load_s = time.perf_counter() - t
    check_tree_ranks([args.decoder_obj], lm.codebook_size)  # again for models whose config could not be read
    check_calibration_exists(args.decoder_obj, args.model)
    args.decoder_obj, chose = resolve_decoder(args.decoder_obj, args.model, lm, progress=sys.stderr.isatty())
    codec = getattr(lm.speech_tokenizer, "codec", None)
    if args.codes_to_audio != "auto":
        if codec is None or not hasattr(codec, "decoder_kind"):
            raise ValueError(f"--codes-to-audio {args.codes_to_audio}: {args.model} has no offline codec to choose a "
                             "decoder for (only models built by `make embedded` do); leave it at auto")
        if args.codes_to_audio == "neural" and codec.code_decoder is None:
            raise ValueError(f"--codes-to-audio neural: {args.model}'s codec has no neural code decoder beside it "
                             "(codec.decoder.safetensors); use auto or table, or train one (`make embedded`)")
    gen = lm.generation or {}
    sampling = Sampling.from_generation_config(gen, loop="code_predictor", greedy=args.greedy)
    talker_sampling = Sampling.from_generation_config(gen, loop="talker", greedy=args.greedy)
    notes: list[str] = []

    def _note(msg: str) -> None:
        notes.append(msg)
        note(msg)

    if chose:
        _note(chose)
    if lm.is_random:
        _note(f"{args.model} has RANDOM weights (timing only): the audio and acceptance mean nothing")
    langs = set(lm.model.config.talker_config.codec_language_id or {})
    other = english_only_note(args.model, args.text) if langs == {"english"} else None  # a heuristic, see its doc
    if other:
        _note(other)

    t = time.perf_counter()
    res = synthesize(lm, [args.text], decoder=args.decoder_obj, sampling=sampling, talker_sampling=talker_sampling,
                     generator=torch.Generator().manual_seed(args.seed), max_frames=args.max_frames,
                     language=args.language, speaker=args.speaker, progress=sys.stderr.isatty())
    synth_s = time.perf_counter() - t
    codes = res.codes[0].numpy().astype(np.int64)  # (frames, n_code_groups)

    t = time.perf_counter()
    wav, sr, peak, tokenizer = None, None, 0.0, lm.speech_tokenizer
    if lm.speech_tokenizer is not None and codes.shape[0] > 0:
        if args.codes_to_audio == "table" and getattr(codec, "code_decoder", None) is not None:
            tokenizer = type(tokenizer)(codec.with_decoder(None))
        wavs, sr = tokenizer.decode([{"audio_codes": res.codes[0]}])
        wav = np.asarray(wavs[0], dtype=np.float32)
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        if peak > 0.99:  # a 16-bit wav clips at full scale: scale down instead of distorting (reported below)
            wav = wav * (0.99 / peak)
    decode_s = time.perf_counter() - t if wav is not None else 0.0

    frames = int(res.frames[0])
    audio_s = frames / lm.frame_rate_hz
    words = len(args.text.split())
    ended = bool(res.ended[0])
    cut_short = ended and words > 0 and audio_s < MIN_AUDIO_S_PER_WORD * words
    if cut_short:
        _note(f"the model ended after {audio_s:.2f} s of audio for {words} words (under {MIN_AUDIO_S_PER_WORD} s a "
              "word): most of the text was probably not spoken; split it into sentences and synthesize each")
    if not ended:
        _note(f"stopped at --max-frames {args.max_frames} before the model ended the utterance (raise --max-frames "
              "for the rest)")
    targets = ([out] if wav is not None else []) + [npy] + ([Path(args.json)] if args.json else [])
    with atomic_outputs(targets) as temps:
        tmp = dict(zip(targets, temps))
        if wav is not None:
            import soundfile as sf

            sf.write(tmp[out], wav, sr)
        np.save(tmp[npy], codes)
        total_s = time.perf_counter() - started
        stats = {
            "model": args.model,
            "random_weights": lm.is_random,
            "decoder": repr(args.decoder_obj),
            "audio_scaled_by": round(0.99 / peak, 4) if wav is not None and peak > 0.99 else 1.0,
            "codes_to_audio": (getattr(getattr(tokenizer, "codec", None), "decoder_kind", "official")
                               if wav is not None else None),
            "text": args.text,
            "words": words,
            "seed": args.seed,
            "greedy": args.greedy,
            "sampling": sampling.describe(),
            "talker_sampling": talker_sampling.describe(),
            "threads": threads,
            "frames": frames,
            "ended_by_itself": ended,
            "text_likely_cut_short": cut_short,
            "audio_s_per_word": audio_s / words if words else None,
            "frame_rate_hz": lm.frame_rate_hz,
            "audio_s": audio_s,
            "code_predictor_calls": int(res.code_predictor_calls[0]),
            "talker_calls": int(res.talker_calls),
            "tokens_per_call": float(res.tokens_per_call[0]),
            "startup_s": startup_s,
            "load_s": load_s,
            "synth_s": synth_s,
            "decode_s": decode_s,
            "total_s": total_s,
            "rtf": total_s / audio_s if audio_s > 0 else None,
            "wall_s": total_s,  # the whole run, as total_s (kept for readers of older files)
            "talker_s": res.talker_s,
            "inner_loop_s": res.inner_s,
            "notes": notes,
            "wav": str(out) if wav is not None else None,
            "codes_npy": str(npy),
            "codes": codes.tolist(),
        }
        if args.json:
            tmp[Path(args.json)].write_text(json.dumps(stats, indent=1) + "\n")
    rtf = f"RTF {stats['rtf']:.2f}" if stats["rtf"] is not None else "RTF n/a (no audio)"
    print(f"{frames} frames ({audio_s:.2f} s of audio), {stats['code_predictor_calls']} code-predictor calls, "
          f"{stats['tokens_per_call']:.2f} tokens/call | startup {startup_s:.2f} s, load {load_s:.2f} s, synth "
          f"{synth_s:.2f} s, decode "
          f"{decode_s:.2f} s, total {total_s:.2f} s, {rtf} | {threads_text(threads)}")
    written = ", ".join(str(p) for p in targets)
    if wav is None and lm.speech_tokenizer is None:
        print(f"wrote {written} (no codec weights for {args.model}: codes only, frames x {codes.shape[1]})")
    elif wav is None:
        print(f"wrote {written} (the model ended before its first frame: no audio)")
    else:
        print(f"wrote {written}")
    return 0
