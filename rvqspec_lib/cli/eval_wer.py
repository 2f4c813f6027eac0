"""``rvqspec eval-wer``: WER parity of inner-loop decoders against AR, per language, with a LOSSY control (paper
Table 3; docs/cli.md#rvqspec-eval-wer; notebook 05 calls the same :mod:`rvqspec_lib.eval.wer_parity`)."""

from __future__ import annotations

import sys
from pathlib import Path

from rvqspec_lib.cli.common import load, note, write_json
from rvqspec_lib.data.frame_choice import check_dataset_flags
from rvqspec_lib.data.utterances import embedded_root
from rvqspec_lib.decoding.decoder_names import calibration_budgets, parse_decoder_name, split_decoder_list
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.eval.eval_sets import calibrate_decoders, calibration_data, evaluation_data
from rvqspec_lib.eval import wer_parity as W
from rvqspec_lib.eval.asr_models import check_asr_name, recogniser
from rvqspec_lib.eval.datasets import get_language
from rvqspec_lib.eval.parity import entries_used, table1_rows
from rvqspec_lib.models.named_decoders import check_files, resolve_all
from rvqspec_lib.models.speech_tokenizers import load_codec
from rvqspec_lib.models.tree_files import tree_file


def check_names(names, model: str) -> set[str]:
    """Parse every ``--decoders`` name and check the files other drafters than the heads read; returns what the
    heads' names need (``calibration``, ``best_chain``). Raises ValueError, FileNotFoundError (one line)."""
    needs: set[str] = set()
    for text in names:
        d = parse_decoder_name(text, without=("auto",))
        if d.kind == "auto":
            raise ValueError("auto is chosen by timing (rvqspec synth --decoder auto): name decoders here, e.g. "
                             "chain:4,paper")
        if d.kind == "ar" or d.drafter == "heads":
            needs |= d.needs
        elif d.best_window:
            raise ValueError(f"{d.text}: chain:best is chosen for the heads only: give chain:N@{d.drafter}")
        else:
            check_files(d, model)
    return needs


def _check(args) -> tuple[list[str], set[str], list[str]]:
    """Every check before any work: ``(decoder names, what the heads' names need, languages)``."""
    names = split_decoder_list(args.decoders)
    needs = check_names(names, args.model)
    languages = [x.strip() for x in (args.languages or "").split(",") if x.strip()]
    if not languages:
        raise ValueError("--languages is empty: e.g. --languages en,de")
    for lang in languages:
        get_language(lang)
    check_asr_name(args.asr)
    check_dataset_flags(args.dataset, args.codec)
    if args.calibration and not Path(args.calibration).is_file():
        raise ValueError(f"--calibration {args.calibration} does not exist: give a calibration JSON (`rvqspec "
                         "prepare --model M` writes <model>/trees/heads.json), or drop it to use the "
                         "model's own or calibrate here")
    if not args.dataset:
        try:
            embedded_root(args.model)
        except FileNotFoundError:
            raise ValueError(f"no evaluation data for {', '.join(languages)} with model {args.model}: pass --dataset "
                             "(a Fleurs folder written by save_to_disk, one config per language) and --codec") from None
    return names, needs, languages


def run(args, threads: int) -> int:
    """``rvqspec eval-wer``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    names, needs, languages = _check(args)
    lm = load(args, threads)[0]
    progress = sys.stderr.isatty()
    print(f"{args.model} on {lm.device} ({lm.dtype})")
    own = getattr(lm.speech_tokenizer, "codec", None)
    codec = load_codec(args.codec, device=lm.device) if args.codec else own
    data = evaluation_data(args.model, languages, codec=codec, dataset=args.dataset, dataset_kind=args.dataset_kind,
                           split=args.split, n_sentences=args.sentences, seed=args.seed,
                           work_dir=args.work_dir, progress=progress)
    if codec is None:
        raise ValueError(f"{args.model} has no offline codec: pass --dataset and --codec")
    if lm.is_random:  # after the data is read: an error in it is the only line
        note(f"{args.model} has RANDOM weights: its WER means nothing")
    # codes -> audio that every code 1..15 moves: the offline codec's table decoder (the sum of the chosen codebook
    # entries, nothing learned between a code and the audio); a real checkpoint's own 12 Hz decoder otherwise
    audio_codec = codec.with_decoder(None) if hasattr(codec, "with_decoder") else codec
    calibration, best_chain, cal_meta = None, None, []
    if needs:
        path = Path(args.calibration) if args.calibration else tree_file(args.model, "heads")
        cal_utts = []
        if "best_chain" in needs or path is None or not path.is_file():
            cal_utts, cal_meta, _ = calibration_data(args.model, seed=args.seed)
        heads = [n for n in names if parse_decoder_name(n).drafter == "heads"]
        cal = calibrate_decoders(lm, cal_utts, needs=needs, calibration_path=path,
                                 max_frames=args.calibration_frames, budgets=calibration_budgets(heads) or None,
                                 seed=args.seed, progress=progress)
        calibration, best_chain = cal["calibration"], cal["best_chain"]
        cal_meta = entries_used(cal_meta, cal["n_frames"])
    named = resolve_all(names, lm, calibrations={"heads": calibration} if calibration else None,
                        best_chain=best_chain)
    decoders = {"ar": AR(), **({} if args.no_null_control else {W.NULL_CONTROL: AR()}), **named}
    results, free = {}, None
    for lang in languages:
        utts = data[lang]["utterances"]
        results[lang] = W.evaluate_language(lm, utts, decoders, language=lang, codec=audio_codec,
                                            asr=recogniser(args.asr, lang, [u.text for u in utts]), seed=args.seed,
                                            replicates=args.replicates, drafter=ReusedHeads(), progress=progress)
    if args.free_running and "en" in languages:
        en = data["en"]["utterances"]
        free = W.free_running_parity(lm, en, decoders, codec=audio_codec, asr=recogniser(args.asr, "en", [
            u.text for u in en]), seed=args.seed, progress=progress)
    table3 = W.table3_rows(results)
    entries = cal_meta + [m for lang in languages for m in data[lang]["meta"]]
    out = {"model": args.model, "device": lm.device, "model_dtype": lm.dtype,
           "decoders": {k: repr(W.decoder_of(v)) for k, v in decoders.items()},
           "languages": languages, "table3": table3, "table1": table1_rows(entries), "results": results,
           "free_running": free, "best_chain": best_chain,
           "calibration": calibration and {k: calibration.get(k) for k in ("n_frames", "source")}}
    _print(table3, free)
    write_json(args.json, out)
    return 0


def _print(table3, free) -> None:
    for r in table3:
        line = (f"{r['language']:>3} {r['decoder'] + (' (LOSSY control)' if r['lossy'] else ''):<36} tokens/call "
                f"{r['tokens_per_call']:.3f} [{r['tpc_ci_low']:.3f}, {r['tpc_ci_high']:.3f}]")
        if "codes_differ_from_ar" in r:
            line += (f"  codes differ from AR: {'YES' if r['codes_differ_from_ar'] else 'no'} (Holm p "
                     f"{r['code_test_min_p_holm']:.2g})")
        if r.get("wer", r.get("cer")) is not None:
            line += f"  {'WER' if 'wer' in r else 'CER'} {r.get('wer', r.get('cer')):.3f}"
            line += f" CER {r['cer']:.3f}" if "wer" in r and r.get("cer") is not None else ""
            if "diff_vs_ar" in r:
                line += f" ({r['diff_vs_ar']:+.3f} [{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}])"
        print(line)
    for label, w in (free or {}).get("wer", {}).items():
        cer = f" CER {w['cer']:.3f}" if w.get("cer") is not None else ""
        print(f"free running {label:<30} WER {w['rate']:.3f}{cer} ({w['n_outliers']} outliers apart)")
