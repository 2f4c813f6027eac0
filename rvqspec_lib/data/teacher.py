"""Teacher forcing: the official model over known codes in ONE pass, in the layout of inference
(docs/model.md#teacher-forced-pass, #feedback-to-the-talker), for inner-loop contexts and drafters (the pass that
trains talker and code predictor: recipes/embedded/train.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from rvqspec_lib.models.frame import Prompt, build_prompt, default_speaker
from rvqspec_lib.models.loader import LoadedModel
from rvqspec_lib.decoding import predictor as P


@dataclass
class Utterance:
    """One training pair: ``text`` and its ``(frames, n_code_groups)`` int64 ``codes`` (12.5 Hz, code 0 first);
    ``speaker`` ``None``: the model's default; ``language`` ``"auto"`` or one of the config's."""

    text: str
    codes: torch.Tensor
    speaker: str | None = None
    language: str = "auto"


@contextmanager
def eval_mode(module: torch.nn.Module):
    """``module`` in eval mode for the block; its mode restored after, errors included."""
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)


def as_utterance(item) -> Utterance:
    """Accept an ``Utterance``, ``(text, codes[, speaker[, language]])``, a dict or an object with those fields."""
    if isinstance(item, Utterance):
        u = item
    elif isinstance(item, dict):
        u = Utterance(item["text"], item["codes"], item.get("speaker"), item.get("language", "auto"))
    elif isinstance(item, (tuple, list)):
        u = Utterance(*item)
    else:
        u = Utterance(item.text, item.codes, getattr(item, "speaker", None), getattr(item, "language", "auto"))
    codes = torch.as_tensor(u.codes, dtype=torch.long)
    if codes.dim() != 2 or codes.shape[0] < 1:
        raise ValueError(f"codes must be (frames >= 1, n_code_groups), got shape {tuple(codes.shape)} for {u.text!r}")
    return Utterance(u.text, codes, u.speaker, u.language or "auto")


def frame_embeddings(lm: LoadedModel, codes: torch.Tensor) -> torch.Tensor:
    """The talker's feedback for frames ``(..., G)`` int64: the sum of their code embeddings, ``(..., hidden)``."""
    emb = lm.model.talker.get_input_embeddings()(codes[..., 0])
    tables = lm.code_predictor.get_input_embeddings()
    for j in range(1, codes.shape[-1]):
        emb = emb + tables[j - 1](codes[..., j])
    return emb


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dim 1 on the left to ``length`` (as the official batch ``generate`` pads prompts)."""
    return F.pad(t, (0, 0) * (t.dim() - 2) + (length - t.shape[1], 0))


def batch_prompt(lm: LoadedModel, utts: Sequence[Utterance], *, grad: bool) -> Prompt:
    """The official prompt of a batch: one call per (language, speaker), left-padded as the batch ``generate``."""
    groups: dict[tuple, list[int]] = {}
    for i, u in enumerate(utts):
        groups.setdefault((u.language, u.speaker), []).append(i)
    parts = [(idx, build_prompt(lm, [utts[i].text for i in idx], language=language, speaker=speaker, grad=grad))
             for (language, speaker), idx in groups.items()]
    if len(parts) == 1:
        return parts[0][1]
    length = max(p.inputs_embeds.shape[1] for _, p in parts)
    text_len = max(p.trailing_text_hidden.shape[1] for _, p in parts)
    pad = parts[0][1].tts_pad_embed
    emb, mask, text, order = [], [], [], []
    for idx, p in parts:
        emb.append(_left_pad(p.inputs_embeds, length))
        mask.append(F.pad(p.attention_mask, (length - p.attention_mask.shape[1], 0)))
        t = p.trailing_text_hidden
        text.append(torch.cat([t, pad.expand(t.shape[0], text_len - t.shape[1], -1)], 1))
        order += idx
    inv = torch.argsort(torch.tensor(order))
    return Prompt(torch.cat(emb)[inv], torch.cat(mask)[inv], torch.cat(text)[inv], pad)


def talker_pass(lm: LoadedModel, utts: Sequence[Utterance], *, feedback_noise: float = 0.0,
                generator: torch.Generator | None = None):
    """The official talker over [prompt | frames 0..F-1], teacher-forced (frame t's input: its code embeddings plus
    the text track). Returns ``(out, L, codes (B, F, G), valid (B, F) bool, frames (B,))``, with hidden states in
    ``out``; position ``L-1+t`` emits code 0 of frame t."""
    talker = lm.model.talker
    dev = next(lm.model.parameters()).device
    speaker = default_speaker(lm)
    utts = [Utterance(u.text, u.codes, u.speaker if u.speaker is not None else speaker, u.language) for u in utts]
    prompt = batch_prompt(lm, utts, grad=torch.is_grad_enabled())
    emb, mask = prompt.inputs_embeds, prompt.attention_mask  # (B, L, H), (B, L)
    b, length = mask.shape
    frames = torch.tensor([u.codes.shape[0] for u in utts])
    n_max = int(frames.max())
    g = utts[0].codes.shape[1]
    codes = torch.zeros(b, n_max, g, dtype=torch.long)
    for i, u in enumerate(utts):
        codes[i, : u.codes.shape[0]] = u.codes
    codes = codes.to(dev)
    valid = (torch.arange(n_max)[None] < frames[:, None]).to(dev)  # (B, F)
    fed = codes
    if feedback_noise > 0:
        hit = torch.rand(b, n_max, 1, generator=generator) < feedback_noise
        noise = torch.randint(0, lm.codebook_size, (b, n_max, g), generator=generator)
        fed = torch.where(hit.to(dev), noise.to(dev), codes)
    feed = frame_embeddings(lm, fed)  # (B, F, H): frame t is the input at position L + t
    text = prompt.trailing_text_hidden  # (B, T, H): step t uses text[:, t] while t < T, then tts_pad_embed
    track = torch.cat([text[:, :n_max], prompt.tts_pad_embed.expand(b, max(0, n_max - text.shape[1]), -1)], 1)
    x = torch.cat([emb, feed + track.to(feed.dtype)], 1)  # (B, L + F, H)
    attn = torch.cat([mask, valid.to(mask.dtype)], 1)
    out = talker(inputs_embeds=x, attention_mask=attn, use_cache=False, output_hidden_states=True)
    return out, length, codes, valid, frames


def teacher_forced_hidden(code_predictor, context: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``(N, n, hidden)`` hidden states H_1..H_n (module dtype; entry d-1 produces code d) of the code predictor over
    ``context`` ``(N, 2, talker_hidden)`` and int64 ``codes`` ``(N, n)`` in ONE causal pass, at the inner loop's
    positions (docs/model.md#inner-loop-positions)."""
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


def check_codes(lm: LoadedModel, codes: torch.Tensor, what: str = "codes") -> torch.Tensor:
    """``codes`` as ``(frames >= 1, n_code_groups)`` int64, code 0 first. Raises ValueError naming ``what``: another
    shape, or codes outside ``[0, codebook_size)`` (code 0: ``[0, 2048)``): codes of another codec."""
    g = lm.n_code_groups
    codes = torch.as_tensor(codes, dtype=torch.long)
    if codes.dim() != 2 or codes.shape[1] != g or codes.shape[0] < 1:
        raise ValueError(f"{what} must be (frames >= 1, {g}), got {tuple(codes.shape)}")
    if int(codes.min()) < 0 or int(codes[:, 1:].max()) >= lm.codebook_size or int(codes[:, 0].max()) >= 2048:
        raise ValueError(f"{what} must lie in [0, {lm.codebook_size}) (code 0 in [0, 2048)), got "
                         f"[{int(codes.min())}, {int(codes.max())}]: codes of another codec?")
    return codes


@torch.no_grad()
def contexts_of(lm: LoadedModel, utts: Sequence[Utterance]) -> list[torch.Tensor]:
    """Inner-loop contexts from ONE teacher-forced talker pass: a ``(T_i, 2, talker_hidden)`` float32 CPU tensor per
    utterance = [talker hidden that emitted code 0, talker embedding of code 0]."""
    out, length, codes, _, frames = talker_pass(lm, utts)
    hidden = out.hidden_states[0][-1]  # (B, L + F, Ht), last layer after the final norm
    emb = lm.model.talker.get_input_embeddings()(codes[..., 0])  # (B, F, Ht)
    return [torch.stack([hidden[r, length - 1: length - 1 + int(t)], emb[r, :int(t)]], 1).float().cpu()
            for r, t in enumerate(frames.tolist())]


def teacher_forced_contexts(lm, text: str, codes: torch.Tensor, *, language: str = "auto") -> torch.Tensor:
    """:func:`contexts_of` one utterance's ``codes`` (:func:`check_codes`), the default speaker -> ``(T, 2,
    talker_hidden)`` float32."""
    return contexts_of(lm, [Utterance(text, check_codes(lm, codes), None, language)])[0]
