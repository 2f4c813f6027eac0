"""The phone being spoken at each 80 ms code frame, from the synthesiser itself: flite prints every phone's end time
with ``-psdur``; used by the codec probe's predictability check and by the learned codec's data stage.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from rvqspec_lib.data import voices
from rvqspec_lib.models.audio import FRAME_SAMPLES, SAMPLE_RATE, load_wav

#: The phone flite writes for a pause (silence): frames aligned to it are not speech frames.
SILENCE = "pau"
#: flite's option that holds the pitch at the voice's mean (no intonation): the phones and their timing stay the same.
FLAT_PITCH = ("--setf", "int_f0_target_stddev=0")
#: Frames since the phone began are counted up to this cap (0, 1, 2 = "2 or more").
MAX_POSITION = 2


def parse_psdur(text: str) -> list[tuple[str, float]]:
    """flite's ``-psdur`` output (``pau:0.197 th:0.292 ...``) -> ``[(phone, end time in s)]``.

    Raises:
        ValueError: a field that is not ``phone:seconds``.
    """
    out = []
    for field in text.split():
        phone, sep, end = field.rpartition(":")
        try:
            out.append((phone, float(end)))
        except ValueError:
            sep = ""
        if not sep or not phone:
            raise ValueError(f"not flite -psdur output: {field!r} is not phone:seconds")
    return out


def frame_phones(phones: Sequence[tuple[str, float]], n_frames: int, frame_s: float = FRAME_SAMPLES / SAMPLE_RATE
                 ) -> tuple[list[str], np.ndarray]:
    """Each code frame's phone (the one spoken at the frame's centre; after the last end: :data:`SILENCE`) and the
    frame's position inside it (frames since the phone began, capped at :data:`MAX_POSITION`).

    Returns:
        ``(phones: n_frames names, positions: (n_frames,) int64)``.
    """
    ends = np.array([e for _, e in phones], dtype=np.float64)
    names, pos, prev = [], np.zeros(n_frames, np.int64), None
    for i in range(n_frames):
        j = int(np.searchsorted(ends, (i + 0.5) * frame_s, side="right"))  # first phone ending after the centre
        names.append(phones[j][0] if j < len(phones) else SILENCE)
        pos[i] = 0 if j != prev else min(pos[i - 1] + 1, MAX_POSITION)
        prev = j
    return names, pos


def render_with_phones(text: str, voice: str, sample_rate: int = SAMPLE_RATE,
                       flat_pitch: bool = False) -> tuple[np.ndarray, list]:
    """Speak ``text`` with a flite voice as :func:`rvqspec_lib.data.voices.render_one` does (the same resampling),
    keeping the phones flite prints with ``-psdur``: ``(wav (samples,) float32 at sample_rate, [(phone, end s)])``.
    ``flat_pitch``: hold the pitch at the voice's mean (:data:`FLAT_PITCH`; the same phones and timing).

    Raises:
        ValueError: a voice of another engine (only flite prints its phones). MissingVoiceError; RuntimeError.
    """
    v = voices.check_voice(voice)
    if v.engine != "flite":
        raise ValueError(f"voice {v.name!r} is spoken by {v.engine}, which prints no phone timing: use a flite voice "
                         f"({', '.join(n for n, x in voices.VOICES.items() if x.engine == 'flite')})")
    with tempfile.TemporaryDirectory(prefix="rvqspec-probe-") as tmp:
        txt, raw, res = Path(tmp) / "text.txt", Path(tmp) / "raw.wav", Path(tmp) / "out.wav"
        txt.write_text(text.strip() + "\n", encoding="utf-8")
        phones = None
        for cmd in (v.command(str(txt), str(raw)) + ["-psdur", *(FLAT_PITCH if flat_pitch else ())],
                    ["sox", *voices.SOX_ARGS, str(raw), "-r", str(sample_rate), "-c", "1", "-b", "16", str(res)]):
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if r.returncode != 0:
                raise RuntimeError(f"{cmd[0]} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}")
            phones = parse_psdur(r.stdout) if phones is None else phones
        return load_wav(res, sample_rate), phones
