"""``rvqspec synth --stream`` (docs/streaming.md): a WAV that grows chunk by chunk and is a valid WAV at every moment
(also after Ctrl-C), a WAV stream on standard output (a reader that closes it early stops the run cleanly), time to
first audio, RTF and underruns in the line and the JSON; bad input is one line before the model loads."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import rvqspec_lib.models.loader as loader
from rvqspec_lib.cli.main import main
from rvqspec_lib.cli.synth import stopped_at_cap
from rvqspec_lib.models.audio import WAV_HEADER_BYTES, WavWriter
from rvqspec_lib.models.backends import available

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
TEXT = "The weather is fine today."
FAST = ["--backend", "native", "--talker", "native"] if available("native")[0] else []


def _no_load(*a, **k):
    pytest.fail("the model was loaded before the check")


def _synth(tmp_path, *extra, model="embedded", out="x.wav"):
    target = out if out == "-" else str(tmp_path / out)
    return main(["synth", "--model", model, "--text", TEXT, "--out", target, "--stream", *extra])


@pytest.mark.parametrize("argv, needle", [
    ("--out OUT/x.wav --stream --chunk-frames 0", "--chunk-frames must be in 1..--max-frames (200) frames of 80 ms, "
                                                  "got 0"),
    ("--out OUT/x.wav --stream --chunk-frames 9 --max-frames 8", "--chunk-frames must be in 1..--max-frames (8)"),
    ("--out OUT/x.flac --stream", "--stream writes a WAV as it grows: give --out x.wav"),
    ("--out OUT/x.wav --stream --model tiny-random", "tiny-random has no codec (random weights: codes only): drop "
                                                     "--stream"),
    ("--out OUT/x.wav --chunk-frames 2", "--chunk-frames is for --stream"),
    ("--out -", "--out - (a WAV stream on standard output) is for --stream"),
    ("--out /proc/rvqspec-no/x.wav --stream", "the folder /proc/rvqspec-no cannot be created in /proc"),
    ("--out OUT/x.wav --stream --json OUT/x.npy", "--json"),
])
def test_bad_stream_flags_fail_before_loading(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(loader, "load_model", _no_load)
    extra = argv.replace("OUT", str(tmp_path)).split()
    assert main(["synth", "--model", "embedded", "--text", TEXT, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and err.count("\n") == 1 and needle in err, err
    assert not any(tmp_path.iterdir())


def test_text_file_is_refused_with_stream(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader, "load_model", _no_load)
    (tmp_path / "t.txt").write_text("one\ntwo\n")
    assert main(["synth", "--model", "embedded", "--text-file", str(tmp_path / "t.txt"), "--out",
                 str(tmp_path / "x.wav"), "--stream"]) == 2
    assert "--stream speaks one --text" in capsys.readouterr().err


def test_wav_writer_is_valid_after_every_chunk(tmp_path):
    path = tmp_path / "w.wav"
    with WavWriter(path, 24000) as w:
        assert sf.info(str(path)).frames == 0
        for k in range(1, 4):
            w.write(np.full(1920, 0.5 * (-1) ** k, dtype=np.float32))
            wav, sr = sf.read(str(path))  # read while it is being written
            assert sr == 24000 and wav.shape == (1920 * k,) and abs(wav[-1]) == pytest.approx(0.5, abs=1e-4)
        w.write(np.array([2.0, -3.0], dtype=np.float32))  # clipped, not wrapped
    assert sf.read(str(path))[0][-2:] == pytest.approx([1.0, -1.0], abs=1e-4)


def test_wav_writer_on_a_pipe_has_an_open_ended_header():
    r, w = os.pipe()
    with os.fdopen(w, "wb") as f, WavWriter(f, 24000) as out:
        assert not out.seekable
        out.write(np.zeros(10, dtype=np.float32))
    data = os.read(r, 1000)
    os.close(r)
    assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
    assert data[36:40] == b"data" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert len(data) == WAV_HEADER_BYTES + 20


needs_native = pytest.mark.skipif(not FAST, reason="the native forward does not build here")


@needs_native
def test_stream_writes_a_wav_codes_and_json_with_first_audio_rtf_underruns(tmp_path, capsys):
    js = tmp_path / "x.json"
    assert _synth(tmp_path, *FAST, "--max-frames", "8", "--chunk-frames", "2", "--json", str(js)) == 0
    out, err = capsys.readouterr()
    stats = json.loads(js.read_text())
    wav, sr = sf.read(tmp_path / "x.wav")
    assert sr == 24000 and wav.shape == (stats["frames"] * 1920,) and np.isfinite(wav).all()
    assert np.load(tmp_path / "x.npy").shape == (stats["frames"], 16) and stats["stream"] is True
    assert stats["audio_s"] == pytest.approx(stats["frames"] / 12.5) and stats["chunk_frames"] == 2
    assert stats["rtf"] == pytest.approx(stats["wall_s"] / stats["audio_s"])
    assert stats["ttfa_call_ms"] == pytest.approx(stats["ttfa_ms"] + stats["prompt_ms"])
    assert stats["underruns"] == sum(x > 0 for x in stats["late_ms"]) and stats["lookahead_frames"] == 3
    assert f"time to first audio {stats['ttfa_ms']:.0f} ms after the prompt" in out
    assert f"RTF {stats['rtf']:.2f}" in out and f"{stats['underruns']} underrun(s)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.npy", "x.wav"]
    # the cap: said as without --stream (embedded's utterance of TEXT runs past 8 frames)
    capped = stats["frames"] == 8
    assert stats["ended_by_itself"] is (not capped)
    assert ("stopped at --max-frames 8 before the model ended" in err) is capped
    assert stats["notes"].count(stopped_at_cap(8)) == capped
    # control: an utterance the model ends by itself (the embedded model ends TEXT well within 200 frames)
    assert _synth(tmp_path, *FAST, "--json", str(js), out="y.wav") == 0
    stats = json.loads(js.read_text())
    assert stats["frames"] < 200 and stats["ended_by_itself"] is True
    assert "stopped at --max-frames" not in capsys.readouterr().err and stopped_at_cap(200) not in stats["notes"]


@needs_native
def test_ctrl_c_mid_stream_leaves_a_valid_wav_of_the_chunks_so_far(tmp_path, capsys, monkeypatch):
    from rvqspec_lib.device import streaming_rvq

    pushes = []
    real = streaming_rvq.StreamingRVQDecoder.push

    def push(self, codes, active=None):
        pushes.append(1)
        if len(pushes) == 6:
            raise KeyboardInterrupt
        return real(self, codes, active)

    monkeypatch.setattr(streaming_rvq.StreamingRVQDecoder, "push", push)
    assert _synth(tmp_path, *FAST, "--max-frames", "10", "--json", str(tmp_path / "x.json")) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "rvqspec: interrupted"
    wav, sr = sf.read(tmp_path / "x.wav")  # five frames pushed, look-ahead ramping up from 1 frame: three came out
    assert sr == 24000 and wav.shape == (3 * 1920,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.wav"]  # no codes, no JSON: those are all or nothing


@needs_native
def test_stdout_is_a_wav_stream_and_a_closed_pipe_stops_cleanly(tmp_path):
    cmd = [sys.executable, "-m", "rvqspec_lib.cli.main", "synth", "--model", "embedded", "--text", TEXT, "--out", "-",
           "--stream", "--max-frames", "6", *FAST]
    whole = subprocess.run(cmd, capture_output=True, env=ENV, cwd=REPO, timeout=300)
    assert whole.returncode == 0, whole.stderr.decode()
    data = whole.stdout
    assert data[:4] == b"RIFF" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert (len(data) - WAV_HEADER_BYTES) % (2 * 1920) == 0 and len(data) > WAV_HEADER_BYTES
    assert b"time to first audio" in whole.stderr and b"Traceback" not in whole.stderr
    # a reader that stops after the header: the run ends with status 0, a note, no traceback
    p = subprocess.Popen(cmd[:-len(FAST) - 2] + ["--max-frames", "60", *FAST], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV, cwd=REPO)
    assert p.stdout.read(WAV_HEADER_BYTES)[:4] == b"RIFF"
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0, err
    assert "closed it after" in err and "Traceback" not in err and "Exception ignored" not in err


@needs_native
def test_ctrl_c_from_a_real_signal_mid_stream(tmp_path):
    """SIGINT to a real `rvqspec synth --stream` once its WAV has grown: status 130, the one line, no traceback, and
    the file is a valid WAV of the whole frames written so far."""
    import signal
    import time

    out = tmp_path / "x.wav"
    p = subprocess.Popen([sys.executable, "-m", "rvqspec_lib.cli.main", "synth", "--model", "embedded", "--text", TEXT,
                          "--out", str(out), "--stream", "--max-frames", "200", "--greedy", *FAST],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=REPO,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and p.poll() is None and not (
                out.is_file() and out.stat().st_size > WAV_HEADER_BYTES):
            time.sleep(0.05)
        assert out.is_file() and out.stat().st_size > WAV_HEADER_BYTES, p.communicate(timeout=60)
        p.send_signal(signal.SIGINT)
        err = p.communicate(timeout=120)[1].decode()
    finally:
        if p.poll() is None:
            p.kill()
    if p.returncode == 0:  # the utterance ended before the signal arrived: nothing to interrupt
        pytest.skip("the stream ended before the signal")
    assert p.returncode == 130 and err.endswith("rvqspec: interrupted\n") and "Traceback" not in err, err
    wav, sr = sf.read(out)
    assert sr == 24000 and wav.size > 0 and wav.size % 1920 == 0
    assert sorted(q.name for q in tmp_path.iterdir()) == ["x.wav"]
