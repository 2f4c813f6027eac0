"""Training the offline codec's neural code decoder (:class:`rvqspec_lib.models.code_decoder.CodeDecoder`): L1 to the
unquantised features on random chunks of true or inner-loop-generated codes, with codebook dropout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rvqspec_lib.common.files import atomic_output, json_text
from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.data.teacher import eval_mode
from rvqspec_lib.data.utterances import utterances_from_manifest
from recipes.embedded.codes import inner_loop_codes_batch
from rvqspec_lib.models.audio import load_wav
from rvqspec_lib.models.code_decoder import CodeDecoder, CodeDecoderConfig
from rvqspec_lib.models.configs import seeded
from rvqspec_lib.training.loop import Budget, fit
from recipes.embedded.schedule import GRAD_CLIP, WARMUP_STEPS, WEIGHT_DECAY, WarmupCosine

#: Peak AdamW learning rate of the code decoder.
LR = 1e-3


@dataclass
class DecoderPairs:
    """Per utterance: ``true (F, G)`` int64 codes, ``generated (F, G)`` int64 (true code 0, sampled codes 1..) and
    ``features (F, dim)`` float32 unquantised log-mel frame vectors, plus the utterance ids."""

    ids: list
    true: list
    generated: list
    features: list

    def __len__(self) -> int:
        return len(self.ids)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the pairs to one safetensors file (ids in its metadata), atomically; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        lens = torch.tensor([t.shape[0] for t in self.true])
        t = {"lengths": lens, "true": torch.cat(self.true), "generated": torch.cat(self.generated),
             "features": torch.cat([torch.as_tensor(f) for f in self.features])}
        with atomic_output(p) as tmp:
            save_file(t, str(tmp), metadata={"ids": json_text(list(self.ids), indent=None)})
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DecoderPairs":
        """Read a file written by :meth:`save`."""
        with safe_open(str(path), framework="pt") as f:
            ids = json.loads(f.metadata()["ids"])
            t = {k: f.get_tensor(k) for k in f.keys()}
        lens = t["lengths"].tolist()
        return cls(ids, list(t["true"].split(lens)), list(t["generated"].split(lens)),
                   list(t["features"].split(lens)))


def decoder_rows(rows: Sequence[dict], n_train: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``n_train`` seeded training rows and every validation row (evaluation rows never used)."""
    tr = [r for r in rows if r["split"] == "training"]
    va = [r for r in rows if r["split"] == "validation"]
    if not tr or not va:
        raise ValueError("the manifest needs training and validation rows")
    pick = torch.randperm(len(tr), generator=torch.Generator().manual_seed(seed))[: min(n_train, len(tr))]
    return [tr[i] for i in sorted(pick.tolist())], va


def decoder_pairs(lm, codec, rows: Sequence[dict], codes: dict, *, batch_size: int = 32,
                  generator: torch.Generator | None = None, progress: bool = True) -> DecoderPairs:
    """Training pairs for :func:`train_code_decoder` from manifest rows (``id, path, text, voice``), their ``codes``
    ``{id: (F, G)}`` and the ``codec`` that made them. Raises ValueError: a row without codes, or features whose
    frame count differs from its codes."""
    missing = [r["id"] for r in rows if r["id"] not in codes]
    if missing:
        raise ValueError(f"{len(missing)} row(s) have no codes (e.g. {missing[0]}): run the 'codes' stage first")
    utts = utterances_from_manifest(rows, codes)
    feats = []
    for r, u in progress_bar(list(zip(rows, utts)), desc="features", unit="utt", enabled=progress):
        f = codec.features(load_wav(r["path"]))
        if f.shape[0] != u.codes.shape[0]:
            raise ValueError(f"{r['id']}: {f.shape[0]} feature frames but {u.codes.shape[0]} code frames")
        feats.append(torch.from_numpy(np.ascontiguousarray(f, dtype=np.float32)))
    gen = inner_loop_codes_batch(lm, utts, batch_size=batch_size, generator=generator, progress=progress)
    return DecoderPairs([r["id"] for r in rows], [u.codes.long() for u in utts], gen, feats)


def _padded(pairs: DecoderPairs, idx: Sequence[int], starts: Sequence[int], length: int, generated) -> tuple:
    """Zero-padded frames ``[start, start + length)`` of utterances ``idx``: (codes (B, length, G), generated where
    ``generated[j]``; target (B, length, dim); valid (B, length))."""
    codes = torch.zeros(len(idx), length, pairs.true[idx[0]].shape[1], dtype=torch.long)
    target = torch.zeros(len(idx), length, pairs.features[0].shape[1])
    valid = torch.zeros(len(idx), length, dtype=torch.bool)
    for j, (i, s) in enumerate(zip(idx, starts)):
        e = min(pairs.true[i].shape[0], s + length)
        codes[j, : e - s] = (pairs.generated[i] if bool(generated[j]) else pairs.true[i])[s:e]
        target[j, : e - s] = pairs.features[i][s:e]
        valid[j, : e - s] = True
    return codes, target, valid


def _batch(pairs: DecoderPairs, idx: Sequence[int], chunk: int, gen: torch.Generator, *,
           use_generated: torch.Tensor, dropout_p: float, n_codebooks: int):
    """Random ``chunk``-frame windows of utterances ``idx``: (codes (B, C, G), present (B, G), target (B, C, dim),
    valid (B, C))."""
    b = len(idx)
    starts = [int(torch.randint(0, max(1, pairs.true[i].shape[0] - chunk + 1), (1,), generator=gen)) for i in idx]
    codes, target, valid = _padded(pairs, idx, starts, chunk, use_generated)
    present = torch.ones(b, n_codebooks, dtype=torch.bool)
    drop = torch.rand(b, generator=gen) < dropout_p
    k = torch.randint(1, n_codebooks + 1, (b,), generator=gen)
    present &= ~(drop[:, None] & (torch.arange(n_codebooks)[None] >= k[:, None]))
    return codes, present, target, valid


@torch.no_grad()
def decoder_loss(dec: CodeDecoder, pairs: DecoderPairs, *, source: str = "true", batch: int = 16) -> float:
    """Mean L1 (natural-log mel power) of the decoded to the unquantised features over every frame, from the
    ``source`` codes ("true", "generated", or "table": the true codes' summed centroids)."""
    tot, n = 0.0, 0
    with eval_mode(dec):
        for s in range(0, len(pairs), batch):
            idx = list(range(s, min(len(pairs), s + batch)))
            codes, tgt, valid = _padded(pairs, idx, [0] * len(idx), max(pairs.true[i].shape[0] for i in idx),
                                        [source == "generated"] * len(idx))
            if source == "table":
                y = dec.codebooks[torch.arange(codes.shape[2])[None, None], codes].sum(2)
            else:
                y = dec(codes)
            tot += float((y - tgt).abs().mean(-1)[valid].sum())
            n += int(valid.sum())
    return tot / max(1, n)


def train_code_decoder(codebooks: torch.Tensor, train: DecoderPairs, val: DecoderPairs, *,
                       config: CodeDecoderConfig | None = None, minutes: float | None = 20.0,
                       steps: int | None = None, batch: int = 32, chunk: int = 64, lr: float = LR,
                       generated_p: float = 0.5, dropout_p: float = 0.3, eval_every: int = 200, seed: int = 0,
                       progress: bool = True) -> tuple[CodeDecoder, dict]:
    """Train a :class:`CodeDecoder` (AdamW, warmup + cosine) for ``steps`` or ``minutes``, whichever comes first,
    keeping the lowest validation ``val_l1`` (mean of the true- and generated-code :func:`decoder_loss`; step 0, the
    table decoder, a candidate); weights and batches seeded by ``seed``. Returns ``(decoder, {"meta", "curve"})``.
    Raises ValueError: no budget, or empty pairs."""
    if minutes is None and steps is None:
        raise ValueError("give steps= or minutes= (a training budget)")
    budget = Budget(steps=steps, minutes=minutes)
    if not len(train) or not len(val):
        raise ValueError("no training or validation pairs")
    gen = torch.Generator().manual_seed(seed)
    dec = seeded(seed, lambda: CodeDecoder(codebooks, config))
    opt = torch.optim.AdamW(dec.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)  # torch's default betas
    g = codebooks.shape[0]
    table_val = decoder_loss(dec, val, source="table")

    def random_chunks(epoch: int):
        """Endless random chunks of random utterances (with replacement), true or generated codes."""
        while True:
            idx = torch.randint(0, len(train), (batch,), generator=gen).tolist()
            use_gen = torch.rand(batch, generator=gen) < generated_p
            yield _batch(train, idx, chunk, gen, use_generated=use_gen, dropout_p=dropout_p, n_codebooks=g)

    def step(b):
        codes, present, tgt, valid = b
        y = dec(codes, present)
        loss = (y - tgt).abs().mean(-1)[valid].mean()
        return loss, {"l1": loss.item()}

    def evaluation():
        vt, vg = decoder_loss(dec, val, source="true"), decoder_loss(dec, val, source="generated")
        return {"val_true_l1": vt, "val_generated_l1": vg, "val_l1": 0.5 * (vt + vg), "val_table_l1": table_val}

    res = fit(step, random_chunks, optimizer=opt, budget=budget, schedule=WarmupCosine(lr),
              clip_parameters=list(dec.parameters()), grad_clip=GRAD_CLIP, evaluate=evaluation,
              eval_every=eval_every, eval_at_start=True, metric="val_l1", select="min", keep_best=dec.state_dict(),
              running=("l1",), running_prefix="train_", progress=progress, desc="code decoder")
    dec.eval()
    meta = {"steps": res.steps, "best_step": res.best_step, "wall_s": round(res.wall_s, 2),
            "stopped_by": res.stopped_by, "minutes_budget": minutes, "steps_budget": steps, "batch": batch,
            "chunk": chunk, "lr": lr,
            "warmup_steps": WARMUP_STEPS, "generated_p": generated_p, "dropout_p": dropout_p, "seed": seed,
            "params": dec.n_parameters(), "train_utterances": len(train),
            "train_frames": int(sum(t.shape[0] for t in train.true)), "val_utterances": len(val)}
    return dec, {"meta": meta, "curve": res.curve}
