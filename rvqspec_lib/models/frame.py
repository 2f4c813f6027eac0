"""The frame loop, equal to the official ``generate`` (greedy, and sampled with the same seed for AR through a
bit-identical backend): talker (code 0) -> inner loop (codes 1..15, any frame runner of the registry) -> sum of the
16 embeddings -> next talker step. :func:`frames` yields the frames one at a time, :func:`synthesize` collects them.

Departures from the official loop: the prompt is built by the official ``generate`` itself, intercepted at the
talker; frame t's codes 1..15 are computed right after code 0, not inside talker step t+1
(docs/model.md#frame-offset-quirk), which draws random numbers in the same order.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers.cache_utils import DynamicCache

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling, code0_processors, or_fresh_generator, sample
from rvqspec_lib.models.backends import frame_runner, runner_fields
from rvqspec_lib.models.loader import LoadedModel


class _PromptCaptured(Exception):
    pass


@dataclass
class Prompt:
    """The talker's inputs as the official ``generate`` builds them: ``inputs_embeds`` ``(B, L, talker_hidden)``
    left-padded, ``attention_mask`` ``(B, L)`` int64, ``trailing_text_hidden`` ``(B, T, talker_hidden)`` (the text
    track fed one step at a time), ``tts_pad_embed`` ``(1, 1, talker_hidden)`` (its filler once the text is used up).
    """

    inputs_embeds: torch.Tensor
    attention_mask: torch.Tensor
    trailing_text_hidden: torch.Tensor
    tts_pad_embed: torch.Tensor


def default_speaker(lm: LoadedModel) -> str | None:
    """First speaker of a CustomVoice checkpoint (``None`` for Base / VoiceDesign models)."""
    spk = dict(lm.model.config.talker_config.spk_id or {})
    return sorted(spk)[0] if spk and lm.model.tts_model_type == "custom_voice" else None


def build_prompt(lm: LoadedModel, texts: list[str], *, language: str = "auto", speaker: str | None = None,
                 grad: bool = False) -> Prompt:
    """Build the talker prompt with the official code (``generate`` with ``talker.generate`` intercepted).

    Args:
        texts: sentences to speak (batch). language: ``"auto"`` or a language the checkpoint lists
            (``english``, ``german``, ...). speaker: a CustomVoice speaker (default: the first one). The whole text
            is in the prompt (the official wrapper's default ``non_streaming_mode``).
        grad: build the embeddings with autograd on, for training (the undecorated official ``generate``).

    Raises:
        ValueError: empty text, unknown language or speaker (with the supported values).
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise ValueError("no text given: pass at least one sentence")
    langs = sorted(lm.model.config.talker_config.codec_language_id or {})
    if language.lower() != "auto" and language.lower() not in langs:
        raise ValueError(f"unsupported language {language!r}: use 'auto' or one of {', '.join(langs)}")
    speaker = default_speaker(lm) if speaker is None else speaker
    spk = dict(lm.model.config.talker_config.spk_id or {})
    if speaker is not None and speaker.lower() not in spk:
        raise ValueError(f"unknown speaker {speaker!r}: this model's speakers are {', '.join(sorted(spk)) or '(none)'}")
    dev = next(lm.model.parameters()).device
    ids = [lm.tokenizer(t).to(dev) for t in texts]

    def _capture(**kwargs):
        raise _PromptCaptured(kwargs)

    talker = lm.model.talker
    talker.generate = _capture  # instance attribute shadows the method for this call only
    generate = lm.model.generate
    if grad:
        generate = functools.partial(type(lm.model).generate.__wrapped__, lm.model)
    try:
        with torch.enable_grad() if grad else torch.inference_mode():
            generate(input_ids=ids, languages=[language] * len(ids), speakers=[speaker] * len(ids),
                     non_streaming_mode=True)
    except _PromptCaptured as c:
        kw = c.args[0]
    else:  # pragma: no cover - the official generate always calls talker.generate
        raise RuntimeError("the official generate did not reach the talker")
    finally:
        del talker.generate
    return Prompt(kw["inputs_embeds"], kw["attention_mask"], kw["trailing_text_hidden"], kw["tts_pad_embed"])


class OfficialTalker:
    """The official talker's steps over a ``DynamicCache`` (what ``generate`` runs): :meth:`start` on the prompt, then
    one :meth:`step` per frame. Another talker (e.g. a native one) plugs into :func:`frames` with the same two methods.
    """

    def __init__(self, lm: LoadedModel):
        self.talker = lm.model.talker

    def start(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt ``embeds (B, L, H)`` with ``attention_mask (B, L)`` (0 on left padding); returns the hidden state
        of the last position ``(B, 1, H)`` and the code-0 logits ``(B, vocab)``."""
        self.cache, self.mask = DynamicCache(), attention_mask
        out = self.talker(inputs_embeds=embeds, attention_mask=attention_mask, past_key_values=self.cache,
                          use_cache=True, cache_position=torch.arange(attention_mask.shape[1], device=embeds.device))
        return out.past_hidden, out.logits[:, -1]

    def step(self, feed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One position ``feed (B, 1, H)`` (the frame's summed code embeddings plus the text track); returns as
        :meth:`start`."""
        b, dev = feed.shape[0], feed.device
        cache_pos = torch.tensor([self.mask.shape[1]], device=dev)
        self.mask = torch.cat([self.mask, torch.ones(b, 1, dtype=self.mask.dtype, device=dev)], 1)
        # the official multimodal rope: the same position on the three axes, shifted by the prompt's rope deltas
        pos = ((cache_pos[0] + self.talker.rope_deltas).view(b, 1) + torch.zeros(1, dtype=torch.long, device=dev))
        pos = pos.unsqueeze(0).expand(3, -1, -1)  # (3, B, 1)
        hs = self.talker.model(inputs_embeds=feed, attention_mask=self.mask, position_ids=pos,
                               past_key_values=self.cache, use_cache=True, cache_position=cache_pos).last_hidden_state
        return hs[:, -1:], self.talker.codec_head(hs[:, -1])


class NativeTalkerSteps:
    """:class:`OfficialTalker`'s two calls over a :class:`~rvqspec_lib.device.native_talker.NativeTalker` (the talker
    step in C): ``start`` sizes its KV cache to the prompt plus ``max_frames`` positions and prefills it, ``step``
    appends one position. :func:`frames` wraps a ``NativeTalker`` given as ``talker=`` in this."""

    def __init__(self, native, max_frames: int):
        self.native, self.max_frames = native, int(max_frames)

    def start(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`OfficialTalker.start`."""
        b, length = attention_mask.shape
        self.native.reset(b, max_context=max(int(self.native.max_context), length + self.max_frames))
        hs = self.native.prefill(embeds, attention_mask=attention_mask)  # (B, L, H)
        return hs[:, -1:], self.native.logits(hs[:, -1])

    def step(self, feed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`OfficialTalker.step`."""
        hs = self.native.step(feed)  # (B, 1, H)
        return hs, self.native.logits(hs[:, -1])


@dataclass
class Frame:
    """One frame of a batch, as :func:`frames` yields it.

    Attributes:
        index: the frame's number t (0-based). codes: ``(B, n_code_groups)`` int64, code 0 then codes 1..15 (a row
            no longer speaking: end-of-speech then codes decoded after it, as the official batch does).
        active: ``(B,)`` bool, the rows still speaking (once False, for good). calls: ``(B,)`` int64 inner-loop
            calls (the prefill included). talker_s, inner_s: seconds of the talker call that gave code 0 (frame 0:
            the prompt and its prefill too) and of the inner loop.
        prompt_s: frame 0 only (0.0 after): seconds from the :func:`frames` call to the end of the talker's prefill.
    """

    index: int
    codes: torch.Tensor
    active: torch.Tensor
    calls: torch.Tensor
    talker_s: float
    inner_s: float
    prompt_s: float = 0.0


def inner_sampling(lm: LoadedModel, greedy: bool = False) -> Sampling:
    """The code predictor's sampling in the checkpoint's generation config (``subtalker_*``; ``greedy``: argmax)."""
    return Sampling.from_generation_config(lm.generation or {}, loop="code_predictor", greedy=greedy)


def frames(lm: LoadedModel, texts: list[str] | str, *, runner=None, talker_sampling: Sampling | None = None,
           repetition_penalty: float | None = None, generator: torch.Generator | None = None,
           max_frames: int = 200, language: str = "auto", speaker: str | None = None,
           talker=None) -> Iterator[Frame]:
    """The frames of a batch of utterances, one :class:`Frame` at a time, until every row has ended (end-of-speech,
    not yielded) or ``max_frames`` were yielded; the prompt is built (the arguments checked) when this is called.

    Args:
        lm: from :func:`rvqspec_lib.models.loader.load_model`. texts: one sentence or a batch.
        runner: the inner loop, a :class:`~rvqspec_lib.models.backends.FrameRunner`; default AR stepped through the
            official module with the checkpoint's sampling (:func:`inner_sampling`).
        talker_sampling, repetition_penalty: code 0's (default: the checkpoint's).
        generator: explicit RNG of the talker and the inner loop (default: unseeded, never the global one).
        max_frames: frame cap (12.5 frames a second). Greedy decoding may never emit end-of-speech.
        language, speaker: see :func:`build_prompt`. talker: the talker's steps (default :class:`OfficialTalker`;
            a :class:`~rvqspec_lib.device.native_talker.NativeTalker` runs them in C).

    Raises:
        ValueError: empty text, ``max_frames < 1``, unknown language or speaker.
    """
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1 (frames of 80 ms), got {max_frames}")
    t0 = time.perf_counter()
    prompt = build_prompt(lm, [texts] if isinstance(texts, str) else list(texts), language=language, speaker=speaker)
    gen_cfg = lm.generation or {}
    rp = float(gen_cfg.get("repetition_penalty", 1.05)) if repetition_penalty is None else repetition_penalty
    generator = or_fresh_generator(generator, lm.device)
    return _frame_loop(lm, prompt, runner or frame_runner("official", lm.code_predictor, AR(),
                                                          sampling=inner_sampling(lm)),
                       talker_sampling or Sampling.from_generation_config(gen_cfg, loop="talker"), rp, generator,
                       max_frames, _talker_steps(lm, talker, max_frames), t0)


def _talker_steps(lm, talker, max_frames: int):
    if talker is None:
        return OfficialTalker(lm)
    return NativeTalkerSteps(talker, max_frames) if hasattr(talker, "prefill") else talker


@torch.inference_mode()
def _frame_loop(lm, prompt: Prompt, runner, talker_sampling: Sampling, rp: float, generator: torch.Generator,
                max_frames: int, talker, t0: float) -> Iterator[Frame]:
    tcfg = lm.model.config.talker_config
    eos = int(tcfg.codec_eos_token_id)
    procs = code0_processors(tcfg, repetition_penalty=rp)
    hidden, logits = talker.start(prompt.inputs_embeds, prompt.attention_mask)
    prompt_s = time.perf_counter() - t0
    b, dev = logits.shape[0], logits.device
    history = torch.zeros(b, 0, dtype=torch.long, device=dev)
    active = torch.ones(b, dtype=torch.bool, device=dev)
    embed0, embeds = lm.model.talker.get_input_embeddings(), lm.code_predictor.get_input_embeddings()
    for t in range(max_frames):
        # code 0 (the talker's own warpers and processors)
        scores = procs(history, logits.to(torch.float32))
        code0 = scores.argmax(-1) if talker_sampling.greedy else sample(talker_sampling.probs(scores), generator)
        code0 = torch.where(active, code0, torch.full_like(code0, eos))
        history = torch.cat([history, code0[:, None]], 1)
        active = active & (code0 != eos)
        if not bool(active.any()):
            return
        talker_s = time.perf_counter() - t0
        # inner loop: codes 1..15 for every row (finished rows too, as the official batch does)
        t1 = time.perf_counter()
        code0_emb = embed0(code0[:, None])  # (B, 1, H)
        res = runner(torch.cat([hidden, code0_emb], 1), generator)
        inner = res.codes.to(dev)  # (B, n_codes)
        inner_s = time.perf_counter() - t1
        yield Frame(t, torch.cat([code0[:, None], inner], 1), active.cpu(),
                    torch.where(active.cpu(), res.calls.cpu(), 0), talker_s, inner_s, prompt_s if t == 0 else 0.0)
        if t == max_frames - 1:
            return
        # next talker step: the sum of the 16 code embeddings + the text track
        t0 = time.perf_counter()
        feed = code0_emb[:, 0] + sum(embeds[i](inner[:, i]) for i in range(inner.shape[1]))  # (B, H)
        text = prompt.trailing_text_hidden
        feed = feed[:, None] + (text[:, t:t + 1] if t < text.shape[1] else prompt.tts_pad_embed)
        hidden, logits = talker.step(feed)


@dataclass
class SynthesisResult:
    """Codes and costs of one batch of utterances.

    Attributes:
        codes: per row, ``(frames, n_code_groups)`` int64, end of speech excluded. frames: ``(B,)``. ended: ``(B,)``
            bool, end-of-speech before the cap. code_predictor_calls: ``(B,)``. talker_calls: of the batch.
        wall_s, talker_s, inner_s: seconds in all, in talker steps, in the inner loop.
        per_frame_calls: per row, the inner-loop calls of each frame. runner: the inner loop's
            :func:`~rvqspec_lib.models.backends.runner_fields`.
    """

    codes: list[torch.Tensor]
    frames: torch.Tensor
    ended: torch.Tensor
    code_predictor_calls: torch.Tensor
    talker_calls: int
    wall_s: float
    talker_s: float
    inner_s: float
    per_frame_calls: list[list[int]] = field(default_factory=list)
    runner: dict = field(default_factory=dict)

    @property
    def tokens_per_call(self) -> torch.Tensor:
        """``(B,)`` inner-loop codes per code-predictor call."""
        n = self.codes[0].shape[1] - 1 if self.codes and self.codes[0].numel() else 15
        return (self.frames * n).double() / self.code_predictor_calls.clamp_min(1).double()


def synthesize(lm: LoadedModel, texts: list[str] | str, *, runner=None, sampling: Sampling | None = None,
               progress: bool = False, **kw) -> SynthesisResult:
    """Speak texts: the official talker and code predictor through :func:`frames`, collected per utterance.

    Args:
        lm, texts, runner, kw: as :func:`frames`. sampling: the DEFAULT runner's (a given runner carries its own).
        progress: a progress bar of frames.

    Returns:
        :class:`SynthesisResult`.

    Raises:
        ValueError: as :func:`frames`; ``sampling`` given with a ``runner``.
    """
    if runner is not None and sampling is not None:
        raise ValueError("sampling= is for the default runner: build the runner with it instead "
                         "(frame_runner(..., sampling=sampling))")
    runner = runner or frame_runner("official", lm.code_predictor, AR(), sampling=sampling or inner_sampling(lm))
    max_frames = kw.get("max_frames", 200)
    t0 = time.perf_counter()
    got = list(progress_bar(frames(lm, texts, runner=runner, **kw), total=max_frames, enabled=progress,
                            desc=f"frames ({runner.name.label})", unit="frame"))
    b = len([texts] if isinstance(texts, str) else texts)
    active = torch.stack([f.active for f in got], 1) if got else torch.zeros(b, 0, dtype=torch.bool)  # (B, frames)
    codes = torch.stack([f.codes.cpu() for f in got], 1) if got else \
        torch.zeros(b, 0, lm.n_code_groups, dtype=torch.long)  # (B, frames, G)
    calls = torch.stack([f.calls for f in got], 1) if got else torch.zeros(b, 0, dtype=torch.long)  # (B, frames)
    n = active.sum(1)
    # a row ended if it went quiet within the frames, or if the loop stopped before the cap (every row ended then)
    ended = ~active[:, -1] if len(got) == max_frames else torch.ones(b, dtype=torch.bool)
    return SynthesisResult(
        [codes[i, : int(n[i])] for i in range(b)], n, ended, calls.sum(1), len(got) + (len(got) < max_frames),
        time.perf_counter() - t0, sum(f.talker_s for f in got), sum(f.inner_s for f in got),
        [calls[i, : int(n[i])].tolist() for i in range(b)], runner_fields(runner))
