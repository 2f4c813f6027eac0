"""Time the native fused frame (rvqspec_lib.models.native_frame.NativeChainFrame) beside decode_frame through the
native backend, interleaved, on one thread.

    PYTHONPATH=. .venv/bin/python scripts/bench_native_frame.py [--model embedded] [--frames 40]
        [--precisions float32 int8-dynamic] [--windows 1 2 3 4 5 6]

Per precision: every decoder decodes the same ``--frames`` contexts (``torch.randn(1, 2, talker_hidden)``), one frame
per call, the decoders interleaved frame by frame (after one warm-up frame each); prints the median ms per frame, its
ratio to the native AR frame (``native-ar``, window 1), and the mean tokens per call (n_codes / calls).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--precisions", nargs="+", default=["float32", "int8-dynamic"])
    ap.add_argument("--windows", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--no-decode-frame", action="store_true", help="time the native frames only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from rvqspec_lib.decoding import predictor as P
    from rvqspec_lib.decoding.decode import decode_frame
    from rvqspec_lib.decoding.decoders import AR, Chain
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.native import NativeCodePredictor
    from rvqspec_lib.models.native_frame import NativeChainFrame
    from rvqspec_lib.models.precision import apply_precision

    lm = load_model(args.model)
    for prec in args.precisions:
        cp = apply_precision(copy.deepcopy(lm.code_predictor), prec)
        nb = NativeCodePredictor(cp)
        n = P.n_codes(cp)
        runs = {}
        for w in args.windows:
            f = NativeChainFrame(cp, w, backend=nb)
            runs[f.name] = (lambda f: lambda ctx, g: (f.decode(ctx, g), f.last_calls[0])[1])(f)
        if not args.no_decode_frame:
            for label, dec in (("decode_frame AR", AR()), ("decode_frame Chain(4)", Chain(4))):
                runs[label] = (lambda dec: lambda ctx, g: int(decode_frame(cp, ctx, decoder=dec, backend=nb,
                                                                             generator=g).calls[0]))(dec)
        times = {k: [] for k in runs}
        calls = {k: [] for k in runs}
        gen = torch.Generator().manual_seed(0)
        ctxs = [torch.randn(1, 2, P.talker_hidden_size(cp), generator=gen) for _ in range(args.frames + 1)]
        for i, ctx in enumerate(ctxs):
            for k, run in runs.items():
                g = torch.Generator().manual_seed(i)
                t0 = time.perf_counter()
                c = run(ctx, g)
                dt = time.perf_counter() - t0
                if i:  # frame 0 warms up
                    times[k].append(dt * 1e3)
                    calls[k].append(c)
        ar = statistics.median(times[runs and next(iter(runs))])
        print(f"\n{args.model} {prec} ({'fast' if nb.fast else 'plain C'} path), 1 thread, median of {args.frames} "
              f"frames, interleaved")
        print(f"{'decoder':24s} {'ms/frame':>9s} {'x native-ar':>12s} {'tokens/call':>12s}")
        for k in runs:
            med = statistics.median(times[k])
            tpc = statistics.mean(n / c for c in calls[k])
            print(f"{k:24s} {med:9.3f} {med / ar:12.3f} {tpc:12.3f}")


if __name__ == "__main__":
    main()
