"""Benchmark the streaming codec decoder (rvqspec_lib.device.streaming_codec) against the official chunked_decode
and against its floors, and print the table (docs/codec_streaming.md).

The real-size decoder is built from the released config (data/configs/Qwen3-TTS-Tokenizer-12Hz) with RANDOM weights:
the times are real, the audio means nothing. Run it alone on the machine (one torch thread by default); a timing
during which other processes used the CPU is marked OVERSUBSCRIBED, and the thread-CPU-time column is the one to
read then.

    .venv/bin/python scripts/bench_streaming_codec.py                      # float32 (+ bfloat16 if native), 1 2 4 8
    .venv/bin/python scripts/bench_streaming_codec.py --chunks 1 8 --no-official --json build/stream.json
    .venv/bin/python scripts/bench_streaming_codec.py --fidelity           # stream / chunked_decode vs forward
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.codec_stream_bench import (  # noqa: E402
    CHUNK_FRAMES,
    fidelity,
    format_streaming_table,
    streaming_table,
)
from rvqspec_lib.common.files import json_text  # noqa: E402
from rvqspec_lib.models.configs import build_codec_decoder  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", choices=("float32", "bfloat16"), default=None,
                    help="default: float32, and bfloat16 where the CPU runs it natively")
    ap.add_argument("--chunks", nargs="+", type=int, default=list(CHUNK_FRAMES), help="chunk sizes in frames")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=12, help="timed chunks of the stream per row")
    ap.add_argument("--official-repeats", type=int, default=3, help="timed chunked_decode chunks per row")
    ap.add_argument("--no-official", action="store_true", help="skip the official chunked_decode (slow)")
    ap.add_argument("--config", default="released", choices=("released", "tiny"))
    ap.add_argument("--fidelity", action="store_true",
                    help="also: relative RMS difference of the stream and of chunked_decode from the full forward "
                         "(float32, 100 frames, chunks of 4)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args(argv)
    if min(args.chunks) < 1:
        ap.error("--chunks must be >= 1 frame")
    try:
        result = streaming_table(precisions=tuple(args.precisions) if args.precisions else None,
                                 chunk_frames=tuple(args.chunks), config=args.config, threads=args.threads,
                                 repeats=args.repeats, official_repeats=args.official_repeats,
                                 official=not args.no_official)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_streaming_table(result))
    if args.fidelity:
        fid = fidelity(build_codec_decoder(args.config))
        result["fidelity"] = fid
        print(f"\nfidelity (float32, {fid['frames']} frames in chunks of {fid['chunk_frames']}; relative RMS "
              f"difference from the full forward): stream {fid['stream_vs_forward']:.1e}; chunked_decode "
              f"{fid['chunked_vs_forward_head']:.1e} over the first 26 frames, {fid['chunked_vs_forward_tail']:.1e} "
              "after (25 frames of context against a 72-frame attention window)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json_text(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
