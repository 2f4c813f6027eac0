"""The paper's decoder beside the others, for the notebooks: decoders built from names of the one grammar
(:mod:`rvqspec_lib.decoding.decoder_names`) with each drafter's OWN calibrated trees, the best node budget of a
calibration, and the transfer question of the paper's Table 3 (do offsets trained on English keep their tokens per
call in other languages?) answered from measured tokens per call.

The paper's decoder (``paper[:N]``) is the position-aware offsets shipped beside the model
(``<model>/drafters/offsets.safetensors``) verified through their own calibrated point-mass tree
(``<model>/trees/offsets.json``), N = 32 by default (the paper's node budget; paper §4, Table 2).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rvqspec_lib.eval import parity as S
from rvqspec_lib.models.drafter_files import shipped_drafter, shipped_drafters
from rvqspec_lib.models.tree_files import load_calibration, tree_file
from rvqspec_lib.decoding.decoder_names import PAPER_DRAFTER, decoder_label, parse_decoder_name


def drafter_calibration(lm, drafter: str = "heads") -> dict | None:
    """The calibration shipped beside a loaded model for ``drafter`` (``<model>/trees/<drafter>.json``), checked
    against the model's number of codes and codebook size; ``None`` when the model has no folder or no such file.

    Raises:
        ValueError: a damaged file or one made for another model (one line naming the command that remakes it).
    """
    path = tree_file(lm, drafter)
    if path is None or not path.is_file():
        return None
    return load_calibration(path, n_codes=lm.n_code_groups - 1, codebook_size=lm.codebook_size, model=lm.name,
                            drafter=drafter)


def has_paper_decoder(lm) -> bool:
    """Whether a loaded model ships what ``paper`` needs: the offsets drafter and its calibration file."""
    path = tree_file(lm, PAPER_DRAFTER)
    return path is not None and path.is_file() and PAPER_DRAFTER in shipped_drafters(lm)


def named_decoders(lm, names: Sequence[str], *, calibrations: Mapping[str, dict] | None = None,
                   drafters: Mapping[str, object] | None = None) -> dict:
    """``{label: decoder}`` for decoder names of the grammar (``ar``, ``chain:4``, ``tree:calibrated-point-mass:16``,
    ``...@offsets``, ``paper[:N]``), each drafting with its own drafter (carried by the decoder) and its tree read
    from that drafter's own calibration. Labels are :func:`~rvqspec_lib.decoding.decoder_names.decoder_label`'s
    (``paper-N32``, ``tree-pm-N16@offsets`` ...).

    Args:
        lm: the loaded model (its folder holds the drafters and calibrations).
        names: decoder names. calibrations: ``{drafter: calibration dict}`` to use instead of the shipped files
            (e.g. calibrated in the run itself). drafters: ``{drafter: module}`` to use instead of loading the
            shipped file (e.g. trained in the run itself).

    Raises:
        ValueError: a bad name, a drafter not shipped, a missing calibration or budget (one line each).
    """
    calibrations, drafters = dict(calibrations or {}), dict(drafters or {})
    out = {}
    for text in names:
        name = parse_decoder_name(text)
        drafter = None
        if name.kind != "ar" and name.drafter != "heads":
            if name.drafter not in drafters:
                drafters[name.drafter] = shipped_drafter(lm, name.drafter, lm.code_predictor)
            drafter = drafters[name.drafter]
        cal = None
        if "calibration" in name.needs:
            if name.drafter not in calibrations:
                calibrations[name.drafter] = drafter_calibration(lm, name.drafter)
            cal = calibrations[name.drafter]
        dec = name.decoder(calibration=cal, drafter=drafter)
        out[decoder_label(dec, name)] = dec
    return out


def best_budget(calibration: dict, kind: str = "point-mass", budgets: Sequence[int] | None = None) -> int:
    """The node budget N with the highest PREDICTED tokens per call E(N) of a calibration's ``kind`` of tree, among
    ``budgets`` (default every calibrated one); ties go to the smaller N. E(N) of a greedy tree never falls as N
    grows, so this is the largest budget unless the gain stops: speed is another question (notebook 03).

    Raises:
        ValueError: no calibrated budget among ``budgets``.
    """
    have = [int(b) for b in calibration["budgets"]]
    cands = [b for b in (have if budgets is None else [int(b) for b in budgets]) if b in have]
    if not cands:
        raise ValueError(f"none of the budgets {list(budgets or [])} is calibrated (calibrated: {have})")
    pred = calibration[kind]["predicted_tokens_per_call"]
    return max(sorted(cands), key=lambda b: (pred[str(b)], -b))


def transfer_rows(results: Mapping[str, dict], label: str, *, baseline: str | None = None,
                  english: str = "en", confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Does decoder ``label`` (the paper's: English-trained offsets) keep its tokens per call in other languages?

    One row per language of ``results`` (:func:`rvqspec_lib.eval.wer_parity.evaluate_language` outputs): tokens per
    call with its interval, the ratio to English and the difference to English with a bootstrap interval over the
    utterances of both (independent sentences: :func:`rvqspec_lib.eval.parity.bootstrap_difference`), and, with
    ``baseline`` (e.g. the reused heads' point-mass tree of the same N), the gain over it in the same language,
    PAIRED over that language's utterances (:func:`rvqspec_lib.eval.parity.paired_ratio_difference`).

    Raises:
        ValueError: no English results, or ``label`` (or ``baseline``) not decoded in some language.
    """
    if english not in results:
        raise ValueError(f"the transfer question needs the {english!r} results")
    en = results[english]["per_utterance"]
    rows = []
    for lang, res in results.items():
        pu = res["per_utterance"]
        if label not in pu or (baseline is not None and baseline not in pu):
            raise ValueError(f"{lang}: {label} or {baseline} was not decoded; decode both in every language")
        tpc = res["tokens_per_call"][label]
        row = {"language": lang, "decoder": label, "tokens_per_call": tpc["value"], "ci_low": tpc["ci_low"],
               "ci_high": tpc["ci_high"], "n_utterances": res["n_utterances"],
               "ratio_to_english": tpc["value"] / results[english]["tokens_per_call"][label]["value"]}
        if lang != english:
            d = S.bootstrap_difference(pu[label]["codes"], pu[label]["calls"], en[label]["codes"],
                                       en[label]["calls"], confidence=confidence, seed=seed)
            row.update({"minus_english": d["difference"], "minus_english_ci_low": d["ci_low"],
                        "minus_english_ci_high": d["ci_high"]})
        if baseline is not None:
            g = S.paired_ratio_difference(pu[label]["codes"], pu[label]["calls"], pu[baseline]["codes"],
                                          pu[baseline]["calls"], confidence=confidence, seed=seed)
            row.update({"baseline": baseline, "gain_over_baseline": g["difference"],
                        "gain_ci_low": g["ci_low"], "gain_ci_high": g["ci_high"]})
        rows.append(row)
    return rows


def transfer_answer(rows: Sequence[Mapping], *, english: str = "en", confidence: float = 0.95) -> str:
    """One Markdown paragraph answering the transfer question from :func:`transfer_rows` (nothing typed): per
    language, whether the interval of the difference to English excludes 0 (lower or higher) or not (kept, within
    the interval's resolution), and whether the gain over the baseline is still there."""
    pct = f"{100 * confidence:g}%"
    others = [r for r in rows if r["language"] != english]
    en = next(r for r in rows if r["language"] == english)
    parts = []
    for r in others:
        lo, hi = r["minus_english_ci_low"], r["minus_english_ci_high"]
        verdict = "lower than English" if hi < 0 else "higher than English" if lo > 0 else "not distinguishable from English"
        text = (f"**{r['language']}** ({r['n_utterances']} utterances) {r['tokens_per_call']:.3f} "
                f"({r['ratio_to_english']:.1%} of English; "
                f"difference {r['minus_english']:+.3f} [{pct} CI {lo:+.3f}, {hi:+.3f}]: {verdict})")
        if "gain_over_baseline" in r:
            text += (f", gain over {r['baseline']} {r['gain_over_baseline']:+.3f} "
                     + (f"[{r['gain_ci_low']:+.3f}, {r['gain_ci_high']:+.3f}]" if r["n_utterances"] > 1
                        else "(one utterance: no interval)"))
        parts.append(text)
    if not others:
        return f"Only {english} was decoded: the transfer question needs another language."
    lower = [r["language"] for r in others if r["minus_english_ci_high"] < 0]
    head = (f"**Do offsets trained on English keep their tokens per call in other languages?** `{en['decoder']}` "
            f"commits {en['tokens_per_call']:.3f} tokens per call on English ({en['n_utterances']} utterances)")
    if "gain_over_baseline" in en:
        head += f" (gain over {en['baseline']} {en['gain_over_baseline']:+.3f} [{en['gain_ci_low']:+.3f}, {en['gain_ci_high']:+.3f}])"
    answer = (f"Answer from these numbers: lower than English in {', '.join(lower)}; kept (interval includes 0) in "
              f"{', '.join(r['language'] for r in others if r['language'] not in lower) or 'none'}."
              if lower else "Answer from these numbers: kept in every language (no interval excludes 0 below).")
    return head + "; " + "; ".join(parts) + ". " + answer


__all__ = ["drafter_calibration", "has_paper_decoder", "named_decoders", "best_budget", "transfer_rows",
           "transfer_answer"]
