"""Command line: ``rvqspec synth`` (speak a text with any inner-loop decoder) and ``rvqspec bench`` (per-call latency).

Examples::

    rvqspec synth --model tiny-random --text "Hello world." --out out.wav --decoder tree --tree "0;1;0,0;0,0,0"
    rvqspec synth --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --text "Hello." --out hello.wav --decoder chain --window 4
    rvqspec bench --model qwen3-tts-0.6b-random --json bench.json
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


def _decoder_from_args(args):
    from .decode import AR, Chain, Tree
    from .trees import parse_paths

    if args.decoder == "ar":
        return AR()
    if args.decoder == "chain":
        return Chain(window=args.window)
    return Tree(paths=parse_paths(args.tree))


def add_synth_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="tiny-random, qwen3-tts-0.6b-random, a hub id or a checkpoint dir")
    p.add_argument("--text", required=True, help="sentence to speak")
    p.add_argument("--out", required=True, help="output .wav (codes go to .npy beside it when there is no codec)")
    p.add_argument("--decoder", choices=["ar", "chain", "tree"], default="ar", help="inner-loop decoder")
    p.add_argument("--window", type=int, default=4, help="chain window N (2..8): committed code + N-1 drafts")
    p.add_argument("--tree", default="0;1;0,0;0,0,0", help="tree rank paths: ';' between paths, ',' between ranks")
    p.add_argument("--seed", type=int, default=0, help="seed of the explicit generator")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--json", help="write statistics (frames, calls, tokens per call, wall time, codes) here")
    p.add_argument("--max-frames", type=int, default=200, help="frame cap (12.5 frames = 1 s)")
    p.add_argument("--language", default="auto", help="auto, english, german, ...")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])


def run_synth(args) -> int:
    import torch

    from .frame import synthesize
    from .models import load_model
    from .sampling import Sampling

    if not args.text or not args.text.strip():
        return _die("--text is empty: give the sentence to speak")
    out = Path(args.out)
    if not out.parent.exists():
        return _die(f"output folder {out.parent} does not exist: create it or choose another --out")
    try:
        decoder = _decoder_from_args(args)
        lm = load_model(args.model, dtype=args.dtype)
    except ValueError as e:
        return _die(str(e))
    gen = lm.generation or {}
    sampling = Sampling.from_generation_config(gen, loop="code_predictor", greedy=args.greedy)
    talker_sampling = Sampling.from_generation_config(gen, loop="talker", greedy=args.greedy)
    if lm.is_random:
        print(f"note: {args.model} has RANDOM weights (timing only): the audio and acceptance mean nothing",
              file=sys.stderr)
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

        wavs, sr = lm.speech_tokenizer.decode([{"audio_codes": res.codes[0]}])
        sf.write(out, np.asarray(wavs[0]), sr)
        audio_path = str(out)
    npy = out.with_suffix(".npy")
    np.save(npy, codes)
    stats = {
        "model": args.model,
        "random_weights": lm.is_random,
        "decoder": repr(decoder),
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
    if audio_path is None:
        print(f"no codec weights for {args.model}: codes written to {npy} (frames x {codes.shape[1]})")
    else:
        print(f"wrote {audio_path} and {npy}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rvqspec`` console script. Returns the exit status (2 on bad input)."""
    from . import bench

    parser = argparse.ArgumentParser(prog="rvqspec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_synth_args(sub.add_parser("synth", help="speak a text with a chosen inner-loop decoder"))
    bench.add_bench_args(sub.add_parser("bench", help="per-call latency of the talker and the code predictor"))
    args = parser.parse_args(argv)
    if args.cmd == "synth":
        return run_synth(args)
    try:
        return bench.run_bench(args)
    except ValueError as e:
        return _die(str(e))


if __name__ == "__main__":
    sys.exit(main())
