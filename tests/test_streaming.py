"""Streaming synthesis (docs/streaming.md): the streamed audio equals the decode of the same codes (the official
causal decoder: to float rounding; the embedded model's codec: bit for bit its own stream, within its stated
distance of the offline decode), the codes depend on the seed alone (not on the chunk size nor on overlapping), the
summary's fields agree with each other, a batch's rows equal the same streams alone (greedy), and the errors."""

import threading

import pytest
import torch

from paper.notebook_measures import log_spectral_distance
from rvqspec_lib.decoding.decoders import AR, Chain
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models.backends import available, frame_runner
from rvqspec_lib.models.configs import build_codec_decoder
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.models.streaming import GENERATE_THREAD, codec_stream_for, playback, synthesize_stream
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder

FRAME = 1920
#: float32 stream vs the full forward of the official decoder: relative RMS difference (summation order only).
F32_REL = 2e-5
native = pytest.mark.skipif(not available("native")[0], reason="the native forward does not build here")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def decoder():
    return build_codec_decoder("tiny", seed=0)


def run(lm, decoder, *, chunk_frames=1, overlap=True, seed=0, frames=10, text="hello there", **kw):
    st = synthesize_stream(lm, text, codec_stream=StreamingCodecDecoder(decoder), chunk_frames=chunk_frames,
                           generator=torch.Generator().manual_seed(seed), max_frames=frames, overlap=overlap, **kw)
    chunks = list(st)
    return st, chunks, torch.cat([c.audio for c in chunks], -1)


def test_stream_equals_the_decode_of_its_codes_for_any_chunking_and_overlap(tiny, decoder):
    ref_st, _, ref = run(tiny, decoder, chunk_frames=1, overlap=False)
    codes = ref_st.codes()
    assert codes.shape == (10, 16) and ref.shape == (10 * FRAME,)
    with torch.no_grad():
        full = decoder(codes.T[None])[0, 0]
    assert float(full.std()) > 0.05 and rel(ref, full) < F32_REL
    for chunk_frames, overlap in ((1, True), (3, False), (3, True), (10, True)):
        st, chunks, wav = run(tiny, decoder, chunk_frames=chunk_frames, overlap=overlap)
        assert torch.equal(st.codes(), codes), (chunk_frames, overlap)  # the seed alone decides the codes
        assert [len(c.frames) for c in chunks] == [chunk_frames] * (10 // chunk_frames) + [10 % chunk_frames] * (
            10 % chunk_frames > 0)
        assert rel(wav, full) < F32_REL
        if chunk_frames == 1:  # the same computation, in another thread: the same bits
            assert torch.equal(wav, ref)
    assert not torch.equal(run(tiny, decoder, seed=1)[0].codes(), codes)  # negative control: the seed matters


def test_summary_fields_agree(tiny, decoder):
    st, chunks, wav = run(tiny, decoder, chunk_frames=2, overlap=True)
    s = st.summary()
    assert s["frames"] == 10 and s["chunks"] == len(chunks) == 5 and s["chunk_frames"] == 2 and s["batch"] == 1
    assert s["audio_s"] == pytest.approx(wav.shape[0] / 24000) == pytest.approx(10 * 0.08)
    assert s["ttfa_call_ms"] == pytest.approx(s["ttfa_ms"] + s["prompt_ms"])
    assert s["ttfa_call_ms"] == pytest.approx(chunks[0].t_ready_s * 1e3) and s["prompt_ms"] > 0
    assert s["rtf"] == pytest.approx(s["wall_s"] / s["audio_s"]) and s["wall_s"] == chunks[-1].t_ready_s
    assert s["frame_ms"] == pytest.approx((chunks[-1].t_ready_s - chunks[0].t_ready_s) * 1e3 / 8)
    assert s["late_ms"] == [c.late_ms for c in chunks] and s["underruns"] == sum(c.late_ms > 0 for c in chunks)
    assert s["stall_ms"] == pytest.approx(sum(s["late_ms"]))
    plays = playback([c.t_ready_s for c in chunks], [c.duration_s for c in chunks])
    assert [c.t_play_s for c in chunks] == pytest.approx([p[0] for p in plays])
    assert [c.late_ms for c in chunks] == pytest.approx([1e3 * p[1] for p in plays])
    assert all(a.t_ready_s <= b.t_ready_s for a, b in zip(chunks, chunks[1:]))
    assert [c.index for c in chunks] == list(range(5)) and chunks[2].frames == range(4, 6)
    assert s["overlapped"] and s["threads"] == 1 and s["tokens_per_call"] == 1.0 and s["replay"] is None
    assert s["generate_s"] > 0 and s["decode_s"] > 0 and s["overlap"] > 0
    assert set(s["cpu_s"]) == {"generate", "decode"}


def test_playback_waits_for_late_chunks():
    # chunk 1 in time; chunk 2 ready 0.1 s after chunk 1 ended: an underrun, which delays chunk 3 too
    got = playback([0.0, 0.05, 0.30, 0.35], [0.1, 0.1, 0.1, 0.1])
    assert [x for p in got for x in p] == pytest.approx([0.0, 0.0, 0.1, 0.0, 0.3, 0.1, 0.4, 0.0])
    assert playback([], []) == []
    with pytest.raises(ValueError, match="one of each"):
        playback([0.0], [])


@native
def test_embedded_stream_is_its_codec_stream_of_the_same_codes():
    """The embedded model's codec streams with a look-ahead: the stream's audio is bit for bit that codec's stream of
    the same codes (docs/codec_streaming.md: within its stated distance of the offline decode)."""
    lm = load_model("embedded")
    runner = frame_runner("native", lm.code_predictor, AR(), fused=True, sampling=inner_sampling(lm))
    st = synthesize_stream(lm, "The weather is fine today.", runner=runner, talker=NativeTalker(lm), chunk_frames=2,
                           generator=torch.Generator().manual_seed(0), max_frames=8)
    chunks = list(st)
    wav, codes = torch.cat([c.audio for c in chunks]), st.codes()
    assert codes.shape == (8, 16) and wav.shape == (8 * FRAME,)
    assert chunks[0].frames.start == 0 and st.summary()["lookahead_frames"] == 3
    dec = codec_stream_for(lm)
    ref = torch.cat([dec.push(codes.T[None]), dec.flush()], -1)[0]
    assert torch.equal(wav, ref)
    codec = lm.speech_tokenizer.codec
    target = codec.decode_vectors(codes.numpy())
    offline = log_spectral_distance(codec, codec.features(codec.decode(codes.numpy())), target)
    assert log_spectral_distance(codec, codec.features(wav.numpy()), target) < offline + 1.0


@native
@pytest.mark.parametrize("decoder_obj", [AR(), Chain(4)], ids=["ar", "chain4"])
def test_batch_rows_equal_the_same_streams_alone(tiny, decoder, decoder_obj):
    """B streams batched (one native talker step and one native verify call a round for all rows) decode, row by
    row, what each stream decodes alone. Greedy: with sampling the rows draw from one generator, so a row's draws
    depend on the batch (the design shares the generator); greedy needs none, and the native forward computes a row
    bit for bit as it does alone."""
    greedy = Sampling.from_generation_config(tiny.generation or {}, loop="talker", greedy=True)
    texts = ["hello there", "a somewhat longer sentence"]
    kw = dict(talker_sampling=greedy, max_frames=6, overlap=True, chunk_frames=2)

    def stream(text):
        runner = frame_runner("native", tiny.code_predictor, decoder_obj, sampling=inner_sampling(tiny, greedy=True))
        st = synthesize_stream(tiny, text, runner=runner, talker=NativeTalker(tiny), codec_stream=StreamingCodecDecoder(
            decoder, 2 if isinstance(text, list) else 1), **kw)
        return st, torch.cat([c.audio for c in st], -1)

    both, wav = stream(texts)
    assert wav.shape == (2, 6 * FRAME) and both.summary()["batch"] == 2
    for i, text in enumerate(texts):
        alone, solo = stream(text)
        assert torch.equal(both.codes(i), alone.codes())
        assert rel(wav[i], solo) < F32_REL
    assert not torch.equal(both.codes(0), both.codes(1))  # negative control: the rows differ


def test_errors_are_one_line(tiny, decoder):
    for bad in (0, 11, 2.0, True):
        with pytest.raises(ValueError) as e:
            synthesize_stream(tiny, "hi", codec_stream=StreamingCodecDecoder(decoder), chunk_frames=bad, max_frames=10)
        assert "chunk_frames" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="has no codec") as e:
        synthesize_stream(tiny, "hi")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="max_frames"):
        synthesize_stream(tiny, "hi", codec_stream=StreamingCodecDecoder(decoder), max_frames=0)
    st, _, _ = run(tiny, decoder, frames=2)
    with pytest.raises(RuntimeError, match="iterated once"):
        list(st)


def test_a_consumer_that_stops_early_stops_the_generating_thread(tiny, decoder):
    st = synthesize_stream(tiny, "hello there", codec_stream=StreamingCodecDecoder(decoder), max_frames=50,
                           generator=torch.Generator().manual_seed(0))
    for chunk in st:  # leaving the loop closes the stream's generator, whose finally stops and joins the thread
        assert chunk.index == 0
        break
    assert not any(t.name == GENERATE_THREAD for t in threading.enumerate())
    assert st.frames_made < 50


def test_an_error_while_generating_reaches_the_consumer(tiny, decoder):
    def broken(context, generator=None):
        raise RuntimeError("the inner loop failed")

    broken.acceptance = None
    st = synthesize_stream(tiny, "hello", runner=broken, codec_stream=StreamingCodecDecoder(decoder), max_frames=4)
    with pytest.raises(RuntimeError, match="the inner loop failed"):
        list(st)
    assert not any(t.name == GENERATE_THREAD for t in threading.enumerate())
