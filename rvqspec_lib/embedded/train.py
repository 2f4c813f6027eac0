"""Training a small Qwen3-TTS-class model: teacher forcing in exactly the layout of non-streaming inference.

The model is the OFFICIAL ``Qwen3TTSForConditionalGeneration`` (talker + code predictor), unchanged. One training
sequence is what ``generate(non_streaming_mode=True)`` feeds the talker, with the frames teacher-forced::

    position:  [left pad] prompt[0 .. L-1] | frame 0 feed | ... | frame F-1 feed
    predicts:                  ... code0[0] |   code0[1]   | ... |   end of speech (2150)

* prompt: built by the official ``generate`` itself (:func:`rvqspec_lib.models.frame.build_prompt` with ``grad=True``, the
  same code as inference with autograd on; ``tests/test_train.py`` checks it equals the inference prompt bit for bit).
  Batches are left-padded exactly as the official batch ``generate`` pads them (one forward a batch: on a CPU a batch
  is far cheaper than per-utterance passes with gradient accumulation, and the padding IS the inference layout).
* frame t's feed = talker ``codec_embedding(code 0)`` + sum of code-predictor ``codec_embedding[j-1](code j)``,
  j = 1..15, + the text track (``tts_pad_embed`` in non-streaming mode), as the official loop and our
  :func:`rvqspec_lib.models.frame.synthesize` feed it. The talker's last-layer hidden (after the final norm) at the position
  that emitted code 0 of frame t starts that frame's code-predictor sequence.
* talker loss: cross-entropy of the official forward's ``codec_head`` logits against code 0 of every frame and
  end-of-speech after the last frame (no shift: position i is already aligned with its label).
* code-predictor loss: the logits of the official ``talker.forward_sub_talker_finetune(codes, hidden)`` (16 positions
  ``[hidden, emb(code 0), emb(code 1) .. emb(code 14)]``, ``lm_head[j-1]`` at position j predicts code j) against codes
  1..15, computed HERE: the loss that method returns is double-shifted (QwenLM/Qwen3-TTS #179/#337/#371, PR #278):
  its logits are already aligned, and transformers' causal-LM loss shifts the labels once more, so it scores the head
  of code j against code j+1 and drops code 15
  (``tests/test_train.py::test_official_code_predictor_loss_is_double_shifted``).
* total = talker loss + 0.3 x code-predictor loss (the official finetuning script's weighting).

References: Qwen3-TTS (QwenLM/Qwen3-TTS, ``finetuning/sft_12hz.py`` for the weighting), nanoGPT (AdamW groups,
warmup + cosine schedule).

The teacher-forced passes themselves (prompt batches, talker pass, code-predictor states) are model access:
:mod:`rvqspec_lib.models.teacher`. This module holds the losses and the training runs of the embedded model.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from rvqspec_lib.models.loader import LoadedModel, save_checkpoint
from rvqspec_lib.models.teacher import (
    IGNORE,
    TeacherForced,
    Utterance,
    as_utterance,
    talker_pass,
    teacher_force,
)

#: Weight of the code-predictor loss in the total (the official finetuning script's value).
CP_LOSS_WEIGHT = 0.3


TOY_WORDS = ("the cat sat on a mat while two dogs ran far away from old red barns near green hills "
             "and blue lakes under bright warm sun every quiet morning").split()


def toy_corpus(n: int, *, seed: int = 0, n_code_groups: int = 16, codebook_size: int = 2048,
               words: Sequence[str] = TOY_WORDS, min_words: int = 3, max_words: int = 8) -> list[Utterance]:
    """A learnable stand-in for speech codes, for smoke runs of the trainer (no audio, no codec).

    Each text is random words; frame t "speaks" character ``2t`` of the text (two characters a frame, plus two
    silent frames), so the talker must learn a monotonic text-to-frame alignment, as in TTS:
    ``code0[t] = (7 * byte(text[2t]) + 13 * (t % 3)) mod K``; the residual codes are a fixed function of code 0
    (``code_j = (code0 * (2j + 1) + 31 j) mod K``), so the code predictor has something to learn. Held-out texts
    follow the same rules, so held-out accuracy measures generalisation.
    """
    gen = torch.Generator().manual_seed(seed)
    k = codebook_size
    out = []
    for _ in range(n):
        m = int(torch.randint(min_words, max_words + 1, (1,), generator=gen))
        text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (m,), generator=gen)) + "."
        b = text.encode("utf-8")
        frames = len(b) // 2 + 2
        t = torch.arange(frames)
        chars = torch.tensor([b[min(2 * i, len(b) - 1)] if 2 * i < len(b) else 32 for i in range(frames)])
        code0 = (7 * chars + 13 * (t % 3)) % k
        j = torch.arange(n_code_groups)
        codes = (code0[:, None] * (2 * j + 1) + 31 * j) % k
        out.append(Utterance(text, codes.long()))
    return out


def bucket_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator,
                   bucket_batches_n: int = 50) -> list[list[int]]:
    """One epoch of batches of similar length (little padding), in random order.

    Shuffle, cut into buckets of ``batch_size * bucket_batches_n`` utterances, sort each bucket by length, cut it
    into batches, shuffle the batches. Deterministic given ``generator``.

    Returns:
        list of batches, each a list of dataset indices (the last batch of a bucket may be smaller).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = torch.randperm(len(lengths), generator=generator).tolist()
    span = batch_size * bucket_batches_n
    batches = []
    for s in range(0, len(order), span):
        bucket = sorted(order[s:s + span], key=lambda i: lengths[i])
        batches += [bucket[b:b + batch_size] for b in range(0, len(bucket), batch_size)]
    perm = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in perm]


def losses(tf: TeacherForced, *, cp_weight: float = CP_LOSS_WEIGHT) -> dict:
    """Losses and accuracies of a teacher-forced pass.

    Returns:
        dict with ``loss`` (tensor, for backward) and floats ``talker_loss``, ``cp_loss``, ``code0_acc`` (argmax
        over the talker vocabulary vs code 0 / end of speech), ``cp_acc`` (codes 1..15), and counts ``n_talker``
        (frames + one end of speech per utterance) and ``n_cp`` (frames x 15).
    """
    vocab = tf.talker_logits.shape[-1]
    talker_loss = F.cross_entropy(tf.talker_logits.reshape(-1, vocab).float(), tf.talker_labels.reshape(-1),
                                  ignore_index=IGNORE)
    cp_loss = F.cross_entropy(tf.cp_logits.reshape(-1, tf.cp_logits.shape[-1]).float(), tf.cp_labels.reshape(-1))
    with torch.no_grad():
        ok = tf.talker_labels != IGNORE
        code0_acc = (tf.talker_logits.argmax(-1) == tf.talker_labels)[ok].float().mean()
        cp_acc = (tf.cp_logits.argmax(-1) == tf.cp_labels).float().mean()
    return {"loss": talker_loss + cp_weight * cp_loss,
            "talker_loss": float(talker_loss.detach()), "cp_loss": float(cp_loss.detach()),
            "code0_acc": float(code0_acc), "cp_acc": float(cp_acc), "n_talker": int(ok.sum()),
            "n_cp": int(tf.cp_labels.numel())}


def lr_at(step: int, frac: float, *, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio`` as ``frac`` goes 0 -> 1
    (``frac``: fraction of the step or time budget spent)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, frac))))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * cos)


def set_dropout(model, p: float) -> None:
    """Attention dropout of every talker and code-predictor layer (Qwen3 layers have no other dropout)."""
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = float(p)


@torch.no_grad()
def evaluate(lm: LoadedModel, utts: Sequence[Utterance], *, batch_size: int = 16,
             cp_weight: float = CP_LOSS_WEIGHT) -> dict:
    """Teacher-forced loss and accuracies over utterances (eval mode, token-weighted means)."""
    was = lm.model.training
    lm.model.eval()
    tot = {"talker_loss": 0.0, "cp_loss": 0.0, "code0_acc": 0.0, "cp_acc": 0.0, "n_talker": 0, "n_cp": 0}
    order = sorted(range(len(utts)), key=lambda i: utts[i].codes.shape[0])
    for s in range(0, len(order), batch_size):
        r = losses(teacher_force(lm, [utts[i] for i in order[s:s + batch_size]]), cp_weight=cp_weight)
        for k, n in (("talker_loss", "n_talker"), ("code0_acc", "n_talker"), ("cp_loss", "n_cp"), ("cp_acc", "n_cp")):
            tot[k] += r[k] * r[n]
        tot["n_talker"] += r["n_talker"]
        tot["n_cp"] += r["n_cp"]
    lm.model.train(was)
    out = {k: tot[k] / max(1, tot["n_talker" if k in ("talker_loss", "code0_acc") else "n_cp"])
           for k in ("talker_loss", "cp_loss", "code0_acc", "cp_acc")}
    out["loss"] = out["talker_loss"] + cp_weight * out["cp_loss"]
    return out


def _check_budget(steps: int | None, minutes: float | None) -> None:
    """Exactly one positive training budget (:func:`train`, :func:`train_code_predictor`)."""
    if (steps is None) == (minutes is None):
        raise ValueError("give exactly one budget: steps=... or minutes=...")
    if steps is not None and steps < 1 or minutes is not None and minutes <= 0:
        raise ValueError("the budget must be positive")


def _param_groups(model, weight_decay: float):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def train(lm: LoadedModel, dataset: Iterable, *, steps: int | None = None, minutes: float | None = None,
          lr: float = 1e-3, batch_size: int = 16, dropout: float = 0.0, feedback_noise: float = 0.0,
          cp_fraction: float = 1.0, seed: int = 0,
          eval_every: int = 200, val_dataset: Iterable | None = None, out_dir: str | Path | None = None,
          warmup_steps: int = 100, min_lr_ratio: float = 0.1, weight_decay: float = 0.01, grad_clip: float = 1.0,
          cp_weight: float = CP_LOSS_WEIGHT, max_eval_utterances: int = 64, progress: bool = True) -> dict:
    """Train ``lm.model`` in place with AdamW on (text, codes) pairs; write the curve and a loadable checkpoint.

    Args:
        lm: the model to train (e.g. ``LoadedModel`` around ``build_from_config(small_config_dict())`` with a byte or
            phoneme tokenizer); its ``tokenizer`` is the text front end stored with the checkpoint.
        dataset, val_dataset: utterances (anything :func:`as_utterance` accepts).
        steps / minutes: the budget (exactly one). With ``minutes`` the cosine follows elapsed time.
        lr: peak learning rate (after ``warmup_steps`` linear warmup; cosine down to ``lr * min_lr_ratio``).
        dropout: attention dropout while training. feedback_noise, cp_fraction: see :func:`teacher_force`
            (evaluation always uses every frame and no noise).
        seed: seeds batching and noise (explicit generator; the global RNG is not used, except by attention
            dropout, which draws from torch's global RNG inside SDPA).
        eval_every: steps between evaluations (train subset and held-out set, eval mode); also at the end.
        out_dir: where ``curve.json`` (after every evaluation) and the final checkpoint go (and ``best/``, the
            checkpoint with the lowest held-out loss, when ``val_dataset`` is given).
        max_eval_utterances: size of the train and held-out subsets evaluated (first utterances, fixed).

    Returns:
        dict: ``curve`` (list of evaluation records), ``steps``, ``wall_s``, ``steps_per_s``, ``frames_per_s``,
        ``out_dir``.
    """
    _check_budget(steps, minutes)
    data = [as_utterance(u) for u in dataset]
    val = [as_utterance(u) for u in val_dataset] if val_dataset is not None else []
    if not data:
        raise ValueError("the training set is empty")
    if hasattr(lm.tokenizer, "prefetch"):  # phonemise the corpus once, in parallel
        lm.tokenizer.prefetch([u.text for u in data + val])
    lengths = [u.codes.shape[0] + lm.tokenizer(u.text).shape[1] for u in data]
    gen = torch.Generator().manual_seed(seed)
    model = lm.model
    model.train()
    set_dropout(model, dropout)
    opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95))
    out = Path(out_dir) if out_dir is not None else None
    budget_s = minutes * 60 if minutes is not None else None
    curve: list[dict] = []
    run = {"talker_loss": 0.0, "cp_loss": 0.0, "code0_acc": 0.0, "cp_acc": 0.0, "n": 0}
    best = math.inf
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps if steps is not None else None, desc="train", unit="step")
    t0 = time.perf_counter()
    train_s, n_frames, step = 0.0, 0, 0
    batches: list[list[int]] = []
    meta = {"lr": lr, "batch_size": batch_size, "dropout": dropout, "feedback_noise": feedback_noise,
            "cp_fraction": cp_fraction, "seed": seed,
            "warmup_steps": warmup_steps, "weight_decay": weight_decay, "cp_weight": cp_weight,
            "n_train": len(data), "n_val": len(val)}

    def record():
        nonlocal best
        rec = {"step": step, "elapsed_s": round(time.perf_counter() - t0, 2), "lr": opt.param_groups[0]["lr"],
               "frames_seen": n_frames}
        n = max(1, run["n"])
        rec.update({f"train_run_{k}": run[k] / n for k in ("talker_loss", "cp_loss", "code0_acc", "cp_acc")})
        rec.update({f"train_{k}": v for k, v in evaluate(lm, data[:max_eval_utterances], batch_size=batch_size,
                                                         cp_weight=cp_weight).items()})
        if val:
            rec.update({f"val_{k}": v for k, v in evaluate(lm, val[:max_eval_utterances], batch_size=batch_size,
                                                           cp_weight=cp_weight).items()})
        curve.append(rec)
        for k in run:
            run[k] = 0 if k == "n" else 0.0
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "curve.json").write_text(json.dumps({"meta": meta, "curve": curve}, indent=1))
            if val and rec["val_loss"] < best:
                best = rec["val_loss"]
                save_checkpoint(lm, out / "best", extra={**meta, "step": step, "val_loss": best})
        if bar is not None:
            bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))

    while True:
        elapsed = time.perf_counter() - t0
        if steps is not None and step >= steps or budget_s is not None and elapsed >= budget_s:
            break
        if not batches:
            batches = bucket_batches(lengths, batch_size, gen)
        idx = batches.pop()
        frac = step / steps if steps is not None else elapsed / budget_s
        for group in opt.param_groups:
            group["lr"] = lr_at(step, frac, lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
        ts = time.perf_counter()
        r = losses(teacher_force(lm, [data[i] for i in idx], feedback_noise=feedback_noise,
                                 cp_fraction=cp_fraction, generator=gen),
                   cp_weight=cp_weight)
        opt.zero_grad(set_to_none=True)
        r["loss"].backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        train_s += time.perf_counter() - ts
        n_frames += sum(data[i].codes.shape[0] for i in idx)
        step += 1
        for k in ("talker_loss", "cp_loss", "code0_acc", "cp_acc"):
            run[k] += r[k]
        run["n"] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(r['loss']):.3f}", acc0=f"{r['code0_acc']:.2f}")
        if eval_every and step % eval_every == 0:
            model.eval()
            record()
            model.train()
    if not curve or curve[-1]["step"] != step:
        model.eval()
        record()
    if bar is not None:
        bar.close()
    set_dropout(model, 0.0)
    model.eval()
    wall = time.perf_counter() - t0
    meta.update(steps=step, wall_s=round(wall, 2), train_s=round(train_s, 2))
    if out is not None:
        save_checkpoint(lm, out, extra=meta)
        (out / "curve.json").write_text(json.dumps({"meta": meta, "curve": curve}, indent=1))
    return {"curve": curve, "steps": step, "wall_s": wall, "train_s": train_s,
            "steps_per_s": step / max(train_s, 1e-9), "frames_per_s": n_frames / max(train_s, 1e-9),
            "out_dir": str(out) if out is not None else None}


@dataclass
class CodePredictorStates:
    """Teacher-forced inputs of the code predictor, one row per frame.

    Attributes:
        hidden: ``(N, talker_hidden)`` float32, the frozen talker's last hidden state (after the final norm) at the
            position that emitted code 0 of the frame: exactly what starts the frame's inner loop at inference.
        codes: ``(N, G)`` int64, the frame's true codes (code 0 first).
    """

    hidden: torch.Tensor
    codes: torch.Tensor

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@torch.no_grad()
def code_predictor_states(lm: LoadedModel, dataset: Iterable, *, batch_size: int = 16,
                          progress: bool = True) -> CodePredictorStates:
    """One teacher-forced talker pass (:func:`talker_pass`, eval mode, no gradient) over utterances, keeping the
    hidden state that starts each frame's code-predictor sequence.

    Args:
        dataset: utterances (anything :func:`as_utterance` accepts).
        batch_size: utterances per talker pass (sorted by length: little padding).
    Returns:
        :class:`CodePredictorStates` with every frame of every utterance.
    Raises:
        ValueError: an empty dataset.
    """
    from tqdm.auto import tqdm

    utts = [as_utterance(u) for u in dataset]
    if not utts:
        raise ValueError("no utterances to take code-predictor states from")
    if hasattr(lm.tokenizer, "prefetch"):
        lm.tokenizer.prefetch([u.text for u in utts])
    was = lm.model.training
    lm.model.eval()
    order = sorted(range(len(utts)), key=lambda i: utts[i].codes.shape[0])
    hs, cs = [], []
    try:
        for s in tqdm(range(0, len(order), batch_size), desc="talker states", unit="batch", disable=not progress):
            batch = [utts[i] for i in order[s:s + batch_size]]
            out, length, codes, valid, _ = talker_pass(lm, batch)
            hidden = out.hidden_states[0][-1][:, length - 1: length - 1 + valid.shape[1]]
            hs.append(hidden[valid].float().cpu())
            cs.append(codes[valid].cpu())
    finally:
        lm.model.train(was)
    return CodePredictorStates(torch.cat(hs), torch.cat(cs))


def code_predictor_parameters(lm: LoadedModel) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters :func:`train_code_predictor` trains: the code predictor's decoder layers, final norm, input
    projection and per-depth heads. Its code embedding tables are NOT among them: the talker reads them too (frame
    feedback = sum of the 16 code embeddings), so changing them would change the frozen talker's inputs."""
    return [(n, p) for n, p in lm.code_predictor.named_parameters() if "codec_embedding" not in n]


def _cp_cross_entropy(logits: torch.Tensor, codes: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``forward_sub_talker_finetune`` logits ``(N, G-1, V)`` (head j at position j, already
    aligned) against codes 1..G-1 of ``codes (N, G)``, in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), codes[:, 1:].reshape(-1), reduction=reduction)


def code_predictor_metrics(lm: LoadedModel, states: CodePredictorStates, *, batch_frames: int = 1024) -> dict:
    """Teacher-forced cross-entropy and argmax accuracy of codes 1..G-1 over frames (eval mode, no gradient).

    Returns:
        ``{"cp_loss", "cp_acc", "cp_acc_by_depth": [G-1 floats]}``.
    """
    was = lm.model.training
    lm.model.eval()
    talker = lm.model.talker
    dtype = next(talker.parameters()).dtype
    loss, correct, n = 0.0, None, 0
    with torch.no_grad():
        for s in range(0, len(states), batch_frames):
            h = states.hidden[s:s + batch_frames].to(dtype)
            c = states.codes[s:s + batch_frames]
            logits, _ = talker.forward_sub_talker_finetune(c, h)  # (b, G-1, V)
            loss += float(_cp_cross_entropy(logits, c, reduction="sum"))
            ok = (logits.argmax(-1) == c[:, 1:]).float().sum(0)
            correct = ok if correct is None else correct + ok
            n += c.shape[0]
    lm.model.train(was)
    by_depth = (correct / max(1, n)).tolist()
    return {"cp_loss": loss / max(1, n * len(by_depth)), "cp_acc": sum(by_depth) / len(by_depth),
            "cp_acc_by_depth": by_depth}


def train_code_predictor(lm: LoadedModel, train_states: CodePredictorStates,
                         val_states: CodePredictorStates | None = None, *, steps: int | None = None,
                         minutes: float | None = None, lr: float = 5e-4, batch_frames: int = 256,
                         warmup_steps: int = 50, min_lr_ratio: float = 0.1, weight_decay: float = 0.01,
                         grad_clip: float = 1.0, eval_every: int = 200, seed: int = 0,
                         out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Train the code predictor alone on a frozen talker's teacher-forced states (a second stage after :func:`train`).

    Joint training (:func:`train`) sends a fraction of the frames through the code predictor; this stage gives it
    every frame of the corpus, cheaply: the talker is run once (:func:`code_predictor_states`), then each step is a
    16-position pass of ``batch_frames`` frames through ``talker.forward_sub_talker_finetune`` (the official method;
    the loss is computed here, aligned: head j against code j). The talker and every code embedding table stay fixed
    (:func:`code_predictor_parameters`), so the talker's behaviour, and free running's code 0, are unchanged.
    With ``val_states`` the weights with the lowest validation loss are restored at the end.

    Args:
        train_states, val_states: from :func:`code_predictor_states`.
        steps / minutes: the budget (exactly one); the cosine schedule follows it.
        lr: peak AdamW learning rate (linear warmup, cosine to ``lr * min_lr_ratio``).
        batch_frames: frames per step (random, without replacement within an epoch).
        eval_every: steps between validation evaluations (and at the end).
        out_dir: ``cp_curve.json`` goes there after each evaluation.
    Returns:
        dict: ``curve`` (evaluation records), ``steps``, ``wall_s``, ``frames_seen``, ``best_step``,
        ``best`` (validation metrics of the kept weights), ``params_trained``.
    Raises:
        ValueError: no budget or two, an empty state set, batch_frames < 1.
    """
    _check_budget(steps, minutes)
    if len(train_states) == 0:
        raise ValueError("no training frames")
    if batch_frames < 1:
        raise ValueError(f"batch_frames must be >= 1, got {batch_frames}")
    named = code_predictor_parameters(lm)
    was_trainable = [(p, p.requires_grad) for p in lm.model.parameters()]
    for p in lm.model.parameters():
        p.requires_grad_(False)
    for _, p in named:
        p.requires_grad_(True)
    params = [p for _, p in named]
    opt = torch.optim.AdamW(_param_groups(lm.model, weight_decay), lr=lr, betas=(0.9, 0.95))
    talker = lm.model.talker
    dtype = next(talker.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    out = Path(out_dir) if out_dir is not None else None
    budget_s = minutes * 60 if minutes is not None else None
    meta = {"lr": lr, "batch_frames": batch_frames, "warmup_steps": warmup_steps, "min_lr_ratio": min_lr_ratio,
            "weight_decay": weight_decay, "seed": seed, "train_frames": len(train_states),
            "val_frames": len(val_states) if val_states is not None else 0,
            "params_trained": sum(p.numel() for p in params), "steps_budget": steps, "minutes_budget": minutes}
    curve: list[dict] = []
    best, best_step, best_state, best_metrics = math.inf, 0, None, None
    step, seen, run_loss, run_n = 0, 0, 0.0, 0
    perm = torch.empty(0, dtype=torch.long)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc="code predictor", unit="step")
    t0 = time.perf_counter()

    def record():
        nonlocal best, best_step, best_state, best_metrics
        rec = {"step": step, "elapsed_s": round(time.perf_counter() - t0, 2), "frames_seen": seen,
               "lr": opt.param_groups[0]["lr"], "train_run_cp_loss": run_loss / max(1, run_n)}
        if val_states is not None:
            m = code_predictor_metrics(lm, val_states)
            rec.update({f"val_{k}": v for k, v in m.items()})
            if m["cp_loss"] < best:
                best, best_step, best_metrics = m["cp_loss"], step, m
                best_state = {n: p.detach().clone() for n, p in named}
        curve.append(rec)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "cp_curve.json").write_text(json.dumps({"meta": meta, "curve": curve}, indent=1))
        if bar is not None:
            bar.write(" ".join(f"{k}={v:.4g}" for k, v in rec.items() if isinstance(v, (int, float))))

    lm.model.eval()  # no dropout; the code predictor has no batch statistics
    try:
        if val_states is not None:
            record()  # step 0: the jointly trained weights
        while True:
            elapsed = time.perf_counter() - t0
            if steps is not None and step >= steps or budget_s is not None and elapsed >= budget_s:
                break
            if perm.numel() < batch_frames:
                perm = torch.cat([perm, torch.randperm(len(train_states), generator=gen)])
            idx, perm = perm[:batch_frames], perm[batch_frames:]
            frac = step / steps if steps is not None else elapsed / budget_s
            for group in opt.param_groups:
                group["lr"] = lr_at(step, frac, lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
            c = train_states.codes[idx]
            logits, _ = talker.forward_sub_talker_finetune(c, train_states.hidden[idx].to(dtype))
            loss = _cp_cross_entropy(logits, c)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            step += 1
            seen += len(idx)
            run_loss += float(loss.detach())
            run_n += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
            if eval_every and step % eval_every == 0:
                record()
                run_loss, run_n = 0.0, 0
        if not curve or curve[-1]["step"] != step:
            record()
    finally:
        if bar is not None:
            bar.close()
        for p, flag in was_trainable:
            p.requires_grad_(flag)
    if best_state is not None:
        with torch.no_grad():
            for n, p in named:
                p.copy_(best_state[n])
    meta.update(steps=step, wall_s=round(time.perf_counter() - t0, 2), best_step=best_step, frames_seen=seen)
    if out is not None:
        (out / "cp_curve.json").write_text(json.dumps({"meta": meta, "curve": curve}, indent=1))
    return {"curve": curve, "steps": step, "wall_s": meta["wall_s"], "frames_seen": seen, "best_step": best_step,
            "best": best_metrics, "params_trained": meta["params_trained"]}
