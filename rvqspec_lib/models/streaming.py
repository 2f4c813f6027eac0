"""Streaming synthesis: the frame loop's frames pushed to a streaming codec decoder every ``chunk_frames`` frames,
each chunk of audio yielded when decoded; with ``overlap`` a second thread (:data:`GENERATE_THREAD`) generates while
the caller decodes, each on half of torch's threads. A row of a batch that ends before the others ends its codec
stream there (the codec's ``push(codes, active)``: a look-ahead codec flushes the row as it would a stream of that
row alone) and is silent from its end on; :meth:`AudioStream.collect` gives each row's own audio.
docs/streaming.md: what runs where, playback and underruns, batches.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from rvqspec_lib.models.frame import Frame, frames
from rvqspec_lib.models.rvq_codec import RVQCodec
from rvqspec_lib.models.speech_tokenizers import streaming_decoder

#: Name of the thread that generates frames when a stream overlaps.
GENERATE_THREAD = "rvqspec-generate"


@dataclass
class AudioChunk:
    """One chunk of a stream's audio.

    Attributes:
        index: 0-based (chunks without audio, while a look-ahead codec waits, are not yielded).
        audio: ``(samples,)`` float32 (one text) or ``(B, samples)`` (a batch), whole codec frames, at ``sample_rate``
            Hz. frames: the codec frames it holds. t_ready_s: seconds from the call until it was ready.
        t_play_s, late_ms: when the player of :func:`playback` starts it and how long it waited (> 0: an underrun).
    """

    index: int
    audio: torch.Tensor
    frames: range
    t_ready_s: float
    t_play_s: float
    late_ms: float
    sample_rate: int

    @property
    def duration_s(self) -> float:
        """Seconds of audio in the chunk."""
        return self.audio.shape[-1] / self.sample_rate


def playback(t_ready_s: Sequence[float], duration_s: Sequence[float]) -> list[tuple[float, float]]:
    """``[(start_s, late_s)]`` per chunk for a player that starts the first chunk when ready and plays them back to
    back, waiting for a chunk not ready (an underrun, delaying the rest); ``t_ready_s`` and ``duration_s`` in
    seconds. ValueError: lists of different lengths."""
    if len(t_ready_s) != len(duration_s):
        raise ValueError(f"{len(t_ready_s)} ready times for {len(duration_s)} durations: give one of each per chunk")
    out, end = [], None
    for ready, dur in zip(t_ready_s, duration_s):
        late = 0.0 if end is None else max(0.0, ready - end)
        start = ready if end is None else max(ready, end)
        out.append((start, late))
        end = start + dur
    return out


def codec_stream_for(lm, *, batch_size: int = 1, chunk_frames: int = 1, table: bool = False):
    """The streaming decoder of a loaded model's own codec, laid out for ``chunk_frames`` (``table``: the embedded
    codec's table decoder instead of its neural code decoder).

    Raises:
        ValueError: the model has no codec (random-weight models: codes only), in one line naming the fix.
    """
    tok = lm.speech_tokenizer
    if tok is None:
        raise ValueError(f"{lm.name} has no codec to turn codes into audio (random weights: codes only): pass "
                         "codec_stream= (e.g. StreamingCodecDecoder(build_codec_decoder('released'))), or use a "
                         "model with a codec")
    codec = getattr(tok, "codec", tok)
    if isinstance(codec, RVQCodec):
        return streaming_decoder(codec.with_decoder(None) if table else codec, batch_size)
    return streaming_decoder(tok, batch_size, chunk_frames_hint=int(chunk_frames))


_END = object()


class AudioStream:
    """A stream of audio chunks (:func:`synthesize_stream` makes it; iterate it once); ``chunks`` records every
    chunk yielded (``index``, ``first_frame``, ``n_frames``, ``samples``, times, ``decode_ms``, ``flush``)."""

    def __init__(self, lm, texts, *, runner, talker, codec_stream, chunk_frames: int, generator, max_frames: int,
                 overlap: bool, **frame_kw):
        self.t_call = time.perf_counter()
        if not isinstance(chunk_frames, int) or isinstance(chunk_frames, bool) or chunk_frames < 1 or \
                chunk_frames > max(1, max_frames):  # max_frames < 1: frames() says so
            raise ValueError(f"chunk_frames must be a whole number of frames in 1..max_frames ({max_frames}), got "
                             f"{chunk_frames!r}")
        self.single = isinstance(texts, str)
        self.batch = 1 if self.single else len(texts)
        self.chunk_frames, self.overlap, self.runner = int(chunk_frames), bool(overlap), runner
        self.codec = codec_stream if codec_stream is not None else codec_stream_for(
            lm, batch_size=self.batch, chunk_frames=chunk_frames)
        self.codec.reset(self.batch)
        self.sample_rate, self.frame_samples = int(self.codec.sample_rate), int(self.codec.frame_samples)
        self._frames = frames(lm, texts, runner=runner, talker=talker, generator=generator, max_frames=max_frames,
                              **frame_kw)
        self.chunks: list[dict] = []
        self._made: list[Frame] = []  # codes kept; per-frame times
        self._stop = threading.Event()
        self._started = False
        self.emitted = 0
        self.decode_s = 0.0
        self.cpu_s = {"generate": 0.0, "decode": 0.0}
        self.threads = torch.get_num_threads()

    @property
    def frames_made(self) -> int:
        return len(self._made)

    # -- the two sides ---------------------------------------------------------------------------------------------
    def _inline(self) -> Iterator[Frame]:
        c0 = time.thread_time()
        try:
            for f in self._frames:
                self.cpu_s["generate"] += time.thread_time() - c0
                yield f
                c0 = time.thread_time()
        finally:
            self.cpu_s["generate"] += time.thread_time() - c0

    def _threaded(self) -> Iterator[Frame]:
        q: queue.SimpleQueue = queue.SimpleQueue()

        def generate():
            torch.set_num_threads(self.threads)  # this thread's OpenMP count (module docstring)
            c0 = time.thread_time()
            try:
                for f in self._frames:
                    q.put(f)
                    if self._stop.is_set():
                        break
                q.put(_END)
            except BaseException as e:  # handed to the caller's thread, raised there
                q.put(e)
            finally:
                self.cpu_s["generate"] = time.thread_time() - c0

        self._worker = threading.Thread(target=generate, name=GENERATE_THREAD, daemon=True)
        self._worker.start()
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _decode(self, got: list[Frame], flush: bool = False) -> Iterator[AudioChunk]:
        """Push ``got`` (or flush the codec) and yield the chunk of audio that comes out, if any."""
        t0, c0 = time.perf_counter(), time.thread_time()
        with torch.inference_mode():
            if flush:
                wav = self.codec.flush()
            else:
                codes = torch.stack([f.codes for f in got], -1)  # (B, G, n)
                active = torch.stack([f.active for f in got], -1)  # (B, n)
                wav = self.codec.push(torch.where(active[:, None, :], codes.cpu(), torch.zeros_like(codes.cpu())),
                                      active)  # a row that ends is flushed there, as alone (module docstring)
        wav = wav.float().reshape(self.batch, -1).clone()  # a normal tensor (not an inference one): the caller's
        self.decode_s += time.perf_counter() - t0
        self.cpu_s["decode"] += time.thread_time() - c0
        m = wav.shape[1] // self.frame_samples
        if m == 0:
            return
        first, fs = self.emitted, self.frame_samples
        self.emitted += m
        for e in range(first, first + m):  # rows that had ended: silence (module docstring)
            if e < len(self._made):
                wav[~self._made[e].active, (e - first) * fs:(e - first + 1) * fs] = 0.0
            else:  # frames after every row ended (a look-ahead codec's flush): nothing to hear
                wav[:, (e - first) * fs:] = 0.0
        ready = time.perf_counter() - self.t_call
        prev = self.chunks[-1] if self.chunks else None
        start, late = playback([prev["t_play_s"], ready] if prev else [ready],
                               [prev["samples"] / self.sample_rate, 0.0] if prev else [0.0])[-1]
        chunk = AudioChunk(len(self.chunks), wav[0] if self.single else wav, range(first, first + m), ready, start,
                           late * 1e3, self.sample_rate)
        self.chunks.append({"index": chunk.index, "first_frame": first, "n_frames": m, "samples": wav.shape[1],
                            "t_ready_s": ready, "t_play_s": start, "late_ms": late * 1e3,
                            "decode_ms": (time.perf_counter() - t0) * 1e3, "flush": flush})
        yield chunk

    def __iter__(self) -> Iterator[AudioChunk]:
        if self._started:
            raise RuntimeError("an AudioStream is iterated once: call synthesize_stream again for another")
        self._started = True
        outer = torch.get_num_threads()
        self.threads = max(1, outer // 2) if self.overlap else outer
        try:
            torch.set_num_threads(self.threads)
            pending: list[Frame] = []
            for f in (self._threaded() if self.overlap else self._inline()):
                self._made.append(f)
                pending.append(f)
                if len(pending) == self.chunk_frames:
                    yield from self._decode(pending)
                    pending = []
            if pending:
                yield from self._decode(pending)
            yield from self._decode([], flush=True)
        finally:
            self._stop.set()
            worker = getattr(self, "_worker", None)
            if worker is not None:
                worker.join()
            self._frames.close()
            torch.set_num_threads(outer)

    def collect(self) -> list[torch.Tensor]:
        """Run the stream to its end (iterating it) and return each row's audio, ``(frames_r * frame_samples,)``
        float32 at ``sample_rate`` Hz, ``frames_r`` the frames row r spoke (``codes(r)``): its own length, not the
        silence after it while longer rows went on. One text: a list of one. RuntimeError: already iterated."""
        chunks = [c.audio.reshape(self.batch, -1) for c in self]
        wav = torch.cat(chunks, 1) if chunks else torch.zeros(self.batch, 0)
        return [wav[r, :int(self.codes(r).shape[0]) * self.frame_samples].clone() for r in range(self.batch)]

    def close(self) -> None:
        """Stop generating (a consumer that stops early: the generating thread ends after its current frame)."""
        self._stop.set()

    # -- results ---------------------------------------------------------------------------------------------------
    def codes(self, row: int = 0) -> torch.Tensor:
        """``(frames, n_code_groups)`` int64 codes of one row's frames while it spoke (code 0, then codes 1..15)."""
        got = [f.codes[row] for f in self._made if bool(f.active[row])]
        return torch.stack(got).cpu() if got else torch.zeros(0, 0, dtype=torch.long)

    def summary(self) -> dict:
        """What the stream measured so far (after the last chunk: the whole stream): ``ttfa_ms``, ``ttfa_call_ms``,
        ``rtf``, ``frame_ms``, ``underruns``, ``late_ms`` and ``overlap`` as docs/streaming.md defines them, and
        ``frames`` (made), ``chunks``, ``chunk_frames``, ``lookahead_frames`` and ``first_audio_frames`` (the codec's), ``audio_s``, ``wall_s``
        (call to the last chunk ready), ``prompt_ms`` (call to the end of the talker's prefill), ``rtf_after_prompt``,
        ``stall_ms`` (the underruns' sum), per-frame means ``talker_ms`` (frames after the first), ``inner_ms`` and
        ``codec_ms`` (push and flush), ``generate_s`` and ``decode_s`` (busy seconds of each side), ``cpu_s`` (thread
        CPU seconds of each side; per frame ``generate_cpu_ms``, ``decode_cpu_ms``), ``overlapped``, ``threads``
        (torch threads per side), ``tokens_per_call``, ``replay`` (a timing replay's words, else ``None``), ``batch``;
        ``undefined``: ``{field: why}`` for each of those numbers that is NaN or infinite (no audio; ``frame_ms``
        when every frame came in the first chunk, so that there is no period between chunks; ...), which the JSON
        writer stores as ``null``.
        """
        ch, made = self.chunks, self._made
        audio_s = sum(c["samples"] for c in ch) / self.sample_rate
        prompt_s = made[0].prompt_s if made else float("nan")
        first = ch[0]["t_ready_s"] if ch else float("nan")
        wall = ch[-1]["t_ready_s"] if ch else time.perf_counter() - self.t_call
        late = [c["late_ms"] for c in ch]
        gen = sum(f.talker_s + f.inner_s for f in made)
        steady = [c for c in ch[1:] if not c["flush"]]  # a look-ahead codec's flush comes at once: not a period
        period = (steady[-1]["t_ready_s"] - first) / sum(c["n_frames"] for c in steady) if steady else math.nan
        codes = sum(int(f.codes.shape[1]) - 1 for f in made) * self.batch
        calls = sum(int(f.calls.sum()) for f in made)
        oracle = getattr(self.runner, "acceptance", None)
        out = {"frames": len(made), "chunks": len(ch), "chunk_frames": self.chunk_frames,
               "lookahead_frames": int(getattr(self.codec, "lookahead_frames", 0)),
               "first_audio_frames": int(getattr(self.codec, "first_audio_frames", 1)), "batch": self.batch,
               "audio_s": audio_s, "wall_s": wall, "prompt_ms": prompt_s * 1e3, "ttfa_ms": (first - prompt_s) * 1e3,
               "ttfa_call_ms": first * 1e3, "rtf": wall / audio_s if audio_s else math.inf,
               "rtf_after_prompt": (wall - prompt_s) / audio_s if audio_s else math.inf,
               "frame_ms": period * 1e3,
               "underruns": sum(x > 0 for x in late), "stall_ms": sum(late), "late_ms": late,
               "talker_ms": 1e3 * sum(f.talker_s for f in made[1:]) / max(1, len(made) - 1),
               "inner_ms": 1e3 * sum(f.inner_s for f in made) / max(1, len(made)),
               "codec_ms": 1e3 * self.decode_s / max(1, len(made)), "generate_s": gen, "decode_s": self.decode_s,
               "overlap": (gen + self.decode_s) / wall if wall > 0 else math.nan, "cpu_s": dict(self.cpu_s),
               "generate_cpu_ms": 1e3 * self.cpu_s["generate"] / max(1, len(made)),
               "decode_cpu_ms": 1e3 * self.cpu_s["decode"] / max(1, len(made)),
               "overlapped": self.overlap, "threads": self.threads,
               "tokens_per_call": codes / calls if calls else math.nan,
               "replay": getattr(oracle, "text", None)}
        why = {"frame_ms": "no chunk after the first but the codec's flush (a chunk as long as the stream): no period "
                           "between chunks", "tokens_per_call": "no code-predictor call", "overlap": "no time passed"}
        out["undefined"] = {k: why.get(k, "no audio" if ch else "no chunk yet") for k, v in out.items()
                            if isinstance(v, float) and not math.isfinite(v)}
        return out


def synthesize_stream(lm, text: str | list[str], *, runner=None, talker=None, codec_stream=None,
                      chunk_frames: int = 1, generator: torch.Generator | None = None, max_frames: int = 200,
                      overlap: bool = True, **frame_kw) -> AudioStream:
    """Speak ``text`` (a sentence, or a list: a batch of streams) as a stream of audio chunks (module docstring).

    Args:
        lm, runner, talker, generator, max_frames, frame_kw: as :func:`~rvqspec_lib.models.frame.frames`; the codes
            depend on ``generator`` alone, not on ``chunk_frames`` or ``overlap``.
        codec_stream: a streaming decoder (``reset``, ``push(codes, active)``, ``flush``, ``sample_rate``,
            ``frame_samples``); default the model's own (:func:`codec_stream_for`). It is reset to the batch here.
        chunk_frames: frames pushed to the codec at once, 1..``max_frames``. overlap: generate in a second thread.

    Returns:
        :class:`AudioStream`: iterate it for :class:`AudioChunk` s (or ``collect()`` each row's audio at the end);
        ``summary()`` after (or during).

    Raises:
        ValueError: ``chunk_frames`` outside 1..``max_frames``; no codec (one line); as ``frames`` (empty text, bad
            language or speaker, ``max_frames < 1``).
    """
    return AudioStream(lm, text, runner=runner, talker=talker, codec_stream=codec_stream, chunk_frames=chunk_frames,
                       generator=generator, max_frames=max_frames, overlap=overlap, **frame_kw)
