"""``rvqspec export``: one code-predictor graph to ONNX or Core ML, checked against eager PyTorch where it can run.

Examples::

    rvqspec export --model qwen3-tts-0.6b-random --format onnx --graph verify --nodes 32 --out build/export
    rvqspec export --model embedded --format coreml --graph frame --dtype float16 --out build/export

Writes ``<out>/<graph>[-n<N>]-<dtype>.onnx|.mlpackage`` and ``<same stem>.json`` beside it: the declared inputs,
outputs and states (the tree's paths for a verify graph), the file's size, the agreement with eager PyTorch and
provenance. ONNX files are run with ONNX Runtime and compared here; Core ML packages are built anywhere and
predicted, compared and timed per compute unit on macOS 15+ only (elsewhere the JSON says so; ``--predict`` makes
that an error). Bad input (an unknown format or graph, N outside 2..64, a model whose code predictor cannot be
exported, ``--predict`` off macOS) is a one-line error before any work (rvqspec_lib.models.export_graphs,
rvqspec_lib.models.export_formats).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: ``--format`` and ``--graph`` values (kept here so that the parser does not import torch).
FORMATS = ("onnx", "coreml")
GRAPHS = ("stepped", "verify", "frame")
DTYPES = ("float32", "float16")
TARGETS = ("macOS15", "iOS18")


from rvqspec_lib.cli.common import _die, add_threads_arg, check_output_folder, check_tree_ranks, note


def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``rvqspec export``'s options to ``p``; returns it. Values are checked by :func:`run` (one-line errors)."""
    p.add_argument("--model", required=True, help="embedded, tiny-random, qwen3-tts-0.6b-random, a checkpoint dir "
                   "or hub id")
    p.add_argument("--format", dest="fmt", required=True, help="onnx (run and checked here) or coreml (.mlpackage; "
                   "predicted on macOS 15+ only)")
    p.add_argument("--graph", required=True, help="stepped (one position per call, logits of every head), verify "
                   "(the fused verify call of N positions), frame (all codes of a frame, sampling inside)")
    p.add_argument("--nodes", type=int, default=None, help="verify graph: node budget N, the root included (2..64; "
                   "default 4, or the --tree's size)")
    p.add_argument("--tree", default=None, help="verify graph: rank paths of the tree, e.g. '0;1;0,0' "
                   "(default: a chain of N-1 drafts)")
    p.add_argument("--decoder", default=None, help="verify graph: the tree of a decoder name instead of --tree: "
                   "paper[:N] (the paper's decoder: the calibrated point-mass tree of the offsets shipped beside the "
                   "model, N default 32), tree:calibrated[-point-mass|-sampled]:N[@DRAFTER], chain:N, tree:PATHS")
    p.add_argument("--dtype", default="float32", help="float32 or float16")
    p.add_argument("--target", default="macOS15", help="Core ML deployment target: macOS15 or iOS18 (KV-cache "
                   "states need 15/18)")
    p.add_argument("--predict", action="store_true", help="Core ML: require prediction, comparison and timing "
                   "(macOS 15+; without it a package is only built off macOS)")
    p.add_argument("--out", required=True, help="output folder (created if its parent exists)")
    p.add_argument("--repeats", type=int, default=20, help="Core ML on macOS: timed calls per compute unit")
    add_threads_arg(p)
    return p


def check_args(args) -> str | None:
    """Why the arguments cannot run (one line naming the fix), or ``None``; checked before any work."""
    if args.fmt not in FORMATS:
        return f"unknown --format {args.fmt!r}: use onnx or coreml"
    if args.graph not in GRAPHS:
        return f"unknown --graph {args.graph!r}: use stepped, verify or frame"
    if args.dtype not in DTYPES:
        return f"unknown --dtype {args.dtype!r}: use float32 or float16"
    if args.target not in TARGETS:
        return f"unknown --target {args.target!r}: use macOS15 or iOS18"
    if args.graph != "verify" and (args.nodes is not None or args.tree is not None
                                   or getattr(args, "decoder", None) is not None):
        given = [f for f, v in (("--decoder", getattr(args, "decoder", None)), ("--nodes", args.nodes),
                                ("--tree", args.tree)) if v is not None]
        return f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for --graph verify; the {args.graph} graph " \
               "has no tree: drop it or use --graph verify"
    if args.tree is not None and getattr(args, "decoder", None) is not None:
        return "--tree and --decoder both name the verify graph's tree: give one"
    if args.nodes is not None and not 2 <= args.nodes <= 64:
        return f"--nodes must be in 2..64 (query positions of one verify call, the root included), got {args.nodes}"
    if args.repeats < 1:
        return f"--repeats must be >= 1, got {args.repeats}"
    if args.predict and args.fmt != "coreml":
        return "--predict is for --format coreml (ONNX files are always run with ONNX Runtime here)"
    if args.fmt == "coreml":
        from rvqspec_lib.models.export_formats import coreml_available

        ok, why = coreml_available()
        if args.predict and not ok:
            return f"--predict: {why}; drop --predict to build the package here"
    return check_output_folder(args.out)  # a folder, writable, before the model loads (the export takes minutes)


def _decoder_tree(args):
    """The DraftTree of ``--decoder NAME`` (before the model loads: a calibrated tree is read from the model's
    files, checked), or ``None`` without ``--decoder``."""
    from rvqspec_lib.cli.common import check_decoder_files
    from rvqspec_lib.models.tree_files import load_calibration, tree_file
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name

    text = getattr(args, "decoder", None)
    if text is None:
        return None
    name = parse_decoder_name(text)
    if name.kind in ("ar", "auto", "ssd-lossy") or name.best_window:
        raise ValueError(f"--decoder {name.text}: a verify graph needs a tree: give paper[:N], "
                         "tree:calibrated...:N, chain:N or tree:PATHS")
    check_decoder_files(name, args.model)
    if name.kind in ("calibrated", "paper"):
        cal = load_calibration(tree_file(args.model, name.drafter), model=args.model, drafter=name.drafter)
        return name.calibrated_tree(cal).tree(0)
    from dataclasses import replace

    return replace(name, drafter="heads").decoder().tree(0)  # the graph holds the tree, not the drafter


def _tree_and_nodes(args):
    from rvqspec_lib.decoding.trees import DraftTree, parse_paths

    if args.graph != "verify":
        return None, None
    tree = _decoder_tree(args)
    if tree is not None and args.nodes is not None and args.nodes != tree.n_nodes + 1:
        raise ValueError(f"--decoder {args.decoder}'s tree has {tree.n_nodes} nodes, so N = {tree.n_nodes + 1}; "
                         f"--nodes {args.nodes} disagrees: drop --nodes")
    if args.tree is not None:
        tree = DraftTree.from_paths(parse_paths(args.tree))
        if args.nodes is not None and args.nodes != tree.n_nodes + 1:
            raise ValueError(f"--tree has {tree.n_nodes} nodes, so N = {tree.n_nodes + 1}; --nodes {args.nodes} "
                             "disagrees: drop --nodes or change the tree")
        if tree.n_nodes + 1 > 64:
            raise ValueError(f"--tree has {tree.n_nodes} nodes: a verify graph takes at most 63 (N <= 64)")
    n = args.nodes if args.nodes is not None else (tree.n_nodes + 1 if tree is not None else 4)
    return (tree if tree is not None else DraftTree.chain(n - 1)), n


def run(args, threads: int = 1) -> int:
    """Run ``rvqspec export`` from parsed :func:`add_args` options; returns the exit status (2 on bad input).
    ``threads``: torch's CPU threads (0 keeps torch's choice), applied after the cheap checks."""
    problem = check_args(args)
    if problem:
        return _die(problem)
    try:
        tree, nodes = _tree_and_nodes(args)
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e))
    from rvqspec_lib.cli.common import apply_threads

    apply_threads(threads)
    import torch

    from rvqspec_lib.common.files import write_text_atomic
    from rvqspec_lib.common.provenance import provenance
    from rvqspec_lib.eval import export_check as T
    from rvqspec_lib.models import export_formats as F
    from rvqspec_lib.models import export_graphs as G
    from rvqspec_lib.models.loader import load_model

    try:
        lm = load_model(args.model)
        cp = lm.code_predictor.eval()
        G.check_exportable(cp)
        if tree is not None:
            check_tree_ranks([tree], int(cp.config.vocab_size))
    except ValueError as e:
        return _die(str(e))
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    stem = f"{args.graph}" + (f"-n{nodes}" if nodes else "") + f"-{args.dtype}"
    path = out / (stem + F.FORMATS[args.fmt])
    if lm.is_random:
        print(f"note: {args.model} has RANDOM weights: the graph's shapes and timing are real, its outputs mean "
              "nothing", file=sys.stderr)
    try:
        res = F.export_graph(cp, args.graph, args.fmt, path, dtype=args.dtype, nodes=nodes, tree=tree,
                             target=args.target)
        agreement = [r for r in T.check_file(cp, args.graph, path, dtype=args.dtype, nodes=nodes, tree=tree)
                     if r["ran"]]
    except ValueError as e:
        return _die(str(e))
    timing = None
    if args.fmt == "coreml" and F.coreml_available()[0]:
        timing = T.coreml_call_times(cp, out / f".time-{stem}", nodes=[nodes] if nodes else [4],
                                     repeats=args.repeats, progress=sys.stderr.isatty())["rows"]
    info = {"model": args.model, "random_weights": lm.is_random, **{k: v for k, v in res.items() if k != "path"},
            "file": path.name, "tree": [list(p) for p in tree.paths] if tree is not None else None,
            "decoder": getattr(args, "decoder", None),
            "agreement": agreement, "coreml_timing": timing,
            "ran": bool(agreement), "note": "" if agreement else F.coreml_available()[1],
            "provenance": provenance({"model": args.model, "format": args.fmt, "graph": args.graph,
                                      "dtype": args.dtype, "nodes": nodes, "threads": torch.get_num_threads()})}
    write_text_atomic(out / (stem + ".json"), json.dumps(info, indent=1, default=str) + "\n")
    print(f"wrote {path} ({res['bytes'] / 1e6:.1f} MB, {res['export_s']:.0f} s; inputs "
          f"{', '.join(r[0] for r in res['written']['inputs'])}; outputs "
          f"{', '.join(r[0] for r in res['written']['outputs'])}"
          + (f"; states {', '.join(r[0] for r in res['written']['states'])}" if res["written"]["states"] else "")
          + ")")
    if args.fmt == "coreml" and args.dtype == "float32" and res["written"]["states"]:
        states = ", ".join(r[0] for r in res["written"]["states"])
        note(f"--dtype float32 computes in float32, but the KV-cache states ({states}) stay float16: Core ML states "
             "are float16 only (coremltools 9), so keys and values are rounded to float16 once, when written")
    if res["declared"] != res["written"]:
        return _die(f"{path} does not declare the graph's inputs/outputs/states (see {stem}.json): an exporter "
                    "problem, please report it")
    for r in agreement:
        if "max_abs_logit_diff" in r:
            print(f"{r['runner']}: max abs logit difference {r['max_abs_logit_diff']:.2e} vs eager PyTorch "
                  f"(relative {r['relative_diff']:.1e}, tolerance {r['tolerance']:.0e})")
        else:
            print(f"{r['runner']}: codes equal to eager PyTorch for {100 * r['codes_equal_frac']:.0f}% of codes")
    if not agreement:
        print(f"not run: {F.coreml_available()[1]}")
    return 0
