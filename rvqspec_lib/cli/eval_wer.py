"""``rvqspec eval-wer``: WER parity of inner-loop decoders against AR, per language, with a LOSSY control (paper
Table 3; notebook 04 calls the same library functions, :mod:`rvqspec_lib.eval.wer_parity`).

Examples::

    rvqspec eval-wer --model embedded --decoders ar,chain:best,tree:calibrated-sampled:16,ssd-lossy --json wer.json
    rvqspec eval-wer --model embedded --languages en,de,ja --sentences 20
    rvqspec eval-wer --model /path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice --dataset /data/fleurs --codec /path/to/tok \\
        --languages en,de,es,ru,ja,zh --asr whisper:/path/to/whisper-large-v3-turbo
    rvqspec eval-wer --model embedded --asr pocketsphinx-prompt    # PROMPT-INFORMED (knows the references)

Exposes ``add_args(parser)`` and ``run(args) -> int`` (0 on success, 2 with a one-line ``rvqspec: error:`` message
on bad input, before any long work).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rvqspec_lib.cli.common import add_threads_arg, apply_threads, resolve_threads

DEFAULT_DECODERS = "ar,chain:best,tree:calibrated-point-mass:16,tree:calibrated-sampled:16,ssd-lossy"
#: ``--decoders`` help: the grammar's forms (rvqspec_lib.decoding.decoder_names) that eval-wer runs.
DECODERS_HELP = ("comma-separated: ar, chain:N, chain:best, tree:calibrated[-sampled|-point-mass][:N], "
                 "tree:<rank paths>, tree-sampled:<paths>, ssd-lossy[:BETA] (a LOSSY control), paper[:N] (the "
                 "paper's decoder: the offsets shipped beside the model + their calibrated point-mass tree, N "
                 "default 32); @DRAFTER after a name drafts with another shipped drafter and its own calibrated "
                 "trees (<model>/trees/DRAFTER.json), e.g. tree:calibrated-point-mass:16@offsets; AR is always "
                 f"added as the reference (default {DEFAULT_DECODERS})")


def _die(msg: str) -> int:
    print(f"rvqspec: error: {msg}", file=sys.stderr)
    return 2


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``rvqspec eval-wer``."""
    p.add_argument("--model", required=True, help="embedded, a checkpoint folder or a hub id")
    p.add_argument("--decoders", default=DEFAULT_DECODERS, help=DECODERS_HELP)
    p.add_argument("--languages", default="en", help="comma-separated ISO codes among en,de,es,ru,ja,zh")
    p.add_argument("--dataset", help="a Fleurs folder (save_to_disk; one config folder per language, e.g. de_de) or "
                                     "hub id; default for the embedded model: its shipped English evaluation split "
                                     "and the multilingual sentences rendered with espeak-ng")
    p.add_argument("--dataset-kind", default="fleurs", choices=["fleurs", "librispeech", "voxpopuli"])
    p.add_argument("--split", default=None, help="the dataset's split (default test)")
    p.add_argument("--codec", help="with --dataset: the codec of the model (e.g. the 12 Hz tokenizer folder)")
    p.add_argument("--calibration", help="calibrated trees of the heads (JSON of rvqspec_lib.eval.calibration); "
                                         "default <model>/trees/heads.json, else calibrated here on the shipped "
                                         "calibration split (other drafters: always <model>/trees/DRAFTER.json)")
    p.add_argument("--calibration-frames", type=int, default=1000,
                   help="calibration frames when the trees are calibrated here (and for chain:best)")
    p.add_argument("--sentences", type=int, default=None, help="at most this many utterances per language")
    p.add_argument("--replicates", type=int, default=1, help="draws per frame for the code-distribution tests")
    p.add_argument("--asr", default="auto",
                   help="recogniser: auto (= whisper-tiny.en for English, none elsewhere), whisper-tiny.en (OpenAI "
                        "Whisper tiny.en offline, CTranslate2), whisper[:PATH] (a CTranslate2 folder or a "
                        "transformers checkpoint, e.g. large-v3-turbo), pocketsphinx (default LM), "
                        "pocketsphinx-prompt (PROMPT-INFORMED: a bigram LM of the reference sentences), "
                        "parakeet[:PATH], none")
    p.add_argument("--free-running", action="store_true", help="also measure free running (talker sampled too)")
    p.add_argument("--no-null-control", action="store_true", help="skip AR under other seeds (the null control)")
    p.add_argument("--seed", type=int, default=0)
    add_threads_arg(p)
    p.add_argument("--work-dir", default="build/eval_wer", help="rendered audio and the calibration made here")
    p.add_argument("--json", help="write the results here")


def _check_out(path: str | None) -> str | None:
    if path is None:
        return None
    p = Path(path)
    if p.is_dir() or not p.name:
        return f"--json {path} is a folder: give a file name"
    if not (p.parent if str(p.parent) else Path(".")).is_dir():
        return f"output folder {p.parent} does not exist: create it or choose another --json"
    return None


def check_decoder_names(names, model: str) -> set[str]:
    """Parse every ``--decoders`` name before any work, and check the files the names with another drafter than
    the heads read beside the model (the drafter, its calibration). Returns what the HEADS' names need
    (``calibration``, ``best_chain``: made here when the model ships none).

    Raises:
        ValueError, FileNotFoundError: one line naming the fix.
    """
    from rvqspec_lib.cli.common import check_decoder_files
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name

    needs: set[str] = set()
    for name in names:
        d = parse_decoder_name(name, without=("auto",))
        if d.kind == "auto":
            raise ValueError("auto is chosen by timing (rvqspec synth --decoder auto): name decoders here, e.g. "
                             "chain:4,paper")
        if d.kind == "ar" or d.drafter == "heads":
            needs |= d.needs
            continue
        if d.best_window:
            raise ValueError(f"{d.text}: chain:best is chosen for the heads only: give chain:N@{d.drafter}")
        check_decoder_files(d, model)
    return needs


def run(args, threads: int | None = None) -> int:
    """Run ``rvqspec eval-wer``; returns the exit status."""

    from rvqspec_lib.eval.asr_models import check_asr_name
    from rvqspec_lib.eval.datasets import get_language
    from rvqspec_lib.decoding.decoder_names import split_decoder_list

    try:
        names = split_decoder_list(args.decoders)
        needs = check_decoder_names(names, args.model)
        languages = [x.strip() for x in (args.languages or "").split(",") if x.strip()]
        if not languages:
            raise ValueError("--languages is empty: e.g. --languages en,de")
        for lang in languages:
            get_language(lang)
        for flag, v in (("--sentences", args.sentences), ("--replicates", args.replicates),
                        ("--calibration-frames", args.calibration_frames)):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be >= 1, got {v}")
        check_asr_name(args.asr)
        if args.codec and not args.dataset:
            raise ValueError("--codec is used only with --dataset (it encodes the dataset's audio)")
        if args.dataset and not args.codec:
            raise ValueError("--dataset needs --codec (the codec that turns its audio into codes)")
        if args.calibration and not Path(args.calibration).is_file():
            raise ValueError(f"--calibration {args.calibration} does not exist")
        err = _check_out(args.json)
        if err:
            raise ValueError(err)
        if not args.dataset:
            from rvqspec_lib.data.utterances import embedded_root

            try:
                embedded_root(args.model)
            except FileNotFoundError:
                raise ValueError(f"no evaluation data for {', '.join(languages)} with model {args.model}: pass "
                                 "--dataset (a Fleurs folder written by save_to_disk, one config per language) and "
                                 "--codec") from None
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e))
    apply_threads(resolve_threads(args.threads, None) if threads is None else threads)
    progress = sys.stderr.isatty()
    try:
        return _run(args, names, needs, languages, progress)
    except (ValueError, FileNotFoundError) as e:
        return _die(str(e).splitlines()[0] if str(e) else type(e).__name__)


def _run(args, names, needs, languages, progress) -> int:
    from rvqspec_lib.embedded.eval_sets import (
        calibrate_decoders,
        calibration_data,
        evaluation_data,
    )
    from rvqspec_lib.eval import wer_parity as W
    from rvqspec_lib.eval.asr_models import recogniser
    from rvqspec_lib.eval.parity import entries_used, table1_rows
    from rvqspec_lib.models.drafter_files import shipped_drafter
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.tree_files import load_calibration, tree_file
    from rvqspec_lib.decoding.decoder_names import calibration_budgets, parse_decoder, parse_decoder_name
    from rvqspec_lib.models.speech_tokenizers import load_codec
    from rvqspec_lib.decoding.decoders import AR
    from rvqspec_lib.decoding.drafters import ReusedHeads

    lm = load_model(args.model)
    own = getattr(lm.speech_tokenizer, "codec", None)
    codec = load_codec(args.codec) if args.codec else own
    data = evaluation_data(args.model, languages, codec=codec, dataset=args.dataset, dataset_kind=args.dataset_kind,
                           split=args.split, n_sentences=args.sentences, seed=args.seed,
                           work_dir=args.work_dir, progress=progress)
    if codec is None:
        raise ValueError(f"{args.model} has no offline codec: pass --dataset and --codec")
    if lm.is_random:
        print(f"note: {args.model} has RANDOM weights: its WER means nothing", file=sys.stderr)
    # codes -> audio that codes 1..15 change: the offline codec's table decoder (its neural one ignores them)
    audio_codec = codec.with_decoder(None) if hasattr(codec, "with_decoder") else codec
    drafter = ReusedHeads()  # for decoders that carry no drafter of their own (the paper's carries its offsets)
    calibration, best_chain, cal_meta = None, None, []
    if needs:
        from rvqspec_lib.models.tree_files import tree_file

        path = Path(args.calibration) if args.calibration else tree_file(args.model, "heads")
        cal_utts, cal_meta = [], []
        if not ("best_chain" not in needs and path is not None and path.is_file()):
            cal_utts, cal_meta, _ = calibration_data(args.model, seed=args.seed)
        heads_names = [n for n in names if parse_decoder_name(n).drafter == "heads"]
        cal = calibrate_decoders(lm, cal_utts, needs=needs, calibration_path=path,
                                 max_frames=args.calibration_frames, budgets=calibration_budgets(heads_names) or None,
                                 seed=args.seed, progress=progress)
        calibration, best_chain = cal["calibration"], cal["best_chain"]
        cal_meta = entries_used(cal_meta, cal["n_frames"])
    decoders = {"ar": AR()}
    if not args.no_null_control:
        decoders[W.NULL_CONTROL] = AR()
    drafters, calibrations = {"heads": None}, {"heads": calibration}
    for name in names:
        d = parse_decoder_name(name)
        if d.kind != "ar" and d.drafter not in drafters:  # another drafter: shipped beside the model (checked)
            drafters[d.drafter] = shipped_drafter(lm, d.drafter, lm.code_predictor)
            if "calibration" in d.needs:
                calibrations[d.drafter] = load_calibration(
                    tree_file(lm, d.drafter), n_codes=lm.n_code_groups - 1, codebook_size=lm.codebook_size,
                    model=args.model, drafter=d.drafter)
        label, dec = parse_decoder(name, calibration=calibrations.get(d.drafter), best_chain=best_chain,
                                   drafter=drafters.get(d.drafter))
        decoders.setdefault(label, dec)
    results, free = {}, None
    for lang in languages:
        utts = data[lang]["utterances"]
        asr = recogniser(args.asr, lang, [u.text for u in utts])
        results[lang] = W.evaluate_language(lm, utts, decoders, language=lang, codec=audio_codec, asr=asr,
                                            seed=args.seed, replicates=args.replicates, drafter=drafter,
                                            progress=progress)
    if args.free_running and "en" in languages:
        utts = data["en"]["utterances"]
        asr = recogniser(args.asr, "en", [u.text for u in utts])
        if asr is not None:
            free = W.free_running_parity(lm, utts, decoders, codec=audio_codec, asr=asr, seed=args.seed,
                                         progress=progress)
    table3 = W.table3_rows(results)
    entries = cal_meta + [m for lang in languages for m in data[lang]["meta"]]
    out = {"model": args.model, "decoders": {k: repr(v) for k, v in decoders.items()}, "languages": languages,
           "table3": table3, "table1": table1_rows(entries), "results": results,
           "free_running": free, "best_chain": best_chain,
           "calibration": None if calibration is None else {k: calibration.get(k) for k in ("n_frames", "source")}}
    _print(table3, free)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


def _print(table3, free) -> None:
    for r in table3:
        wer = r.get("wer", r.get("cer"))
        line = (f"{r['language']:>3} {r['decoder']:<36} tokens/call {r['tokens_per_call']:.3f} "
                f"[{r['tpc_ci_low']:.3f}, {r['tpc_ci_high']:.3f}]")
        if "codes_differ_from_ar" in r:
            line += f"  codes differ from AR: {'YES' if r['codes_differ_from_ar'] else 'no'}"
            line += f" (Holm p {r['code_test_min_p_holm']:.2g})"
        if wer is not None:
            line += f"  {'WER' if 'wer' in r else 'CER'} {wer:.3f}"
            if "wer" in r and r.get("cer") is not None:
                line += f" CER {r['cer']:.3f}"
            if "diff_vs_ar" in r:
                line += f" ({r['diff_vs_ar']:+.3f} [{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}])"
        print(line)
    if free:
        for label, w in free["wer"].items():
            cer = f" CER {w['cer']:.3f}" if w.get("cer") is not None else ""
            print(f"free running {label:<30} WER {w['rate']:.3f}{cer} ({w['n_outliers']} outliers apart)")


__all__ = ["add_args", "run", "DEFAULT_DECODERS"]
