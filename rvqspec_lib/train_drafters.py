"""Training data and training loop for the drafters of :mod:`rvqspec_lib.drafters` (paper §2.2, Table 2).

Data: a "frame" is what the inner loop sees, ``context (2, talker_hidden)`` = [talker hidden state that emitted code
0, talker embedding of code 0], and the frame's ``codes`` 1..15 (:class:`Frames`). Sources:

* :func:`frames_from_model`: the model speaks texts with the frame loop (:func:`rvqspec_lib.frame.synthesize`), so
  the codes are samples of its own distribution p (what the decoder will meet);
* :func:`frames_from_dataset`: a local Hugging Face ``datasets`` dataset of audio + text (VoxPopuli schema, the
  paper's training set) encoded by a codec (``encode(wav) -> (frames, 16)``);
* :func:`frames_from_utterances` / :func:`frames_from_shipped`: given utterances (text + ground-truth codes), e.g.
  the codes and texts that ship with the embedded model (``data/embedded/utterances.safetensors``, splits
  ``training`` / ``validation`` / ``evaluation``);
* :func:`frames_from_contexts`: given contexts, the inner loop samples the codes itself (no talker; tests).

All but the last compute the contexts by ONE teacher-forced talker pass over the prompt and the codes' feedback
(:func:`teacher_forced_contexts`; the same sum of 16 embeddings + text track the frame loop feeds).

Training (paper: "teacher-forced hidden states and subsequent ground-truth codes; the verifier stream never consumes
offset states"): one parallel pass of the frozen code predictor per frame (:func:`teacher_forced_hidden`, the pass of
``forward_finetune``) gives H_1..H_15; the drafter maps H_k to logits for depths k+1..k+K; the loss is either

* ``"ce"``: cross-entropy to the ground-truth codes (the paper's), or
* ``"kl"``: KL(p || q_T) to the verifier's WARPED distribution p = ``Sampling.probs(lm_head[d-1](H_d))`` for depth d
  (temperature 0.9, top-k 50: what the verifier actually samples from), with q_T = softmax(draft logits / T). The
  draft side is tempered but not top-k truncated: a truncated q would make the KL infinite wherever p keeps a code q
  cut, and minimising KL(p || q_T) already drives q's top-k set onto p's.

The exact one-step acceptance E[sum_x min(p, q)] (q warped like p) is tracked on the validation split at every epoch.
Adam, mini-batches, early stopping on the validation loss (the best state is restored), tqdm progress, and the
training curve returned and optionally saved as JSON.
"""

from __future__ import annotations

import copy
import datetime as _dt
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from . import predictor as P
from .sampling import Sampling

LOSSES = ("ce", "kl", "tv")
#: Adam learning rates by drafter: offsets are a few vectors on the scale of a normed hidden state (large steps are
#: safe); Medusa heads start from the LM heads (Medusa-1 trains its heads at 1e-3).
DEFAULT_LR = {"offsets": 1e-2, "medusa": 1e-3}
#: Texts spoken by :func:`frames_from_model` when none are given (short, varied English sentences).
DEFAULT_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "It was the best of times, it was the worst of times.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "A journey of a thousand miles begins with a single step.",
    "She sells seashells by the seashore, and the shells she sells are surely seashells.",
    "The meeting has been moved to Thursday afternoon at three o'clock.",
    "Numbers like 1,234 and dates like March 5th are hard to read aloud.",
)


# --------------------------------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------------------------------
@dataclass
class Frames:
    """Frames for drafter training and acceptance statistics.

    Attributes:
        context: ``(N, 2, talker_hidden)`` float32 = [talker hidden state that emitted code 0, its code-0 embedding].
        codes: ``(N, n_codes)`` int64, codes 1..n_codes of each frame.
        utterance: ``(N,)`` int64 utterance index (a split keeps an utterance's frames on one side).
        targets: ``(N, n_codes)`` int64 cross-entropy targets, ``None`` = ``codes``. Only a negative control changes
            them (targets shuffled while the inputs stay: training must not help).
        source: JSON-able description of where the frames came from.
    """

    context: torch.Tensor
    codes: torch.Tensor
    utterance: torch.Tensor
    targets: torch.Tensor | None = None
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        n = self.context.shape[0]
        if self.context.dim() != 3 or self.context.shape[1] != 2:
            raise ValueError(f"context must be (N, 2, talker_hidden), got {tuple(self.context.shape)}")
        if self.codes.dim() != 2 or self.codes.shape[0] != n or self.utterance.shape != (n,):
            raise ValueError(f"codes (N, n_codes) and utterance (N,) must match context's N={n}: got "
                             f"{tuple(self.codes.shape)}, {tuple(self.utterance.shape)}")
        if self.targets is not None and self.targets.shape != self.codes.shape:
            raise ValueError("targets must have the shape of codes")

    def __len__(self) -> int:
        return int(self.context.shape[0])

    @property
    def n_codes(self) -> int:
        return int(self.codes.shape[1])

    @property
    def ce_targets(self) -> torch.Tensor:
        return self.codes if self.targets is None else self.targets

    def subset(self, idx: torch.Tensor) -> "Frames":
        t = None if self.targets is None else self.targets[idx]
        return Frames(self.context[idx], self.codes[idx], self.utterance[idx], t, dict(self.source))

    def split(self, val_fraction: float = 0.1, seed: int = 0) -> tuple["Frames", "Frames"]:
        """``(train, val)`` by utterance (whole utterances go to validation); by frame if there is one utterance.

        Raises:
            ValueError: ``val_fraction`` outside (0, 1) or fewer than 2 frames.
        """
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if len(self) < 2:
            raise ValueError("need at least 2 frames to split into training and validation")
        g = torch.Generator().manual_seed(seed)
        utts = torch.unique(self.utterance)
        if len(utts) >= 2:
            perm = utts[torch.randperm(len(utts), generator=g)]
            n_val = min(len(utts) - 1, max(1, round(val_fraction * len(utts))))
            is_val = torch.isin(self.utterance, perm[:n_val])
        else:
            perm = torch.randperm(len(self), generator=g)
            is_val = torch.zeros(len(self), dtype=torch.bool)
            is_val[perm[: min(len(self) - 1, max(1, round(val_fraction * len(self))))]] = True
        return self.subset(~is_val), self.subset(is_val)

    @staticmethod
    def cat(parts: Sequence["Frames"]) -> "Frames":
        """Concatenate frame sets (utterance ids are renumbered so that they stay distinct)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no frames to concatenate")
        utt, base = [], 0
        for p in parts:
            u = torch.unique(p.utterance, return_inverse=True)[1]
            utt.append(u + base)
            base += int(u.max()) + 1
        tg = None
        if any(p.targets is not None for p in parts):
            tg = torch.cat([p.ce_targets for p in parts])
        return Frames(torch.cat([p.context for p in parts]), torch.cat([p.codes for p in parts]), torch.cat(utt), tg,
                      {"parts": [p.source for p in parts]})

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (``.safetensors``; ``source`` in the header metadata)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        t = {"context": self.context.contiguous(), "codes": self.codes.contiguous(),
             "utterance": self.utterance.contiguous()}
        if self.targets is not None:
            t["targets"] = self.targets.contiguous()
        save_file(t, str(path), metadata={"rvqspec_frames": json.dumps(self.source, default=str)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Frames":
        """Read a file written by :meth:`save`. Raises FileNotFoundError / ValueError with the path."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no frames file {path}: make one with frames_from_model / frames_from_dataset "
                                    "and Frames.save")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if "rvqspec_frames" not in meta:
            raise ValueError(f"{path} is not an rvqspec frames file")
        t = load_file(str(path))
        return cls(t["context"], t["codes"], t["utterance"], t.get("targets"), json.loads(meta["rvqspec_frames"]))


# --------------------------------------------------------------------------------------------------------------------
# Teacher-forced passes
# --------------------------------------------------------------------------------------------------------------------
def teacher_forced_hidden(code_predictor, context: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Hidden states H_1..H_n of the code predictor over a whole frame in ONE causal pass (``forward_finetune``'s).

    Inputs, as in the inner loop: positions 0, 1 = ``small_to_mtp_projection(context)``, position j+1 =
    ``small_to_mtp_projection(codec_embedding[j-1](code j))`` for j = 1..n-1; the official decoder stack
    (``code_predictor.model``) with its default causal mask. ``lm_head[d-1](H_d)`` is the verifier's logits for
    code d given the frame's codes before d.

    Args:
        context: ``(N, 2, talker_hidden)``. codes: ``(N, n)`` int64 codes 1..n (code n is not fed).

    Returns:
        ``(N, n, hidden)`` in the module's dtype: entry d-1 is H_d, the hidden state that produces code d.
    """
    cp = code_predictor
    n = P.n_codes(cp)
    if codes.shape[-1] != n or codes.shape[0] != context.shape[0]:
        raise ValueError(f"codes must be (N, {n}) for N={context.shape[0]} contexts, got {tuple(codes.shape)}")
    dtype = P.param_dtype(cp)
    x_ctx = cp.small_to_mtp_projection(context.to(dtype))  # (N, 2, H)
    depth = torch.arange(1, n, device=codes.device).expand(codes.shape[0], n - 1)
    x_codes = P.embed_codes(cp, codes[:, : n - 1], depth)  # (N, n-1, H), projected
    out = cp.model(inputs_embeds=torch.cat([x_ctx, x_codes], 1), use_cache=False)
    return out.last_hidden_state[:, 1:]  # (N, n, H): positions 1..n


def verifier_logits(code_predictor, hidden: torch.Tensor) -> torch.Tensor:
    """``(N, n, V)`` verifier logits for codes 1..n, ``lm_head[d-1](H_d)``, from :func:`teacher_forced_hidden`."""
    nb, n, h = hidden.shape
    head = torch.arange(n, device=hidden.device).repeat(nb)
    return P.head_logits(code_predictor, hidden.reshape(nb * n, h), head).reshape(nb, n, -1)


@torch.no_grad()
def teacher_forced_contexts(lm, text: str, codes: torch.Tensor, *, language: str = "auto",
                            speaker: str | None = None) -> torch.Tensor:
    """Inner-loop contexts of every frame of one utterance, from ONE teacher-forced talker pass.

    The talker pass is :func:`rvqspec_lib.train.talker_pass` (the official prompt, then frame t fed as the sum of its
    16 code embeddings plus the text track, exactly as :func:`rvqspec_lib.frame.synthesize` does step by step), so the
    hidden state that emits code 0 of frame t is the talker's last hidden state at prompt position L-1+t.

    Args:
        lm: :class:`rvqspec_lib.models.LoadedModel`. text: the utterance's text.
        codes: ``(T, n_code_groups)`` int64, code 0 first (the codec's layout).

    Returns:
        ``(T, 2, talker_hidden)`` float32 contexts = [talker hidden that emitted code 0, talker embedding of code 0].

    Raises:
        ValueError: codes of the wrong shape or out of the codebook.
    """
    from .train import Utterance, talker_pass

    g = lm.n_code_groups
    codes = torch.as_tensor(codes, dtype=torch.long)
    if codes.dim() != 2 or codes.shape[1] != g or codes.shape[0] < 1:
        raise ValueError(f"codes must be (frames >= 1, {g}), got {tuple(codes.shape)}")
    if int(codes.min()) < 0 or int(codes[:, 1:].max()) >= lm.codebook_size or int(codes[:, 0].max()) >= 2048:
        raise ValueError(f"codes must lie in [0, {lm.codebook_size}) (code 0 in [0, 2048)); got "
                         f"[{int(codes.min())}, {int(codes.max())}]")
    out, length, codes, _, _ = talker_pass(lm, [Utterance(text, codes, speaker, language)])
    t = codes.shape[1]
    past_hidden = out.hidden_states[0][-1][0, length - 1: length - 1 + t]  # (T, Ht): emits code 0 of each frame
    code0_emb = lm.model.talker.get_input_embeddings()(codes[0, :, 0])  # (T, Ht)
    return torch.stack([past_hidden, code0_emb], 1).float().cpu()


# --------------------------------------------------------------------------------------------------------------------
# Frame sources
# --------------------------------------------------------------------------------------------------------------------
def _progress(it, *, total: int, desc: str, enabled: bool):
    if not enabled:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, total=total, desc=desc, leave=False)


def frames_from_model(lm, texts: Iterable[str] | None = None, *, decoder=None, sampling: Sampling | None = None,
                      talker_sampling: Sampling | None = None, seed: int = 0, max_frames: int = 200,
                      language: str = "auto", speaker: str | None = None, batch_size: int = 1,
                      progress: bool = False) -> Frames:
    """Frames of the model's own speech: the frame loop speaks each text, then :func:`teacher_forced_contexts`.

    Args:
        lm: a loaded model. texts: sentences (default :data:`DEFAULT_TEXTS`).
        decoder: inner-loop decoder (default AR; any lossless decoder samples the same distribution).
        sampling, talker_sampling: default the checkpoint's (temperature 0.9, top-k 50).
        seed: one explicit generator for everything. max_frames: cap per utterance.
        batch_size: texts spoken together by :func:`~rvqspec_lib.frame.synthesize`.

    Returns:
        :class:`Frames` (one utterance per text; texts that produced no frame are skipped).
    """
    from .frame import synthesize

    texts = list(DEFAULT_TEXTS if texts is None else texts)
    if not texts:
        raise ValueError("no texts given")
    gen = torch.Generator().manual_seed(seed)
    parts, n_frames = [], []
    batches = [texts[i: i + batch_size] for i in range(0, len(texts), batch_size)]
    for bi, batch in enumerate(_progress(batches, total=len(batches), desc="speaking", enabled=progress)):
        res = synthesize(lm, batch, decoder=decoder, sampling=sampling, talker_sampling=talker_sampling,
                         generator=gen, max_frames=max_frames, language=language, speaker=speaker)
        for i, (text, codes) in enumerate(zip(batch, res.codes)):
            n_frames.append(int(codes.shape[0]))
            if codes.shape[0] == 0:
                continue
            ctx = teacher_forced_contexts(lm, text, codes, language=language, speaker=speaker)
            u = bi * batch_size + i
            parts.append(Frames(ctx, codes[:, 1:].cpu(), torch.full((codes.shape[0],), u, dtype=torch.long)))
    if not parts:
        raise ValueError("the model produced no frame for any text (end of speech at once): check the model")
    out = Frames.cat(parts)
    out.utterance = torch.cat([p.utterance for p in parts])  # keep the text index as utterance id
    out.source = {"kind": "model", "model": lm.name, "random_weights": lm.is_random, "n_texts": len(texts),
                  "frames_per_text": n_frames, "seed": seed, "max_frames": max_frames, "decoder": repr(decoder),
                  "language": language, "speaker": speaker}
    return out


TEXT_COLUMNS = ("raw_text", "text", "normalized_text", "transcription", "sentence")


def _decode_audio(item) -> tuple[np.ndarray, int]:
    """``(samples,)`` float32 mono audio and its rate from a datasets audio cell (decoded dict, or bytes / path)."""
    import soundfile as sf

    if isinstance(item, dict) and item.get("array") is not None:
        wav, sr = np.asarray(item["array"], dtype=np.float32), int(item["sampling_rate"])
    elif isinstance(item, dict) and (item.get("bytes") or item.get("path")):
        src = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
        wav, sr = sf.read(src, dtype="float32", always_2d=False)
    else:
        raise ValueError(f"unreadable audio cell {type(item).__name__}: expected {{'array', 'sampling_rate'}} or "
                         "{'bytes'/'path'}")
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2:  # (samples, channels)
        wav = wav.mean(axis=1)
    return wav, sr


def resample(wav: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Polyphase resampling (``scipy.signal.resample_poly``); the input is returned when the rates agree."""
    if sr_from == sr_to:
        return wav
    from scipy.signal import resample_poly

    g = math.gcd(int(sr_from), int(sr_to))
    return resample_poly(wav, sr_to // g, sr_from // g).astype(np.float32)


def frames_from_dataset(dataset, lm, codec, *, split: str | None = None, text_column: str | None = None,
                        audio_column: str = "audio", language: str = "auto", speaker: str | None = None,
                        max_items: int | None = None, max_frames: int | None = None,
                        progress: bool = False) -> Frames:
    """Frames of real speech: each row's audio encoded by ``codec``, contexts by :func:`teacher_forced_contexts`.

    Args:
        dataset: a ``datasets.Dataset`` / ``DatasetDict``, or a folder written by ``save_to_disk`` (VoxPopuli schema:
            an ``audio`` column and a text column; nothing is downloaded).
        lm: the model whose talker gives the contexts. codec: ``encode(wav) -> (frames, n_code_groups)`` at
            ``codec.sample_rate`` (24 kHz if absent); audio at another rate is resampled first.
        split: which split of a ``DatasetDict`` (default ``train``, else the first).
        text_column: default the first of :data:`TEXT_COLUMNS` present (VoxPopuli: ``raw_text``).
        language, speaker: prompt settings (see :func:`rvqspec_lib.frame.build_prompt`).
        max_items: first rows only. max_frames: stop once this many frames are collected.

    Returns:
        :class:`Frames` (rows with empty text or no frames are skipped and counted in ``source``).

    Raises:
        FileNotFoundError: a path that is not a saved dataset. ValueError: missing columns, codes of the wrong shape.
    """
    import datasets as hf

    if isinstance(dataset, (str, os.PathLike)):
        p = Path(dataset).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"no dataset folder {p}: write one with datasets' save_to_disk (nothing is "
                                    "downloaded here)")
        dataset = hf.load_from_disk(str(p))
    if isinstance(dataset, hf.DatasetDict):
        keys = list(dataset)
        dataset = dataset[split or ("train" if "train" in dataset else keys[0])]
    cols = dataset.column_names
    if audio_column not in cols:
        raise ValueError(f"dataset has no {audio_column!r} column (columns: {', '.join(cols)})")
    if text_column is None:
        text_column = next((c for c in TEXT_COLUMNS if c in cols), None)
        if text_column is None:
            raise ValueError(f"no text column among {TEXT_COLUMNS} (columns: {', '.join(cols)}): pass text_column=")
    elif text_column not in cols:
        raise ValueError(f"dataset has no {text_column!r} column (columns: {', '.join(cols)})")
    feat = dataset.features.get(audio_column)
    if isinstance(feat, hf.Audio) and feat.decode:  # decode with soundfile ourselves (no torchcodec needed)
        dataset = dataset.cast_column(audio_column, hf.Audio(decode=False))
    rows = len(dataset) if max_items is None else min(max_items, len(dataset))
    sr_codec = int(getattr(codec, "sample_rate", 24000))
    parts, skipped, have = [], 0, 0
    for i in _progress(range(rows), total=rows, desc="encoding", enabled=progress):
        if max_frames is not None and have >= max_frames:
            break
        row = dataset[i]
        text = row[text_column] or ""
        if not text.strip() and text_column == "raw_text" and "normalized_text" in cols:
            text = row["normalized_text"] or ""
        if not text.strip():
            skipped += 1
            continue
        wav, sr = _decode_audio(row[audio_column])
        codes = torch.as_tensor(np.asarray(codec.encode(resample(wav, sr, sr_codec))), dtype=torch.long)
        if codes.dim() != 2 or codes.shape[1] != lm.n_code_groups:
            raise ValueError(f"codec returned codes of shape {tuple(codes.shape)}, expected (frames, "
                             f"{lm.n_code_groups})")
        if codes.shape[0] == 0:
            skipped += 1
            continue
        ctx = teacher_forced_contexts(lm, text, codes, language=language, speaker=speaker)
        parts.append(Frames(ctx, codes[:, 1:], torch.full((codes.shape[0],), i, dtype=torch.long)))
        have += codes.shape[0]
    if not parts:
        raise ValueError("no usable row (every row had empty text or no audio frames)")
    out = Frames.cat(parts)
    out.utterance = torch.cat([p.utterance for p in parts])  # row index as utterance id
    out.source = {"kind": "dataset", "model": lm.name, "rows": rows, "skipped": skipped, "text_column": text_column,
                  "codec": type(codec).__name__, "codec_sample_rate": sr_codec, "language": language}
    return out


@torch.no_grad()
def frames_from_utterances(lm, utterances: Sequence, *, max_frames: int | None = None, batch_size: int = 8,
                           progress: bool = False, source: dict | None = None) -> Frames:
    """Teacher-forced frames of given utterances (text + ground-truth codes), e.g. the embedded model's shipped ones.

    For every utterance, ONE teacher-forced talker pass (:func:`rvqspec_lib.train.talker_pass`, the exact inference
    layout: prompt, then each true frame fed back as the sum of its 16 code embeddings plus the text track) gives the
    inner-loop context of each frame, ``[talker hidden state that emitted code 0, talker embedding of the TRUE code
    0]`` (what :func:`teacher_forced_contexts` computes for one utterance); the targets are the true codes 1..G-1.
    Utterances are batched by (speaker, language) and similar length (left-padded prompts, as the official batch
    ``generate``); the result keeps the input order.

    Args:
        lm: :class:`rvqspec_lib.models.LoadedModel` whose talker gives the contexts.
        utterances: :class:`rvqspec_lib.train.Utterance` objects (or anything :func:`rvqspec_lib.train.as_utterance`
            takes), codes ``(frames, n_code_groups)`` int, code 0 first; e.g. the second element of
            :func:`rvqspec_lib.embedded.load_shipped_utterances`.
        max_frames: stop once this many frames are collected: utterances are taken in input order and the last one
            is cut (a causal talker pass over its first frames gives the same contexts); ``None``: all.
        batch_size: utterances per talker pass.
        progress: show a tqdm bar (utterances).
        source: extra JSON-able description merged into ``Frames.source``.

    Returns:
        :class:`Frames`: ``context`` ``(N, 2, talker_hidden)`` float32, ``codes`` ``(N, n_code_groups - 1)`` int64,
        ``utterance`` ``(N,)`` int64 = index of the utterance in ``utterances``.

    Raises:
        ValueError: no utterances, ``max_frames < 1`` or ``batch_size < 1``, codes of the wrong shape or out of the
            codebook (the message names the utterance).
    """
    from .train import Utterance, as_utterance, talker_pass

    utts = [as_utterance(u) for u in utterances]
    if not utts:
        raise ValueError("no utterances given")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be >= 1 (or None), got {max_frames}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    g = lm.n_code_groups
    for i, u in enumerate(utts):
        c = u.codes
        if c.shape[1] != g:
            raise ValueError(f"utterance {i} ({u.text!r}): codes must be (frames, {g}), got {tuple(c.shape)}")
        if int(c.min()) < 0 or int(c[:, 1:].max()) >= lm.codebook_size or int(c[:, 0].max()) >= 2048:
            raise ValueError(f"utterance {i} ({u.text!r}): codes must lie in [0, {lm.codebook_size}) (code 0 in "
                             f"[0, 2048)), got [{int(c.min())}, {int(c.max())}]: codes of another codec?")
    chosen: list[tuple[int, Utterance]] = []  # (input index, utterance, the last one possibly cut)
    have = 0
    for i, u in enumerate(utts):
        if max_frames is not None and have >= max_frames:
            break
        t = u.codes.shape[0] if max_frames is None else min(u.codes.shape[0], max_frames - have)
        chosen.append((i, u if t == u.codes.shape[0] else Utterance(u.text, u.codes[:t], u.speaker, u.language)))
        have += t
    order = sorted(range(len(chosen)), key=lambda a: (str(chosen[a][1].speaker), chosen[a][1].language,
                                                      chosen[a][1].codes.shape[0]))
    batches = [order[s: s + batch_size] for s in range(0, len(order), batch_size)]
    got: dict[int, torch.Tensor] = {}
    was = lm.model.training
    lm.model.eval()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(chosen), desc="teacher-forced contexts", unit="utt", leave=False)
    try:
        for b in batches:
            out, length, codes, _, frames = talker_pass(lm, [chosen[a][1] for a in b])
            hidden = out.hidden_states[0][-1]  # (B, L + F, Ht), last layer after the final norm
            emb = lm.model.talker.get_input_embeddings()(codes[..., 0])  # (B, F, Ht)
            for r, a in enumerate(b):
                t = int(frames[r])
                got[a] = torch.stack([hidden[r, length - 1: length - 1 + t], emb[r, :t]], 1).float().cpu()
            if bar is not None:
                bar.update(len(b))
    finally:
        lm.model.train(was)
        if bar is not None:
            bar.close()
    parts = [Frames(got[a], chosen[a][1].codes[:, 1:].clone(),
                    torch.full((chosen[a][1].codes.shape[0],), chosen[a][0], dtype=torch.long))
             for a in range(len(chosen))]
    out_frames = Frames.cat(parts)
    out_frames.utterance = torch.cat([p.utterance for p in parts])  # the input index as utterance id
    out_frames.source = {"kind": "utterances", "model": getattr(lm, "name", None), "n_utterances": len(chosen),
                         "n_given": len(utts), "max_frames": max_frames, "cut_last": bool(
                             max_frames is not None and chosen and
                             chosen[-1][1].codes.shape[0] < utts[chosen[-1][0]].codes.shape[0]),
                         **(source or {})}
    return out_frames


def frames_from_shipped(lm, model: str | os.PathLike, split: str, *, max_frames: int | None = None,
                        seed: int | None = 0, batch_size: int = 8, progress: bool = False) -> Frames:
    """Teacher-forced frames of one split of the utterances that ship beside a model (the embedded model's
    ``utterances.safetensors``): :func:`rvqspec_lib.embedded.load_shipped_utterances` then
    :func:`frames_from_utterances`.

    Args:
        lm: the loaded model. model: its name or folder (``"embedded"``, ``build/embedded-smoke/model``), as
            :func:`rvqspec_lib.embedded.embedded_root` takes it.
        split: ``"training"``, ``"validation"`` or ``"evaluation"``.
        max_frames: frame limit (see :func:`frames_from_utterances`); ``None``: every frame of the split.
        seed: the utterances are taken in a seeded random order (so that a frame limit samples the whole split, not
            its first sentences); ``None``: file order.
        batch_size, progress: as :func:`frames_from_utterances`.

    Returns:
        :class:`Frames`; ``utterance`` is the utterance's index in the split (file order); ``source`` names the file,
        the split and the seed.

    Raises:
        FileNotFoundError: the model ships no utterances. ValueError: a split it does not have, bad codes.
    """
    from .embedded import embedded_root, load_shipped_utterances

    root = embedded_root(model)
    path = root / "utterances.safetensors"
    rows, utts = load_shipped_utterances(path, splits=[split])
    if not utts:
        raise ValueError(f"{path} has no usable {split!r} utterance")
    order = torch.arange(len(utts)) if seed is None else \
        torch.randperm(len(utts), generator=torch.Generator().manual_seed(seed))
    fr = frames_from_utterances(lm, [utts[int(i)] for i in order], max_frames=max_frames, batch_size=batch_size,
                                progress=progress, source={"kind": "shipped", "file": str(path), "split": split,
                                                           "seed": seed, "n_split_utterances": len(utts)})
    fr.utterance = order[fr.utterance]  # back to the index in the split
    return fr


# --------------------------------------------------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------------------------------------------------
def draft_batch(drafter, code_predictor, hidden: torch.Tensor, K: int):
    """Draft logits from every start depth of every frame.

    Args:
        hidden: ``(N, n, H)`` from :func:`teacher_forced_hidden`. K: offsets drafted.

    Returns:
        ``(logits (N, n-1, K, V) float32, depth (N, n-1, K) int64 = k + j, valid (N, n-1, K) bool = k + j <= n)``;
        start depths k = 1..n-1 (H_n has nothing left to draft).
    """
    nb, n, h = hidden.shape
    k = torch.arange(1, n, device=hidden.device)
    logits = drafter.draft_logits(code_predictor, hidden[:, : n - 1].reshape(nb * (n - 1), h), k.repeat(nb), K)
    d = (k[:, None] + torch.arange(1, K + 1, device=hidden.device)[None, :]).expand(nb, n - 1, K)
    return logits.reshape(nb, n - 1, K, -1).float(), d, d <= n


def drafter_loss(drafter, code_predictor, hidden: torch.Tensor, targets: torch.Tensor, *, loss: str = "ce",
                 sampling: Sampling | None = None, p_all: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Loss of a drafter on teacher-forced hidden states, and the exact one-step acceptance of its drafts.

    Args:
        hidden: ``(N, n, H)`` H_1..H_n. targets: ``(N, n)`` codes 1..n (the ``"ce"`` targets).
        loss: ``"ce"`` (ground-truth codes, the paper), ``"kl"`` (KL(p || softmax(logits / T)) to the warped
            verifier p) or ``"tv"`` (the total-variation distance between p and q warped as deployed, i.e. one minus
            the exact acceptance rate sum_x min(p(x), q(x)) that the chain rule pays out; DistillSpec's observation
            that TVD is what acceptance depends on).
        sampling: the deployed warpers (default temperature 0.9, top-k 50).
        p_all: ``(N, n, V)`` warped verifier probabilities (computed from ``hidden`` when ``None``).

    Returns:
        ``(loss, stats)``; loss is the mean over valid (frame, k, j); stats has ``acceptance_by_offset``
        (``(K,)`` mean over valid k of sum_x min(p, q), q warped as p, no gradient).
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}: choose one of {LOSSES}")
    sampling = Sampling() if sampling is None else sampling
    K = drafter.K
    logits, d, valid = draft_batch(drafter, code_predictor, hidden, K)
    nb, n = targets.shape
    f = torch.arange(nb, device=hidden.device)[:, None, None].expand_as(d)
    dd = (d - 1).clamp(max=n - 1)
    if p_all is None:
        with torch.no_grad():
            p_all = sampling.probs(verifier_logits(code_predictor, hidden))  # (N, n, V)
    p = p_all[f, dd]  # (N, n-1, K, V)
    if loss == "ce":
        tgt = targets[f, dd]
        value = torch.nn.functional.cross_entropy(logits[valid], tgt[valid])
    elif loss == "tv":  # 1 - sum_x min(p, q) with q warped as deployed: exactly one minus the acceptance rate
        if sampling.greedy:
            raise ValueError("loss 'tv' needs sampled decoding (a greedy q is a point mass with no gradient)")
        q = sampling.probs(logits[valid])  # temperature and top-k are differentiable in the kept logits
        value = 1.0 - torch.minimum(p[valid], q).sum(-1).mean()
    else:
        temp = 1.0 if sampling.greedy else float(sampling.temperature)
        log_q = torch.log_softmax(logits[valid] / temp, -1)
        pv = p[valid]
        value = (torch.special.xlogy(pv, pv) - pv * log_q).sum(-1).mean()
    with torch.no_grad():
        acc = torch.minimum(p, sampling.probs(logits.detach())).sum(-1)  # (N, n-1, K)
        w = valid.float()
        by_j = (acc * w).sum((0, 1)) / w.sum((0, 1)).clamp_min(1)
    return value, {"acceptance_by_offset": by_j}


# --------------------------------------------------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What :func:`train_drafter` returns.

    Attributes:
        drafter: the drafter with its best state (lowest validation loss) loaded and ``provenance`` filled.
        curve: one dict per epoch (epoch 0 = before training): ``train_loss`` (mean over the epoch's batches,
            ``None`` at epoch 0), ``val_loss``, ``val_acceptance_by_offset`` (exact, per offset j),
            ``val_acceptance`` (their mean), ``steps``, ``wall_s``.
        best_epoch: epoch whose state was kept. stopped_early: patience ran out before ``max_epochs``.
    """

    drafter: object
    curve: list[dict]
    best_epoch: int
    stopped_early: bool

    def to_json(self) -> dict:
        return {"drafter": self.drafter.describe(), "best_epoch": self.best_epoch, "stopped_early": self.stopped_early,
                "curve": self.curve, "provenance": self.drafter.provenance}


class _HiddenSource:
    """Teacher-forced hidden states of a frame set: computed once if they fit in ``cache_mb``, else per batch."""

    def __init__(self, cp, frames: Frames, chunk: int, cache_mb: float):
        self.cp, self.frames, self.chunk = cp, frames, chunk
        dev = next(cp.parameters()).device
        self.dev = dev
        size = len(frames) * frames.n_codes * int(cp.config.hidden_size) * P.param_dtype(cp).itemsize
        self.cache = None
        if size <= cache_mb * 2 ** 20:
            with torch.no_grad():
                self.cache = torch.cat([self._compute(torch.arange(i, min(i + chunk, len(frames))))
                                        for i in range(0, len(frames), chunk)])

    def _compute(self, idx):
        fr = self.frames
        return teacher_forced_hidden(self.cp, fr.context[idx].to(self.dev), fr.codes[idx].to(self.dev))

    @torch.no_grad()
    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.cache[idx] if self.cache is not None else self._compute(idx)


@torch.no_grad()
def _evaluate(drafter, cp, src: _HiddenSource, *, loss, sampling, batch_size) -> tuple[float, list[float]]:
    tot, acc, count = 0.0, None, 0
    frames = src.frames
    for i in range(0, len(frames), batch_size):
        idx = torch.arange(i, min(i + batch_size, len(frames)))
        value, st = drafter_loss(drafter, cp, src(idx), frames.ce_targets[idx].to(src.dev), loss=loss,
                                 sampling=sampling)
        tot += float(value.detach()) * len(idx)
        a = st["acceptance_by_offset"].double() * len(idx)
        acc = a if acc is None else acc + a
        count += len(idx)
    return tot / count, (acc / count).tolist()


def train_drafter(drafter, code_predictor, train: Frames, val: Frames | None = None, *, loss: str = "ce",
                  sampling: Sampling | None = None, lr: float | None = None, batch_size: int = 64,
                  max_epochs: int = 20, patience: int = 3, min_delta: float = 1e-4, val_fraction: float = 0.1,
                  seed: int = 0, cache_mb: float = 1024, progress: bool = False,
                  curve_path: str | os.PathLike | None = None, select: str = "acceptance") -> TrainResult:
    """Train a drafter's own parameters with Adam; the code predictor stays frozen and unchanged.

    Args:
        drafter: :class:`~rvqspec_lib.drafters.PositionOffsets` or :class:`~rvqspec_lib.drafters.MedusaHeads`
            (e.g. from ``make_drafter(name, cp, fresh=True)``); trained in place.
        train, val: frames; ``val`` defaults to ``val_fraction`` of ``train``'s utterances.
        loss: ``"ce"`` (paper) or ``"kl"`` (to the warped verifier distribution, see the module docstring).
        sampling: the deployed warpers (temperature 0.9, top-k 50) for the KL target and the acceptance.
        lr: Adam learning rate (default :data:`DEFAULT_LR` for the drafter).
        batch_size: frames per step (each frame gives (n-1) start depths x K offsets).
        max_epochs, patience, min_delta: early stopping on the validation split: the epoch kept is the best by
            ``select``, and training stops after ``patience`` epochs without an improvement above ``min_delta``.
        select: ``"acceptance"`` (default: the mean exact acceptance rate over the K offsets under ``sampling``,
            what decoding pays for; a lower loss can come with lower acceptance) or ``"loss"`` (the training loss).
        seed: seeds the batch order (the only randomness). cache_mb: keep hidden states in memory up to this size.
        curve_path: also write :meth:`TrainResult.to_json` here.

    Raises:
        ValueError: a drafter without parameters (heads), an unknown loss, frames of another code predictor.
    """
    from .provenance import git_revision

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}: choose one of {LOSSES}")
    if select not in ("acceptance", "loss"):
        raise ValueError(f"unknown select {select!r}: choose 'acceptance' or 'loss'")
    score = (lambda v_loss, v_acc: -float(np.mean(v_acc))) if select == "acceptance" else \
        (lambda v_loss, v_acc: v_loss)  # lower is better
    params = [p for p in getattr(drafter, "parameters", lambda: [])()]
    if not params:
        raise ValueError(f"{getattr(drafter, 'name', drafter)!r} has nothing to train: use offsets or medusa")
    cp = code_predictor
    n = P.n_codes(cp)
    if train.n_codes != n or (val is not None and val.n_codes != n):
        raise ValueError(f"frames have {train.n_codes} codes a frame, the code predictor {n}")
    sampling = Sampling() if sampling is None else sampling
    if val is None:
        train, val = train.split(val_fraction, seed)
    lr = DEFAULT_LR.get(drafter.name, 1e-3) if lr is None else lr
    frozen = {p: p.requires_grad for p in cp.parameters()}
    was_training = cp.training
    t0 = time.perf_counter()
    try:
        for p in cp.parameters():
            p.requires_grad_(False)
        cp.eval()
        tr_src = _HiddenSource(cp, train, batch_size, cache_mb)
        va_src = _HiddenSource(cp, val, batch_size, cache_mb)
        opt = torch.optim.Adam(params, lr=lr)
        gen = torch.Generator().manual_seed(seed)
        drafter.eval()
        v_loss, v_acc = _evaluate(drafter, cp, va_src, loss=loss, sampling=sampling, batch_size=batch_size)
        curve = [{"epoch": 0, "steps": 0, "train_loss": None, "val_loss": v_loss, "val_acceptance_by_offset": v_acc,
                  "val_acceptance": float(np.mean(v_acc)), "wall_s": time.perf_counter() - t0}]
        best, best_epoch, bad, steps, stopped = score(v_loss, v_acc), 0, 0, 0, False
        best_state = copy.deepcopy(drafter.state_dict())
        bar = _progress(range(1, max_epochs + 1), total=max_epochs, desc=f"training {drafter.name} ({loss})",
                        enabled=progress)
        for epoch in bar:
            drafter.train()
            order = torch.randperm(len(train), generator=gen)
            tot, seen = 0.0, 0
            for i in range(0, len(train), batch_size):
                idx = order[i: i + batch_size]
                value, _ = drafter_loss(drafter, cp, tr_src(idx), train.ce_targets[idx].to(tr_src.dev), loss=loss,
                                        sampling=sampling)
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
                tot += float(value.detach()) * len(idx)
                seen += len(idx)
                steps += 1
            drafter.eval()
            v_loss, v_acc = _evaluate(drafter, cp, va_src, loss=loss, sampling=sampling, batch_size=batch_size)
            curve.append({"epoch": epoch, "steps": steps, "train_loss": tot / seen, "val_loss": v_loss,
                          "val_acceptance_by_offset": v_acc, "val_acceptance": float(np.mean(v_acc)),
                          "wall_s": time.perf_counter() - t0})
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(train=f"{tot / seen:.3f}", val=f"{v_loss:.3f}", acc=f"{np.mean(v_acc):.3f}")
            if score(v_loss, v_acc) < best - min_delta:
                best, best_epoch, bad = score(v_loss, v_acc), epoch, 0
                best_state = copy.deepcopy(drafter.state_dict())
            else:
                bad += 1
                if bad >= patience:
                    stopped = epoch < max_epochs
                    break
        drafter.load_state_dict(best_state)
        drafter.eval()
    finally:
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        cp.train(was_training)
    kept = curve[best_epoch]
    drafter.provenance = {
        "loss": loss, "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                                   "top_p": sampling.top_p, "greedy": sampling.greedy},
        "optimizer": "adam", "lr": lr, "batch_size": batch_size, "max_epochs": max_epochs, "patience": patience,
        "select": select, "epochs_run": curve[-1]["epoch"], "best_epoch": best_epoch, "stopped_early": stopped,
        "seed": seed,
        "val_loss": kept["val_loss"], "val_acceptance_by_offset": kept["val_acceptance_by_offset"],
        "val_acceptance_at_init": curve[0]["val_acceptance_by_offset"],
        "n_train_frames": len(train), "n_val_frames": len(val), "data": train.source,
        "git": git_revision(), "created_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    result = TrainResult(drafter, curve, best_epoch, stopped)
    if curve_path is not None:
        Path(curve_path).parent.mkdir(parents=True, exist_ok=True)
        Path(curve_path).write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return result


@torch.no_grad()
def frames_from_contexts(code_predictor, context: torch.Tensor, *, sampling: Sampling | None = None, seed: int = 0,
                         batch_size: int = 4096, frames_per_utterance: int = 1) -> Frames:
    """Frames whose codes the inner loop samples itself (AR, the deployed warpers) from given contexts.

    A cheap source without the talker: contexts from a dataset pass (self-distillation of the code predictor's p), or
    random contexts for tests. ``frames_per_utterance`` groups consecutive frames into one utterance id for splits.
    """
    from .decode import AR, decode_frame

    gen = torch.Generator(device=context.device).manual_seed(seed)
    codes = torch.cat([decode_frame(code_predictor, context[i: i + batch_size], decoder=AR(), sampling=sampling,
                                    generator=gen).codes for i in range(0, context.shape[0], batch_size)])
    utt = torch.arange(context.shape[0]) // max(1, frames_per_utterance)
    return Frames(context.float().cpu(), codes.cpu(), utt, None,
                  {"kind": "contexts", "n": int(context.shape[0]), "seed": seed,
                   "sampling": repr(sampling or Sampling())})
