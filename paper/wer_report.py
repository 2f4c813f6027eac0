"""What notebook 05 reports of WER parity beyond ``rvqspec eval-wer`` (docs/methods.md#reporting-wer): the standard
decoder set and its calibration rows, the true codes' WER floor, the verdicts (in rows and in words), the WER and
outlier tables, the transfer question across languages, and one utterance as every decoder makes it. The statistics
and the decoding runs are the library's (:mod:`rvqspec_lib.eval.parity`, :mod:`rvqspec_lib.eval.wer_parity`)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from rvqspec_lib.data.teacher import as_utterance
from rvqspec_lib.decoding.decoder_names import DEFAULT_TREE_BUDGET, format_paths, parse_decoder_name
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval import parity as S
from rvqspec_lib.eval.inner_loop import codes_to_audio, transcribe_all
from rvqspec_lib.eval.asr import error_rates
from rvqspec_lib.eval.wer_parity import (NULL_CONTROL, ROW_FIELDS, decode_runs, decoder_fields, language_frames,
                                         utterance_codes)
from rvqspec_lib.models.named_decoders import NamedDecoder, has_paper_decoder, resolve_all
from paper.notebook_measures import samples_needed, sentences_needed


def true_codes_wer(utterances: Sequence, *, codec, asr, progress: bool = False) -> dict:
    """The floor of inner-loop WER: every utterance's TRUE codes through the same codec and recogniser, no decoding.

    Returns:
        ``{"rate", "cer", "unit" ("word"), "n_utterances", "asr", "hypotheses", "per_utterance"}``.
    Raises:
        ValueError: no utterance.
    """
    utts = [as_utterance(u) for u in utterances]
    if not utts:
        raise ValueError("no utterance for the true codes' WER")
    refs = [u.text for u in utts]
    hyps = transcribe_all(asr, [codes_to_audio(codec, u.codes) for u in utts], int(codec.sample_rate),
                          desc="asr true codes", progress=progress)
    er = error_rates(refs, hyps, "word")
    return {"rate": er.rate, "unit": "word", "n_utterances": len(utts), "asr": getattr(asr, "name", None),
            "hypotheses": hyps, "per_utterance": [float(u["rate"]) for u in er.utterances],
            "cer": error_rates(refs, hyps, "char").rate}


def standard_decoders(*, calibration: dict | None, best_chain: int | None, budget: int = DEFAULT_TREE_BUDGET,
                      beta: float = 0.4, lm=None, paper_budget: int | None = None,
                      tree_kinds: Sequence[str] = ("point-mass", "sampled")) -> dict[str, NamedDecoder]:
    """``{label: NamedDecoder}`` of WER parity, in table order: AR, the null control (AR, other seeds), the best chain
    (``chain:4`` without ``best_chain``), with a calibration the heads' calibrated trees of ``budget`` nodes of each of
    ``tree_kinds``, with ``paper_budget`` the heads' point-mass tree of that N and ``paper:N`` (needs ``lm``), and last
    the LOSSY control (``ssd-lossy:beta``).

    Raises:
        ValueError: ``paper_budget`` without a model that ships the offsets and their calibration; a budget the
            calibration does not hold.
    """
    names = ["ar"] + ([f"chain:{best_chain}"] if best_chain else ["chain:4"])
    if calibration is not None:
        names += [f"tree:calibrated-{kind}:{budget}" for kind in ("point-mass", "sampled") if kind in tree_kinds]
    if paper_budget is not None:
        if lm is None or not has_paper_decoder(lm):
            raise ValueError(f"paper:{paper_budget} needs a model that ships the offsets drafter and its calibration "
                             "(drafters/offsets.safetensors, trees/offsets.json)")
        if calibration is not None and f"tree:calibrated-point-mass:{paper_budget}" not in names:
            names.append(f"tree:calibrated-point-mass:{paper_budget}")
        names.append(f"paper:{paper_budget}")
    names.append(f"ssd-lossy:{beta}")
    out = resolve_all(names, lm, calibrations={"heads": calibration} if calibration is not None else None,
                      best_chain=best_chain)
    return {"ar": out["ar"], NULL_CONTROL: NamedDecoder(parse_decoder_name("ar"), AR()),
            **{k: v for k, v in out.items() if k != "ar"}}


def calibration_rows(decoders: Mapping[str, object], *, chain_predicted: Mapping[int, float] | None = None,
                     best_chain: int | None = None) -> list[dict]:
    """What the calibration chose, as table rows: the predicted tokens per call of every chain window (``chosen``:
    ``best_chain``), and for every calibrated tree among ``decoders`` its fields, calibration frames, predicted tokens
    per call and rank paths.
    """
    rows = [{"decoder": f"chain:{w}", "kind": "chain", "drafter": "heads", "nodes": int(w),
             "predicted_tokens_per_call": float(v), "chosen": int(w) == best_chain}
            for w, v in (chain_predicted or {}).items()]
    for label, nd in decoders.items():
        if not isinstance(nd, NamedDecoder) or nd.calibration is None:
            continue
        f, cal = decoder_fields(label, nd), nd.calibration
        kind = "sampled" if f["sampled"] else "point-mass"
        rows.append({**{k: f[k] for k in ("decoder", "kind", "drafter", "nodes", "sampled")},
                     "calibration_frames": cal.get("n_frames"),
                     "predicted_tokens_per_call": cal[kind]["predicted_tokens_per_call"][str(f["nodes"])],
                     "paths": format_paths(nd.decoder.paths)})
    return rows


def verdicts(results: Mapping[str, dict], free: dict | None = None) -> list[dict]:
    """Which test flagged which decoder in every language: the code-distribution test, the inner-loop WER difference
    and, for English, the free-running one. A lossless decoder should be flagged by none, the lossy control by one.
    Unflagged rows say what the design could have detected (``detectable_tv`` at power 0.9, ``samples_needed_code``,
    ``wer_mde80``, ``sentences_needed``).

    Returns:
        one row per (language, decoder other than AR): :data:`ROW_FIELDS`, ``lossless``, ``code_test``,
        ``code_min_p_holm``, ``code_at``, ``level``, ``alpha``, ``n_per_sample``, ``power_at_tv``, ``power_tv``,
        ``detectable_tv``, ``max_tv_observed``, WER columns where measured, ``flagged_by``.
    """
    rows = []
    for lang, res in results.items():
        for label, summ in res["distribution"]["summary"].items():
            info = res["decoders"][label]
            row = {"language": lang, **{k: info.get(k) for k in ROW_FIELDS}, "lossless": summ["lossless"],
                   "code_test": "flagged" if summ["rejected"] else "not flagged", "code_min_p_holm": summ["min_p_holm"],
                   "code_at": summ["at"], "level": summ["level"], "alpha": summ["alpha"],
                   "n_per_sample": summ["n_per_sample"], "power_at_tv": summ["power_rank"],
                   "power_tv": summ["power_tv"], "detectable_tv": summ["detectable_tv_rank"],
                   "max_tv_observed": summ["max_tv_rank"]}
            caught = ["code distribution (" + summ["at"] + ")"] if summ["rejected"] else []
            vs = (res.get("wer") or {}).get(label, {}).get("vs_reference")
            if vs:
                row.update({"wer_test": "flagged" if vs["detected"] else "not flagged", "wer_diff": vs["difference"],
                            "wer_ci_low": vs["ci_low"], "wer_ci_high": vs["ci_high"], "wer_p": vs["p_value"],
                            "wer_mde80": vs["mde80"], "wer_n_utterances": vs["n_utterances"],
                            "sentences_needed": sentences_needed(vs["difference"], vs["se"], vs["n_utterances"],
                                                                   alpha=vs["alpha"])})
                if vs["detected"]:
                    caught.append("inner-loop WER")
            fv = ((free or {}).get("wer") or {}).get(label, {}).get("vs_reference") if lang == "en" else None
            if fv:
                row.update({"free_wer_test": "flagged" if fv["detected"] else "not flagged",
                            "free_wer_diff": fv["difference"], "free_wer_ci_low": fv["ci_low"],
                            "free_wer_ci_high": fv["ci_high"]})
                if fv["detected"]:
                    caught.append("free-running WER")
            if not summ["rejected"] and not summ["lossless"]:
                row["samples_needed_code"] = samples_needed(summ["max_tv_rank"], summ["df_rank"], level=summ["level"])
            row["flagged_by"] = ", ".join(caught) or "none"
            rows.append(row)
    return rows


@torch.no_grad()
def inner_loop_codes(lm, utterance, decoders: Mapping[str, object], *, seed: int = 0,
                     sampling: Sampling | None = None, drafter=None) -> dict[str, torch.Tensor]:
    """One English utterance's codes as each decoder makes them on its TRUE code 0, every decoder with the SAME
    generator seed (the inner loop the only difference: a listening example).

    Returns:
        ``{label: (frames, 1 + n) int64}``.
    Raises:
        ValueError: no decoder.
    """
    (u,), frames = language_frames(lm, [as_utterance(utterance)], "en")
    runs = decode_runs(lm.code_predictor, frames, decoders, seed=seed, sampling=sampling, drafter=drafter,
                       batch_size=max(len(frames), 1))
    return {label: utterance_codes(u.codes[:, 0], run.codes[0], frames.utterance)[0] for label, run in runs.items()}


def transfer_rows(results: Mapping[str, dict], label: str, *, baseline: str | None = None, seed: int = 0) -> list[dict]:
    """Does decoder ``label`` (the paper's: English-trained offsets) keep its tokens per call in other languages?

    One row per language of ``results`` (:func:`rvqspec_lib.eval.wer_parity.evaluate_language` outputs): tokens per
    call, its ratio to English (``en``) and its difference to English (:func:`bootstrap_difference`, 95% interval),
    and with ``baseline`` the gain over it, paired over that language's utterances (:func:`paired_ratio_difference`).

    Raises:
        ValueError: no English results, or ``label`` (or ``baseline``) not decoded in some language.
    """
    if "en" not in results:
        raise ValueError("the transfer question needs the 'en' results")
    en = results["en"]["per_utterance"]
    rows = []
    for lang, res in results.items():
        pu = res["per_utterance"]
        if label not in pu or (baseline is not None and baseline not in pu):
            raise ValueError(f"{lang}: {label} or {baseline} was not decoded; decode both in every language")
        tpc = res["tokens_per_call"][label]
        row = {"language": lang, "decoder": label, "tokens_per_call": tpc["value"], "ci_low": tpc["ci_low"],
               "ci_high": tpc["ci_high"], "n_utterances": res["n_utterances"],
               "ratio_to_english": tpc["value"] / results["en"]["tokens_per_call"][label]["value"]}
        if lang != "en":
            d = S.bootstrap_difference(pu[label]["codes"], pu[label]["calls"], en[label]["codes"],
                                       en[label]["calls"], confidence=0.95, seed=seed)
            row.update({"minus_english": d["difference"], "minus_english_ci_low": d["ci_low"],
                        "minus_english_ci_high": d["ci_high"]})
        if baseline is not None:
            g = S.paired_ratio_difference(pu[label]["codes"], pu[label]["calls"], pu[baseline]["codes"],
                                          pu[baseline]["calls"], confidence=0.95, seed=seed)
            row.update({"baseline": baseline, "gain_over_baseline": g["difference"],
                        "gain_ci_low": g["ci_low"], "gain_ci_high": g["ci_high"]})
        rows.append(row)
    return rows


def _utterances(n: int) -> str:
    """``"1 utterance"`` or ``"N utterances"``."""
    return f"{n} utterance" + "s" * (n != 1)


def transfer_answer(rows: Sequence[Mapping]) -> str:
    """One Markdown paragraph answering the transfer question from :func:`transfer_rows` (nothing typed): per
    language, whether the interval of the difference to English excludes 0 (lower or higher) or not (kept, within
    the interval's resolution), and whether the gain over the baseline is still there."""
    others = [r for r in rows if r["language"] != "en"]
    en = next(r for r in rows if r["language"] == "en")
    parts = []
    for r in others:
        lo, hi = r["minus_english_ci_low"], r["minus_english_ci_high"]
        verdict = "lower than English" if hi < 0 else "higher than English" if lo > 0 else "not distinguishable from English"
        text = (f"**{r['language']}** ({_utterances(r['n_utterances'])}) {r['tokens_per_call']:.3f} "
                f"({r['ratio_to_english']:.1%} of English; "
                f"difference {r['minus_english']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}]: {verdict})")
        if "gain_over_baseline" in r:
            text += (f", gain over {r['baseline']} {r['gain_over_baseline']:+.3f} "
                     + (f"[{r['gain_ci_low']:+.3f}, {r['gain_ci_high']:+.3f}]" if r["n_utterances"] > 1
                        else "(one utterance: no interval)"))
        parts.append(text)
    if not others:
        return "Only en was decoded: the transfer question needs another language."
    lower = [r["language"] for r in others if r["minus_english_ci_high"] < 0]
    head = (f"**Do offsets trained on English keep their tokens per call in other languages?** `{en['decoder']}` "
            f"commits {en['tokens_per_call']:.3f} tokens per call on English ({_utterances(en['n_utterances'])})")
    if "gain_over_baseline" in en:
        head += f" (gain over {en['baseline']} {en['gain_over_baseline']:+.3f} [{en['gain_ci_low']:+.3f}, {en['gain_ci_high']:+.3f}])"
    higher = [r["language"] for r in others if r["minus_english_ci_low"] > 0]
    same = [r["language"] for r in others if r["language"] not in lower + higher]
    answer = "Answer from these numbers: " + "; ".join(
        [f"lower than English in {', '.join(lower)}"] * bool(lower)
        + [f"higher than English (the interval lies above 0) in {', '.join(higher)}"] * bool(higher)
        + [f"not distinguishable from English (the interval includes 0) in {', '.join(same)}"] * bool(same)) + "."
    if not lower:
        answer += " No language is below English: the paper's decoder keeps its tokens per call everywhere measured."
    no_gain = [r for r in rows if "gain_ci_low" in r and r["gain_ci_low"] <= 0 <= r["gain_ci_high"]]
    if no_gain and len(no_gain) == len(rows):
        answer += (f" Its gain over {en['baseline']} includes 0 in every language, so what is kept is that tree's "
                   "yield, not a gain the offsets add.")
    return head + "; " + "; ".join(parts) + ". " + answer


#: The label of the floor row of a WER table: the true codes through the same codec, no decoding.
TRUE_CODES = "true codes (codec resynthesis, no decoding)"


def wer_table(wer: Mapping[str, Mapping], decoders: Mapping[str, Mapping], *,
              tokens_per_call: Mapping[str, Mapping] | None = None, ended: Mapping[str, Sequence[bool]] | None = None,
              floor: Mapping | None = None) -> list[dict]:
    """Rows of a WER table, one per decoder of ``wer`` (:func:`rvqspec_lib.eval.wer_parity.wer_parity`) keyed by
    its fields (``decoders``: :func:`~rvqspec_lib.eval.wer_parity.decoder_info`), then the ``floor``
    (:func:`~rvqspec_lib.eval.wer_parity.true_codes_wer`) as :data:`TRUE_CODES`: ``wer``, ``cer``,
    ``wer_without_outliers``, ``outliers``, the paired difference to AR (``diff_vs_ar``, ``ci95_low``, ``ci95_high``,
    ``p_value``, ``flagged``, ``mde80``), ``n_utterances``, and ``tokens_per_call`` / ``ended_by_itself`` where given.
    """
    rows = []
    for label, w in wer.items():
        vs = w.get("vs_reference") or {}
        row = {**{k: decoders[label].get(k) for k in ROW_FIELDS}, "wer": w["rate"], "cer": w.get("cer"),
               "wer_without_outliers": w["rate_without_outliers"], "outliers": w["n_outliers"],
               "diff_vs_ar": vs.get("difference"), "ci95_low": vs.get("ci_low"), "ci95_high": vs.get("ci_high"),
               "p_value": vs.get("p_value"), "flagged": vs.get("detected"), "mde80": vs.get("mde80"),
               "n_utterances": len(w["per_utterance"])}
        if tokens_per_call is not None:
            row["tokens_per_call"] = tokens_per_call[label]["value"]
        if ended is not None:
            row["ended_by_itself"] = int(sum(bool(e) for e in ended[label]))
        rows.append(row)
    if floor is not None:
        rows.append({**{k: None for k in ROW_FIELDS}, "decoder": TRUE_CODES, "wer": floor["rate"],
                     "cer": floor.get("cer"), "n_utterances": floor["n_utterances"]})
    return rows


def outlier_rows(paths: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """Every outlier of every decoder, one row each: ``{path, decoder, index, why, ref, hyp}``, from ``{path name:
    wer_parity output}`` (e.g. ``{"inner loop": ..., "free running": ...}``); ``[]`` when there is none."""
    return [{"path": path, "decoder": label, **o} for path, wer in paths.items() for label, w in wer.items()
            for o in w["outliers"]]


def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}"


def _interval(lo: float, hi: float) -> str:
    """``[lo, hi]``, or words when the interval could not be formed (too few utterances)."""
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return f"[{lo:+.3f}, {hi:+.3f}]" if ok else "(too few sentences for an interval)"


def verdict_text(rows: Sequence[Mapping]) -> str:
    """The verdicts of :func:`rvqspec_lib.eval.wer_parity.verdicts` in words (Markdown, nothing typed): per
    language, whether each lossy control was caught and by which test, or missed, and then why (the smallest
    Holm-adjusted p-value against the level; the shift the design finds with power 0.9 at its sample size
    against the largest shift observed, beside the null control's, which is noise alone; the codes that shift would
    need); the WER tests with their power where a recogniser ran; the lossless decoders flagged (false alarms at
    the stated level, or bugs); and a last line counting the languages where the lossy control was caught."""
    langs = list(dict.fromkeys(r["language"] for r in rows))
    parts, caught, missed = [], [], []
    for lang in langs:
        mine = [r for r in rows if r["language"] == lang]
        null = next((r for r in mine if r.get("decoder") == "ar-seed2"), None)
        for r in (x for x in mine if not x["lossless"]):
            text = f"**{lang}**, {r['n_per_sample']:,} codes per depth: the lossy control `{r['decoder']}` "
            if r["flagged_by"] != "none":
                caught.append(lang)
                text += (f"was caught, by {r['flagged_by']}; the code test's smallest Holm-adjusted p is "
                         f"{_p(r['code_min_p_holm'])} against the family-wise level {r['alpha']:g}.")
            else:
                missed.append(lang)
                text += (f"was missed: its smallest Holm-adjusted p, {_p(r['code_min_p_holm'])} at {r['code_at']}, "
                         f"is above the family-wise level {r['alpha']:g}. The sample was too small to be sure: one "
                         f"depth's test (level {r['level']:.1e}) is guaranteed power 0.9 only against shifts "
                         f"of total variation {r['detectable_tv']:.3f} or more in the binned ranks (a lower bound on "
                         f"its power), and the largest shift observed was {r['max_tv_observed']:.3f}")
                if null is not None:
                    text += f" (AR against itself, noise alone: {null['max_tv_observed']:.3f})"
                if r.get("samples_needed_code"):
                    text += (f"; a shift that large needs about {r['samples_needed_code']:,} codes per depth, "
                             f"{r['samples_needed_code'] / r['n_per_sample']:.1f} times this run's")
                text += "."
            if r.get("wer_test"):
                mde = r.get("wer_mde80")
                text += (f" Its inner-loop WER differs from AR's by {r['wer_diff']:+.3f} "
                         f"{_interval(r['wer_ci_low'], r['wer_ci_high'])} over {r['wer_n_utterances']} utterances "
                         f"({r['wer_test']}; " + (f"a difference of {mde:.3f} is found with power 0.8"
                                                  if mde is not None and math.isfinite(mde)
                                                  else "too few sentences to state the power"))
                need = r.get("sentences_needed")
                text += (f", the one observed would need about {need:,.0f} sentences)." if need and math.isfinite(need)
                         else ").")
            if r.get("free_wer_test"):
                text += (f" Free running: {r['free_wer_diff']:+.3f} "
                         f"{_interval(r['free_wer_ci_low'], r['free_wer_ci_high'])} ({r['free_wer_test']}).")
            parts.append(text)
    alarms = [f"{r['language']}: `{r['decoder']}` ({r['flagged_by']})" for r in rows
              if r["lossless"] and r["flagged_by"] != "none"]
    parts.append("**Lossless decoders flagged** (each a false alarm at its stated level, or a bug): "
                 + ("; ".join(alarms) if alarms else "none") + ".")
    n_lossy_langs = len(set(caught) | set(missed))
    if n_lossy_langs:
        parts.append(f"**The lossy control was caught in {len(set(caught))} of {n_lossy_langs} languages**"
                     + (f" ({', '.join(dict.fromkeys(caught))})" if caught else "")
                     + (f"; missed in {', '.join(dict.fromkeys(missed))}." if missed else "."))
    return "\n\n".join(parts)
