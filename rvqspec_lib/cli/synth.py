"""``rvqspec synth``: speak a text (or every line of a file) with a chosen inner-loop decoder through a chosen
backend; write the audio, the codes and statistics atomically. Everything that needs no weights is checked first,
against the model's config; the order of work and the statistics' timing fields: docs/cli.md#rvqspec-synth."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from rvqspec_lib.cli.args import AUDIO_SUFFIXES
from rvqspec_lib.cli.common import check_device, check_outputs, check_tree_ranks, check_utf8, load, make_folder, note, \
    threads_text
from rvqspec_lib.common.files import atomic_outputs, json_text
from rvqspec_lib.data.frame_choice import read_lines
from rvqspec_lib.decoding.decoder_names import grammar, parse_decoder_name
from rvqspec_lib.decoding.decoders import Tree, is_lossless
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval import budget
from rvqspec_lib.models import backends as B
from rvqspec_lib.models import frame, loader
from rvqspec_lib.models.audio import WavWriter
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.models.drafter_files import model_drafter_dir
from rvqspec_lib.models.named_decoders import check_files, resolve
from rvqspec_lib.models.speech_tokenizers import decode_audio
from rvqspec_lib.device.precision import PRECISIONS, apply_precision, check_precision
from rvqspec_lib.models.streaming import codec_stream_for, synthesize_stream
from rvqspec_lib.models.text_language import english_only_note

#: Below this many seconds of audio per word, an utterance that ENDED BY ITSELF probably did not speak the whole text:
#: 0.15 s a word (6.7 words a second) is faster than anyone speaks (2-3 words a second; fast read speech under 5), so
#: the model ended early, typically on a long text (the embedded model stops after a sentence or two).
MIN_AUDIO_S_PER_WORD = 0.15


def output_paths(out: Path, n: int) -> list[tuple[Path, Path]]:
    """``(audio, codes)`` of ``n`` utterances: ``out``, ``out.npy`` for one, else ``out_000.wav``, ``out_000.npy``."""
    if n == 1:
        return [(out, out.with_suffix(".npy"))]
    width = max(3, len(str(n - 1)))
    return [(out.with_name(f"{out.stem}_{i:0{width}d}{out.suffix}"), out.with_name(f"{out.stem}_{i:0{width}d}.npy"))
            for i in range(n)]


def check_args(args) -> list[tuple[Path, Path]]:
    """Every check that needs no model; sets ``args.texts``, ``args.device``, ``args.dtype`` (``auto`` resolved from
    the weights' header where it can be), ``args.decoder_name``, ``args.batch_size``, ``args.chunk_frames``; returns
    the ``(audio, codes)`` paths, one pair per text. Raises ValueError: the first problem, one line naming the flag."""
    if args.text_file is None and not args.text.strip():
        raise ValueError("--text is empty: give the sentence to speak")
    args.texts = read_lines(args.text_file, "--text-file") if args.text_file is not None else [args.text]
    check_utf8(args.texts[0], "--text")  # read_lines checks a file's
    if args.batch_size is not None and args.text_file is None:
        raise ValueError("--batch-size is for --text-file (lines decoded together): drop it with --text")
    if not args.stream and (args.out == "-" or args.chunk_frames is not None):
        raise ValueError("--out - (a WAV stream on standard output) is for --stream: add --stream, or give a file"
                         if args.out == "-" else "--chunk-frames is for --stream (frames decoded to audio at once): "
                         "add --stream")
    if args.stream and args.text_file is not None:
        raise ValueError("--stream speaks one --text (a stream of audio as it is made): give --text, or drop --stream")
    args.batch_size = 8 if args.batch_size is None else args.batch_size
    args.chunk_frames = 1 if args.chunk_frames is None else args.chunk_frames
    if not 1 <= args.chunk_frames <= args.max_frames:
        raise ValueError(f"--chunk-frames must be in 1..--max-frames ({args.max_frames}) frames of 80 ms, got "
                         f"{args.chunk_frames}")
    if args.stream and args.out != "-" and Path(args.out).suffix.lower() != ".wav":
        raise ValueError(f"--stream writes a WAV as it grows: give --out {Path(args.out).with_suffix('.wav').name}, "
                         "or --out - for standard output")
    out = Path(args.out)
    if args.out != "-" and out.suffix.lower() not in AUDIO_SUFFIXES:
        raise ValueError(f"--out {out} must end in {', '.join(AUDIO_SUFFIXES)} (the audio file; the codes go to "
                         f"{out.with_suffix('.npy').name} beside it)")
    pairs = [(None, None)] if args.out == "-" else output_paths(out, len(args.texts))  # standard output: no files
    files = [f for pair in pairs for f in pair if f is not None]
    check_outputs([(f, "--out" if f.suffix != ".npy" else "--out (its codes file)") for f in files]
                  + [(args.json, "--json")], make_parents=True)  # a missing parent folder is made by run()
    if args.decoder is None and args.frame != "auto":  # --frame names how AR runs (as before the default path)
        args.decoder = "ar"
    if args.decoder is not None and not args.decoder.strip():
        raise ValueError(f"--decoder is empty: give one of {grammar(('chain:best',))}")
    name = args.decoder_name = parse_decoder_name(args.decoder or "ar", without=("chain:best",))
    if name.best_window:
        raise ValueError("chain:best is chosen on calibration frames by eval-wer: give chain:N here, or --decoder auto")
    cpu_only = [f"--backend {args.backend}"] * (args.backend in ("native", "onnx")) + \
        ["--talker native"] * (args.talker == "native")
    check_device(args, " and ".join(cpu_only) or None, "--backend official, eager or compile and --talker official "
                 "(they run on every device)")
    if name.kind == "auto" and args.frame != "auto":
        raise ValueError(f"--frame {args.frame}: --decoder auto chooses how its decoder runs; drop --frame")
    if args.frame == "fused":  # a calibrated tree or paper is a tree: no fused frame either
        probe = Tree() if name.kind in ("calibrated", "paper") else name.decoder(drafter=name.drafter
                                                                                  if name.drafter != "heads" else None)
        why = B.fused_support(args.backend or "official", probe)
        if why:
            raise ValueError(f"--frame fused with --backend {args.backend or 'official'} and --decoder {name.text}: "
                             f"{why}; or use --frame stepped")
    if args.dtype == "auto":  # the dtype load_model's rule picks for this model here; a hub id not cached: on loading
        args.dtype = loader.auto_dtype(args.model, args.device) or "auto"
    if args.dtype != "auto":
        check_dtype(args)
    return pairs


def check_dtype(args) -> None:
    """``args.dtype`` (resolved) against ``--device``, ``--backend`` and ``--talker``. Raises ValueError (one line)."""
    if args.dtype in ("bfloat16", "int8", "int8-dynamic"):  # a precision this CPU cannot run natively: one line
        check_precision(args.dtype, device=args.device)
    if args.backend:
        B.check_available(args.backend, args.dtype, args.device)
        if args.backend == "native" and args.dtype not in PRECISIONS:
            raise ValueError(f"--backend native runs {', '.join(PRECISIONS)}: drop --dtype {args.dtype}")
    if args.talker == "native" and args.dtype not in PRECISIONS:
        raise ValueError(f"--talker native runs --dtype {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, not "
                         f"{args.dtype}: give one of those, or use --talker official")
    if args.talker == "native" and not (native := B.available("native", args.dtype))[0]:
        raise ValueError(f"--talker native is not available here: {native[1]}: use --talker official")


def check_against_model(args, facts) -> str | None:
    """Checks against the model's config (``facts``; ``None``: a hub id not cached) before loading; returns the
    decoder's note (``paper`` capped) or ``None``. Raises ValueError, FileNotFoundError (one line)."""
    if facts is None:
        return check_files(args.decoder_name, args.model)
    if args.stream and facts.kind in ("tiny-random", "random-size"):
        raise ValueError(f"--stream turns codes into audio as they come, and {args.model} has no codec (random "
                         "weights: codes only): drop --stream, or use a model with a codec (embedded, a checkpoint); "
                         "rvqspec bench pipeline times the real-size pipeline")
    if args.language.lower() != "auto" and args.language.lower() not in facts.languages:
        raise ValueError(f"unsupported language {args.language!r}: use 'auto' or one of {', '.join(facts.languages)}")
    if args.speaker is not None and args.speaker.lower() not in facts.speakers:
        raise ValueError(f"unknown speaker {args.speaker!r}: this model's speakers are "
                         f"{', '.join(facts.speakers) or '(none)'}")
    check_codes_to_audio(args, facts.offline_codec)
    return check_files(args.decoder_name, args.model, n_codes=facts.n_code_groups - 1,
                       codebook_size=facts.codebook_size)


def check_codes_to_audio(args, offline_codec: bool, neural: bool = True) -> None:
    """``--codes-to-audio`` other than auto needs the offline codec, ``neural`` its neural code decoder (ValueError)."""
    if args.codes_to_audio != "auto" and not offline_codec:
        raise ValueError(f"--codes-to-audio {args.codes_to_audio}: {args.model} has no offline codec to choose a "
                         "decoder for (only models built by `make embedded` do); leave it at auto")
    if args.codes_to_audio == "neural" and not neural:
        raise ValueError(f"--codes-to-audio neural: {args.model}'s codec has no neural code decoder beside it "
                         "(codec.decoder.safetensors); use auto or table, or train one (`make embedded`)")


def build_runner(args, lm, sampling: Sampling) -> tuple[object, str | None]:
    """The frame runner of ``--decoder``, ``--backend``, ``--frame`` and a line saying what was chosen (``None``: named
    decoder). ``auto``: timed among ``budget.auto_backends`` (or ``--backend``) once and cached. No ``--decoder``: the
    cached ``auto`` choice, never timed; without one AR through native (fused) where it runs, else official."""
    name, default = args.decoder_name, args.decoder is None
    choice = None
    if name.kind == "auto" or default:
        pool = budget.auto_backends(args.dtype, args.device, note=True)
        native = "native" in pool
        choice = budget.auto_for_model(lm, backends=[args.backend] if args.backend else pool,
                                       drafter_name=name.drafter, progress=sys.stderr.isatty(), timed=not default)
    if choice is not None:
        args.decoder_name = parse_decoder_name("auto")
        named, backend = replace(choice.named, note=f"{'--decoder ' * (not default)}auto chose {choice.reason}"), \
            choice.backend
        # the choice was timed with the checkpoint's sampling; a fused frame takes no top-p (fused_support)
        fused = choice.fused and B.fused_support(backend, named.decoder, sampling, named.drafter) is None
    else:
        named = resolve(name, lm)
        backend = args.backend or ("native" if default and native else "official")
        fused = args.frame == "fused" or (args.frame == "auto" and backend == "native" and B.fused_support(
            backend, named.decoder, sampling, named.drafter) is None)
        if default:
            why = (f"`rvqspec prepare --model {args.model}` times the fastest path once" if model_drafter_dir(lm)
                   else f"{args.model} has no calibrated trees to choose among")
            named = replace(named, note=f"the default path is ar through {backend}{', fused' * fused}, untimed: {why}")
    runner = B.frame_runner(backend, lm.code_predictor, named, fused=fused, sampling=sampling, drafter=named.drafter)
    return runner, named.note if choice is not None or default else None


def _audio(lm, codec_choice: str, rows: list[dict]) -> tuple[str | None, int | None]:
    """Codes to audio of every row (``row["wav"]`` peak-limited, ``row["peak"]``); returns how, and the sample rate."""
    tokenizer, codec = lm.speech_tokenizer, getattr(lm.speech_tokenizer, "codec", None)
    if tokenizer is not None and codec_choice == "table" and getattr(codec, "code_decoder", None) is not None:
        tokenizer = type(tokenizer)(codec.with_decoder(None))
    sr = None
    for r in rows:
        r["wav"], r["peak"] = None, 0.0
        if tokenizer is not None and r["frames"] > 0:
            wav, sr = decode_audio(tokenizer, r["codes"])
            r["peak"] = float(np.abs(wav).max()) if wav.size else 0.0
            # a 16-bit wav clips at full scale: scale down instead of distorting (reported as audio_scaled_by)
            r["wav"] = wav * (0.99 / r["peak"]) if r["peak"] > 0.99 else wav
    if sr is None:
        return None, None
    return getattr(getattr(tokenizer, "codec", None), "decoder_kind", "official"), sr


def run(args, threads: int) -> int:
    """``rvqspec synth``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    t0 = args._started  # main records when the command started
    pairs, texts = check_args(args), args.texts
    cap_note = check_against_model(args, loader.model_facts(args.model))  # config only: milliseconds
    if cap_note:
        note(cap_note)
    startup_s = time.perf_counter() - t0  # interpreter imports (torch, transformers) and the checks
    lm, threads, _ = load(args, threads, dtype={"int8": "bfloat16", "int8-dynamic": "float32"}.get(args.dtype,
                          args.dtype), check=lambda m: check_tree_ranks([args.decoder_name], m.codebook_size))
    if args.dtype == "auto":  # a hub id whose weights were not cached: the rule's answer is the loaded dtype
        args.dtype = lm.dtype
        check_dtype(args)
    if args.dtype in ("int8", "int8-dynamic"):
        apply_precision(lm.code_predictor, args.dtype)  # AR and speculation alike run the int8 code predictor
    load_s = time.perf_counter() - t0 - startup_s
    codec = getattr(lm.speech_tokenizer, "codec", None)
    check_codes_to_audio(args, hasattr(codec, "decoder_kind"), getattr(codec, "code_decoder", None) is not None)
    for path, flag in [(f, "--out") for pair in pairs for f in pair if f is not None] + [(args.json, "--json")]:
        if path is not None:  # a missing parent folder (checked creatable by check_args)
            make_folder(Path(path).parent, flag)
    t = time.perf_counter()
    sampling = frame.inner_sampling(lm, greedy=args.greedy)
    talker_sampling = Sampling.from_generation_config(lm.generation or {}, loop="talker", greedy=args.greedy)
    runner, chose = build_runner(args, lm, sampling)
    choose_s = time.perf_counter() - t
    notes = [cap_note] if cap_note else []

    def _note(msg: str) -> None:
        notes.append(msg)
        note(msg)

    if chose:
        _note(chose)
    if not is_lossless(runner.decoder):
        _note(f"LOSSY: {args.decoder_name.text} changes the code distribution (a control, not lossless speculative "
              "decoding); its audio is not the target model's")
    if lm.is_random:
        _note(f"{args.model} has RANDOM weights (timing only): the audio and acceptance mean nothing")
    if set(lm.model.config.talker_config.codec_language_id or {}) == {"english"}:
        for i, other in enumerate(english_only_note(args.model, text) for text in texts):  # a heuristic (its doc)
            if other:
                _note((f"line {i + 1}: " if len(texts) > 1 else "") + other)

    generator = torch.Generator(device=lm.device).manual_seed(args.seed)
    talker = NativeTalker(lm) if args.talker == "native" else None  # its KV cache is sized per batch by frames()
    base = {"model": args.model, "random_weights": lm.is_random, "decoder_name": args.decoder_name.text,
            **B.runner_fields(runner), "seed": args.seed, "greedy": args.greedy, "dtype": args.dtype,
            "device": lm.device, "model_dtype": lm.dtype, "talker": args.talker, "threads": threads,
            "startup_s": startup_s, "load_s": load_s, "choose_s": choose_s}
    if args.stream:
        return run_stream(args, lm, runner, talker, generator, talker_sampling, t0, base, notes)
    batch = args.batch_size if len(texts) > 1 else 1
    rows: list[dict] = []
    talker_calls, talker_s, inner_s = 0, 0.0, 0.0
    t = time.perf_counter()
    for b0 in range(0, len(texts), batch):  # the frame loop decodes a batch of rows together
        res = frame.synthesize(lm, texts[b0:b0 + batch], runner=runner, talker_sampling=talker_sampling,
                               generator=generator, max_frames=args.max_frames, language=args.language,
                               speaker=args.speaker, progress=sys.stderr.isatty(), talker=talker)
        talker_calls, talker_s, inner_s = talker_calls + res.talker_calls, talker_s + res.talker_s, \
            inner_s + res.inner_s
        rows += [{"codes": res.codes[j], "frames": int(res.frames[j]), "ended": bool(res.ended[j]),
                  "calls": int(res.code_predictor_calls[j]), "tpc": float(res.tokens_per_call[j])}
                 for j in range(len(res.codes))]
    synth_s = time.perf_counter() - t
    del res, runner, talker  # the frame loop's caches and weight copies freed before codes to audio, its peak
    t = time.perf_counter()
    codes_to_audio, sr = _audio(lm, args.codes_to_audio, rows)
    decode_s = time.perf_counter() - t if sr is not None else 0.0

    per = []
    for i, (text, r, (wav_p, npy_p)) in enumerate(zip(texts, rows, pairs)):
        audio_s, words, which = r["frames"] / lm.frame_rate_hz, len(text.split()), f"line {i + 1}: " * (len(texts) > 1)
        short = r["ended"] and words > 0 and audio_s < MIN_AUDIO_S_PER_WORD * words
        if short:
            _note(f"{which}the model ended after {audio_s:.2f} s of audio for {words} words (under "
                  f"{MIN_AUDIO_S_PER_WORD} s a word): most of the text was probably not spoken; split it into "
                  "sentences and synthesize each")
        if not r["ended"]:
            _note(which + stopped_at_cap(args.max_frames))
        per.append({"text": text, "words": words, "frames": r["frames"], "audio_s": audio_s,
                    "ended_by_itself": r["ended"], "text_likely_cut_short": short,
                    "audio_s_per_word": audio_s / words if words else None, "code_predictor_calls": r["calls"],
                    "tokens_per_call": r["tpc"], "audio_scaled_by": round(0.99 / r["peak"], 4) if r["peak"] > 0.99
                    else 1.0, "wav": str(wav_p) if r["wav"] is not None else None, "codes_npy": str(npy_p),
                    "codes": r["codes"].tolist()})
    frames, calls = sum(r["frames"] for r in rows), sum(r["calls"] for r in rows)
    audio_s, tpc = frames / lm.frame_rate_hz, frames * (lm.n_code_groups - 1) / calls if calls else rows[0]["tpc"]
    audio = {wav_p: r["wav"] for (wav_p, _), r in zip(pairs, rows) if r["wav"] is not None}
    stats = {**base, "codes_to_audio": codes_to_audio, "sampling": sampling.describe(),
             "talker_sampling": talker_sampling.describe(), "batch_size": batch, "frame_rate_hz": lm.frame_rate_hz,
             "n_utterances": len(texts), "frames": frames, "audio_s": audio_s, "code_predictor_calls": calls,
             "talker_calls": talker_calls, "tokens_per_call": tpc, "synth_s": synth_s, "decode_s": decode_s,
             "rtf": (synth_s + decode_s) / audio_s if audio_s > 0 else None, "talker_s": talker_s,
             "inner_loop_s": inner_s, "notes": notes, **(per[0] if len(texts) == 1 else {"utterances": per})}
    targets = _write(args, stats, t0, {npy_p: r["codes"] for (_, npy_p), r in zip(pairs, rows)}, audio, sr)
    rtf = (f"RTF {stats['rtf']:.2f} (synthesis alone; {stats['rtf_total']:.2f} with start-up, load and choice)"
           if stats["rtf"] is not None else "RTF n/a (no audio)")
    print(f"{f'{len(texts)} texts, ' * (len(texts) > 1)}{frames} frames ({audio_s:.2f} s of audio), {calls} "
          f"code-predictor calls, {tpc:.2f} tokens/call | startup {startup_s:.2f} s, load {load_s:.2f} s, "
          f"{args.decoder_name.text} decoder {choose_s:.2f} s ({B.runner_label(base)}) on {lm.device} ({lm.dtype}), "
          f"synthesis {synth_s + decode_s:.2f} s (frame loop {synth_s:.2f} s + codes to audio {decode_s:.2f} s), "
          f"total {stats['total_s']:.2f} s | {rtf} | {threads_text(threads)}")
    written = ", ".join(str(p) for p in targets) if len(targets) <= 4 else \
        f"{len(targets)} files ({targets[0]} ... {targets[-1]})"
    why = (f" (no codec weights for {args.model}: codes only, frames x {lm.n_code_groups})" if sr is None and
           lm.speech_tokenizer is None else f" (the model ended before its first frame for {len(rows) - len(audio)} "
           "text(s): no audio for them)" if len(audio) < len(rows) else "")
    print(f"wrote {written}{why}")
    return 0


def _write(args, stats: dict, t0: float, codes: dict, audio: dict, sample_rate: int | None) -> list[Path]:
    """Write the audio, the codes (``.npy``, int64 ``(frames, n_code_groups)``) and ``--json`` (``stats`` with
    ``total_s``, ``rtf_total``) atomically, all or none. Returns the files written."""
    targets = [*audio, *codes] + ([Path(args.json)] if args.json else [])
    with atomic_outputs(targets) as temps:
        tmp = dict(zip(targets, temps))
        for path, wav in audio.items():
            sf.write(tmp[path], wav, sample_rate)
        for path, c in codes.items():
            np.save(tmp[path], c.numpy().astype(np.int64))
        stats["total_s"] = total_s = time.perf_counter() - t0
        if "rtf" in stats:
            stats["rtf_total"] = total_s / stats["audio_s"] if stats["audio_s"] > 0 else None
        if args.json:
            tmp[Path(args.json)].write_text(json_text(stats) + "\n")
    return targets


def _write_stream(stream, sink, sample_rate: int) -> bool:
    """Write every chunk of ``stream`` to ``sink`` (a path or stdout) as it comes; False when the reader closed it."""
    try:
        with WavWriter(sink, sample_rate) as wav:
            for chunk in stream:
                wav.write(chunk.audio.numpy())
        return True
    except BrokenPipeError:
        # the reader is gone: nothing more can be written, and Python must not fail flushing stdout at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    finally:
        stream.close()


def stopped_at_cap(max_frames: int) -> str:
    """The note of an utterance cut at ``--max-frames`` before the model ended it (streamed or not)."""
    return f"stopped at --max-frames {max_frames} before the model ended the utterance (raise --max-frames for the rest)"


def run_stream(args, lm, runner, talker, generator, talker_sampling, t0: float, base: dict, notes) -> int:
    """``synth --stream``: the WAV (or standard output) as it comes, then the codes and ``--json`` atomically; the
    report goes to stderr when the audio goes to stdout. Returns 0 (a note when the reader closed stdout early)."""
    to_stdout = args.out == "-"
    codec = codec_stream_for(lm, chunk_frames=args.chunk_frames, table=args.codes_to_audio == "table")
    stream = synthesize_stream(lm, args.texts[0], runner=runner, talker=talker, codec_stream=codec,
                               chunk_frames=args.chunk_frames, generator=generator, max_frames=args.max_frames,
                               language=args.language, speaker=args.speaker, talker_sampling=talker_sampling)
    complete = _write_stream(stream, sys.stdout.buffer if to_stdout else Path(args.out), codec.sample_rate)
    s = stream.summary()
    if not complete:
        note(f"the reader of standard output closed it after {s['audio_s']:.2f} s of audio: stopped")
        return 0
    codes = stream.codes(0)
    ended = s["frames"] < args.max_frames  # frames() yields up to the cap, the end of speech not yielded
    if not ended:
        notes.append(stopped_at_cap(args.max_frames))
        note(notes[-1])
    stats = {**base, "stream": True, "out": args.out, **{k: v for k, v in s.items() if k not in ("cpu_s", "replay")},
             "thread_cpu_s": s["cpu_s"], "ended_by_itself": ended, "notes": notes, "text": args.texts[0],
             "codes": codes.tolist()}
    targets = _write(args, stats, t0, {} if to_stdout else {Path(args.out).with_suffix(".npy"): codes}, {}, None)
    report = sys.stderr if to_stdout else sys.stdout
    print(f"{s['frames']} frames ({s['audio_s']:.2f} s of audio) streamed in chunks of {args.chunk_frames} frame(s) "
          f"({B.runner_label(base)}) on {lm.device} ({lm.dtype}) | time to first audio {s['ttfa_ms']:.0f} ms after the "
          f"prompt ({s['ttfa_call_ms']:.0f} ms from the start of synthesis) | RTF {s['rtf']:.2f} | {s['underruns']} "
          f"underrun(s) ({s['stall_ms']:.0f} ms waited) | startup {base['startup_s']:.2f} s, load {base['load_s']:.2f} "
          f"s, total {stats['total_s']:.2f} s | {threads_text(s['threads'])} per side, generation and decoding "
          "overlapped", file=report)
    print(f"wrote {', '.join([args.out if not to_stdout else 'standard output'] + [str(t) for t in targets])}",
          file=report)
    return 0
