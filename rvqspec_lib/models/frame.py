"""The frame loop: talker (code 0) -> inner loop (codes 1..15, any decoder) -> sum of the 16 embeddings -> next step.

It reproduces the official ``Qwen3TTSForConditionalGeneration.generate`` exactly (greedy, and sampled with the same
seed for the AR decoder; tests/test_frame.py), while letting the inner loop be AR, Chain or Tree:

* the prompt (text track, codec tags, speaker) is built by the OFFICIAL ``generate`` itself: we call it with the
  talker's ``generate`` intercepted and keep its inputs, so no prompt code is duplicated here;
* the official loop computes frame t's codes 1..15 inside talker step t+1 (docs/model.md#frame-offset-quirk); here they are
  computed right after code 0 is sampled, which consumes random numbers in the same order;
* code 0 is warped exactly as transformers does for the talker: repetition penalty 1.05 over the code-0 history,
  end-of-speech masked for the first 2 codes, special ids 2048..3071 suppressed except end-of-speech, then
  temperature -> top-k -> top-p.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from rvqspec_lib.models.loader import LoadedModel
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling, code0_processors, sample


class _PromptCaptured(Exception):
    pass


@dataclass
class Prompt:
    """The talker's inputs as the official ``generate`` builds them.

    Attributes:
        inputs_embeds: ``(B, L, talker_hidden)`` left-padded prompt embeddings.
        attention_mask: ``(B, L)`` int64, 0 on left padding.
        trailing_text_hidden: ``(B, T, talker_hidden)`` text track fed one step at a time after the prompt.
        tts_pad_embed: ``(1, 1, talker_hidden)`` text-track filler once the text is used up.
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
                 non_streaming_mode: bool = True, grad: bool = False) -> Prompt:
    """Build the talker prompt with the official code (``generate`` with ``talker.generate`` intercepted).

    Args:
        texts: sentences to speak (batch). language: ``"auto"`` or a language the checkpoint lists
            (``english``, ``german``, ...). speaker: a CustomVoice speaker (default: the first one).
        non_streaming_mode: the official wrapper's default (whole text in the prompt).
        grad: build the embeddings with autograd on, for training (rvqspec_lib.train). The official ``generate``
            is decorated with ``@torch.no_grad()``; with ``grad=True`` its undecorated function (``__wrapped__``,
            set by torch's decorator) runs under ``torch.enable_grad()``: the same code, with gradients.

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
                     non_streaming_mode=non_streaming_mode)
    except _PromptCaptured as c:
        kw = c.args[0]
    else:  # pragma: no cover - the official generate always calls talker.generate
        raise RuntimeError("the official generate did not reach the talker")
    finally:
        del talker.generate
    return Prompt(kw["inputs_embeds"], kw["attention_mask"], kw["trailing_text_hidden"], kw["tts_pad_embed"])


@dataclass
class SynthesisResult:
    """Codes and costs of one batch of utterances.

    Attributes:
        codes: per row, ``(frames, n_code_groups)`` int64 (code 0 then codes 1..15), end of speech excluded.
        frames: ``(B,)`` frames per row. ended: ``(B,)`` bool, the row emitted end-of-speech before the cap.
        code_predictor_calls: ``(B,)`` inner-loop calls per row. talker_calls: talker calls (batch).
        wall_s, talker_s, inner_s: wall-clock seconds in all, in talker steps, in the inner loop.
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

    @property
    def tokens_per_call(self) -> torch.Tensor:
        """``(B,)`` inner-loop codes per code-predictor call."""
        n = self.codes[0].shape[1] - 1 if self.codes and self.codes[0].numel() else 15
        return (self.frames * n).double() / self.code_predictor_calls.clamp_min(1).double()


@torch.inference_mode()
def synthesize(
    lm: LoadedModel,
    texts: list[str] | str,
    *,
    decoder=None,
    sampling: Sampling | None = None,
    talker_sampling: Sampling | None = None,
    repetition_penalty: float | None = None,
    generator: torch.Generator | None = None,
    max_frames: int = 200,
    language: str = "auto",
    speaker: str | None = None,
    progress: bool = False,
    drafter=None,
    backend=None,
    frame_decoder=None,
    talker_backend=None,
) -> SynthesisResult:
    """Speak texts: the official talker and code predictor, with our frame loop and any inner-loop decoder.

    Args:
        lm: from :func:`rvqspec_lib.load_model`.
        texts: one sentence or a batch.
        decoder: inner-loop decoder (``AR()``, ``Chain(window)``, ``Tree(paths)``).
        sampling: code-predictor sampling (default: the checkpoint's ``subtalker_*`` values).
        talker_sampling: code-0 sampling (default: the checkpoint's values); ``repetition_penalty`` likewise (1.05).
        generator: explicit RNG for everything (default: unseeded).
        max_frames: frame cap (12.5 frames a second: 200 = 16 s). Greedy decoding may never emit end-of-speech.
        language, speaker: see :func:`build_prompt`.
        drafter: where the drafts come from (default: reused heads).
        backend: what runs the code-predictor calls (default: the official module; e.g.
            ``rvqspec_lib.models.lean.LeanCodePredictor(lm.code_predictor)``), see
            :func:`rvqspec_lib.decoding.decode.decode_frame`.
        frame_decoder: instead of ``decode_frame``, an object that decodes a whole inner-loop frame itself, with
            ``decode(context (B, 2, H), generator) -> codes (B, n_codes)`` and ``last_calls`` (a list of each row's
            calls), e.g. :class:`rvqspec_lib.models.native_frame.NativeChainFrame` (AR or Chain, the whole frame in
            one C call); ``decoder``, ``drafter`` and ``backend`` are then not used for the inner loop.
        talker_backend: what runs the talker steps (default: the official module): an object with
            ``reset(batch, max_context=N)``, ``prefill(embeds (B, L, H), attention_mask (B, L)) -> (B, L, H)``,
            ``step(embed (B, 1, H)) -> (B, 1, H)``, ``logits(hidden (B, H)) -> (B, vocab)`` and ``max_context``, e.g.
            :class:`rvqspec_lib.models.native_talker.NativeTalker` (the talker step in C). Its KV cache is grown to
            the prompt plus ``max_frames`` positions when it holds fewer. The prompt is still built by the official
            ``generate`` and the embeddings looked up in the official tables.

    Returns:
        :class:`SynthesisResult`.

    Raises:
        ValueError: empty text, max_frames < 1, unknown language or speaker.
    """
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    gen_cfg = lm.generation or {}
    sampling = sampling or Sampling.from_generation_config(gen_cfg, loop="code_predictor")
    talker_sampling = talker_sampling or Sampling.from_generation_config(gen_cfg, loop="talker")
    rp = float(gen_cfg.get("repetition_penalty", 1.05)) if repetition_penalty is None else repetition_penalty
    decoder = decoder or AR()
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    t0 = time.perf_counter()
    prompt = build_prompt(lm, [texts] if isinstance(texts, str) else list(texts), language=language, speaker=speaker)
    talker, cp = lm.model.talker, lm.code_predictor
    tcfg = lm.model.config.talker_config
    eos = int(tcfg.codec_eos_token_id)
    procs = code0_processors(tcfg, repetition_penalty=rp)
    emb, mask = prompt.inputs_embeds, prompt.attention_mask
    b, length = mask.shape
    dev = emb.device
    if talker_backend is None:
        cache = DynamicCache()
        out = talker(inputs_embeds=emb, attention_mask=mask, past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(length, device=dev))
        past_hidden, logits = out.past_hidden, out.logits[:, -1]
    else:
        # the prompt and one position per frame after it (the last frame feeds no step)
        talker_backend.reset(b, max_context=max(int(talker_backend.max_context), length + max_frames - 1))
        hs = talker_backend.prefill(emb, attention_mask=mask)  # (B, L, H)
        past_hidden, logits = hs[:, -1:], talker_backend.logits(hs[:, -1])
    history = torch.zeros(b, 0, dtype=torch.long, device=dev)
    unfinished = torch.ones(b, dtype=torch.bool, device=dev)
    frames_codes: list[torch.Tensor] = []
    calls = torch.zeros(b, dtype=torch.long)
    per_frame_calls: list[list[int]] = [[] for _ in range(b)]
    talker_s = time.perf_counter() - t0
    inner_s = 0.0
    talker_calls = 1
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_frames, desc=f"frames ({type(decoder).__name__})", unit="frame", leave=False)
    for step in range(max_frames):
        # code 0 (the talker's own warpers and processors)
        scores = procs(history, logits.to(torch.float32))
        code0 = scores.argmax(-1) if talker_sampling.greedy else sample(talker_sampling.probs(scores), generator)
        code0 = torch.where(unfinished, code0, torch.full_like(code0, eos))
        history = torch.cat([history, code0[:, None]], 1)
        unfinished = unfinished & (code0 != eos)
        if not bool(unfinished.any()):
            break
        # inner loop: codes 1..15 for every row (finished rows too, as the official batch does)
        t1 = time.perf_counter()
        code0_emb = talker.get_input_embeddings()(code0[:, None])  # (B, 1, H)
        ctx = torch.cat([past_hidden, code0_emb], 1)
        if frame_decoder is None:
            res = decode_frame(cp, ctx, decoder=decoder, sampling=sampling, generator=generator, drafter=drafter,
                               backend=backend)
            inner_codes, inner_calls = res.codes, res.calls
        else:
            inner_codes = frame_decoder.decode(ctx, generator).to(dev)
            inner_calls = torch.tensor(frame_decoder.last_calls, dtype=torch.long)
        inner_s += time.perf_counter() - t1
        frame = torch.cat([code0[:, None], inner_codes], 1)  # (B, G)
        frames_codes.append(frame)
        calls += torch.where(unfinished.cpu(), inner_calls.cpu(), torch.zeros_like(calls))
        for i in torch.nonzero(unfinished).flatten().tolist():
            per_frame_calls[i].append(int(inner_calls[i]))
        if bar is not None:
            bar.update(1)
        if step == max_frames - 1:
            break
        # next talker step: sum of the 16 code embeddings + text track
        t2 = time.perf_counter()
        feed = code0_emb[:, 0] + sum(cp.get_input_embeddings()[i](inner_codes[:, i]) for i in range(inner_codes.shape[1]))
        text = prompt.trailing_text_hidden
        feed = feed[:, None] + (text[:, step:step + 1] if step < text.shape[1] else prompt.tts_pad_embed)
        if talker_backend is None:
            mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=dev)], 1)
            cache_pos = torch.tensor([length + step], device=dev)
            pos = (cache_pos[0] + talker.rope_deltas).view(b, 1) + torch.zeros(1, dtype=torch.long, device=dev)
            pos = pos.unsqueeze(0).expand(3, -1, -1)
            hs = talker.model(inputs_embeds=feed, attention_mask=mask, position_ids=pos, past_key_values=cache,
                              use_cache=True, cache_position=cache_pos).last_hidden_state
            past_hidden, logits = hs[:, -1:], talker.codec_head(hs[:, -1])
        else:
            hs = talker_backend.step(feed)  # (B, 1, H)
            past_hidden, logits = hs, talker_backend.logits(hs[:, -1])
        talker_calls += 1
        talker_s += time.perf_counter() - t2
    if bar is not None:
        bar.close()
    g = int(tcfg.num_code_groups)
    all_codes = torch.stack(frames_codes, 1) if frames_codes else torch.zeros(b, 0, g, dtype=torch.long)
    # a row's frames end at its first end-of-speech code 0
    hist = history[:, : all_codes.shape[1] + 1]
    is_eos = hist == eos
    ended = is_eos.any(1)
    n_frames = torch.where(ended, is_eos.int().argmax(1), torch.full_like(ended, all_codes.shape[1], dtype=torch.long))
    n_frames = n_frames.clamp(max=all_codes.shape[1])
    codes = [all_codes[i, : int(n_frames[i])].cpu() for i in range(b)]
    return SynthesisResult(codes, n_frames.cpu(), ended.cpu(), calls, talker_calls, time.perf_counter() - t0,
                           talker_s, inner_s, per_frame_calls)
