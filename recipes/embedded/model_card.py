"""The embedded model's MODEL_CARD.md, written from its evaluation results (``eval.json``), never by hand.
"""

from __future__ import annotations

import json
from typing import Mapping


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def model_card(result: Mapping) -> str:
    """A MODEL_CARD.md for the built model, from the ``eval.json`` dict :mod:`recipes.embedded.build` writes."""
    p = result.get("params", {})
    m = result.get("model", {})
    c = result.get("codec", {})
    t = result.get("training", {})
    acc = result.get("accuracy", {})
    w = result.get("wer", {})
    fr = result.get("free_running", {})
    corp = result.get("corpus", {})
    lines = [
        f"# rvqspec embedded model ({p.get('scale', '?')} preset)",
        "",
        "A small Qwen3-TTS-class model (the official `Qwen3TTSForConditionalGeneration`, talker + code predictor) "
        "trained from scratch, offline, on synthetic speech encoded by an offline residual-k-means codec "
        "(`rvqspec_lib.models.rvq_codec.RVQCodec`, Griffin-Lim decoder). Built by `recipes/embedded/build.py`; "
        "load it with `rvqspec_lib.load_model(\"<this dir>\")`, decode its codes with "
        "`rvqspec_lib.models.rvq_codec.RVQCodec.load(\"<this dir>/codec.safetensors\")`. The copy shipped in the "
        "repository's `data/embedded/` is `load_model(\"embedded\")` / `rvqspec synth --model embedded`. Weights "
        "are stored in float16 (loaded into float32); every figure below was measured on the stored weights.",
        "",
        "**Not a real TTS.** It exists so that the inner-loop speculation of this project can be measured on "
        "weights that were trained (not random) where no Qwen3-TTS checkpoint can be downloaded. Its acceptance "
        "rates and audio quality are NOT those of the released Qwen3-TTS models.",
        "",
        "## Model",
        "",
        f"- talker {m.get('talker_layers')} x {m.get('talker_hidden')}, code predictor "
        f"{m.get('code_predictor_layers')} x {m.get('code_predictor_hidden')}; {m.get('n_code_groups')} code groups "
        f"x {m.get('codebook_size')} entries; text front end `{json.dumps(m.get('tokenizer'))}`; speakers "
        f"{', '.join(m.get('speakers', []))}",
        f"- parameters: talker (with code predictor) {m.get('params_talker_total')}, code predictor "
        f"{m.get('params_code_predictor')}",
        f"- codec: {c.get('n_codebooks')} x {c.get('codebook_size')} residual k-means on log-mel "
        f"(12.5 Hz frames), fitted on {c.get('vectors', '?')} frame vectors; decoder: "
        + ("neural code decoder (`codec.decoder.safetensors`, " + f"{c.get('decoder_params')} parameters, see below)"
           if c.get("decoder") == "neural" else "sum of the selected centroids (table)")
        + ", then mel inversion and Griffin-Lim",
        "",
        "## Data",
        "",
        f"- sentences: {corp.get('n_train')} training, {corp.get('n_val')} validation, {corp.get('n_eval')} "
        f"evaluation (held out by the hash split of `recipes.embedded.voices.split_of`); sources "
        f"{', '.join(p.get('sources', []))}",
        f"- voices: {', '.join(p.get('voices', []))}; {corp.get('hours_train', 0):.2f} h of training audio",
        "",
        "## Training",
        "",
        f"- {t.get('steps')} steps in {t.get('wall_s', 0) / 60:.1f} min ({t.get('steps_per_s', 0):.2f} steps/s), "
        f"batch {p.get('batch_size')}, lr {p.get('lr')}, cp_fraction {p.get('cp_fraction')}, "
        f"torch threads {p.get('threads')}",
    ]
    curve = result.get("curve") or []
    if curve:
        lines += ["", "Learning curve (teacher-forced argmax accuracy on a training subset and on the validation "
                  "split; `curve.json` beside the weights has every field):", "",
                  "| step | minutes | train code-0 acc | validation code-0 acc | train codes 1.. acc | "
                  "validation codes 1.. acc |", "|---:|---:|---:|---:|---:|---:|"]
        nan = float("nan")
        for r in curve:
            lines.append(f"| {r.get('step')} | {(r.get('elapsed_s') or nan) / 60:.1f} | "
                         f"{_num(r.get('train_code0_acc'))} | {_num(r.get('val_code0_acc'))} | "
                         f"{_num(r.get('train_cp_acc'))} | {_num(r.get('val_cp_acc'))} |")
    cps = result.get("code_predictor_stage")
    if cps:
        cm = cps.get("meta", {})
        lines += ["", "Then the code predictor alone (`recipes.embedded.train.train_code_predictor`): the "
                  "talker frozen and run once over the training split, the code predictor's layers, projection and "
                  "heads trained on "
                  f"every frame's teacher-forced state ({cm.get('train_frames')} frames; the code embedding tables "
                  "stay fixed, the talker reads them), "
                  f"{cm.get('steps')} steps of {cm.get('batch_frames')} frames in {(cm.get('wall_s') or 0) / 60:.1f} "
                  f"min, lr {cm.get('lr')}, {cm.get('params_trained')} parameters trained; kept the step with the "
                  f"lowest validation loss ({cm.get('best_step')}):", "",
                  "| step | minutes | frames seen | validation codes 1.. loss | validation codes 1.. acc | "
                  "validation code 1 acc |", "|---:|---:|---:|---:|---:|---:|"]
        for r in cps.get("curve", []):
            d = r.get("val_cp_acc_by_depth") or [None]
            lines.append(f"| {r.get('step')} | {(r.get('elapsed_s') or 0) / 60:.1f} | {r.get('frames_seen')} | "
                         f"{_num(r.get('val_cp_loss'))} | {_num(r.get('val_cp_acc'))} | {_num(d[0])} |")
    cd = result.get("code_decoder")
    if cd:
        dm = cd.get("meta", {})
        lines += ["", "Then the neural code decoder (`rvqspec_lib.code_decoder`): codes -> log-mel frames, trained "
                  f"on {dm.get('train_utterances')} training utterances ({dm.get('train_frames')} frames), each with "
                  "its true codes and its inner-loop codes (true code 0, codes 1..15 sampled by the code predictor "
                  f"at T 0.9 / top-k 50), input drawn from either with probability {dm.get('generated_p')}, "
                  f"codebook dropout {dm.get('dropout_p')}; {dm.get('steps')} steps of {dm.get('batch')} x "
                  f"{dm.get('chunk')} frames in {(dm.get('wall_s') or 0) / 60:.1f} min, "
                  f"{dm.get('params')} parameters; kept step {dm.get('best_step')} (lowest mean validation L1):", "",
                  "| step | minutes | train L1 | validation L1, true codes | validation L1, inner-loop codes | "
                  "table decoder, true codes |", "|---:|---:|---:|---:|---:|---:|"]
        for r in cd.get("curve", []):
            lines.append(f"| {r.get('step')} | {(r.get('elapsed_s') or 0) / 60:.1f} | {_num(r.get('train_l1'))} | "
                         f"{_num(r.get('val_true_l1'))} | {_num(r.get('val_generated_l1'))} | "
                         f"{_num(r.get('val_table_l1'))} |")
        lines += ["", "(L1: mean absolute error of natural-log mel power against the unquantised features.)"]
    tim = result.get("timings_s") or {}
    if tim:
        lines += ["", "Build time by stage (seconds, this machine; stages skipped on a resumed run are absent): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in tim.items()) + "."]
    lines += [
        "",
        "## Evaluation (held-out evaluation sentences)",
        "",
        "Teacher-forced accuracy (argmax):",
        "",
        "| set | code-0 accuracy | codes 1.. accuracy | talker loss |",
        "|---|---|---|---|",
    ]
    for name in ("train", "held_out"):
        a = acc.get(name, {})
        lines.append(f"| {name} | {a.get('code0_acc', float('nan')):.3f} | {a.get('cp_acc', float('nan')):.3f} | "
                     f"{a.get('talker_loss', float('nan')):.3f} |")
    lines += ["", f"WER ({result.get('asr', 'pocketsphinx default LM')}, {corp.get('n_eval')} utterances):", "",
              "| condition | WER | WER without repetition outliers |", "|---|---|---|"]
    for name, r in w.items():
        lines.append(f"| {name} | {r.get('wer', float('nan')):.3f} | "
                     f"{r.get('wer_without_outliers', float('nan')):.3f} |")
    dg = result.get("wer_diagnostics") or {}
    if dg:
        lines += ["", "Where the inner loop loses intelligibility (same sentences, same ASR):", "",
                  "| diagnostic | WER |", "|---|---|"]
        for name, r in dg.items():
            lines.append(f"| {name} | {r.get('wer', float('nan')):.3f} |")
        lines += ["", "`codec_1_codebook`: the true code 0 alone (what the talker decides); "
                  "`codec_4_codebooks`: the true codes, decoded from their first 4 codebooks only; "
                  "`inner_loop_4_codebooks`: true code 0 + generated codes 1..3, decoded from 4 codebooks (the "
                  "code predictor's error on the shallow codes alone); `inner_loop_greedy`: codes 1..15 by argmax "
                  "instead of the deployed sampling (T 0.9, top-k 50)."
                  + (" `*_table_decoder`: the same codes decoded by summing centroids instead of the neural code "
                     "decoder." if "codec_table_decoder" in dg else "")]
    cph = result.get("cp_held_out") or {}
    if cph.get("cp_acc_by_depth"):
        lines += ["", "Teacher-forced argmax accuracy of the code predictor by depth on the held-out sentences "
                  "(codes 1..15): " + ", ".join(f"{a:.3f}" for a in cph["cp_acc_by_depth"])
                  + f" (loss {cph.get('cp_loss', float('nan')):.3f} nats a code; chance ln(codebook size))."]
    lines += [
        "",
        f"Free running: {fr.get('not_ended', '?')} of {fr.get('n', '?')} utterances did not end by themselves "
        f"(frame cap {fr.get('frame_factor', '?')} x the true length + 10, at most {fr.get('max_frames', '?')}).",
        "",
        "`original`: the synthesiser's audio; `codec`: codec resynthesis (the ceiling); `inner_loop`: true code 0 "
        "+ codes 1.. generated by the code predictor from the teacher-forced talker state; `free_running`: "
        "`rvqspec_lib.models.frame.synthesize` from text alone.",
        "",
        "## Limitations",
        "",
        "- Synthetic voices only (flite/festival): no human speech, English only.",
        "- Griffin-Lim vocoding and a k-means codec: the deep codebooks carry little structure, so the code "
        "predictor's distributions are flat (acceptance is lower than on a neural codec). Its samples of codes "
        "1..15 carry almost no information about the true residual: a decoder can learn to ignore them (compare "
        "`inner_loop` with `codec_1_codebook` when the neural code decoder is used), not recover it.",
        "- The default-LM WER of PocketSphinx is itself 0.2-0.35 on clean synthetic speech: compare conditions, "
        "not absolute values.",
        "",
    ]
    return "\n".join(lines)
