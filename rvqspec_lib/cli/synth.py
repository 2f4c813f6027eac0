"""``rvqspec synth``: speak a text (or every line of a file) with a chosen inner-loop decoder; write the audio, the
codes and statistics.

Order of work (README "Command line"): every flag, the text(s), every output path and the files the decoder reads
beside the model (its drafter, its calibrated trees) are checked first, the model's config is read without its
weights (:func:`rvqspec_lib.models.loader.model_facts`: language, speaker, tree ranks), THEN the model loads
(seconds), the decoder is built (``auto``: chosen by timing once, then cached), the frame loop runs
(:func:`rvqspec_lib.models.frame.synthesize`; the lines of ``--text-file`` in batches), the codes become audio, and
the outputs are written atomically (all of them or none, also on Ctrl-C).

Timing fields (JSON and the printed line), each apart: ``startup_s`` (imports of torch and transformers, and the
checks, before loading), ``load_s`` (loading the model), ``choose_s`` (building the decoder: loading its drafter and
trees, and for ``auto`` the one-off timing, milliseconds when cached), ``synth_s`` (the frame loop: prompt, talker and
inner loop), ``decode_s`` (codes to audio), ``total_s`` (from the command's start to the outputs being ready),
``audio_s``, ``rtf = (synth_s + decode_s) / audio_s`` (synthesis alone; below 1 is faster than real time) and
``rtf_total = total_s / audio_s`` (with start-up, load and the choice).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rvqspec_lib.cli.common import (
    DECODER_HELP,
    TREE_HELP,
    WINDOW_HELP,
    add_threads_arg,
    apply_threads,
    build_decoder,
    check_decoder_files,
    check_outputs,
    check_seed,
    check_tree_ranks,
    check_utf8,
    decoder_name_from_flags,
    note,
    read_text_file,
    threads_text,
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
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="sentence to speak (long texts: one sentence per call, or --text-file)")
    text.add_argument("--text-file", help="UTF-8 file, one sentence a line (blank lines skipped): one audio and codes "
                                          "file each, named from --out with an index (out.wav -> out_000.wav, "
                                          "out_000.npy, ...), decoded in batches of --batch-size")
    p.add_argument("--out", required=True, help="output audio: .wav, .flac or .ogg (the codes always go to "
                                                "<out without its extension>.npy beside it)")
    p.add_argument("--decoder", default="ar", help=DECODER_HELP)
    p.add_argument("--window", type=int, default=None, help=WINDOW_HELP + "; with --decoder chain")
    p.add_argument("--tree", default=None, help=TREE_HELP + ", or calibrated:N / calibrated-sampled:N / "
                   "calibrated-point-mass:N[@DRAFTER] (N = 2..64 nodes, from the model's calibrated trees); with "
                   "--decoder tree")
    p.add_argument("--batch-size", type=int, default=None, help="--text-file: lines decoded together (1..64, default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the explicit generator (0..2**63-1)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--json", help="write statistics (frames, calls, tokens per call, timings, RTF, codes) here; with "
                                  "--text-file one file for all lines (their statistics under 'utterances')")
    p.add_argument("--max-frames", type=int, default=200, help="frame cap, >= 1 (12.5 frames = 1 s; default 200)")
    p.add_argument("--language", default="auto", help="auto, english, german, ... (the model's config lists them)")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "int8", "int8-dynamic"],
                   help="int8: int8 weights in the code predictor, bfloat16 elsewhere; int8-dynamic: int8 weights and "
                        "per-row int8 activations in the code predictor, float32 elsewhere (docs/precision.md); "
                        "bfloat16 and int8 need AVX512-BF16 or AMX, int8-dynamic VNNI or AMX")
    p.add_argument("--backend", default=None, choices=["official", "native"],
                   help="what runs the code-predictor calls: official (the official module) or native (one C call "
                        "over packed weights, row for row the same arithmetic in a verify call as in an AR call; "
                        "docs/precision.md#the-native-forward; AR and chain:N then run as the whole frame in one C "
                        "call). Default: official; with --decoder auto, whichever is faster here (the choice is "
                        "timed with the decoder's and cached)")
    p.add_argument("--talker", default="official", choices=["official", "native"],
                   help="what runs the talker steps (code 0 of each frame): official (the official module) or native "
                        "(one C call a step over packed copies of its layers and codec_head, in the talker's "
                        "precision: float32, or bfloat16 with --dtype bfloat16 or int8; "
                        "docs/precision.md#the-native-talker). Default: official")
    p.add_argument("--codes-to-audio", default="auto", choices=["auto", "neural", "table"],
                   help="models with the offline codec (embedded): 'auto' decodes with the neural code decoder shipped "
                        "beside the codec (codec.decoder.safetensors) when there is one, 'neural' requires it, "
                        "'table' sums the codebook entries")
    add_threads_arg(p)


#: Largest --batch-size of --text-file (rows decoded together by the frame loop).
MAX_BATCH = 64


def texts_from_args(args) -> list[str]:
    """The sentence(s) to speak: ``--text``, or the non-blank lines of ``--text-file``.

    Raises:
        ValueError: an empty text or file, a file that is missing or not UTF-8 (one line naming the flag).
    """
    if getattr(args, "text_file", None) is None:
        if not args.text or not args.text.strip():
            raise ValueError("--text is empty: give the sentence to speak")
        check_utf8(args.text, "--text")
        return [args.text]
    lines = [line.strip() for line in read_text_file(args.text_file, "--text-file").splitlines()]
    texts = [line for line in lines if line]
    if not texts:
        raise ValueError(f"--text-file {args.text_file} has no sentence (only blank lines): one sentence a line")
    return texts


def output_paths(out: Path, n: int) -> list[tuple[Path, Path]]:
    """``(audio, codes)`` paths of ``n`` utterances: ``out`` and ``out.npy`` for one ``--text``, else
    ``<out stem>_000<suffix>`` and ``<out stem>_000.npy`` ... (three digits, more when needed)."""
    if n == 1:
        return [(out, out.with_suffix(".npy"))]
    width = max(3, len(str(n - 1)))
    return [(out.with_name(f"{out.stem}_{i:0{width}d}{out.suffix}"),
             out.with_name(f"{out.stem}_{i:0{width}d}.npy")) for i in range(n)]


def check_args(args) -> list[tuple[Path, Path]]:
    """Every check that needs no model: text(s), seed, frame cap, batch size, output paths, the decoder's name.
    Sets ``args.texts`` and ``args.decoder_name``. Returns the ``(audio, codes)`` paths, one pair per text.

    Raises:
        ValueError: the first problem, in one line naming the flag.
    """
    args.texts = texts_from_args(args)
    check_seed(args.seed)
    if args.max_frames < 1:
        raise ValueError(f"--max-frames must be >= 1 (frames of 80 ms; 12.5 frames = 1 s), got {args.max_frames}")
    batch = getattr(args, "batch_size", None)
    if batch is not None and getattr(args, "text_file", None) is None:
        raise ValueError("--batch-size is for --text-file (lines decoded together): drop it with --text")
    batch = 8 if batch is None else batch
    args.batch_size = batch
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"--batch-size must be in 1..{MAX_BATCH}, got {batch}")
    out = Path(args.out)
    if out.suffix.lower() not in AUDIO_SUFFIXES:
        raise ValueError(f"--out {out} must end in {', '.join(AUDIO_SUFFIXES)} (the audio file; the codes go to "
                         f"{out.with_suffix('.npy').name} beside it)")
    pairs = output_paths(out, len(args.texts))
    files = [f for pair in pairs for f in pair]
    if args.json and Path(args.json).resolve() in {f.resolve() for f in files}:
        raise ValueError(f"--json {args.json} is an audio or codes file of --out: give it its own name")
    check_outputs([(f, "--out" if f.suffix != ".npy" else "--out (its codes file)") for f in files]
                  + [(args.json, "--json")])
    args.decoder_name = decoder_name_from_flags(args.decoder, args.window, args.tree)
    if args.decoder_name.best_window:
        raise ValueError("chain:best is chosen on calibration frames by eval-wer: give chain:N here, or --decoder auto")
    if args.dtype in ("bfloat16", "int8", "int8-dynamic"):
        from rvqspec_lib.models.precision import check_precision

        check_precision(args.dtype)  # a precision this CPU cannot run natively: one line naming the fix
    if getattr(args, "backend", None) == "native":
        if args.dtype == "float64":
            raise ValueError("--backend native runs float32, bfloat16, int8 or int8-dynamic: drop --dtype float64")
        from rvqspec_lib.models.kernels import cpforward

        if not cpforward.available():
            raise ValueError(f"--backend native: the native forward cannot be built here "
                             f"({cpforward.unavailable_reason()}): use --backend official")
    if getattr(args, "talker", "official") == "native":
        if args.dtype == "float64":
            raise ValueError("--talker native runs float32 or bfloat16 talkers: drop --dtype float64")
        from rvqspec_lib.models.kernels import cpforward

        if not cpforward.available():
            raise ValueError(f"--talker native: the native forward cannot be built here "
                             f"({cpforward.unavailable_reason()}): use --talker official")
    return pairs


def backends_for(args, cp) -> dict:
    """The verify backends ``synth`` may run: ``{name: backend}``, the first the reference. ``--backend`` given: that
    one; ``--decoder auto`` without it: the official module and, where it builds and the precision is one of its
    four, the native forward (auto times both); otherwise the official module."""
    from rvqspec_lib.decoding.predictor import OfficialBackend

    choice = getattr(args, "backend", None)
    if choice is None and args.decoder_name.kind == "auto" and args.dtype == "float64":
        note("--decoder auto with --dtype float64 times the official forward only (the native forward runs float32, "
             "bfloat16, int8 and int8-dynamic)")
    if choice == "native" or (choice is None and args.decoder_name.kind == "auto" and args.dtype != "float64"):
        from rvqspec_lib.models.kernels import cpforward
        from rvqspec_lib.models.native import NativeCodePredictor

        if choice == "native":
            return {"native": NativeCodePredictor(cp)}
        if cpforward.available():
            return {"official": OfficialBackend(cp), "native": NativeCodePredictor(cp)}
    return {"official": OfficialBackend(cp)}


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
    check_tree_ranks([args.decoder_name], facts.codebook_size)
    args.budget_note = check_decoder_files(args.decoder_name, args.model, n_codes=facts.n_code_groups - 1,
                                           codebook_size=facts.codebook_size)
    if args.codes_to_audio != "auto" and not facts.offline_codec:
        raise ValueError(f"--codes-to-audio {args.codes_to_audio}: {args.model} has no offline codec to choose a "
                         "decoder for (only models built by `make embedded` do); leave it at auto")


def run(args, threads: int) -> int:
    """Run ``synth`` on parsed flags (``threads``: the torch thread count in use). Returns the exit status.

    Raises:
        ValueError, FileNotFoundError: bad input (``main`` prints them in one line, exit status 2).
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    pairs = check_args(args)
    texts = args.texts

    from rvqspec_lib.models.loader import load_model, model_facts

    facts = model_facts(args.model)  # config only: milliseconds; None for a hub id not in the cache
    if facts is not None:
        check_against_model(args, facts)
    else:
        args.budget_note = check_decoder_files(args.decoder_name, args.model)
    if getattr(args, "budget_note", None):
        note(args.budget_note)

    threads = apply_threads(threads)  # after the cheap checks: torch loads here
    import numpy as np
    import torch

    from rvqspec_lib.common.files import atomic_outputs
    from rvqspec_lib.models.frame import synthesize
    from rvqspec_lib.models.text_language import english_only_note
    from rvqspec_lib.decoding.decoders import is_lossless
    from rvqspec_lib.decoding.sampling import Sampling

    t = time.perf_counter()
    startup_s = t - started  # interpreter imports (torch, transformers) and the checks
    lm = load_model(args.model, dtype={"int8": "bfloat16", "int8-dynamic": "float32"}.get(args.dtype, args.dtype))
    if args.dtype in ("int8", "int8-dynamic"):
        from rvqspec_lib.models.precision import apply_precision

        apply_precision(lm.code_predictor, args.dtype)  # AR and speculation alike run the int8 code predictor
    load_s = time.perf_counter() - t
    check_tree_ranks([args.decoder_name], lm.codebook_size)  # again for models whose config could not be read
    t = time.perf_counter()
    pool = backends_for(args, lm.code_predictor)
    decoder, drafter, chose, backend_name = build_decoder(args.decoder_name, lm, progress=sys.stderr.isatty(),
                                                          backends=pool)
    backend = None if backend_name == "official" else pool["native" if backend_name == "native-frame" else backend_name]
    choose_s = time.perf_counter() - t
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
    # through the native forward, AR and Chain run as the whole frame in one C call (the same rules and distributions)
    from rvqspec_lib.models.native_frame import native_frame_for

    frame_decoder = native_frame_for(lm.code_predictor, decoder, sampling, drafter=drafter, backend=backend) \
        if backend is not None else None
    inner_loop = ("native whole frame (one C call a frame)" if frame_decoder is not None
                  else f"decode_frame through the {backend_name} forward")
    talker_backend = None
    if getattr(args, "talker", "official") == "native":
        from rvqspec_lib.models.native_talker import NativeTalker

        talker_backend = NativeTalker(lm)  # its KV cache is sized per batch by synthesize
    notes: list[str] = []

    def _note(msg: str) -> None:
        notes.append(msg)
        note(msg)

    if chose:
        _note(chose)
    if getattr(args, "budget_note", None):
        notes.append(args.budget_note)  # printed by the checks, before loading
    if not is_lossless(decoder):
        _note(f"LOSSY: {args.decoder_name.text} changes the code distribution (a control, not lossless speculative "
              "decoding); its audio is not the target model's")
    if lm.is_random:
        _note(f"{args.model} has RANDOM weights (timing only): the audio and acceptance mean nothing")
    langs = set(lm.model.config.talker_config.codec_language_id or {})
    for i, text in enumerate(texts):  # a heuristic, see english_only_note's doc
        other = english_only_note(args.model, text) if langs == {"english"} else None
        if other:
            _note((f"line {i + 1}: " if len(texts) > 1 else "") + other)

    generator = torch.Generator().manual_seed(args.seed)
    batch = getattr(args, "batch_size", 8) if len(texts) > 1 else 1
    rows: list[dict] = []
    synth_s = 0.0
    talker_calls, talker_s, inner_s = 0, 0.0, 0.0
    t = time.perf_counter()
    for b0 in range(0, len(texts), batch):  # the frame loop decodes a batch of rows together
        res = synthesize(lm, texts[b0:b0 + batch], decoder=decoder, sampling=sampling,
                         talker_sampling=talker_sampling, generator=generator, max_frames=args.max_frames,
                         language=args.language, speaker=args.speaker, progress=sys.stderr.isatty(), drafter=drafter,
                         backend=backend, frame_decoder=frame_decoder, talker_backend=talker_backend)
        talker_calls, talker_s, inner_s = talker_calls + int(res.talker_calls), talker_s + res.talker_s, \
            inner_s + res.inner_s
        for j in range(len(res.codes)):
            rows.append({"codes": res.codes[j], "frames": int(res.frames[j]), "ended": bool(res.ended[j]),
                         "calls": int(res.code_predictor_calls[j]), "tpc": float(res.tokens_per_call[j])})
    synth_s = time.perf_counter() - t

    t = time.perf_counter()
    tokenizer = lm.speech_tokenizer
    if tokenizer is not None and args.codes_to_audio == "table" and getattr(codec, "code_decoder", None) is not None:
        tokenizer = type(tokenizer)(codec.with_decoder(None))
    sr = None
    for r in rows:
        r["wav"], r["peak"] = None, 0.0
        if tokenizer is not None and r["frames"] > 0:
            wavs, sr = tokenizer.decode([{"audio_codes": r["codes"]}])
            wav = np.asarray(wavs[0], dtype=np.float32)
            r["peak"] = float(np.abs(wav).max()) if wav.size else 0.0
            if r["peak"] > 0.99:  # a 16-bit wav clips at full scale: scale down instead of distorting (reported)
                wav = wav * (0.99 / r["peak"])
            r["wav"] = wav
    decode_s = time.perf_counter() - t if any(r["wav"] is not None for r in rows) else 0.0

    for i, (text, r) in enumerate(zip(texts, rows)):
        r["audio_s"] = r["frames"] / lm.frame_rate_hz
        r["words"] = len(text.split())
        which = f"line {i + 1}: " if len(texts) > 1 else ""
        r["cut_short"] = r["ended"] and r["words"] > 0 and r["audio_s"] < MIN_AUDIO_S_PER_WORD * r["words"]
        if r["cut_short"]:
            _note(f"{which}the model ended after {r['audio_s']:.2f} s of audio for {r['words']} words (under "
                  f"{MIN_AUDIO_S_PER_WORD} s a word): most of the text was probably not spoken; split it into "
                  "sentences and synthesize each")
        if not r["ended"]:
            _note(f"{which}stopped at --max-frames {args.max_frames} before the model ended the utterance (raise "
                  "--max-frames for the rest)")
    targets = [f for (wav_p, npy_p), r in zip(pairs, rows) for f in ([wav_p] if r["wav"] is not None else []) + [npy_p]]
    targets += [Path(args.json)] if args.json else []
    frames = sum(r["frames"] for r in rows)
    audio_s = frames / lm.frame_rate_hz
    calls = sum(r["calls"] for r in rows)
    n_inner = lm.n_code_groups - 1
    tpc = frames * n_inner / calls if calls else float(rows[0]["tpc"])
    with atomic_outputs(targets) as temps:
        tmp = dict(zip(targets, temps))
        per = []
        for (wav_p, npy_p), text, r in zip(pairs, texts, rows):
            codes = r["codes"].numpy().astype(np.int64)  # (frames, n_code_groups)
            if r["wav"] is not None:
                import soundfile as sf

                sf.write(tmp[wav_p], r["wav"], sr)
            np.save(tmp[npy_p], codes)
            per.append({
                "text": text, "words": r["words"], "frames": r["frames"], "audio_s": r["audio_s"],
                "ended_by_itself": r["ended"], "text_likely_cut_short": r["cut_short"],
                "audio_s_per_word": r["audio_s"] / r["words"] if r["words"] else None,
                "code_predictor_calls": r["calls"], "tokens_per_call": r["tpc"],
                "audio_scaled_by": round(0.99 / r["peak"], 4) if r["wav"] is not None and r["peak"] > 0.99 else 1.0,
                "wav": str(wav_p) if r["wav"] is not None else None, "codes_npy": str(npy_p),
                "codes": codes.tolist()})
        total_s = time.perf_counter() - started
        speak_s = synth_s + decode_s
        stats = {
            "model": args.model,
            "random_weights": lm.is_random,
            "decoder": repr(decoder),
            "decoder_name": args.decoder_name.text,
            "drafter": args.decoder_name.drafter if args.decoder_name.kind != "ar" else None,
            "codes_to_audio": (getattr(getattr(tokenizer, "codec", None), "decoder_kind", "official")
                               if any(r["wav"] is not None for r in rows) else None),
            "seed": args.seed,
            "greedy": args.greedy,
            "dtype": args.dtype,
            "backend": "native" if backend_name == "native-frame" else backend_name,
            "inner_loop": inner_loop,
            "talker": getattr(args, "talker", "official"),
            "sampling": sampling.describe(),
            "talker_sampling": talker_sampling.describe(),
            "threads": threads,
            "batch_size": batch,
            "frame_rate_hz": lm.frame_rate_hz,
            "n_utterances": len(texts),
            "frames": frames,
            "audio_s": audio_s,
            "code_predictor_calls": calls,
            "talker_calls": talker_calls,
            "tokens_per_call": tpc,
            "startup_s": startup_s,
            "load_s": load_s,
            "choose_s": choose_s,
            "synth_s": synth_s,
            "decode_s": decode_s,
            "total_s": total_s,
            "rtf": speak_s / audio_s if audio_s > 0 else None,
            "rtf_total": total_s / audio_s if audio_s > 0 else None,
            "wall_s": total_s,  # the whole run, as total_s (kept for readers of older files)
            "talker_s": talker_s,
            "inner_loop_s": inner_s,
            "notes": notes,
        }
        if len(texts) == 1:
            stats.update(per[0])  # one text: its fields at the top level, as before
        else:
            stats["utterances"] = per
        if args.json:
            tmp[Path(args.json)].write_text(json.dumps(stats, indent=1) + "\n")
    rtf = (f"RTF {stats['rtf']:.2f} (synthesis alone; {stats['rtf_total']:.2f} with start-up, load and choice)"
           if stats["rtf"] is not None else "RTF n/a (no audio)")
    what = f"{len(texts)} texts, " if len(texts) > 1 else ""
    print(f"{what}{frames} frames ({audio_s:.2f} s of audio), {calls} code-predictor calls, {tpc:.2f} tokens/call | "
          f"startup {startup_s:.2f} s, load {load_s:.2f} s, {args.decoder_name.text} decoder {choose_s:.2f} s "
          f"({inner_loop}), "
          f"synthesis {speak_s:.2f} s (frame loop {synth_s:.2f} s + codes to audio {decode_s:.2f} s), total "
          f"{total_s:.2f} s | {rtf} | {threads_text(threads)}")
    written = ", ".join(str(p) for p in targets) if len(targets) <= 4 else \
        f"{len(targets)} files ({targets[0]} ... {targets[-1]})"
    if not any(r["wav"] is not None for r in rows) and lm.speech_tokenizer is None:
        print(f"wrote {written} (no codec weights for {args.model}: codes only, frames x {lm.n_code_groups})")
    elif any(r["wav"] is None for r in rows):
        print(f"wrote {written} (the model ended before its first frame for {sum(r['wav'] is None for r in rows)} "
              "text(s): no audio for them)")
    else:
        print(f"wrote {written}")
    return 0
