"""Time the talker step, official and native (rvqspec_lib.device.native_talker.NativeTalker), per precision, at
contexts 64 and 512, in one interleaved run on one torch thread, against the weight-streaming floor.

    PYTHONPATH=. nice .venv/bin/python scripts/bench_talker.py [--model qwen3-tts-0.6b-random]
        [--precisions float32 bfloat16 int8 int8-dynamic] [--contexts 64 512] [--repeats 15] [--json out.json]
        [--scan-capacity 2048]

The real-size architecture is built from the shipped config with RANDOM weights: timing only. Prints the table of
:func:`bench.talker_bench.format_talker_table`, then what the prefix scan of the native KV cache saves
against scanning the whole capacity (:func:`bench.talker_bench.scan_cost`; ``--scan-capacity 0`` skips
it). Memory: one slim copy of the talker per precision plus its packed copy (about 7 GB on the 0.6B with all four
precisions).
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-tts-0.6b-random")
    ap.add_argument("--precisions", nargs="+", default=None, help="default: those this CPU runs natively")
    ap.add_argument("--contexts", nargs="+", type=int, default=[64, 512])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--scan-capacity", type=int, default=2048)
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from bench.talker_bench import bench_talker_precisions, format_talker_table, scan_cost, slim_talker
    from rvqspec_lib.common.files import json_text
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.device.native_talker import NativeTalker

    lm = load_model(args.model)
    name, random = lm.name, bool(lm.is_random)
    talker = slim_talker(lm.talker)
    del lm
    gc.collect()
    res = bench_talker_precisions(talker, args.precisions, contexts=args.contexts, warmup=args.warmup,
                                  repeats=args.repeats, progress=True, model_name=name, random_weights=random)
    print(format_talker_table(res))
    if args.scan_capacity:
        gc.collect()
        sc = scan_cost(NativeTalker(talker), context=min(args.contexts), capacity=args.scan_capacity,
                       repeats=args.repeats)
        res["scan_cost"] = {**sc, "precision": "float32"}
        print(f"KV scan (float32, context {sc['context']}, capacity {sc['capacity']}): prefix {sc['prefix_ms']:.2f} "
              f"ms, whole cache {sc['whole_cache_ms']:.2f} ms, saved {sc['saved_ms']:.2f} ms a step (CPU time: "
              f"{sc['prefix_cpu_ms']:.2f}, {sc['whole_cache_cpu_ms']:.2f}, saved {sc['saved_cpu_ms']:.2f} ms)")
    if args.json:
        args.json.write_text(json_text(res))


if __name__ == "__main__":
    main()
