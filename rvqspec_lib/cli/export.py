"""``rvqspec export``: one code-predictor graph to ONNX or Core ML, checked against eager PyTorch where it can run
(docs/cli.md#rvqspec-export): ``<out>/<graph>[-n<N>]-<dtype>.onnx|.mlpackage`` and its ``.json`` (inputs, outputs,
states, size, agreement, provenance); bad input is a one-line error before any work."""

from __future__ import annotations

import sys

from rvqspec_lib.cli.common import _die, check_tree_ranks, load, make_folder, note
from rvqspec_lib.common.files import write_json_atomic
from rvqspec_lib.common.provenance import provenance
from rvqspec_lib.decoding.decoder_names import MAX_BUDGET, parse_decoder_name
from rvqspec_lib.decoding.trees import DraftTree
from rvqspec_lib.eval import export_check as T
from rvqspec_lib.device import export_check as X
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device import export_graphs as G
from rvqspec_lib.models.named_decoders import check_files, resolve

#: Node budget N of a verify graph given neither --nodes nor --decoder (a chain of 3 drafts).
DEFAULT_NODES = 4


def check_args(args) -> int | None:
    """Every check before the model loads; returns the verify graph's node budget N (``None`` for the other graphs)
    and sets ``args.decoder_name``. Raises ValueError, FileNotFoundError (one line naming the fix)."""
    args.decoder_name = None
    if args.graph != "verify" and (args.nodes is not None or args.decoder is not None):
        given = [f for f, v in (("--decoder", args.decoder), ("--nodes", args.nodes)) if v is not None]
        raise ValueError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for --graph verify; the "
                         f"{args.graph} graph has no tree: drop it or use --graph verify")
    if args.predict and args.fmt != "coreml":
        raise ValueError("--predict is for --format coreml (ONNX files are always run with ONNX Runtime here)")
    if args.predict and not F.coreml_available()[0]:
        raise ValueError(f"--predict: {F.coreml_available()[1]}; drop --predict to build the package here")
    if args.graph != "verify":
        return None
    if args.decoder is None:
        return DEFAULT_NODES if args.nodes is None else args.nodes
    name = args.decoder_name = parse_decoder_name(args.decoder)
    if name.kind in ("ar", "auto", "ssd-lossy") or name.best_window:
        raise ValueError(f"--decoder {name.text}: a verify graph needs a tree: give tree:PATHS, chain:N, "
                         "tree:calibrated...:N or paper[:N]")
    check_files(name, args.model)
    n = name.fields()["nodes"]
    if n > MAX_BUDGET:
        raise ValueError(f"--decoder {name.text} has {n - 1} drafted nodes: a verify graph takes at most "
                         f"{MAX_BUDGET - 1} (N <= {MAX_BUDGET})")
    if args.nodes is not None and args.nodes != n:
        raise ValueError(f"--decoder {name.text}'s tree has {n - 1} nodes, so N = {n}; --nodes {args.nodes} "
                         "disagrees: drop --nodes")
    return n


def run(args, threads: int) -> int:
    """``rvqspec export``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    nodes = check_args(args)
    lm, threads, _ = load(args, threads, "the graph's shapes and timing are real, its outputs mean nothing",
                          cpu_only="export (it traces and checks its graphs on the CPU)",
                          check=lambda m: check_tree_ranks([args.decoder_name], m.codebook_size))  # None: no tree
    cp = lm.code_predictor.eval()
    G.check_exportable(cp)
    # the graph holds the tree, not the drafter; paper without :N is capped to the largest calibrated budget
    tree = resolve(args.decoder_name, lm).decoder.tree(0) if args.decoder_name else \
        DraftTree.chain(nodes - 1) if nodes else None
    nodes = tree.n_nodes + 1 if tree is not None else None
    out = make_folder(args.out, "--out")  # and its missing parents
    stem = f"{args.graph}" + (f"-n{nodes}" if nodes else "") + f"-{args.dtype}"
    path = out / (stem + F.FORMATS[args.fmt])
    res = F.export_graph(cp, args.graph, args.fmt, path, dtype=args.dtype, nodes=nodes, tree=tree, target=args.target)
    agreement = [r for r in X.check_file(cp, args.graph, path, dtype=args.dtype, nodes=nodes, tree=tree) if r["ran"]]
    timing = None
    if args.fmt == "coreml" and F.coreml_available()[0]:
        timing = T.coreml_call_times(cp, out / f".time-{stem}", nodes=[nodes] if nodes else [4],
                                     repeats=args.repeats, progress=sys.stderr.isatty())["rows"]
    info = {"model": args.model, "random_weights": lm.is_random, **{k: v for k, v in res.items() if k != "path"},
            "file": path.name, "tree": [list(p) for p in tree.paths] if tree is not None else None,
            "decoder": args.decoder, "agreement": agreement, "coreml_timing": timing, "ran": bool(agreement),
            "note": "" if agreement else F.coreml_available()[1],
            "provenance": provenance({"model": args.model, "format": args.fmt, "graph": args.graph,
                                      "dtype": args.dtype, "nodes": nodes, "threads": threads,
                                      "device": lm.device})}
    write_json_atomic(out / (stem + ".json"), info)
    inputs, outputs, states = (", ".join(r[0] for r in res["written"][k]) for k in ("inputs", "outputs", "states"))
    print(f"wrote {path} ({res['bytes'] / 1e6:.1f} MB, {res['export_s']:.0f} s; inputs {inputs}; outputs {outputs}"
          + (f"; states {states}" if states else "") + ")")
    if args.fmt == "coreml" and args.dtype == "float32" and states:
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
