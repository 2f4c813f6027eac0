"""The native talker step (rvqspec_lib.device.native_talker, kernels/cpforward.c's rvq_forward_scan): the talker's
multimodal RoPE with equal ids is 1-D RoPE; hidden states and logits equal to the official talker in every precision
to a stated tolerance; greedy code 0 equal where the official top-2 margin is clear; batch rows equal single streams
bit for bit (left padding included); a whole utterance through the frame loop equal to the official loop (float32);
one-line errors. Small models only (tiny-random, embedded); no timing asserts (the timing is rvqspec bench precisions
--talker-contexts).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers.cache_utils import DynamicCache

from rvqspec_lib.decoding.sampling import Sampling
from bench.latency import bench_talker_precisions, format_talker_table, scan_cost, slim_talker
from rvqspec_lib.device import precision as PR
from rvqspec_lib.models.configs import CONFIG_DIR, build_from_config, tiny_config_dict
from rvqspec_lib.models.frame import synthesize
from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.models.shim import import_qwen_tts

pytestmark = pytest.mark.skipif(not C.available(), reason=f"native forward unavailable: {C.unavailable_reason()}")

#: Tolerance against the official talker in the same precision, relative to the largest |hidden|. float32: summation
#: order only (measured ~3e-7). bfloat16 / int8: the official rounding points in another summation order, a few
#: bfloat16 steps (2^-8 relative) over 2-4 layers (measured up to 8e-3). int8-dynamic: float32, but a row's int8
#: quantisation of an activation flips by one step (1/127 of the row's largest value) where summation order moves it
#: across a rounding boundary (measured up to 8e-4).
OFFICIAL_RTOL = {"float32": 1e-5, "bfloat16": 4e-2, "int8": 4e-2, "int8-dynamic": 2e-2}
MODELS = ("tiny-random", "embedded")
#: The tiny model with the released talkers' head width (128, MRoPE sections [24, 20, 20]): the C paths of that width.
D128 = "tiny-d128"


@pytest.fixture(scope="module")
def models():
    cfg = tiny_config_dict()
    cfg["talker_config"].update(head_dim=128, rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20],
                                                            "rope_type": "default"})
    return {**{name: load_model(name) for name in MODELS}, D128: SimpleNamespace(talker=build_from_config(cfg).talker)}


def _talker(models, name, prec):
    return PR.apply_precision(slim_talker(models[name].talker), prec, require_native=False)


def _inputs(talker, *, lengths=(7, 4, 6), steps=5, seed=0):
    """A left-padded prompt batch (B, L, H), its mask (B, L) and step inputs (B, steps, H), in the talker's dtype."""
    g = torch.Generator().manual_seed(seed)
    h = int(talker.config.hidden_size)
    dtype = talker.model.norm.weight.dtype
    big = max(lengths)
    prompt = torch.randn(len(lengths), big, h, generator=g).to(dtype)
    mask = torch.zeros(len(lengths), big, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, big - n:] = 1
    prompt = prompt * mask[..., None].to(dtype)  # padded rows zero, as the official prompt's
    feeds = torch.randn(len(lengths), steps, h, generator=g).to(dtype)
    return prompt, mask, feeds


@torch.inference_mode()
def official_run(talker, prompt, mask, feeds):
    """The official talker as the official generate / our frame loop run it: prefill with the left-padding mask and
    its rope deltas, then one step per feed. Returns hidden (B, L, H), step hidden (B, F, H), step logits (B, F, V)."""
    b, length, _ = prompt.shape
    cache = DynamicCache()
    pos, deltas = talker.get_rope_index(mask)
    deltas = deltas - (1 - mask).sum(-1, keepdim=True)
    h0 = talker.model(inputs_embeds=prompt, attention_mask=mask, position_ids=pos, past_key_values=cache,
                      use_cache=True, cache_position=torch.arange(length)).last_hidden_state
    hs, m = [], mask
    for i in range(feeds.shape[1]):
        m = torch.cat([m, torch.ones(b, 1, dtype=m.dtype)], 1)
        cp = torch.tensor([length + i])
        p = (cp[0] + deltas).view(b, 1).unsqueeze(0).expand(3, -1, -1)
        hs.append(talker.model(inputs_embeds=feeds[:, i:i + 1], attention_mask=m, position_ids=p,
                               past_key_values=cache, use_cache=True, cache_position=cp).last_hidden_state)
    hs = torch.cat(hs, 1)
    return h0, hs, talker.codec_head(hs)


@torch.inference_mode()
def native_run(nt, prompt, mask, feeds):
    h0 = nt.prefill(prompt, attention_mask=mask)
    hs = torch.cat([nt.step(feeds[:, i:i + 1]) for i in range(feeds.shape[1])], 1)
    return h0, hs, nt.logits(hs)


# ----------------------------------------------------------------------------------------------------------------
# RoPE: the talker's multimodal RoPE with the same id on all three axes is 1-D RoPE
# ----------------------------------------------------------------------------------------------------------------
def _released_talker_config():
    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig

    cfg = Qwen3TTSConfig.from_pretrained(CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
    return cfg.talker_config


@pytest.mark.parametrize("which", ["tiny-random", "embedded", "0.6B"])
def test_mrope_with_equal_ids_is_1d_rope_bit_for_bit(models, which):
    from qwen_tts.core.models.modeling_qwen3_tts import (Qwen3TTSTalkerRotaryEmbedding,
                                                         apply_multimodal_rotary_pos_emb, rotate_half)

    cfg = _released_talker_config() if which == "0.6B" else models[which].talker.config
    rot = Qwen3TTSTalkerRotaryEmbedding(cfg)
    sec, inter = cfg.rope_scaling["mrope_section"], cfg.rope_scaling["interleaved"]
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 40, d, generator=g), torch.randn(1, 2, 40, d, generator=g)  # (B, heads, T, D)
    ids = torch.tensor([0, 1, 2, 5, 63, 64, 511, 512, 4095, 8191] * 4)[None]  # (1, T)
    cos3, sin3 = rot(q, ids[None].expand(3, 1, -1))  # (3, 1, T, D)
    qm, km = apply_multimodal_rotary_pos_emb(q, k, cos3, sin3, sec, inter)
    c, s = cos3[0][:, None], sin3[0][:, None]  # axis 0 as a 1-D table: (1, 1, T, D)
    assert torch.equal(qm, q * c + rotate_half(q) * s) and torch.equal(km, k * c + rotate_half(k) * s)
    # negative control: other ids on the height and width axes change the rotation
    other = torch.stack([ids, ids + 7, ids + 11])  # (3, 1, T)
    cos_o, sin_o = rot(q, other)
    qo, _ = apply_multimodal_rotary_pos_emb(q, k, cos_o, sin_o, sec, inter)
    assert not torch.equal(qo, qm)


# ----------------------------------------------------------------------------------------------------------------
# equal to the official talker in the same precision
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS + (D128,))
@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_hidden_and_logits_equal_official_within_tolerance(models, name, prec):
    talker = _talker(models, name, prec)
    nt = NativeTalker(talker, max_context=16)
    assert nt.precision == prec and nt.dtype == PR.ACTIVATION_DTYPE[prec]
    prompt, mask, feeds = _inputs(talker, steps=8)
    a0, a1, la = native_run(nt, prompt, mask, feeds)
    b0, b1, lb = official_run(talker, prompt, mask, feeds)
    assert a0.dtype == b0.dtype and a1.shape == b1.shape and la.shape == lb.shape
    real = mask.bool()
    for a, b in ((a0[real], b0[real]), (a1, b1)):
        scale = float(b.float().abs().max())
        assert float((a.float() - b.float()).abs().max()) <= OFFICIAL_RTOL[prec] * scale, prec
    la, lb = la.float(), lb.float()
    diff = float((la - lb).abs().max())
    assert diff <= OFFICIAL_RTOL[prec] * 4 * float(lb.abs().max()) + 1e-6
    # greedy code 0 equal wherever the official top-2 margin is clear (both sides may move by diff)
    top2 = lb.topk(2, -1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * diff
    # enough rows for the comparison to mean something (bfloat16 logits of random weights have small margins)
    assert int(clear.sum()) >= 0.3 * clear.numel()
    assert torch.equal(la.argmax(-1)[clear], lb.argmax(-1)[clear])


def test_the_tolerance_test_can_fail(models):
    """Negative control: the same comparison against a talker with one weight changed by 1 % fails."""
    talker = _talker(models, "tiny-random", "float32")
    other = copy.deepcopy(talker)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight.mul_(1.01)
    prompt, mask, feeds = _inputs(talker)
    _, a1, _ = native_run(NativeTalker(other, max_context=16), prompt, mask, feeds)
    _, b1, _ = official_run(talker, prompt, mask, feeds)
    assert float((a1 - b1).abs().max()) > OFFICIAL_RTOL["float32"] * float(b1.abs().max())


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_greedy_code0_loop_equals_official_where_margin_clear(models, name, prec):
    """Frames of the talker loop fed the codec embedding of the official greedy code 0: the native code 0 equals the
    official one at every frame whose official top-2 margin exceeds twice the logit difference."""
    talker = _talker(models, name, prec)
    nt = NativeTalker(talker, max_context=32)
    prompt, _, _ = _inputs(talker, lengths=(6,))
    frames = 10
    with torch.inference_mode():
        cache = DynamicCache()
        b0 = talker.model(inputs_embeds=prompt, past_key_values=cache, use_cache=True,
                          position_ids=torch.arange(6).view(1, 1, -1).expand(3, 1, -1)).last_hidden_state
        a0 = nt.prefill(prompt)
        lb, la = talker.codec_head(b0[:, -1]).float(), nt.logits(a0[:, -1]).float()
        agree, clear_n = [], 0
        for f in range(frames):
            diff = float((la - lb).abs().max())
            top2 = lb.topk(2, -1).values[0]
            code_b, code_a = int(lb.argmax()), int(la.argmax())
            if float(top2[0] - top2[1]) > 2 * diff:
                clear_n += 1
                agree.append(code_a == code_b)
            feed = talker.model.codec_embedding(torch.tensor([[code_b]]))  # (1, 1, H): the official code's embedding
            hb = talker.model(inputs_embeds=feed, past_key_values=cache, use_cache=True,
                              position_ids=torch.full((3, 1, 1), 6 + f)).last_hidden_state
            lb = talker.codec_head(hb[:, -1]).float()
            la = nt.logits(nt.step(feed)[:, -1]).float()
    assert clear_n >= frames // 2, (prec, clear_n)
    assert all(agree), (prec, agree)


# ----------------------------------------------------------------------------------------------------------------
# batch rows are independent streams, bit for bit
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-random", D128])
@pytest.mark.parametrize("prec", PR.PRECISIONS)
def test_batch_rows_equal_single_streams_bit_for_bit(models, name, prec):
    talker = _talker(models, name, prec)
    nt = NativeTalker(talker, max_context=16)
    prompt, mask, feeds = _inputs(talker)
    a0, a1, la = native_run(nt, prompt, mask, feeds)
    for i in range(prompt.shape[0]):
        real = mask[i].bool()
        s0, s1, sl = native_run(nt, prompt[i:i + 1, real], None, feeds[i:i + 1])  # the stream alone, unpadded
        assert torch.equal(a0[i, real], s0[0]) and torch.equal(a1[i], s1[0]) and torch.equal(la[i], sl[0]), (prec, i)


@pytest.mark.parametrize("prec", ["bfloat16", "int8"])
def test_bfloat16_kv_cache_is_exact(models, prec):
    """In bfloat16 and int8 the KV cache is held in bfloat16 by default: every result equals the float32 cache's bit
    for bit (the keys and values are bfloat16 values already); head widths 16, 64 and 128."""
    for name in MODELS + (D128,):
        talker = _talker(models, name, prec)
        half, full = NativeTalker(talker, max_context=16), NativeTalker(talker, max_context=16, kv_bfloat16=False)
        assert half.kv_dtype == torch.bfloat16 and full.kv_dtype == torch.float32
        assert 2 * half.kv_bytes_per_position == full.kv_bytes_per_position
        prompt, mask, feeds = _inputs(talker)
        for a, b in zip(native_run(half, prompt, mask, feeds), native_run(full, prompt, mask, feeds)):
            assert torch.equal(a, b), (name, prec)
        assert half.cache.k.dtype == torch.bfloat16 and torch.equal(half.cache.k[..., :half.length, :].float(),
                                                                    full.cache.k[..., :full.length, :])


def test_batch_test_can_fail(models):
    """Negative control: the padded batch run WITHOUT its mask (padding attended, positions shifted) differs from the
    streams alone."""
    talker = _talker(models, "tiny-random", "float32")
    nt = NativeTalker(talker, max_context=16)
    prompt, mask, feeds = _inputs(talker)
    _, a1, _ = native_run(nt, prompt, None, feeds)
    _, s1, _ = native_run(nt, prompt[1:2, mask[1].bool()], None, feeds[1:2])
    assert not torch.equal(a1[1], s1[0])


def test_prefix_scan_equals_whole_cache_scan_and_crop_reuses_the_cache(models):
    """rvq_forward_scan over the filled prefix computes what an allow mask over the whole capacity computes (bit for
    bit); crop and reset reuse the cache's memory and rerun steps identically."""
    talker = _talker(models, "embedded", "float32")
    nt = NativeTalker(talker, max_context=64)
    prompt, mask, feeds = _inputs(talker)
    a0, a1, _ = native_run(nt, prompt, mask, feeds)
    ptr = nt.cache.k.data_ptr()
    nt.scan_whole_cache = True
    w0, w1, _ = native_run(nt, prompt, mask, feeds)
    nt.scan_whole_cache = False
    assert torch.equal(a0, w0) and torch.equal(a1, w1)
    assert nt.cache.k.data_ptr() == ptr  # prefill's reset kept the memory
    length = nt.length
    nt.crop(length - 2)
    with torch.inference_mode():
        again = torch.cat([nt.step(feeds[:, i:i + 1]) for i in range(3, 5)], 1)
    assert torch.equal(again, a1[:, 3:5]) and nt.length == length
    sc = scan_cost(nt, context=8, capacity=32, warmup=0, repeats=1)
    assert sc["capacity"] == 32 and nt.cache.max_context == 32


# ----------------------------------------------------------------------------------------------------------------
# the frame loop
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_whole_utterance_through_the_frame_loop_equals_official(models, name):
    """synthesize(..., talker=NativeTalker(lm)) speaks the same greedy codes as the official talker, for a
    left-padded batch of two (float32: the logits differ by summation order only)."""
    lm = models[name]
    texts = ["Hello world.", "A somewhat longer sentence, to pad the batch."]
    g = Sampling(greedy=True)
    frames = 8 if name == "tiny-random" else 4
    ref = synthesize(lm, texts, sampling=g, talker_sampling=g, max_frames=frames)
    nt = NativeTalker(lm, max_context=8)  # grown by synthesize to the prompt + frames
    res = synthesize(lm, texts, sampling=g, talker_sampling=g, max_frames=frames, talker=nt)
    assert nt.max_context >= nt.length and res.talker_calls == ref.talker_calls
    assert [c.shape for c in res.codes] == [c.shape for c in ref.codes]
    for mine, theirs in zip(res.codes, ref.codes):
        assert torch.equal(mine, theirs)


# ----------------------------------------------------------------------------------------------------------------
# errors: one line naming the fix
# ----------------------------------------------------------------------------------------------------------------
def test_errors_name_the_fix(models):
    talker = _talker(models, "tiny-random", "float32")
    h = int(talker.config.hidden_size)
    nt = NativeTalker(talker, max_context=8)

    def one_line(exc_info, *words):
        msg = str(exc_info.value)
        assert "\n" not in msg and all(w in msg for w in words), msg

    with pytest.raises(ValueError) as e:
        NativeTalker(torch.nn.Linear(2, 2))
    one_line(e, "lm.model.talker")
    with pytest.raises(ValueError) as e:
        NativeTalker(talker, max_context=0)
    one_line(e, "max_context")
    with pytest.raises(ValueError) as e:
        NativeTalker(talker, kv_bfloat16=True)
    one_line(e, "kv_bfloat16=None or False")
    with pytest.raises(ValueError) as e:
        nt.step(torch.zeros(1, 1, h))
    one_line(e, "prefill")
    with pytest.raises(ValueError) as e:
        nt.prefill(torch.zeros(1, 3, h + 1))
    one_line(e, f"(B, T, {h})", "hidden size")
    with pytest.raises(ValueError) as e:
        nt.prefill(torch.zeros(1, 9, h))
    one_line(e, "context 9", "capacity of 8", "max_context")
    with torch.inference_mode():
        nt.prefill(torch.zeros(2, 7, h))
        nt.step(torch.zeros(2, 1, h))
    with pytest.raises(ValueError) as e:
        nt.step(torch.zeros(2, 1, h))
    one_line(e, "context 9", "max_context")
    with pytest.raises(ValueError) as e:
        nt.step(torch.zeros(3, 1, h))
    one_line(e, "3 streams", "reset(batch=3)")
    with pytest.raises(ValueError) as e:
        nt.step(torch.zeros(2, 2, h))
    one_line(e, "one position", "extend")
    with pytest.raises(ValueError) as e:
        nt.logits(torch.zeros(2, h - 1))
    one_line(e, f"(..., {h})", "hidden size")
    with pytest.raises(ValueError) as e:
        nt.extend(torch.zeros(2, 1, h), attention_mask=torch.ones(1, 1))
    one_line(e, "attention_mask", "(2, 1)")
    with pytest.raises(ValueError) as e:
        nt.crop(99)
    one_line(e, "crop length")
    mixed = copy.deepcopy(talker)
    mixed.codec_head = PR.Int8Linear(mixed.codec_head)
    with pytest.raises(ValueError) as e:
        NativeTalker(mixed)
    one_line(e, "apply_precision(lm.model.talker")
    assert nt.length == 8  # the refused calls appended nothing


# ----------------------------------------------------------------------------------------------------------------
# the benchmark runs (its numbers are not asserted)
# ----------------------------------------------------------------------------------------------------------------
def test_benchmark_reports_every_condition(models):
    talker = slim_talker(models["tiny-random"].talker)
    bw = {"gb_per_s": 10.0, "gb_per_s_cpu": 12.0, "buffer_bytes": 2 ** 29, "repeats": 1, "threads": 1}
    res = bench_talker_precisions(talker, ["float32", "int8-dynamic"], contexts=[4, 9], warmup=0, repeats=1,
                                  bandwidth=bw, model_name="tiny-random")
    keys = [(r["precision"], r["context"], r["forward"]) for r in res["rows"]]
    assert keys == [(p, c, f) for p in ("float32", "int8-dynamic") for c in (4, 9) for f in ("official", "native")]
    for r in res["rows"]:
        assert r["weight_bytes"] > 0 and r["floor_kv_ms"] > r["floor_ms"] > 0 and r["median_ms"] > 0
        assert r["cpu_over_floor"] > r["cpu_over_floor_kv"] > 0 and r["floor_cpu_ms"] < r["floor_ms"]
    assert "RANDOM weights" in format_talker_table(res) and all(r["cpu_ms"] > 0 for r in res["rows"])
    assert PR.precision_of(talker.model) == "float32"  # the float32 talker was not converted
