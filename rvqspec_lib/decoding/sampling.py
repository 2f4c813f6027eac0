"""Sampling identical to transformers' ``generate``: its own warper classes, built under its conditions, applied to
float32 logits; the SAME warpers for p and q (docs/model.md#warper-order). Randomness from an explicit generator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True)
class Sampling:
    """Sampling knobs of one loop (code predictor, or the talker's code 0), defaults the released
    ``generation_config.json`` (docs/model.md#sampling-defaults): top_k 0 and top_p 1.0 disable; ``greedy``: argmax,
    the others ignored. Raises ValueError: a knob out of range (not when ``greedy``)."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self):
        if not self.greedy:
            if not (self.temperature > 0):
                raise ValueError(f"temperature must be > 0, got {self.temperature} (use greedy=True for argmax)")
            if self.top_k < 0:
                raise ValueError(f"top_k must be >= 0, got {self.top_k}")
            if not (0 < self.top_p <= 1):
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def from_generation_config(cls, gen: dict, *, loop: str = "code_predictor", greedy: bool = False) -> "Sampling":
        """Read a checkpoint's generation config. ``loop="code_predictor"`` reads the ``subtalker_*`` keys."""
        pre = "subtalker_" if loop == "code_predictor" else ""
        return cls(
            temperature=float(gen.get(pre + "temperature", 0.9)),
            top_k=int(gen.get(pre + "top_k", 50)),
            top_p=float(gen.get(pre + "top_p", 1.0)),
            greedy=greedy or not bool(gen.get(pre + "dosample" if pre else "do_sample", True)),
        )

    def describe(self) -> dict:
        """JSON-able knobs, as every result file records them."""
        return {"temperature": float(self.temperature), "top_k": int(self.top_k), "top_p": float(self.top_p),
                "greedy": bool(self.greedy)}

    def warpers(self) -> LogitsProcessorList:
        """The transformers warpers ``generate(do_sample=True, ...)`` would build for these knobs."""
        out = LogitsProcessorList()
        if self.greedy:
            return out
        if self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k != 0:
            out.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return out

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``(..., V)`` logits -> float32 ``softmax(warp(logits.float()))`` (one-hot argmax when ``greedy``)."""
        scores = logits.to(torch.float32)
        shape = scores.shape
        if self.greedy:
            return torch.nn.functional.one_hot(scores.argmax(-1), shape[-1]).to(torch.float32)
        flat = scores.reshape(-1, shape[-1]).clone()
        for warper in self._warpers:  # LogitsProcessorList.__call__ without its per-call signature inspection
            flat = warper(None, flat)
        return torch.softmax(flat, dim=-1).reshape(shape)

    @functools.cached_property
    def _warpers(self) -> LogitsProcessorList:
        """:meth:`warpers`, built once (the dataclass is frozen)."""
        return self.warpers()


def or_fresh_generator(generator: torch.Generator | None, device) -> torch.Generator:
    """``generator``, or a fresh OS-seeded one on ``device``, never the global RNG (docs/style.md#randomness)."""
    if generator is None:
        generator = torch.Generator(device=device)
        generator.seed()
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``(B, V)`` probabilities (unnormalised allowed) -> ``(B,)`` int64, as ``GenerationMixin._sample`` draws."""
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def code0_processors(talker_config, *, repetition_penalty: float) -> LogitsProcessorList:
    """The non-warper processors the official talker applies to code 0, in transformers' order: repetition penalty,
    end-of-speech masked for 2 codes, special ids but end-of-speech suppressed (docs/model.md#special-ids)."""
    vocab = int(talker_config.vocab_size)
    eos = int(talker_config.codec_eos_token_id)
    out = LogitsProcessorList()
    if repetition_penalty is not None and repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(penalty=repetition_penalty))
    out.append(MinNewTokensLengthLogitsProcessor(0, 2, torch.tensor([eos])))
    out.append(SuppressTokensLogitsProcessor([i for i in range(vocab - 1024, vocab) if i != eos]))
    return out
