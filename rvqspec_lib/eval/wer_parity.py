"""WER parity across decoders and languages (paper Tables 1 and 3; notebook 05 and ``rvqspec eval-wer``;
docs/methods.md#reporting-wer, #testing-losslessness): every decoder on the SAME utterances with the SAME seeds, tested
on tokens per call, the codes' distribution against AR's and WER; the LOSSY control must be caught, AR under other
seeds (:data:`NULL_CONTROL`) must not (:func:`verdicts`). Rows carry each decoder's fields, never parsed labels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.eval import parity as S
from rvqspec_lib.eval.parity import WER_ROW_FIELDS as ROW_FIELDS  # the fields every result row starts with
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.eval.asr import error_rates
from rvqspec_lib.eval.inner_loop import batch_seed, codes_to_audio, free_running_codes, transcribe_all
from rvqspec_lib.data.teacher import as_utterance, teacher_forced_hidden, verifier_logits
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoder_names import name_of
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS, Chain, is_lossless
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models.named_decoders import NamedDecoder

#: The reference decoder's label, and the null control's (AR again, other seeds: nothing may be detected).
REFERENCE = "ar"
NULL_CONTROL = "ar-seed2"
#: Bins of the rank and code statistics (coarse bins: power against broad shifts at few degrees of freedom).
RANK_BINS = 16
CODE_BINS = 32


# ---- the chain window of chain:best (decoder names: rvqspec_lib.decoding.decoder_names, the one grammar) -------------
def best_chain_window(code_predictor, drafter, frames: Frames) -> tuple[int, dict]:
    """``(window, {window: predicted})``: the chain window (of ``CHAIN_WINDOWS``) with the highest tokens per call
    PREDICTED from exact acceptance tables on ``frames`` (the calibration split, never the evaluation one;
    :func:`rvqspec_lib.eval.acceptance.predicted_tokens_per_call`); ties keep the smaller window."""
    from rvqspec_lib.eval.acceptance import exact_statistics, predicted_tokens_per_call

    n = P.n_codes(code_predictor)
    exact = exact_statistics(code_predictor, drafter, frames.context, frames.codes, n_ahead=max(CHAIN_WINDOWS) - 1,
                             max_rank=1, batch_size=256)
    pred = {int(w): predicted_tokens_per_call(exact, Chain(int(w)), n) for w in CHAIN_WINDOWS}
    best = max(pred.values())
    return min(w for w, v in pred.items() if v >= best - 1e-12), pred


# ---- a decoder's fields: what result rows are keyed by ---------------------------------------------------------------
def decoder_of(decoder):
    """The decoder object of a :class:`~rvqspec_lib.models.named_decoders.NamedDecoder`, or ``decoder`` itself."""
    return decoder.decoder if isinstance(decoder, NamedDecoder) else decoder


def decoder_fields(label: str, decoder) -> dict:
    """The result-row fields of the decoder run under ``label``: a
    :class:`~rvqspec_lib.models.named_decoders.NamedDecoder`'s own, else
    :func:`~rvqspec_lib.decoding.decoder_names.name_of`'s; ``decoder`` is ``label``, ``null_control`` whether it is
    :data:`NULL_CONTROL`. Returns ``{"decoder", "kind", "drafter", "nodes", "lossy", "sampled", "null_control"}``.
    """
    fields = decoder.fields() if isinstance(decoder, NamedDecoder) else name_of(decoder).fields()
    return {**fields, "decoder": label, "null_control": label == NULL_CONTROL}


# ---- decoding runs ---------------------------------------------------------------------------------------------------
@dataclass
class DecodeRun:
    """What one decoder produced on a set of frames: ``codes`` ``(R, N, n)`` int64 codes 1..n of every frame in every
    replicate, ``calls`` ``(R, N)`` int64 code-predictor calls per frame (the prefill included).
    """

    label: str
    decoder: object
    lossless: bool
    codes: torch.Tensor
    calls: torch.Tensor


@torch.no_grad()
def decode_runs(code_predictor, frames: Frames, decoders: Mapping[str, object], *, seed: int = 0,
                replicates: int = 1, seeds: Mapping[str, int] | None = None, sampling: Sampling | None = None,
                drafter=None, batch_size: int = 1024, progress: bool = False) -> dict[str, DecodeRun]:
    """Every decoder (``{label: decoder or NamedDecoder}``) over every frame's context, ``replicates`` times, with
    PAIRED seeds: chunk c of replicate r is decoded with a generator seeded by ``(seed, r, c)`` for every decoder;
    ``seeds`` overrides ``seed`` per label (the null control). ``sampling`` default temperature 0.9, top-k 50;
    ``drafter`` default the reused heads.

    Returns:
        ``{label: DecodeRun}``.
    Raises:
        ValueError: no decoder, ``replicates < 1``.
    """
    if not decoders:
        raise ValueError("no decoder to run")
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    dev = next(code_predictor.parameters()).device
    out = {}
    for label, dec in decoders.items():
        dec = decoder_of(dec)
        s0 = (seeds or {}).get(label, seed)
        codes, calls = [], []
        chunks = [(r, c) for r in range(replicates) for c in range(0, len(frames), batch_size)]
        for r, c in progress_bar(chunks, desc=f"decode {label}", enabled=progress, unit="chunk"):
            gen = torch.Generator(device=dev).manual_seed(batch_seed(s0, r, c // batch_size))
            res = decode_frame(code_predictor, frames.context[c:c + batch_size].to(dev), decoder=dec,
                               sampling=sampling, generator=gen, drafter=drafter)
            codes.append(res.codes.cpu())
            calls.append(res.calls.cpu())
        r_codes = torch.cat(codes).reshape(replicates, len(frames), -1)
        r_calls = torch.cat(calls).reshape(replicates, len(frames))
        out[label] = DecodeRun(label, dec, is_lossless(dec), r_codes, r_calls)
    return out


def per_utterance(run: DecodeRun, utterance: torch.Tensor) -> dict:
    """``{"codes", "calls"}``: per utterance (sorted ids), the codes and calls of a run, summed over replicates."""
    ids, inv = torch.unique(utterance, return_inverse=True)
    calls = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inv, run.calls.double().sum(0))
    return {"codes": (torch.bincount(inv).double() * run.codes.shape[-1] * run.codes.shape[0]).tolist(),
            "calls": calls.tolist()}


# ---- code-distribution tests -----------------------------------------------------------------------------------------
@torch.no_grad()
def verifier_ranks(code_predictor, context: torch.Tensor, codes: torch.Tensor, *,
                   batch_size: int = 512) -> torch.Tensor:
    """Rank of every generated code under the verifier's p (default sampling) GIVEN ITS OWN PREFIX (0 = the most
    probable code; under a lossless decoder its law is AR's), from one teacher-forced pass per frame.

    Args:
        context: ``(N, 2, talker_hidden)``. codes: ``(N, n)`` int64.
    Returns:
        ``(N, n)`` int64 ranks (number of codes with a strictly larger p).
    """
    sampling = Sampling()
    dev = next(code_predictor.parameters()).device
    out = []
    for i in range(0, codes.shape[0], batch_size):
        c = codes[i:i + batch_size].to(dev)
        p = sampling.probs(verifier_logits(code_predictor, teacher_forced_hidden(
            code_predictor, context[i:i + batch_size].to(dev), c)))
        out.append((p > p.gather(2, c[..., None])).sum(-1).cpu())
    return torch.cat(out)


def code_distribution_tests(code_predictor, context: torch.Tensor, runs: Mapping[str, DecodeRun], *,
                            alpha: float = S.ALPHA, power_tv: float = S.POWER_TV, batch_size: int = 512) -> dict:
    """Per depth, is a decoder's output distributed as the reference's (AR)? Two-sample chi-square tests
    (:func:`rvqspec_lib.eval.parity.two_sample_test`) of each code's verifier rank (:func:`verifier_ranks`,
    :data:`RANK_BINS` bins) and of the code itself (:data:`CODE_BINS` bins), all replicates; a decoder's 2 x n p-values
    Holm-adjusted, ``rejected`` when one is below ``alpha``. Power: one depth's test at level ``alpha / (2 n)``
    against a shift ``power_tv`` (median degrees of freedom); ``detectable_tv``: the shift found with power 0.9.

    Returns:
        ``{"rows": [{decoder, statistic, depth, statistic_value, df, p_value, p_holm, tv, n}], "summary": {label:
        {rejected, min_p_holm, at, power_rank, power_code, detectable_tv_rank, detectable_tv_code, df_rank, df_code,
        max_tv_rank, max_tv_code, power_tv, alpha, level, n_per_sample, lossless}}}``.
    Raises:
        ValueError: the reference is not among the runs, or runs of different shapes.
    """
    if REFERENCE not in runs:
        raise ValueError(f"reference decoder {REFERENCE!r} is not among the runs ({', '.join(runs)})")
    ref = runs[REFERENCE]
    n = ref.codes.shape[-1]
    vocab = int(code_predictor.config.vocab_size)
    ranks = {}
    for label, run in runs.items():
        if run.codes.shape != ref.codes.shape:
            raise ValueError(f"run {label} has codes {tuple(run.codes.shape)}, the reference {tuple(ref.codes.shape)}")
        ranks[label] = torch.cat([verifier_ranks(code_predictor, context, run.codes[r], batch_size=batch_size)
                                  for r in range(run.codes.shape[0])])
    rows, summary = [], {}
    level = alpha / (2 * n)
    for label, run in runs.items():
        if label == REFERENCE:
            continue
        mine = []
        for stat, a_all, b_all, bins, cats in (
                ("rank", ranks[REFERENCE], ranks[label], RANK_BINS, vocab),
                ("code", ref.codes.reshape(-1, n), run.codes.reshape(-1, n), CODE_BINS, vocab)):
            for d in range(n):
                t = S.two_sample_test(a_all[:, d].numpy(), b_all[:, d].numpy(), n_categories=cats, max_bins=bins)
                mine.append({"decoder": label, "lossless": run.lossless, "statistic": stat, "depth": d + 1,
                             "statistic_value": t["statistic"], "df": t["df"], "p_value": t["p_value"], "tv": t["tv"],
                             "n": t["n_a"]})
        adj = S.holm([r["p_value"] for r in mine])
        for r, p in zip(mine, adj):
            r["p_holm"] = float(p)
        rows += mine
        i_min = int(np.argmin(adj))
        n_a = mine[0]["n"]
        info = {"rejected": bool(adj[i_min] < alpha), "min_p_holm": float(adj[i_min]),
                "at": f"{mine[i_min]['statistic']} depth {mine[i_min]['depth']}", "power_tv": power_tv,
                "alpha": alpha, "level": level, "n_per_sample": n_a, "lossless": run.lossless,
                "max_tv_rank": max(r["tv"] for r in mine if r["statistic"] == "rank"),
                "max_tv_code": max(r["tv"] for r in mine if r["statistic"] == "code")}
        for stat in ("rank", "code"):
            dfs = [r["df"] for r in mine if r["statistic"] == stat and r["df"] > 0]
            df = int(np.median(dfs)) if dfs else 0
            info[f"df_{stat}"] = df
            info[f"power_{stat}"] = S.power_two_sample(n_a, n_a, df, tv=power_tv, level=level)
            info[f"detectable_tv_{stat}"] = S.detectable_tv(n_a, n_a, df, power=0.9, level=level)
        summary[label] = info
    return {"rows": rows, "summary": summary}


# ---- audio and WER ---------------------------------------------------------------------------------------------------
def utterance_codes(code0: torch.Tensor, generated: torch.Tensor, utterance: torch.Tensor) -> list[torch.Tensor]:
    """Per utterance (sorted ids), ``(frames, 1 + n)`` codes: the TRUE code 0 (``code0`` ``(N,)``) beside the
    generated codes 1..n (``generated`` ``(N, n)``).
    """
    full = torch.cat([code0[:, None].long(), generated.long()], 1)
    return [full[utterance == u] for u in torch.unique(utterance)]


def wer_parity(hypotheses: Mapping[str, Sequence[str]], refs: Sequence[str], *, unit: str = "word",
               lengths: Mapping[str, Sequence[int]] | None = None, ref_lengths: Sequence[int] | None = None,
               capped: Mapping[str, Sequence[bool]] | None = None, alpha: float = S.ALPHA, seed: int = 0) -> dict:
    """Error rate of every decoder's transcripts (``{label: transcript per reference}``), outliers flagged
    (:func:`rvqspec_lib.eval.parity.flag_outliers`), and the paired difference to the reference
    (:func:`rvqspec_lib.eval.parity.paired_wer_difference`). ``unit``: ``"word"`` (WER, CER beside it) or ``"char"``;
    ``lengths`` / ``ref_lengths`` / ``capped``: free running only, per label.

    Returns:
        ``{label: {"rate", "rate_without_outliers", "n_outliers", "unit", "outliers": [{index, why, ref, hyp}],
        "per_utterance", "cer" (word unit), "vs_reference" (not for the reference)}}``.
    Raises:
        ValueError: the reference is missing; transcripts of another length than ``refs``.
    """
    if REFERENCE not in hypotheses:
        raise ValueError(f"the reference {REFERENCE!r} has no transcripts")
    rates, why = {}, {}
    for label, hyps in hypotheses.items():
        er = error_rates(refs, hyps, unit)
        rates[label] = er
        why[label] = S.flag_outliers(er.utterances, lengths=(lengths or {}).get(label), ref_lengths=ref_lengths,
                                     capped=(capped or {}).get(label))
    out = {}
    for label, er in rates.items():
        w = why[label]
        kept = [u for u, x in zip(er.utterances, w) if not x]
        n_words = sum(u["ref_units"] for u in kept)
        entry = {"rate": er.rate, "rate_without_outliers": (sum(u["substitutions"] + u["deletions"] + u["insertions"]
                                                                for u in kept) / n_words) if n_words else 0.0,
                 "n_outliers": sum(bool(x) for x in w), "unit": unit,
                 "outliers": [{"index": i, "why": x, "ref": er.utterances[i]["ref"], "hyp": er.utterances[i]["hyp"]}
                              for i, x in enumerate(w) if x],
                 "per_utterance": [float(u["rate"]) for u in er.utterances]}
        if unit == "word":  # CER beside WER: the same transcripts, characters (spaces removed) instead of words
            entry["cer"] = error_rates(refs, hypotheses[label], "char").rate
        if label != REFERENCE:
            entry["vs_reference"] = S.paired_wer_difference(er.utterances, rates[REFERENCE].utterances,
                                                            outliers_a=w, outliers_ref=why[REFERENCE], alpha=alpha,
                                                            seed=seed)
        out[label] = entry
    return out


# ---- one language, end to end ----------------------------------------------------------------------------------------


def decoder_info(decoders: Mapping[str, object]) -> dict[str, dict]:
    """``{label: {"repr", "lossless", **fields}}`` of a decoder set (:func:`decoder_fields`): what result files keep
    of each decoder."""
    return {k: {"repr": repr(decoder_of(v)), "lossless": is_lossless(decoder_of(v)), **decoder_fields(k, v)}
            for k, v in decoders.items()}


def language_frames(lm, utts: list, language: str, progress: bool = False):
    """The utterances in the language's text front end (:func:`rvqspec_lib.eval.datasets.speaking`) and their frames
    from one teacher-forced talker pass each."""
    from rvqspec_lib.data.frame_sources import frames_from_utterances
    from rvqspec_lib.eval.datasets import speaking

    with speaking(lm, language) as prompt_language:
        utts = [type(u)(u.text, u.codes, u.speaker, prompt_language if u.language == "auto" else u.language)
                for u in utts]
        return utts, frames_from_utterances(lm, utts, progress=progress)


def evaluate_language(lm, utterances: Sequence, decoders: Mapping[str, object], *, language: str = "en",
                      codec=None, asr=None, seed: int = 0, replicates: int = 1, drafter=None, alpha: float = S.ALPHA,
                      power_tv: float = S.POWER_TV, batch_size: int = 1024, progress: bool = False) -> dict:
    """Tokens per call, code-distribution tests and (with ``codec`` and ``asr``) inner-loop WER of every decoder on
    one language's utterances against AR (``"ar"`` in ``decoders``), contexts from one teacher-forced talker pass over
    the TRUE codes, default sampling. ``codec`` must depend on codes 1..n (the embedded model's table decoder); error
    rates in the language's unit; the first replicate becomes audio.

    Returns:
        JSON-able dict: ``language``, ``n_utterances``, ``n_frames``, ``replicates``, ``seconds``, ``asr``, ``unit``,
        ``tokens_per_call`` {label: {value, ci_low, ci_high, n}}, ``per_utterance`` {label: {codes, calls}},
        ``distribution`` (:func:`code_distribution_tests`), ``wer`` (:func:`wer_parity` or ``None``), ``decoders``
        (:func:`decoder_info`), ``references``, ``hypotheses`` {label: list}.
    Raises:
        ValueError: no utterance, no ``"ar"`` decoder, an unknown language.
    """
    from rvqspec_lib.eval.datasets import get_language

    lang = get_language(language)
    if REFERENCE not in decoders:
        raise ValueError(f"decoders must include the reference {REFERENCE!r} (AR)")
    utts = [as_utterance(u) for u in utterances]
    if not utts:
        raise ValueError(f"no utterance of language {language!r}")
    utts, frames = language_frames(lm, utts, language, progress)
    code0 = torch.cat([u.codes[:, 0] for u in utts])
    cp = lm.code_predictor
    seeds = {NULL_CONTROL: seed + 1}
    runs = decode_runs(cp, frames, decoders, seed=seed, replicates=replicates, seeds=seeds,
                       drafter=drafter, batch_size=batch_size, progress=progress)
    per_utt = {label: per_utterance(run, frames.utterance) for label, run in runs.items()}
    tpc = {label: S.bootstrap_mean(c["codes"], c["calls"], seed=seed) for label, c in per_utt.items()}
    dist = code_distribution_tests(cp, frames.context, runs, alpha=alpha, power_tv=power_tv)
    refs = [u.text for u in utts]
    unit = lang.unit
    wer_out, hyps = None, {}
    if codec is not None and asr is not None:
        sr = int(codec.sample_rate)
        for label, run in runs.items():
            wavs = [codes_to_audio(codec, c) for c in utterance_codes(code0, run.codes[0], frames.utterance)]
            hyps[label] = transcribe_all(asr, wavs, sr, desc=f"asr {label}", progress=progress)
        wer_out = wer_parity(hyps, refs, unit=unit, alpha=alpha, seed=seed)
    return {"language": language, "n_utterances": len(utts), "n_frames": len(frames), "replicates": replicates,
            "seconds": float(sum(u.codes.shape[0] for u in utts) / lm.frame_rate_hz),
            "asr": getattr(asr, "name", None) if asr is not None else None, "unit": unit,
            "tokens_per_call": tpc, "per_utterance": per_utt, "distribution": dist, "wer": wer_out,
            "decoders": decoder_info(decoders), "references": refs, "hypotheses": hyps}


def free_running_parity(lm, utterances: Sequence, decoders: Mapping[str, object], *, codec, asr, seed: int = 0,
                        max_frames: int = 300, progress: bool = False) -> dict:
    """Free running (talker AND inner loop sampled, from the text alone): WER of every decoder paired against AR,
    outliers by length apart. Every decoder speaks the same batches with the same seed per batch, as
    :func:`rvqspec_lib.eval.inner_loop.free_running_codes` (``max_frames``) makes them.

    Returns:
        ``{"wer", "frames", "ended", "true_frames", "hypotheses", "codes" {label: [(frames, G) int64]}, "decoders"}``.
    """
    us = [as_utterance(u) for u in utterances]
    if REFERENCE not in decoders:
        raise ValueError(f"decoders must include the reference {REFERENCE!r} (AR)")
    frames, ended, hyps, all_codes = {}, {}, {}, {}
    for label, dec in decoders.items():
        spoken = free_running_codes(lm, us, max_frames=max_frames, seed=seed + 1 if label == NULL_CONTROL else seed,
                                    decoder=decoder_of(dec), paired=True, progress=progress,
                                    desc=f"free-running {label}")
        all_codes[label] = [f["codes"] for f in spoken]
        frames[label], ended[label] = [f["frames"] for f in spoken], [f["ended"] for f in spoken]
        hyps[label] = transcribe_all(asr, [codes_to_audio(codec, c) for c in all_codes[label]],
                                     int(codec.sample_rate), desc=f"asr free {label}", progress=progress)
    true = [int(u.codes.shape[0]) for u in us]
    w = wer_parity(hyps, [u.text for u in us], lengths=frames, ref_lengths=true,
                   capped={k: [not e for e in v] for k, v in ended.items()}, seed=seed)
    return {"wer": w, "frames": frames, "ended": ended, "true_frames": true, "hypotheses": hyps, "codes": all_codes,
            "decoders": decoder_info(decoders)}


# ---- tables ----------------------------------------------------------------------------------------------------------
def table3_rows(results: Mapping[str, dict]) -> list[dict]:
    """Table 3 analogue: one row per (language, decoder), keyed by :data:`ROW_FIELDS`: tokens per call with its
    interval, its difference to English (bootstrap over both utterance sets), the code-distribution verdict with its
    power, and WER/CER with the paired difference to AR where a recogniser ran (``wer_note`` says why not).
    """
    rows = []
    en = results.get("en")
    for lang, res in results.items():
        for label, tpc in res["tokens_per_call"].items():
            info = res["decoders"][label]
            row = {"language": lang, **{k: info.get(k) for k in ROW_FIELDS}, "lossless": info["lossless"],
                   "tokens_per_call": tpc["value"], "tpc_ci_low": tpc["ci_low"], "tpc_ci_high": tpc["ci_high"],
                   "n_utterances": res["n_utterances"], "n_frames": res["n_frames"]}
            if en is not None and lang != "en" and label in en["per_utterance"]:
                a, b = res["per_utterance"][label], en["per_utterance"][label]
                d = S.bootstrap_difference(a["codes"], a["calls"], b["codes"], b["calls"])
                row.update({"tpc_minus_english": d["difference"], "tpc_minus_english_ci_low": d["ci_low"],
                            "tpc_minus_english_ci_high": d["ci_high"]})
            summ = res["distribution"]["summary"].get(label)
            if summ is not None:
                row.update({"codes_differ_from_ar": summ["rejected"], "code_test_min_p_holm": summ["min_p_holm"],
                            "code_test_at": summ["at"], f"power_at_tv{summ['power_tv']:g}": summ["power_rank"]})
            if res.get("wer"):
                w = res["wer"][label]
                metric = "cer" if res["unit"] == "char" else "wer"
                row.update({metric: w["rate"], f"{metric}_without_outliers": w["rate_without_outliers"],
                            "outliers": w["n_outliers"]})
                if metric == "wer" and w.get("cer") is not None:
                    row["cer"] = w["cer"]
                vs = w.get("vs_reference")
                if vs:
                    row.update({"diff_vs_ar": vs["difference"], "diff_ci_low": vs["ci_low"],
                                "diff_ci_high": vs["ci_high"], "diff_p_value": vs["p_value"]})
            else:
                row["wer_note"] = "no offline recogniser" if res.get("asr") is None else ""
            rows.append(row)
    return rows


