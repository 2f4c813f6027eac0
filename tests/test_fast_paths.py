"""Fast paths are kept where they can be and never lost without a word: the C kernels are built in the cache folder,
else in a private temporary folder (an unwritable ``RVQSPEC_CACHE`` once cost the native forward, and ``--decoder
auto`` ran about five times slower saying nothing); where a fast path is missing, the command prints one line naming
the real cause and the fix (``build.note_slower``), once; the refusals name the real cause."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rvqspec_lib.device import streaming_codec
from rvqspec_lib.device.kernels import build, cpforward, snake
from rvqspec_lib.models import backends
from rvqspec_lib.models.configs import build_codec_decoder

REPO = Path(__file__).resolve().parent.parent
needs_cc = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                              reason="no C compiler here")


@pytest.fixture
def fresh_notes(monkeypatch):
    monkeypatch.setattr(build, "_NOTED", set())


@pytest.fixture
def unwritable_cache(tmp_path, monkeypatch):
    """``RVQSPEC_CACHE`` below a plain file (no one, root included, can create it) and the temporary folder in
    ``tmp_path``."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("RVQSPEC_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


@needs_cc
def test_an_unwritable_cache_builds_in_a_private_temporary_folder(unwritable_cache):
    out = build.build(snake.SOURCE, snake.CFLAGS)
    assert out.parent == unwritable_cache / "tmp" / f"rvqspec-{os.getuid()}" and out.is_file()
    assert oct(out.parent.stat().st_mode & 0o777) == "0o700"
    assert build.build(snake.SOURCE, snake.CFLAGS) == out  # found there the next time, not rebuilt
    lib = build.Library(snake.SOURCE, snake.CFLAGS, {"rvqspec_snake_f32": snake._ARGS})
    assert lib.load() is not None and lib.reason is None


def test_a_shared_or_foreign_folder_of_that_name_is_not_used(unwritable_cache):
    taken = unwritable_cache / "tmp" / f"rvqspec-{os.getuid()}"
    taken.mkdir(mode=0o777)
    os.chmod(taken, 0o777)  # anyone could have planted a library in it
    got = build.private_dir()
    assert got != taken and got.parent == unwritable_cache / "tmp" and got.name.startswith("rvqspec-kernels-")


def test_no_writable_folder_at_all_names_rvqspec_cache(unwritable_cache, monkeypatch):
    def nowhere():
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(build, "private_dir", nowhere)
    with pytest.raises(RuntimeError, match=r"cannot be written to .*a-file/cache .*nor to a temporary folder "
                                           r"\(Permission denied\): set RVQSPEC_CACHE to a writable folder"):
        build.build(snake.SOURCE, snake.CFLAGS)


def test_the_native_refusal_names_the_real_cause_and_the_note_comes_once(tmp_path, monkeypatch, capsys, fresh_notes):
    monkeypatch.setenv("RVQSPEC_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that fails without a word
    monkeypatch.setattr(cpforward, "_LIB", build.Library(cpforward.SOURCE, cpforward.CFLAGS, {}, cpforward._x86_64))
    ok, why = backends.available("native")
    assert not ok and why == "the native forward cannot be built here: false failed: exit status 1 (set CC to " \
                             "another C compiler)"
    assert "x86-64" not in why  # the cause it once named whatever the cause
    with pytest.raises(ValueError, match="backend native is not available here: the native forward cannot be built "
                                         "here: false failed"):
        backends.check_available("native")
    assert capsys.readouterr().err == ""  # asking is not running slower: no note
    for _ in range(2):
        assert not backends.available_or_note("native", instead="--decoder auto chooses among the official module's "
                                                                 "decoders alone")
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: the native backend is unavailable here, so this runs slower: the native forward cannot be "
                   "built here: false failed: exit status 1 (set CC to another C compiler); --decoder auto chooses "
                   "among the official module's decoders alone"]


def test_the_snake_kernel_and_onednn_say_when_they_are_missing(monkeypatch, capsys, fresh_notes):
    monkeypatch.setattr(snake, "_LIB", build.Library(snake.SOURCE, snake.CFLAGS, {}, lambda: (_ for _ in ()).throw(
        RuntimeError("planted: this CPU cannot run it"))))
    x = torch.randn(1, 4, 1, 8).contiguous(memory_format=torch.channels_last)
    alpha, inv_beta = torch.rand(4), torch.rand(4)
    want = x + inv_beta.view(1, 4, 1, 1) * torch.sin(x * alpha.view(1, 4, 1, 1)) ** 2
    for _ in range(2):
        assert torch.allclose(snake.snake(x, alpha, inv_beta), want, atol=1e-6)
    assert capsys.readouterr().err.splitlines() == [
        "note: the SnakeBeta kernel of the streaming codec decoder is unavailable here, so this runs slower: planted: "
        "this CPU cannot run it; torch operations compute it instead (five passes over memory)"]
    monkeypatch.setattr(streaming_codec, "onednn_available", lambda: (False, "planted: no oneDNN"))
    dec = streaming_codec.StreamingCodecDecoder(build_codec_decoder("tiny", seed=0))
    assert dec.backend == "official"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("note: the streaming codec decoder's oneDNN backend is unavailable "
                                               "here, so this runs slower: planted: no oneDNN; the official modules")
    streaming_codec.StreamingCodecDecoder(build_codec_decoder("tiny", seed=0), backend="official")
    assert capsys.readouterr().err == ""  # asked for: nothing lost


@needs_cc
@pytest.mark.skipif(not cpforward.available(), reason="the native forward does not build here")
def test_synth_through_the_native_forward_with_an_unwritable_cache(tmp_path):
    """As a user would: ``RVQSPEC_CACHE`` unwritable, ``--backend native`` still runs (built in the private folder),
    no note."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "RVQSPEC_CACHE": str(tmp_path / "a-file" / "cache"), "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "rvqspec_lib.cli.main", "synth", "--model", "tiny-random", "--text",
                        "Hi there.", "--backend", "native", "--max-frames", "2", "--out", str(tmp_path / "x.wav")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "(native" in r.stdout and "unavailable" not in r.stderr
    assert list((tmp_path / "tmp" / f"rvqspec-{os.getuid()}").glob("cpforward-*.so"))
