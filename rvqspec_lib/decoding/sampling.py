"""Sampling identical to transformers' ``generate``: temperature -> top-k -> top-p -> multinomial.

The warpers are transformers' own classes (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``),
created under exactly the conditions ``GenerationMixin._get_logits_processor`` uses, applied to float32 logits as
``GenerationMixin._sample`` does. Speculative verification applies the SAME warpers to the target (p) and the
draft (q) distributions (docs/methods.md#letters-and-indices; the order of the warpers: docs/model.md#warper-order). All randomness comes from an explicit ``torch.Generator``.
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
    """Sampling knobs of one loop (the code predictor's, or the talker's code 0).

    Defaults are the released checkpoints' ``generation_config.json`` values (temperature 0.9, top-k 50, top-p 1.0).

    Attributes:
        temperature: > 0. Ignored when ``greedy``.
        top_k: keep the k most likely codes (0 disables). Ignored when ``greedy``.
        top_p: nucleus mass in (0, 1] (1.0 disables). Ignored when ``greedy``.
        greedy: argmax decoding (``do_sample=False``); every distribution becomes a point mass.
    """

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
        """JSON-able knobs, the one form every result file records: ``{"temperature": float, "top_k": int,
        "top_p": float, "greedy": bool}`` (the values as given, also when ``greedy`` ignores them)."""
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
        """Warped probabilities.

        Args:
            logits: ``(..., V)`` any float dtype.

        Returns:
            ``(..., V)`` float32: ``softmax(warp(logits.float()))``, or a one-hot of the argmax when ``greedy``.
        """
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
        """:meth:`warpers`, built once (the dataclass is frozen, so they never change)."""
        return self.warpers()


def or_fresh_generator(generator: torch.Generator | None, device) -> torch.Generator:
    """``generator`` itself, or, when ``None``, a fresh generator on ``device`` seeded from the OS (non-deterministic;
    never the global RNG): the rule of every ``generator=`` argument of the library."""
    if generator is None:
        generator = torch.Generator(device=device)
        generator.seed()
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one code per row, as ``GenerationMixin._sample`` does (``torch.multinomial`` on the probabilities).

    Args:
        probs: ``(B, V)`` float, rows need not be normalised (multinomial normalises).
        generator: explicit RNG; never the global one inside this library.

    Returns:
        ``(B,)`` int64.
    """
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def code0_processors(talker_config, *, repetition_penalty: float) -> LogitsProcessorList:
    """The non-warper processors the official talker ``generate`` applies to code 0 (in transformers' order).

    Repetition penalty over the code-0 history (``repetition_penalty`` != 1), end-of-speech masked until 2 codes
    were generated (``min_new_tokens=2``; the history passed as ``input_ids`` holds only generated codes), and the 1024 special ids 2048..3071 suppressed except end-of-speech.

    Args:
        talker_config: ``model.config.talker_config``.
        repetition_penalty: the checkpoint's value (1.05).
    """
    vocab = int(talker_config.vocab_size)
    eos = int(talker_config.codec_eos_token_id)
    out = LogitsProcessorList()
    if repetition_penalty is not None and repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(penalty=repetition_penalty))
    out.append(MinNewTokensLengthLogitsProcessor(0, 2, torch.tensor([eos])))
    out.append(SuppressTokensLogitsProcessor([i for i in range(vocab - 1024, vocab) if i != eos]))
    return out
