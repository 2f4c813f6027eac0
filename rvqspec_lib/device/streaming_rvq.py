"""Streaming decoding of the embedded model's offline codec (:class:`rvqspec_lib.models.rvq_codec.RVQCodec`) with a
stated look-ahead: the code decoder sees codes ``[t - context_frames, t + lookahead_frames]``, the phase is
reconstructed as in RTISI-LA (Zhu, Beauregard and Wyse, 2007). The audio does not depend on how the codes were
chunked. docs/codec_streaming.md#the-embedded-codec: the method and how far from the offline decode it lands.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from rvqspec_lib.device.streaming_layers import check_codes_chunk

#: Code frames before frame t in the code decoder's window (16: an LSD of 0.59 dB between the streamed and the
#: offline frame vectors of shipped utterances at 2 frames of look-ahead, against 0.85 dB at 8 and 0.46 dB at 32;
#: docs/codec_streaming.md#the-embedded-codec).
CONTEXT_FRAMES = 16
#: Code frames after frame t in the code decoder's window (once the stream is under way: :data:`RAMP_FRAMES`).
LOOKAHEAD_FRAMES = 2
#: The code decoder's look-ahead at frame t is ``min(LOOKAHEAD_FRAMES, t // RAMP_FRAMES)``: it grows by one frame
#: every 4 frames, so the first audio waits for 2 pushed frames instead of 4, and a generator at up to 60 ms per
#: 80 ms frame still keeps ahead of the player (docs/codec_streaming.md#the-embedded-codec). 0: no ramp.
RAMP_FRAMES = 4
#: Frames of STFT columns after frame t that phase reconstruction sees before frame t is committed (>= 1).
GL_LOOKAHEAD_FRAMES = 1
#: Fast Griffin-Lim's momentum (librosa's default, used by the offline decode).
MOMENTUM = 0.99


def check_active(active, batch_size: int, n: int) -> torch.Tensor | None:
    """``active`` of a push as a ``(batch_size, n)`` bool tensor (``None`` stays ``None``: every row speaks); ValueError
    (one line) for another shape or a row that speaks again after a silent frame (a row's stream ends for good)."""
    if active is None:
        return None
    active = torch.as_tensor(active, dtype=torch.bool).cpu()
    if tuple(active.shape) != (batch_size, n):
        raise ValueError(f"active must be (batch_size, frames) = ({batch_size}, {n}) booleans, got "
                         f"{tuple(active.shape)}")
    if bool((active[:, 1:] & ~active[:, :-1]).any()):
        raise ValueError("a row's active frames must come first: once a row has ended (False) it stays ended")
    return active


class StreamingRVQDecoder:
    """Stateful streaming decoder over an :class:`RVQCodec` (or a ``CodecSpeechTokenizer``): push codes, get the audio
    of the frames whose look-ahead has arrived; :meth:`flush` returns the rest (module docstring). Rows may end at
    different frames (``push(codes, active)``): a row that ends is flushed there, as a stream of that row alone would
    be, so each row's audio is bit for bit its own stream's, whatever the other rows do.

    Args:
        codec: the codec (its neural code decoder when attached, else its tables; its Griffin-Lim iterations per
            frame and initial phases' seed). batch_size: rows of the first stream.
        gl_lookahead_frames: frames of STFT columns after a frame that phase reconstruction sees first (>= 1).
        ramp_frames: frames per step of the code decoder's start-up look-ahead (:data:`RAMP_FRAMES`; 0: the full
            look-ahead from the first frame).
    The code decoder's window: :data:`CONTEXT_FRAMES` and :data:`LOOKAHEAD_FRAMES` (ignored by the table decoder).

    Raises:
        ValueError: ``gl_lookahead_frames < 1``, ``ramp_frames < 0``, a codec with ``griffin_lim_iters < 1``.

    Attributes: the codec's ``n_codebooks``, ``codebook_size``, ``frame_samples`` and ``sample_rate``;
    ``lookahead_frames`` (a frame's wait before its audio comes out once the ramp is over), ``first_audio_frames``
    (frames pushed before the first audio comes out), ``frames`` (pushed), ``emitted`` (frames whose audio was
    returned).
    """

    def __init__(self, codec, batch_size: int = 1, *, gl_lookahead_frames: int = GL_LOOKAHEAD_FRAMES,
                 ramp_frames: int = RAMP_FRAMES):
        codec = getattr(codec, "codec", codec)  # a CodecSpeechTokenizer holds its RVQCodec
        if type(codec).__name__ != "RVQCodec":  # by name: this layer sits below the models that define it
            raise ValueError(f"expected an RVQCodec or a CodecSpeechTokenizer, got {type(codec).__name__}: for the "
                             "official 12 Hz decoder use StreamingCodecDecoder")
        if gl_lookahead_frames < 1:
            raise ValueError(f"need gl_lookahead_frames >= 1 (the STFT columns of a frame reach into the next), got "
                             f"{gl_lookahead_frames}")
        if ramp_frames < 0:
            raise ValueError(f"need ramp_frames >= 0 (0: no ramp), got {ramp_frames}")
        c = codec.config
        self.codec = codec
        self.neural = codec.code_decoder is not None
        self.context = CONTEXT_FRAMES if self.neural else 0
        self.code_lookahead = LOOKAHEAD_FRAMES if self.neural else 0
        self.gl_lookahead = int(gl_lookahead_frames)
        self.gl_iters = int(c.griffin_lim_iters)
        if self.gl_iters < 1:
            raise ValueError(f"the codec's griffin_lim_iters must be >= 1, got {self.gl_iters}")
        self.seed = int(c.seed)
        self.ramp = int(ramp_frames)
        self.lookahead_frames = self.code_lookahead + self.gl_lookahead
        self.first_audio_frames = self.gl_lookahead + self.code_lookahead_at(self.gl_lookahead) + 1
        self.n_codebooks, self.codebook_size = int(c.n_codebooks), int(c.codebook_size)
        self.frame_samples, self.sample_rate = int(c.frame_samples), int(c.sample_rate)
        self.hop, self.n_fft, self.stack = int(c.hop_samples), int(c.n_fft), int(c.stack)
        win = torch.hann_window(int(c.win_samples), periodic=True)  # librosa's 'hann'
        pad = (self.n_fft - win.shape[0]) // 2
        self.window = F.pad(win, (pad, self.n_fft - win.shape[0] - pad))  # (n_fft,), centred as librosa pads it
        self._wsum: dict[int, torch.Tensor] = {}
        self.reset(batch_size)

    def code_lookahead_at(self, t: int) -> int:
        """Code frames after frame ``t`` that its code-decoder window holds: ``min(LOOKAHEAD_FRAMES, t // ramp)``
        (the full look-ahead without a ramp; 0 for the table decoder)."""
        return min(self.code_lookahead, t // self.ramp) if self.ramp else self.code_lookahead

    # ------------------------------------------------------------------------------------------------------ state
    def reset(self, batch_size: int = 1) -> None:
        """Start a fresh stream of ``batch_size`` rows.

        Raises:
            ValueError: ``batch_size < 1``.
        """
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.frames = 0  # frames pushed
        self.emitted = 0  # frames whose audio was returned
        self._rows = [_RowStream(self) for _ in range(self.batch_size)]
        self._ended = False

    def push(self, codes, active=None) -> torch.Tensor:
        """Add ``codes`` ``(batch_size, 16, n)`` (the official decoder's layout); return ``(batch_size, m * 1920)``
        float32 audio at 24 kHz of the m frames this push completes (m = 0 while the first ``lookahead_frames``
        arrive). ``active``: ``(batch_size, n)`` bool, default all True; a row's first False frame ends its stream
        there (its later codes are ignored): its held-back frames are flushed as its stream alone would be and come
        out in step with the other rows, then silence. ValueError (one line): bad codes or ``active``, or a push
        after :meth:`flush` without :meth:`reset`."""
        if self._ended:
            raise ValueError("this stream was flushed: call reset() to start a new one")
        codes = check_codes_chunk(codes, self.n_codebooks, self.codebook_size, self.batch_size)
        n = codes.shape[2]
        active = check_active(active, self.batch_size, n)
        for b, row in enumerate(self._rows):
            k = n if active is None else int(active[b].sum())
            if row.ended and k:
                raise ValueError(f"row {b} ended in an earlier push: it cannot speak again before reset()")
            if not row.ended:
                row.push(codes[b, :, :k].cpu())
                if k < n:
                    row.flush()
        self.frames += n
        return self._release(all(r.ended for r in self._rows))

    def flush(self) -> torch.Tensor:
        """End of stream: decode the frames still held back (their windows and columns cut at the last frame, as the
        offline decode's are) and return their audio, ``(batch_size, m * 1920)`` float32. Call :meth:`reset` to
        start another stream."""
        if self._ended:
            return torch.zeros(self.batch_size, 0)
        self._ended = True
        for row in self._rows:
            if not row.ended:
                row.flush()
        return self._release(True)

    def _release(self, everything: bool) -> torch.Tensor:
        """The audio every row has ready, in step: as many frames as the rows still speaking have (all that is ready
        when ``everything``); a row that ended has silence after its own frames."""
        ready = [r.out.shape[0] for r in self._rows if not r.ended or everything]
        m = (min(ready) if ready and not everything else max(ready, default=0)) // self.frame_samples
        out = torch.zeros(self.batch_size, m * self.frame_samples)
        for b, row in enumerate(self._rows):
            got = row.out[:m * self.frame_samples]
            out[b, :got.shape[0]] = got
            row.out = row.out[got.shape[0]:]
        self.emitted += m
        return out

    def wsum(self, n_cols: int) -> torch.Tensor:
        """Overlap-added squared window of ``n_cols`` STFT columns, ``(hop * (n_cols - 1) + n_fft,)``."""
        if n_cols not in self._wsum:
            w2 = (self.window ** 2)[None, :, None].expand(1, self.n_fft, n_cols)
            self._wsum[n_cols] = F.fold(w2, (1, self.hop * (n_cols - 1) + self.n_fft), (1, self.n_fft),
                                        stride=(1, self.hop))[0, 0, 0]
        return self._wsum[n_cols]


class _RowStream:
    """One row of a :class:`StreamingRVQDecoder`. Rows are decoded one at a time and each frame's computations have
    the same shapes whatever the chunking: Griffin-Lim is chaotic (a relative change of 1e-7 in its magnitudes, a
    different rounding of one matrix product, moves the waveform by up to 0.15 while the spectrum stays), so the same
    audio for any chunking and any batch needs the same arithmetic, not merely the same mathematics."""

    def __init__(self, cfg: StreamingRVQDecoder):
        self.cfg = cfg
        self.frames = 0  # frames pushed
        self.emitted = 0  # frames committed
        self.codes = torch.zeros(cfg.n_codebooks, 0, dtype=torch.long)  # (G, frames kept)
        self.codes_start = 0  # absolute frame of codes[:, 0]
        self.mag = torch.zeros(cfg.n_fft // 2 + 1, 0)  # (bins, columns kept)
        self.mag_start = 0  # absolute STFT column of mag[:, 0]
        self.vectors_done = 0  # frames whose magnitude columns are known
        self.est = torch.zeros(0)  # estimate of the samples from emitted * 1920 on
        self.past = torch.zeros(cfg.n_fft)  # the n_fft committed samples before them (zeros before the start)
        self.cols_started = 0  # STFT columns some commit has iterated on
        self.out = torch.zeros(0)  # committed samples not yet returned (the batch returns its rows in step)
        self.ended = False  # flushed: its stream is over

    def push(self, codes: torch.Tensor) -> None:  # (G, n): the audio it completes goes to ``out``
        cfg = self.cfg
        self.codes = torch.cat([self.codes, codes], -1)
        self.frames += codes.shape[1]
        until = self.vectors_done
        while until + cfg.code_lookahead_at(until) < self.frames:  # the frames whose window has arrived
            until += 1
        self._advance_vectors(until)
        self.out = torch.cat([self.out, self._commit(self.vectors_done - cfg.gl_lookahead)])

    def flush(self) -> None:
        self.ended = True
        self._advance_vectors(self.frames)
        if self.frames:  # the offline decode's last STFT column (centred just past the end) repeats the last one
            self.mag = torch.cat([self.mag, self.mag[:, -1:]], -1)
        self.out = torch.cat([self.out, self._commit(self.frames)])

    # ------------------------------------------------------------------------------------------------- vectors
    def _advance_vectors(self, until: int) -> None:
        """Magnitude columns of frames ``[vectors_done, until)``, frame by frame, each from its code-decoder window
        (the table decoder: its own codes)."""
        cfg, c = self.cfg, self.cfg.codec
        for t in range(self.vectors_done, until):
            if cfg.neural:
                lo, hi = max(0, t - cfg.context), min(self.frames, t + cfg.code_lookahead_at(t) + 1)
                window = self.codes[:, lo - self.codes_start:hi - self.codes_start].T[None]  # (1, w, G)
                with torch.no_grad():
                    vec = c.code_decoder(window)[0, t - lo]  # (dim,)
            else:
                col = self.codes[:, t - self.codes_start]
                vec = c.codebooks[torch.arange(cfg.n_codebooks), col].sum(0)  # (dim,)
            mel = torch.exp(vec.reshape(cfg.stack, -1).T)  # (n_mels, stack) mel power, as vectors_to_audio
            mag = torch.from_numpy(np.asarray(c.mel_to_magnitude(mel.numpy()), dtype=np.float32))  # (bins, stack)
            self.mag = torch.cat([self.mag, mag], -1)
        self.vectors_done = max(self.vectors_done, until)
        keep = self.vectors_done - cfg.context - cfg.code_lookahead - 1  # codes no later window reads
        if keep > self.codes_start:
            self.codes = self.codes[:, keep - self.codes_start:]
            self.codes_start = keep

    # ---------------------------------------------------------------------------------------------------- phase
    def _commit(self, until: int) -> torch.Tensor:
        """Commit frames ``[emitted, until)`` one by one; their audio ``(m * 1920,)`` float32."""
        until = min(until, self.frames)
        out = [self._commit_frame(t) for t in range(self.emitted, until)]
        self.emitted = max(self.emitted, until)
        return torch.cat(out) if out else torch.zeros(0)

    def _commit_frame(self, t: int) -> torch.Tensor:
        """Griffin-Lim over the STFT columns ``[j0, j1)`` from the first that overlaps frame t to the last of frame
        ``t + gl_lookahead`` (or the last there is, at the end of a stream: the same columns for any chunking), the
        samples before frame t held at their committed values; frame t's samples out."""
        cfg = self.cfg
        hop, n_fft, fs = cfg.hop, cfg.n_fft, cfg.frame_samples
        j0 = max(0, t * cfg.stack - 1)  # the first column overlapping frame t (centred STFT: column j at j * hop)
        j1 = min(self.mag_start + self.mag.shape[-1], (t + cfg.gl_lookahead + 1) * cfg.stack)
        s0 = j0 * hop - n_fft // 2  # the region's first sample (negative at the start: the zero padding)
        length = hop * (j1 - j0 - 1) + n_fft
        n_fixed = t * fs - s0  # samples before frame t: committed (<= n_fft of them)
        x = torch.zeros(length)
        x[:n_fixed] = self.past[n_fft - n_fixed:]
        n_est = min(self.est.shape[0], length - n_fixed)
        x[n_fixed:n_fixed + n_est] = self.est[:n_est]
        fixed = x[:n_fixed].clone()
        mag = self.mag[:, j0 - self.mag_start:j1 - self.mag_start]  # (bins, n_cols)
        wsum = cfg.wsum(j1 - j0)
        angles = torch.sgn(self._stft(x))
        for j in range(max(j0, self.cols_started), j1):  # columns no earlier commit iterated on: seeded phases
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + j)
            angles[:, j - j0] = torch.polar(torch.ones(mag.shape[0]),
                                            2 * math.pi * torch.rand(mag.shape[0], generator=g))
        self.cols_started = j1
        tprev = None
        for _ in range(cfg.gl_iters):  # fast Griffin-Lim, the update librosa.griffinlim runs offline
            x = self._istft(mag * angles, length, wsum, fixed)
            rebuilt = self._stft(x)
            angles = torch.sgn(rebuilt if tprev is None else rebuilt - (MOMENTUM / (1 + MOMENTUM)) * tprev)
            tprev = rebuilt
        x = self._istft(mag * angles, length, wsum, fixed)
        frame = x[n_fixed:n_fixed + fs]
        self.est = x[n_fixed + fs:]
        self.past = torch.cat([self.past, frame])[-n_fft:]
        drop = (t + 1) * cfg.stack - 1 - self.mag_start  # columns before the next commit's first
        if drop > 0:
            self.mag = self.mag[:, drop:]
            self.mag_start += drop
        return frame

    def _stft(self, x: torch.Tensor) -> torch.Tensor:  # (length,) -> (bins, n_cols)
        cfg = self.cfg
        return torch.fft.rfft(x.unfold(-1, cfg.n_fft, cfg.hop) * cfg.window, dim=-1).T

    def _istft(self, spec: torch.Tensor, length: int, wsum: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
        """Overlap-add of the windowed inverse FFTs over the window's squared sum (librosa's istft), with the
        committed samples put back."""
        cfg = self.cfg
        frames = torch.fft.irfft(spec.T, n=cfg.n_fft, dim=-1) * cfg.window  # (n_cols, n_fft)
        y = F.fold(frames.T[None], (1, length), (1, cfg.n_fft), stride=(1, cfg.hop))[0, 0, 0]
        y = torch.where(wsum > 1e-8, y / wsum.clamp_min(1e-8), torch.zeros(()))
        y[:fixed.shape[0]] = fixed
        return y
