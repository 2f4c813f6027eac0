"""Training a small model of the OFFICIAL Qwen3-TTS classes, teacher-forced in the layout of inference
(:mod:`rvqspec_lib.data.teacher`) through :func:`rvqspec_lib.training.loop.fit`. The losses are computed HERE on the
official logits, since the code-predictor loss the official method returns is double-shifted
(docs/model.md#training-caveats; QwenLM/Qwen3-TTS #179, PR #278): total = talker + 0.3 x code predictor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.models.configs import tiny_config_dict
from rvqspec_lib.models.loader import LoadedModel, save_checkpoint
from rvqspec_lib.data.teacher import Utterance, as_utterance, eval_mode, talker_pass
from rvqspec_lib.training.loop import fit, write_curve
from recipes.embedded.schedule import (
    ADAMW_BETAS,
    GRAD_CLIP,
    MIN_LR_RATIO,
    WARMUP_STEPS,
    WEIGHT_DECAY,
    WarmupCosine,
    decay_groups,
    one_budget,
)

#: Weight of the code-predictor loss in the total (the official finetuning script's value).
CP_LOSS_WEIGHT = 0.3
#: Peak AdamW learning rate of the joint training (talker + code predictor, from random weights).
LR = 1e-3
#: Peak learning rate and warmup of the code-predictor stage (it starts from the jointly trained weights: a lower
#: peak, half the warmup).
CP_LR = 5e-4
CP_WARMUP_STEPS = WARMUP_STEPS // 2


def bucket_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator,
                   bucket_batches_n: int = 50) -> list[list[int]]:
    """One epoch of index batches of similar length, in random order: shuffle, cut into buckets of ``batch_size *
    bucket_batches_n``, sort each by length, cut into batches, shuffle them. Raises ValueError: ``batch_size < 1``."""
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
    """``loss`` (a tensor, for backward), floats ``talker_loss, cp_loss, code0_acc, cp_acc`` and the counts
    ``n_talker`` (frames + one end of speech an utterance), ``n_cp`` (frames x 15) of a teacher-forced pass."""
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


def set_dropout(model, p: float) -> None:
    """Attention dropout of every talker and code-predictor layer (Qwen3 layers have no other dropout)."""
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = float(p)


@torch.no_grad()
def evaluate(lm: LoadedModel, utts: Sequence[Utterance], *, batch_size: int = 16,
             cp_weight: float = CP_LOSS_WEIGHT) -> dict:
    """Teacher-forced loss and accuracies over utterances (eval mode, token-weighted means)."""
    count_of = {"talker_loss": "n_talker", "cp_loss": "n_cp", "code0_acc": "n_talker", "cp_acc": "n_cp"}
    tot = {**dict.fromkeys(count_of, 0.0), "n_talker": 0, "n_cp": 0}
    order = sorted(range(len(utts)), key=lambda i: utts[i].codes.shape[0])
    with eval_mode(lm.model):
        for s in range(0, len(order), batch_size):
            r = losses(teacher_force(lm, [utts[i] for i in order[s:s + batch_size]]), cp_weight=cp_weight)
            for k, n in count_of.items():
                tot[k] += r[k] * r[n]
            for n in ("n_talker", "n_cp"):
                tot[n] += r[n]
    out = {k: tot[k] / max(1, tot[n]) for k, n in count_of.items()}
    out["loss"] = out["talker_loss"] + cp_weight * out["cp_loss"]
    return out


def train(lm: LoadedModel, dataset: Iterable, *, steps: int | None = None, minutes: float | None = None,
          lr: float = LR, batch_size: int = 16, dropout: float = 0.0, feedback_noise: float = 0.0,
          cp_fraction: float = 1.0, seed: int = 0,
          eval_every: int = 200, val_dataset: Iterable | None = None, out_dir: str | Path | None = None,
          warmup_steps: int = WARMUP_STEPS, min_lr_ratio: float = MIN_LR_RATIO, weight_decay: float = WEIGHT_DECAY,
          grad_clip: float = GRAD_CLIP, cp_weight: float = CP_LOSS_WEIGHT, max_eval_utterances: int = 64,
          progress: bool = True) -> dict:
    """Train ``lm.model`` in place with AdamW on utterances (:func:`as_utterance`) for ``steps`` or ``minutes``
    (exactly one), batches :func:`bucket_batches`, loss :func:`losses`; the last step's weights are kept, the best
    held-out ones go to ``out_dir/best`` (with ``curve.json`` and the final checkpoint). ``feedback_noise``,
    ``cp_fraction``: see :func:`teacher_force`; ``lr``: the peak; ``dropout``: attention dropout while training;
    ``eval_every``: steps between evaluations (also at the end); ``seed``: of batching and noise (attention dropout
    draws from torch's global RNG inside SDPA); ``max_eval_utterances``: size of the evaluated subsets.

    Returns:
        dict: ``curve``, ``steps``, ``wall_s``, ``train_s``, ``steps_per_s``, ``frames_per_s``, ``out_dir``.
    Raises:
        ValueError: no budget or two, a budget that is not positive, an empty training set.
    """
    budget = one_budget(steps, minutes)
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
    opt = torch.optim.AdamW(decay_groups(model.parameters(), weight_decay), lr=lr, betas=ADAMW_BETAS)
    out = Path(out_dir) if out_dir is not None else None
    meta = {"lr": lr, "batch_size": batch_size, "dropout": dropout, "feedback_noise": feedback_noise,
            "cp_fraction": cp_fraction, "seed": seed,
            "warmup_steps": warmup_steps, "weight_decay": weight_decay, "cp_weight": cp_weight,
            "n_train": len(data), "n_val": len(val)}
    seen = {"frames": 0}

    def epoch_batches(epoch: int):
        # popped from the end, as the batches of one bucket_batches call always were
        return [[data[i] for i in idx] for idx in reversed(bucket_batches(lengths, batch_size, gen))]

    def step(batch):
        r = losses(teacher_force(lm, batch, feedback_noise=feedback_noise, cp_fraction=cp_fraction, generator=gen),
                   cp_weight=cp_weight)
        seen["frames"] += sum(u.codes.shape[0] for u in batch)
        return r["loss"], r

    def evaluation():
        model.eval()
        rec = {"frames_seen": seen["frames"]}
        rec.update({f"train_{k}": v for k, v in evaluate(lm, data[:max_eval_utterances], batch_size=batch_size,
                                                         cp_weight=cp_weight).items()})
        if val:
            rec.update({f"val_{k}": v for k, v in evaluate(lm, val[:max_eval_utterances], batch_size=batch_size,
                                                           cp_weight=cp_weight).items()})
        model.train()
        return rec

    def save_best(rec, improved):
        if out is not None and improved:
            save_checkpoint(lm, out / "best", extra={**meta, "step": rec["step"], "val_loss": rec["val_loss"]})

    res = fit(step, epoch_batches, optimizer=opt, budget=budget,
              schedule=WarmupCosine(lr, warmup_steps, min_lr_ratio), clip_parameters=list(model.parameters()),
              grad_clip=grad_clip, evaluate=evaluation, eval_every=eval_every,
              metric="val_loss" if val else None, select="min", on_record=save_best,
              running=("talker_loss", "cp_loss", "code0_acc", "cp_acc"), running_prefix="train_run_",
              curve_path=out / "curve.json" if out is not None else None, curve_meta=meta,
              progress=progress, desc="train", log_records=True)
    set_dropout(model, 0.0)
    model.eval()
    meta.update(steps=res.steps, wall_s=round(res.wall_s, 2), train_s=round(res.train_s, 2))
    if out is not None:
        save_checkpoint(lm, out, extra=meta)
        write_curve(out / "curve.json", res.curve, meta)
    return {"curve": res.curve, "steps": res.steps, "wall_s": res.wall_s, "train_s": res.train_s,
            "steps_per_s": res.steps / max(res.train_s, 1e-9), "frames_per_s": seen["frames"] / max(res.train_s, 1e-9),
            "out_dir": str(out) if out is not None else None}


@dataclass
class CodePredictorStates:
    """Teacher-forced code-predictor inputs a frame: the frozen talker's ``hidden`` ``(N, talker_hidden)`` float32
    starting the inner loop, the true ``codes`` ``(N, G)`` int64."""

    hidden: torch.Tensor
    codes: torch.Tensor

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@torch.no_grad()
def code_predictor_states(lm: LoadedModel, dataset: Iterable, *, batch_size: int = 16,
                          progress: bool = True) -> CodePredictorStates:
    """:class:`CodePredictorStates` of every frame of ``dataset`` from teacher-forced talker passes (eval mode,
    ``batch_size`` utterances by length). Raises ValueError: an empty dataset."""
    utts = [as_utterance(u) for u in dataset]
    if not utts:
        raise ValueError("no utterances to take code-predictor states from")
    if hasattr(lm.tokenizer, "prefetch"):
        lm.tokenizer.prefetch([u.text for u in utts])
    order = sorted(range(len(utts)), key=lambda i: utts[i].codes.shape[0])
    hs, cs = [], []
    with eval_mode(lm.model):
        for s in progress_bar(range(0, len(order), batch_size), desc="talker states", unit="batch", enabled=progress):
            batch = [utts[i] for i in order[s:s + batch_size]]
            out, length, codes, valid, _ = talker_pass(lm, batch)
            hidden = out.hidden_states[0][-1][:, length - 1: length - 1 + valid.shape[1]]
            hs.append(hidden[valid].float().cpu())
            cs.append(codes[valid].cpu())
    return CodePredictorStates(torch.cat(hs), torch.cat(cs))


def code_predictor_parameters(lm: LoadedModel) -> list[tuple[str, torch.nn.Parameter]]:
    """What :func:`train_code_predictor` trains: the code predictor but its code embeddings (the talker reads them)."""
    return [(n, p) for n, p in lm.code_predictor.named_parameters() if "codec_embedding" not in n]


def _cp_cross_entropy(logits: torch.Tensor, codes: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """float32 cross-entropy of aligned ``forward_sub_talker_finetune`` logits ``(N, G-1, V)``, codes 1..G-1."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), codes[:, 1:].reshape(-1), reduction=reduction)


def code_predictor_metrics(lm: LoadedModel, states: CodePredictorStates, *, batch_frames: int = 1024) -> dict:
    """``{"cp_loss", "cp_acc", "cp_acc_by_depth": [G-1 floats]}``: teacher-forced cross-entropy and argmax accuracy
    of codes 1..G-1 (eval mode, no gradient)."""
    talker = lm.model.talker
    dtype = next(talker.parameters()).dtype
    loss, correct, n = 0.0, None, 0
    with eval_mode(lm.model), torch.no_grad():
        for s in range(0, len(states), batch_frames):
            h = states.hidden[s:s + batch_frames].to(dtype)
            c = states.codes[s:s + batch_frames]
            logits, _ = talker.forward_sub_talker_finetune(c, h)  # (b, G-1, V)
            loss += float(_cp_cross_entropy(logits, c, reduction="sum"))
            ok = (logits.argmax(-1) == c[:, 1:]).float().sum(0)
            correct = ok if correct is None else correct + ok
            n += c.shape[0]
    by_depth = (correct / max(1, n)).tolist()
    return {"cp_loss": loss / max(1, n * len(by_depth)), "cp_acc": sum(by_depth) / len(by_depth),
            "cp_acc_by_depth": by_depth}


def train_code_predictor(lm: LoadedModel, train_states: CodePredictorStates,
                         val_states: CodePredictorStates | None = None, *, steps: int | None = None,
                         minutes: float | None = None, lr: float = CP_LR, batch_frames: int = 256,
                         warmup_steps: int = CP_WARMUP_STEPS, min_lr_ratio: float = MIN_LR_RATIO,
                         weight_decay: float = WEIGHT_DECAY, grad_clip: float = GRAD_CLIP, eval_every: int = 200,
                         seed: int = 0, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Second stage after :func:`train`: the code predictor alone on a frozen talker's states (code 0 unchanged),
    AdamW, ``batch_frames`` random frames a step, for ``steps`` or ``minutes``; with ``val_states`` the weights of
    lowest validation loss are restored (step 0 a candidate). ``out_dir`` gets ``cp_curve.json``.

    Returns:
        dict: ``curve``, ``steps``, ``wall_s``, ``frames_seen``, ``best_step``, ``best`` (validation metrics of the
        kept weights), ``params_trained``.
    Raises:
        ValueError: no budget or two, an empty state set, batch_frames < 1.
    """
    budget = one_budget(steps, minutes)
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
    opt = torch.optim.AdamW(decay_groups(lm.model.parameters(), weight_decay), lr=lr, betas=ADAMW_BETAS)
    talker = lm.model.talker
    dtype = next(talker.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    out = Path(out_dir) if out_dir is not None else None
    meta = {"lr": lr, "batch_frames": batch_frames, "warmup_steps": warmup_steps, "min_lr_ratio": min_lr_ratio,
            "weight_decay": weight_decay, "seed": seed, "train_frames": len(train_states),
            "val_frames": len(val_states) if val_states is not None else 0,
            "params_trained": sum(p.numel() for p in params), "steps_budget": steps, "minutes_budget": minutes}
    seen = {"frames": 0}

    def frame_batches(epoch: int):
        """Endless random frames without replacement (a fresh permutation appended when short)."""
        perm = torch.empty(0, dtype=torch.long)
        while True:
            if perm.numel() < batch_frames:
                perm = torch.cat([perm, torch.randperm(len(train_states), generator=gen)])
            idx, perm = perm[:batch_frames], perm[batch_frames:]
            yield idx

    def step(idx):
        c = train_states.codes[idx]
        logits, _ = talker.forward_sub_talker_finetune(c, train_states.hidden[idx].to(dtype))
        loss = _cp_cross_entropy(logits, c)
        seen["frames"] += len(idx)
        return loss, {"cp_loss": float(loss.detach())}

    def evaluation():
        rec = {"frames_seen": seen["frames"]}
        if val_states is not None:
            rec.update({f"val_{k}": v for k, v in code_predictor_metrics(lm, val_states).items()})
        return rec

    lm.model.eval()  # no dropout; the code predictor has no batch statistics
    try:
        res = fit(step, frame_batches, optimizer=opt, budget=budget,
                  schedule=WarmupCosine(lr, warmup_steps, min_lr_ratio), clip_parameters=params, grad_clip=grad_clip,
                  evaluate=evaluation, eval_every=eval_every, eval_at_start=val_states is not None,
                  metric="val_cp_loss" if val_states is not None else None, select="min", keep_best=dict(named),
                  running=("cp_loss",), running_prefix="train_run_",
                  curve_path=out / "cp_curve.json" if out is not None else None, curve_meta=meta,
                  progress=progress, desc="code predictor", log_records=True)
    finally:
        for p, flag in was_trainable:
            p.requires_grad_(flag)
    best = res.best_record
    best_metrics = {k[len("val_"):]: v for k, v in best.items() if k.startswith("val_")} if best else None
    meta.update(steps=res.steps, wall_s=round(res.wall_s, 2), best_step=res.best_step or 0,
                frames_seen=seen["frames"])
    if out is not None:
        write_curve(out / "cp_curve.json", res.curve, meta)
    return {"curve": res.curve, "steps": res.steps, "wall_s": meta["wall_s"], "frames_seen": seen["frames"],
            "best_step": meta["best_step"], "best": best_metrics, "params_trained": meta["params_trained"]}


# ---- the teacher-forced pass of talker AND code predictor (training only) -----------------------------------------
IGNORE = -100


@dataclass
class TeacherForced:
    """Outputs of one teacher-forced pass: ``talker_logits`` ``(B, F+1, vocab)`` at the positions emitting code 0 of
    each frame then end of speech, ``talker_labels`` ``(B, F+1)`` int64 (-100 beyond), ``talker_hidden`` ``(N, H)``
    starting each selected frame's code-predictor sequence (row-major), ``cp_logits`` ``(N, G-1, V)`` and
    ``cp_labels`` ``(N, G-1)`` int64 for codes 1..G-1, ``frames`` ``(B,)``, ``official_cp_loss`` (double-shifted;
    tests)."""

    talker_logits: torch.Tensor
    talker_labels: torch.Tensor
    talker_hidden: torch.Tensor
    cp_logits: torch.Tensor
    cp_labels: torch.Tensor
    frames: torch.Tensor
    official_cp_loss: torch.Tensor | None = None


def teacher_force(lm: LoadedModel, utts: Sequence[Utterance], *, feedback_noise: float = 0.0,
                  cp_fraction: float = 1.0, generator: torch.Generator | None = None) -> TeacherForced:
    """One teacher-forced pass of the official talker and code predictor over a batch (autograd as ambient).

    Args:
        feedback_noise: probability that a fed-back frame is replaced by random codes (labels keep the true ones).
        cp_fraction: a random subset of frames (at least one) through the code predictor (Sesame CSM: 1/16).
        generator: RNG of the noise and the subset.

    Raises:
        ValueError: codes of another shape or range; random draws without ``generator``; ``cp_fraction <= 0``.
    """
    utts = [as_utterance(u) for u in utts]
    if (feedback_noise > 0 or cp_fraction < 1.0) and generator is None:
        raise ValueError("feedback_noise and cp_fraction < 1 draw random numbers: pass generator=torch.Generator()")
    for u in utts:
        if u.codes.shape[1] != lm.n_code_groups or int(u.codes.min()) < 0 or int(u.codes.max()) >= lm.codebook_size:
            raise ValueError(f"codes of {u.text!r} must be (frames, {lm.n_code_groups}) in 0..{lm.codebook_size - 1}, "
                             f"got shape {tuple(u.codes.shape)}, range {int(u.codes.min())}..{int(u.codes.max())}")
    model, talker = lm.model, lm.model.talker
    eos = int(model.config.talker_config.codec_eos_token_id)
    out, length, codes, valid, frames = talker_pass(lm, utts, feedback_noise=feedback_noise, generator=generator)
    b, n_max = valid.shape
    dev = codes.device
    hidden = out.hidden_states[0][-1]  # (B, L + F, H), last layer after the final norm (= inference's past_hidden)
    talker_logits = out.logits[:, length - 1:]  # (B, F + 1, V): position L-1+t emits code 0 of frame t
    labels = torch.full((b, n_max + 1), IGNORE, dtype=torch.long, device=dev)
    labels[:, :n_max] = torch.where(valid, codes[..., 0], torch.full_like(codes[..., 0], IGNORE))
    labels[torch.arange(b, device=dev), frames.to(dev)] = eos
    sel = valid
    if cp_fraction < 1.0:
        if not 0.0 < cp_fraction:
            raise ValueError(f"cp_fraction must be in (0, 1], got {cp_fraction}")
        where = valid.flatten().nonzero().flatten()
        k = max(1, math.ceil(cp_fraction * where.numel()))
        pick = where[torch.randperm(where.numel(), generator=generator)[:k].to(dev)]
        sel = torch.zeros_like(valid).flatten().index_fill(0, pick, True).view_as(valid)
    h = hidden[:, length - 1: length - 1 + n_max][sel]  # (N, H): row-major over (utterance, frame)
    c = codes[sel]  # (N, G)
    cp_logits, official_loss = talker.forward_sub_talker_finetune(c, h)  # (N, G-1, Vc)
    return TeacherForced(talker_logits, labels, h, cp_logits, c[:, 1:], frames, official_loss)


# ---- the config of a small model trained from scratch ----------------------------------------------------------------
def small_config_dict(*, talker_layers: int = 4, talker_hidden: int = 256, code_predictor_layers: int = 5,
                      code_predictor_hidden: int = 256, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 64,
                      text_hidden: int = 256, speakers: Sequence[str] = ("slt",), n_code_groups: int = 16,
                      codebook_size: int = 2048) -> dict:
    """Config of a small model of the official classes for training from scratch (defaults: the feasibility run's,
    docs/offline.md#template-sentences), sized as the releases are scaled, one speaker id (3000 + i) per voice.

    Raises:
        ValueError: an odd ``head_dim``, ``n_heads`` not a multiple of ``n_kv_heads``, not 1..72 speakers.
    """
    cfg = tiny_config_dict(n_code_groups=n_code_groups, codebook_size=codebook_size, talker_hidden=talker_hidden,
                           code_predictor_hidden=code_predictor_hidden, talker_layers=talker_layers,
                           code_predictor_layers=code_predictor_layers)
    if head_dim % 2 or n_heads % n_kv_heads:
        raise ValueError("head_dim must be even and n_heads a multiple of n_kv_heads")
    if not 1 <= len(speakers) <= 72:
        raise ValueError("need 1..72 speakers (ids 3000..3071)")
    half = head_dim // 2
    side = round(half * 20 / 64)
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    cfg["tts_model_size"] = f"small-{talker_layers}x{talker_hidden}"
    for c, hid in ((t, talker_hidden), (cp, code_predictor_hidden)):
        c.update(intermediate_size=3 * hid, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                 head_dim=head_dim)
    t["text_hidden_size"] = text_hidden
    t["rope_scaling"] = {"interleaved": True, "mrope_section": [half - 2 * side, side, side], "rope_type": "default"}
    t["spk_id"] = {s.lower(): 3000 + i for i, s in enumerate(speakers)}
    t["spk_is_dialect"] = {s.lower(): False for s in speakers}
    return cfg
