"""The ``rvqspec`` command line (rvqspec_lib/cli/): one module per command, fast --help, one --threads rule,
checks before the model loads, atomic outputs, timing fields, Ctrl-C, model-config errors.

Other CLI tests: tests/test_frame.py (synth), tests/test_drafters.py (train-drafter, eval-acceptance),
tests/test_embedded_model.py (synth on the embedded model), tests/test_bench.py (bench).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rvqspec_lib.models.loader as loader
from rvqspec_lib.cli import common
from rvqspec_lib.cli.main import main

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
HEAVY = ("torch", "transformers")


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _status(argv) -> int:
    """``main``'s exit status; a value the parser refuses (out of range, not a choice) exits 2 there."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ---------------------------------------------------------------------------------------------------------------------
# --help is fast: no torch, no transformers
# ---------------------------------------------------------------------------------------------------------------------
_PROBE = """
import json, sys
from rvqspec_lib.cli.main import main
try:
    main({argv!r})
except SystemExit:
    pass
{extra}
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})), file=sys.stderr)
"""


def _heavy_modules_after(argv: list[str], extra: str = "") -> list[str]:
    code = _PROBE.format(argv=argv, extra=extra, heavy=HEAVY)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    return json.loads(r.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["synth", "--help"], ["bench", "--help"], ["train-drafter", "--help"],
                                  ["eval-acceptance", "--help"]])
def test_help_does_not_import_torch(argv):
    assert _heavy_modules_after(argv) == []


def test_help_probe_sees_torch_when_it_is_imported():
    """Negative control: the same probe reports torch once a public name is used (the lazy API imports it)."""
    found = _heavy_modules_after(["--help"], extra="import rvqspec_lib; rvqspec_lib.Tree().tree(15)")
    assert "torch" in found


def test_public_api_resolves_lazily():
    import rvqspec_lib

    for name in rvqspec_lib.__all__:
        assert getattr(rvqspec_lib, name) is not None
    assert set(rvqspec_lib.__all__) <= set(dir(rvqspec_lib))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rvqspec_lib.nope  # noqa: B018


# ---------------------------------------------------------------------------------------------------------------------
# constants defined once
# ---------------------------------------------------------------------------------------------------------------------
def test_default_tree_and_windows_come_from_one_place():
    from rvqspec_lib.cli.eval_acceptance import decoder_names
    from rvqspec_lib.decoding.decoders import (
        CHAIN_WINDOWS,
        DEFAULT_TREE,
        DEFAULT_WINDOW,
        MAX_WINDOW,
        Chain,
        Tree,
    )

    assert CHAIN_WINDOWS == tuple(range(2, MAX_WINDOW + 1)) and Chain().window == DEFAULT_WINDOW
    Chain(MAX_WINDOW)
    with pytest.raises(ValueError, match=f"2..{MAX_WINDOW}"):
        Chain(MAX_WINDOW + 1)
    sweep = [n.decoder() for n in decoder_names(None)]
    assert [d.window for d in sweep[:-1]] == list(CHAIN_WINDOWS) and sweep[-1] == Tree(DEFAULT_TREE)
    assert decoder_names("tree")[0].label == "tree:0;1;0,0;0,0,0"  # the default tree's name, from DEFAULT_TREE
    # no second copy of the literals in the library
    lib = {p: p.read_text() for p in (REPO / "rvqspec_lib").rglob("*.py")}
    assert [p.name for p, s in lib.items() if "((0,), (1,), (0, 0), (0, 0, 0))" in s] == ["decoders.py"]
    assert not [p.name for p, s in lib.items() if p.parent.name == "cli" and "0;1;0,0;0,0,0" in s]
    assert not [p.name for p, s in lib.items() if "range(2, 9)" in s]


def test_sampling_describe_is_the_one_dict():
    from rvqspec_lib.decoding.sampling import Sampling

    assert Sampling(temperature=0.7, top_k=5, top_p=0.5).describe() == {
        "temperature": 0.7, "top_k": 5, "top_p": 0.5, "greedy": False}
    assert Sampling(greedy=True).describe()["greedy"] is True
    copies = [p for p in list((REPO / "rvqspec_lib").rglob("*.py")) + list((REPO / "notebooks").glob("*.py"))
              if '"temperature": sampling' in p.read_text() or "'temperature': sampling" in p.read_text()]
    assert copies == []


# ---------------------------------------------------------------------------------------------------------------------
# --threads: default 1, 0 = torch's choice, the command's flag wins over the global one
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("glob, sub, expected", [(None, None, 1), (2, None, 2), (None, 3, 3), (2, 3, 3), (0, None, 0),
                                                 (2, 0, 0), (0, 2, 2)])
def test_resolve_threads(glob, sub, expected):
    assert common.resolve_threads(sub, glob) == expected


def test_negative_threads_is_a_one_line_error(capsys):
    assert _status(["--threads", "-1", "bench", "latency", "--model", "tiny-random"]) == 2
    assert capsys.readouterr().err == "rvqspec: error: --threads must be >= 0 (0 keeps torch's choice), got -1\n"


@pytest.fixture
def fake_threads(monkeypatch):
    """torch.set_num_threads recorded instead of applied (the test process keeps its one thread)."""
    calls: list[int] = []
    real = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: calls[-1] if calls else real)
    return calls


@pytest.mark.parametrize("before, after, set_calls, shown", [
    ([], [], [1], 1),
    (["--threads", "2"], [], [2], 2),  # the global flag is no longer overridden by the command's default
    ([], ["--threads", "0"], [], "torch"),  # 0 was refused by bench before
    (["--threads", "2"], ["--threads", "3"], [3], 3),
])
def test_bench_threads(tmp_path, capsys, fake_threads, before, after, set_calls, shown):
    out = tmp_path / "b.json"
    assert main([*before, "bench", "latency", "--model", "tiny-random", "--repeats", "1", "--warmup", "0", "--queries",
                 "1", "--no-progress", "--json", str(out), *after]) == 0
    assert fake_threads == set_calls
    want = torch.get_num_threads() if shown == "torch" else shown
    assert json.loads(out.read_text())["threads"] == want
    assert f"threads {want} " in capsys.readouterr().out


def test_every_command_reports_its_threads(tmp_path, capsys, fake_threads):
    assert main(["--threads", "2", "synth", "--model", "tiny-random", "--text", "Hi there.", "--out",
                 str(tmp_path / "a.wav"), "--max-frames", "2", "--json", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["threads"] == 2
    assert "| 2 threads" in capsys.readouterr().out
    assert main(["eval-acceptance", "--model", "tiny-random", "--frames", "4", "--decoder", "chain:4", "--json",
                 str(tmp_path / "e.json"), "--threads", "3"]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["threads"] == 3
    assert "| 3 threads" in capsys.readouterr().out
    out = tmp_path / "d.safetensors"
    assert main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "8", "--epochs", "1",
                 "--out", str(out)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["provenance"]["threads"] == 1
    assert "| 1 thread" in capsys.readouterr().out
    assert fake_threads == [2, 3, 1]


# ---------------------------------------------------------------------------------------------------------------------
# argparse's own errors: one line naming the fix, status 2, never the usage block
# ---------------------------------------------------------------------------------------------------------------------
def _parse_error(capsys, argv) -> str:
    """main(argv) must stop in the parser with status 2 and ONE line ``rvqspec: error: ...``; returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    err = captured.err
    assert captured.out == "" and "usage:" not in err and "Traceback" not in err, err
    assert err.startswith("rvqspec: error: ") and err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize("argv, line", [
    (["synth", "--dtype", "float16"],
     "--dtype float16 is not a precision rvqspec synth takes: use auto, float32, float64, bfloat16, int8 or "
     "int8-dynamic"),
    (["train-drafter", "--drafter", "bogus"],
     "--drafter bogus is not a drafter rvqspec train-drafter takes: use offsets or medusa"),
    (["eval-wer", "--dataset-kind", "common-voice"],
     "--dataset-kind common-voice is not a dataset kind rvqspec eval-wer takes: use fleurs, librispeech or voxpopuli"),
    (["bench", "latency", "--queries", "0"], "--queries 0: query positions are >= 1: give e.g. 1,2,4,8 (at most 1024)"),
    (["bench", "latency", "--queries", "1,x"], "--queries 1,x: give query positions as comma-separated whole numbers, "
                                               "e.g. 1,2,4,8"),
    (["bench", "latency", "--prefix-len", "eight"],
     "--prefix-len eight is not a whole number: give e.g. --prefix-len 8"),
    (["bench", "latency", "--noise-target", "two"],
     "--noise-target two is not a number: write a number after --noise-target"),
    (["--threads", "many", "bench"], "--threads many is not a whole number: write a whole number after --threads"),
    (["synth", "--model", "tiny-random", "--text", "Hi."],
     "rvqspec synth needs --out: add it (rvqspec synth --help describes every flag)"),
    (["synth", "--model", "tiny-random", "--out", "x.wav"],
     "rvqspec synth needs one of --text or --text-file: add one"),
    (["synth", "--model", "tiny-random", "--text", "Hi.", "--out"],
     "--out needs a value: give it after the flag (rvqspec synth --help)"),
    (["bench", "--bogus"], "rvqspec bench has no argument --bogus: rvqspec bench --help lists the flags"),
    (["bench", "frames", "--de", "cpu"], "--de could be --decoders or --device: write the flag out"),
    (["speak"], "'speak' is not an rvqspec command: use synth, prepare, train-drafter, eval-acceptance, export, "
                "eval-wer, extract-frames, train-drafter-parallel or bench (rvqspec --help says what each does)"),
    ([], "give a command: synth, prepare, train-drafter, eval-acceptance, export, eval-wer, extract-frames, "
         "train-drafter-parallel or bench (rvqspec --help says what each does)"),
])
def test_parser_errors_are_one_line_naming_the_fix(capsys, argv, line):
    assert _parse_error(capsys, argv) == f"rvqspec: error: {line}"


def test_every_choices_flag_of_every_command_is_one_line(capsys):
    """Solved once, for all commands: every sub-parser is the one-line parser, and each ``choices=`` flag of each
    command refuses a bad value in one line that lists its choices (no usage block)."""
    from rvqspec_lib.cli.common import OneLineParser
    from rvqspec_lib.cli.main import COMMANDS, build_parser, plugins

    subs = next(a for a in build_parser()._actions if a.dest == "cmd").choices
    assert set(subs) == set(COMMANDS) | set(plugins())
    checked = 0
    for name, sub in subs.items():
        assert isinstance(sub, OneLineParser), name
        for action in sub._actions:
            if action.option_strings and action.choices is not None:
                flag = max(action.option_strings, key=len)
                line = _parse_error(capsys, [name, flag, "no-such-value"])
                assert line.startswith(f"rvqspec: error: {flag} no-such-value is not ") and \
                    f"rvqspec {name} takes: use " in line and all(str(c) in line for c in action.choices), line
                checked += 1
    assert checked >= 8  # synth --dtype / --codes-to-audio, train-drafter --drafter / --loss / --dtype, ...


def test_a_bad_choice_from_a_real_process_is_one_line():
    """The console's view: status 2 and exactly one line on stderr, before torch is imported."""
    r = subprocess.run([sys.executable, "-m", "rvqspec_lib.cli.main", "synth", "--dtype", "float16"],
                       capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("rvqspec: error: --dtype float16 is not a precision rvqspec synth takes: use auto, float32, "
                        "float64, bfloat16, int8 or int8-dynamic\n")
    assert _heavy_modules_after(["synth", "--dtype", "float16"]) == []


def test_the_accelerate_entry_points_are_one_line_too(capsys):
    """``accelerate launch -m rvqspec_lib.cli.extract_frames / .train_drafter_parallel`` build their own parser."""
    from rvqspec_lib.cli import extract_frames, train_drafter_parallel

    for mod, argv, line in (
            (train_drafter_parallel, ["--drafter", "eagle"], "--drafter eagle is not a drafter rvqspec "
                                                              "train-drafter-parallel takes: use offsets or medusa"),
            (extract_frames, ["--model", "embedded", "--out", "x", "--batch-size", "8.5"],
             "--batch-size 8.5 is not a whole number: give e.g. --batch-size 8")):
        with pytest.raises(SystemExit) as e:
            mod.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err == f"rvqspec: error: {line}\n"


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: rvqspec bench")


# ---------------------------------------------------------------------------------------------------------------------
# synth: checks before any work (and before the model loads)
# ---------------------------------------------------------------------------------------------------------------------
def _synth(tmp_path, *extra, text="Hi there."):
    return _status(["synth", "--model", "tiny-random", "--text", text, "--out", str(tmp_path / "x.wav"), *extra])


@pytest.mark.parametrize("extra, needle", [
    (["--seed", str(2**64)], "--seed must be in 0..9223372036854775807"),
    (["--seed", "-1"], "--seed must be in 0.."),
    (["--max-frames", "0"], "--max-frames must be >= 1"),
    (["--language", "klingon"], "unsupported language 'klingon': use 'auto' or one of chinese, english"),
    (["--speaker", "nobody"], "unknown speaker 'nobody': this model's speakers are tiny"),
    (["--decoder", "tree:0;2048"], "tree rank 2048 is out of range for this model's codebook of 2048"),
    (["--decoder", "chain:9"], "Chain window must be an integer in 2..8"),
    (["--backend", "compile", "--dtype", "int8-dynamic"], "backend compile is not available here: the compile "
                                                          "backend runs float32 and bfloat16 modules"),
    (["--decoder", "ssd-lossy", "--frame", "fused", "--backend", "native"], "not LossySSD; or use --frame stepped"),
    (["--decoder", "auto", "--frame", "stepped"], "--decoder auto chooses how its decoder runs; drop --frame"),
    (["--codes-to-audio", "table"], "no offline codec"),
    (["--talker", "native", "--dtype", "float64"], "--talker native runs --dtype float32, bfloat16, int8 or "
                                                   "int8-dynamic, not float64: give one of those, or use --talker "
                                                   "official"),
])
def test_synth_bad_flags_fail_before_loading(tmp_path, capsys, extra, needle, no_load):
    assert _synth(tmp_path, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqspec: error: ") and err.count("\n") == 1 and needle in err, err
    assert "max_frames" not in err and _listing(tmp_path) == []


def test_synth_text_that_is_not_utf8(tmp_path, capsys, no_load):
    assert _synth(tmp_path, text="caf\udce9 au lait") == 2  # how Python passes the byte 0xE9 of a Latin-1 argv
    err = capsys.readouterr().err
    assert "--text is not valid UTF-8 (byte 0xe9 at character 3)" in err and err.count("\n") == 1


def test_synth_text_that_is_not_utf8_from_a_real_argv(tmp_path):
    """The same through a real process: argv bytes that are not UTF-8, refused before torch is even imported."""
    r = subprocess.run([sys.executable, "-m", "rvqspec_lib.cli.main", "synth", "--model", "tiny-random", "--text",
                        b"caf\xe9", "--out", str(tmp_path / "x.wav")], capture_output=True, env=ENV, cwd=REPO,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.decode() == ("rvqspec: error: --text is not valid UTF-8 (byte 0xe9 at character 3): convert it "
                                 "to UTF-8 (e.g. iconv -f latin1 -t utf-8)\n")


def test_synth_refuses_an_unwritable_codes_file_before_any_work(tmp_path, capsys, no_load):
    """The codes file beside the audio (a folder here) is checked with the audio and the JSON, before any work."""
    (tmp_path / "x.npy").mkdir()
    assert _synth(tmp_path, "--json", str(tmp_path / "x.json")) == 2
    err = capsys.readouterr().err
    assert f"--out (its codes file) {tmp_path / 'x.npy'} is a folder" in err and err.count("\n") == 1
    assert _listing(tmp_path) == ["x.npy"]  # no wav, no json, no temporary file


def test_synth_refuses_a_folder_where_no_file_can_be_created(tmp_path, capsys, no_load):
    """/proc takes no new files, whoever runs the test (root included)."""
    assert main(["synth", "--model", "tiny-random", "--text", "hi", "--out", "/proc/rvqspec-test.wav"]) == 2
    assert "--out /proc/rvqspec-test.wav is not writable" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--out", "--json"])
def test_synth_refuses_a_parent_folder_that_cannot_be_made(tmp_path, capsys, flag, no_load):
    """A missing parent folder is made by synth; one under a file, or in /proc, cannot be: one line, before work."""
    (tmp_path / "f").write_text("x")
    for bad, needle in ((tmp_path / "f" / "sub" / "x", f"{tmp_path / 'f'} is a file, not a folder"),
                        (Path("/proc/rvqspec-none/x"), "the folder /proc/rvqspec-none cannot be created in /proc")):
        args = {"--out": str(tmp_path / "a.wav"), "--json": None, flag: str(bad) + (".wav" if flag == "--out" else
                                                                                  ".json")}
        argv = [a for k, v in args.items() if v is not None for a in (k, v)]
        assert main(["synth", "--model", "tiny-random", "--text", "hi", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("rvqspec: error: ") and err.count("\n") == 1 and needle in err, err
    assert _listing(tmp_path) == ["f"]


def test_synth_creates_missing_parent_folders_of_out_and_json(tmp_path, capsys):
    out, js = tmp_path / "a" / "b" / "x.wav", tmp_path / "c" / "x.json"
    assert main(["synth", "--model", "tiny-random", "--text", "Hi there.", "--max-frames", "2", "--out", str(out),
                 "--json", str(js)]) == 0, capsys.readouterr().err
    assert out.with_suffix(".npy").is_file() and json.loads(js.read_text())["frames"] >= 1


# ---------------------------------------------------------------------------------------------------------------------
# synth: outputs are atomic; timings; the note for audio far shorter than the text
# ---------------------------------------------------------------------------------------------------------------------
def test_synth_writes_audio_codes_and_json_with_timings(tmp_path, capsys, tiny_with_audio):
    import soundfile as sf

    js = tmp_path / "x.json"
    assert _synth(tmp_path, "--max-frames", "3", "--json", str(js)) == 0
    assert _listing(tmp_path) == ["x.json", "x.npy", "x.wav"]  # and no temporary file left
    stats = json.loads(js.read_text())
    wav, sr = sf.read(tmp_path / "x.wav")
    assert sr == 24000 and len(wav) == stats["frames"] * 1920 and stats["codes_to_audio"] == "official"
    # issue 18: the RTF is synthesis alone (frame loop + codes to audio); load, the decoder's choice and start-up apart
    assert stats["audio_s"] == stats["frames"] / 12.5
    assert stats["rtf"] == (stats["synth_s"] + stats["decode_s"]) / stats["audio_s"]
    assert stats["rtf_total"] == stats["total_s"] / stats["audio_s"] and stats["rtf_total"] > stats["rtf"]
    parts = stats["startup_s"] + stats["load_s"] + stats["choose_s"] + stats["synth_s"] + stats["decode_s"]
    assert min(stats["load_s"], stats["synth_s"], stats["decode_s"]) > 0 and stats["total_s"] >= parts
    out = capsys.readouterr().out
    assert f"RTF {stats['rtf']:.2f} (synthesis alone; {stats['rtf_total']:.2f} with" in out
    assert f"load {stats['load_s']:.2f} s" in out and f"ar decoder {stats['choose_s']:.2f} s" in out


@pytest.mark.parametrize("exc, rc, msg", [(OSError(28, "No space left on device", "x.npy"), 2,
                                           "rvqspec: error: x.npy: No space left on device\n"),
                                          (KeyboardInterrupt(), 130, "rvqspec: interrupted\n")])
def test_synth_failure_while_writing_leaves_no_file(tmp_path, capsys, monkeypatch, tiny_with_audio, exc, rc, msg):
    """The wav is written first; a failure (full disk, Ctrl-C) while the codes are written leaves NO file behind:
    neither the wav nor a half-written or temporary file."""
    def broken_save(path, arr):
        Path(path).write_bytes(b"half")
        raise exc

    monkeypatch.setattr(np, "save", broken_save)
    (tmp_path / "keep.txt").write_text("unrelated")
    assert _synth(tmp_path, "--max-frames", "2", "--json", str(tmp_path / "x.json")) == rc
    assert capsys.readouterr().err.endswith(msg)
    assert _listing(tmp_path) == ["keep.txt"]


def test_synth_keeps_the_old_outputs_when_a_rerun_fails(tmp_path, capsys, monkeypatch, tiny_with_audio):
    assert _synth(tmp_path, "--max-frames", "2") == 0
    before = {p: (tmp_path / p).read_bytes() for p in ("x.wav", "x.npy")}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    import soundfile as sf

    monkeypatch.setattr(sf, "write", interrupted)
    assert _synth(tmp_path, "--max-frames", "3", "--seed", "1") == 130
    assert {p: (tmp_path / p).read_bytes() for p in ("x.wav", "x.npy")} == before
    assert _listing(tmp_path) == ["x.npy", "x.wav"]


def _force_ended(monkeypatch):
    """synthesize as usual, but the utterance reports that it ended by itself (a trained model's end-of-speech)."""
    import rvqspec_lib.models.frame as frame

    real = frame.synthesize

    def ended(*a, **k):
        res = real(*a, **k)
        res.ended = torch.ones(res.ended.shape, dtype=torch.bool)
        return res

    monkeypatch.setattr(frame, "synthesize", ended)


@pytest.mark.parametrize("words, frames, noted", [(40, 3, True), (2, 4, False), (20, 37, True), (20, 38, False)])
def test_synth_notes_audio_far_shorter_than_the_text(tmp_path, capsys, monkeypatch, words, frames, noted):
    """Under MIN_AUDIO_S_PER_WORD (0.15 s) of audio per word, an utterance that ended by itself gets a note and
    ``text_likely_cut_short``; at or above it, none (20 words need 3.0 s = 37.5 frames: 37 is short, 38 is not)."""
    from rvqspec_lib.cli.synth import MIN_AUDIO_S_PER_WORD

    assert MIN_AUDIO_S_PER_WORD == 0.15
    _force_ended(monkeypatch)
    js = tmp_path / "x.json"
    text = " ".join(["word"] * words)
    assert _synth(tmp_path, "--max-frames", str(frames), "--json", str(js), text=text) == 0
    stats = json.loads(js.read_text())
    assert stats["frames"] == frames and stats["ended_by_itself"] and stats["words"] == words
    assert stats["text_likely_cut_short"] is noted
    err = capsys.readouterr().err
    assert ("most of the text was probably not spoken; split it into sentences" in err) is noted
    assert (len([n for n in stats["notes"] if "split it into sentences" in n]) == 1) is noted


# ---------------------------------------------------------------------------------------------------------------------
# train-drafter, eval-acceptance: checks before the model loads
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["eval-acceptance", "--model", "tiny-random", "--decoder", "tree:0;5000"], "tree rank 5000"),
    (["eval-acceptance", "--model", "tiny-random", "--decoder", "paper"], "eval-acceptance takes chain[:N] or "
                                                                          "tree[:PATHS] (the drafter is --drafter)"),
    (["eval-acceptance", "--model", "tiny-random", "--max-rank", "4096"], "exceeds the codebook (2048 codes)"),
    (["eval-acceptance", "--model", "tiny-random", "--seed", str(2**70)], "--seed must be in"),
    (["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--K", "15", "--out", "OUT/d.safetensors"],
     "K=15 is out of range"),
    (["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--texts-file", "OUT/latin1.txt", "--out",
      "OUT/d.safetensors"], "is not UTF-8 text (byte 0xe9 at offset 3)"),
    (["train-drafter", "--model", "OUT/notqwen", "--drafter", "offsets", "--out", "OUT/d.safetensors"],
     "is a 'bert' config, not Qwen3-TTS"),
])
def test_drafter_commands_check_before_loading(tmp_path, capsys, argv, needle, no_load):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "notqwen").mkdir()
    (tmp_path / "notqwen" / "config.json").write_text('{"model_type": "bert"}')
    assert _status([a.replace("OUT", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "d.safetensors").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Ctrl-C: one line, status 130, no partial output
# ---------------------------------------------------------------------------------------------------------------------
def _interrupt(*a, **k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, target", [
    (["synth", "--model", "tiny-random", "--text", "Hi.", "--out", "OUT/x.wav", "--json", "OUT/x.json"],
     "rvqspec_lib.models.frame.synthesize"),
    (["bench", "latency", "--model", "tiny-random", "--json", "OUT/b.json", "--no-progress"],
     "bench.latency.bench_model"),
    (["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "8", "--out",
      "OUT/d.safetensors"], "rvqspec_lib.training.drafters.train_drafter"),
    (["eval-acceptance", "--model", "tiny-random", "--frames", "4", "--json", "OUT/e.json"],
     "rvqspec_lib.eval.acceptance.evaluate_acceptance"),
    (["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "8", "--epochs", "1", "--out",
      "OUT/d.safetensors"], "safetensors.torch.save_file"),  # while the drafter file is being written
])
def test_ctrl_c_is_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch, argv, target):
    module, _, name = target.rpartition(".")
    if name == "save_file":
        def _interrupt_mid_write(tensors, path, metadata=None):
            Path(path).write_bytes(b"half a drafter")
            raise KeyboardInterrupt
        monkeypatch.setattr(module + "." + name, _interrupt_mid_write)
        # where drafter_files imports it by name at its top
        monkeypatch.setattr("rvqspec_lib.models.drafter_files.save_file", _interrupt_mid_write, raising=False)
    else:
        monkeypatch.setattr(module + "." + name, _interrupt)
    assert main([a.replace("OUT", str(tmp_path)) for a in argv]) == 130
    assert capsys.readouterr().err.splitlines()[-1:] == ["rvqspec: interrupted"]
    assert _listing(tmp_path) == []


def test_ctrl_c_from_a_real_signal(tmp_path):
    """SIGINT to a running `rvqspec bench` (sent once its progress bar shows): status 130, the one line, no
    traceback, no JSON."""
    out = tmp_path / "b.json"
    p = subprocess.Popen([sys.executable, "-m", "rvqspec_lib.cli.main", "bench", "latency", "--model", "tiny-random",
                          "--repeats", "1000000", "--warmup", "0", "--queries", "1", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=REPO,
                         # as from a shell: pytest-xdist's workers ignore SIGINT, and an ignored signal is inherited
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"bench tiny-random" not in seen and time.monotonic() < deadline:
            chunk = os.read(p.stderr.fileno(), 256)
            if not chunk:
                break
            seen += chunk
        assert b"bench tiny-random" in seen, seen
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=60)[1]
    finally:
        if p.poll() is None:
            p.kill()
    err = (seen + rest).decode()
    assert p.returncode == 130, err
    # the one line on a line of its own (after the progress bar's line, cleared with "\r"), no traceback
    assert err.endswith("rvqspec: interrupted\n") and err[-len("rvqspec: interrupted\n") - 1] in "\r\n"
    assert "Traceback" not in err
    assert _listing(tmp_path) == []


# ---------------------------------------------------------------------------------------------------------------------
# model configs: one-line errors; one code group
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, needle", [
    ({}, "has no model_type: expected a Qwen3-TTS config (model_type 'qwen3_tts'"),
    ({"model_type": "bert"}, "is a 'bert' config, not Qwen3-TTS"),
    ({"model_type": "qwen3_tts"}, "has no talker_config.code_predictor_config"),
    ([1, 2], "is not a JSON object"),
])
def test_a_folder_that_is_not_qwen3_tts_is_one_line(tmp_path, capsys, config, needle):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    for fn in (loader.load_model, loader.model_facts):
        with pytest.raises(loader.ModelNotFoundError, match="expected a Qwen3-TTS config") as e:
            fn(str(tmp_path / "m"))
        assert needle in str(e.value) and "\n" not in str(e.value) and "aimv2" not in str(e.value)
    assert main(["synth", "--model", str(tmp_path / "m"), "--text", "hi", "--out", str(tmp_path / "x.wav")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and len(err) < 300


def _one_group_config() -> dict:
    from rvqspec_lib.models.configs import tiny_config_dict

    cfg = tiny_config_dict()
    cfg["talker_config"]["num_code_groups"] = 1
    cfg["talker_config"]["code_predictor_config"]["num_code_groups"] = 1
    return cfg


def test_one_code_group_is_a_clear_error_at_load_and_at_decode(tmp_path, capsys):
    from rvqspec_lib.models.configs import build_from_config
    from rvqspec_lib.decoding.decode import decode_frame

    cfg = _one_group_config()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", **cfg}))
    with pytest.raises(loader.ModelNotFoundError, match="num_code_groups 1: .* nothing to decode"):
        loader.load_model(str(tmp_path / "m"))
    assert main(["synth", "--model", str(tmp_path / "m"), "--text", "hi", "--out", str(tmp_path / "x.wav")]) == 2
    assert "num_code_groups 1" in capsys.readouterr().err
    # a model built in Python (no loader): decode_frame says so instead of an IndexError deep inside
    cp = build_from_config(cfg).talker.code_predictor
    with pytest.raises(ValueError, match="nothing to decode"):
        decode_frame(cp, torch.zeros(1, 2, cfg["talker_config"]["hidden_size"]))
    # negative control: the same call on two code groups decodes the one inner code
    cfg2 = _one_group_config()
    cfg2["talker_config"]["num_code_groups"] = cfg2["talker_config"]["code_predictor_config"]["num_code_groups"] = 2
    res = decode_frame(build_from_config(cfg2).talker.code_predictor, torch.zeros(1, 2, 64),
                       generator=torch.Generator().manual_seed(0))
    assert res.codes.shape == (1, 1)


# ---------------------------------------------------------------------------------------------------------------------
# README
# ---------------------------------------------------------------------------------------------------------------------
def test_readme_first_synth_uses_the_chain_and_the_cli_page_documents_the_timings():
    """The README's command-line quick start speaks with a chain first and shows the paper's decoder; the command
    reference (docs/cli.md) shows a tree and documents every timing field; neither uses a removed spelling, and every
    synth example in them is a command line the parser takes with a decoder name of the grammar."""
    import shlex

    from rvqspec_lib.cli.main import build_parser
    from rvqspec_lib.decoding.decoder_names import parse_decoder_name

    readme = (REPO / "README.md").read_text()
    cli_page = (REPO / "docs" / "cli.md").read_text()
    first = next(line for line in readme.splitlines() if line.lstrip().startswith("rvqspec synth"))
    assert "--decoder chain:4" in first, first
    assert "--decoder paper" in readme
    assert "--decoder tree:" in cli_page or '--decoder "tree:' in cli_page  # the tree is shown in the reference
    examples = [line for text in (readme, cli_page) for line in text.replace("\\\n", " ").splitlines()
                if "rvqspec " in line and line.lstrip().startswith(("rvqspec", ".venv"))]
    assert not [line for line in examples if "--window" in line or "--tree " in line]  # the removed spellings
    synths = [line.split("#")[0].split("|")[0] for line in examples if line.lstrip().startswith(("rvqspec synth",
                                                                                   ".venv/bin/rvqspec synth"))]
    assert len(synths) >= 5, synths
    parser = build_parser(["synth"])
    for line in synths:
        args = parser.parse_args(shlex.split(line)[1:])  # a removed or unknown flag exits 2 here
        parse_decoder_name(args.decoder or "auto")  # no --decoder: the fastest path timed here
    for field in ("load_s", "synth_s", "decode_s", "total_s", "rtf", "--threads 0", "interrupted"):
        assert field in cli_page, field


# --------------------------------------------------------------------------------------------------------------------
# calibrated trees and --decoder auto
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    (["--decoder", "tree:calibrated:65"], "outside 2..64"),
    (["--decoder", "tree:calibrated-beam:8"], "unknown tree name"),
])
def test_synth_calibrated_tree_names_checked_before_loading(tmp_path, capsys, monkeypatch, extra, needle):
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    rc = main(["synth", "--model", "embedded", "--text", "Hi there.", "--out", str(tmp_path / "a.wav"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_synth_calibrated_tree_needs_a_calibration(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    rc = main(["synth", "--model", "tiny-random", "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
               "--decoder", "tree:calibrated:8"])
    assert rc == 2 and "no folder to hold them" in capsys.readouterr().err
    rc = main(["synth", "--model", str(tmp_path), "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
               "--decoder", "auto"])
    assert rc == 2


def test_synth_with_the_embedded_calibrated_tree(tmp_path, capsys):
    js = tmp_path / "s.json"
    rc = main(["synth", "--model", "embedded", "--text", "The weather is fine today.", "--out",
               str(tmp_path / "a.wav"), "--decoder", "tree:calibrated-sampled:8", "--max-frames", "6",
               "--json", str(js)])
    assert rc == 0, capsys.readouterr().err
    stats = json.loads(js.read_text())
    assert stats["decoder"] == "tree:calibrated-sampled:8" and stats["kind"] == "calibrated"
    assert stats["nodes"] == 8 and stats["fused"] is False and stats["tokens_per_call"] > 1.0


def test_synth_decoder_auto_uses_the_cached_choice(tmp_path, capsys, monkeypatch):
    """--decoder auto on the embedded model: the choice is made by timing (here pre-made with a tiny budget, under
    the same cache key the command computes) and the command says what it chose and that it came from the cache."""
    from rvqspec_lib.eval.budget import auto_decoder
    from rvqspec_lib.data.frame_sources import frames_from_shipped
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    from rvqspec_lib.eval import timing

    monkeypatch.setattr(timing.LoadMonitor, "describe", lambda self: {"other_cpu_frac": 0.0})  # a shared machine
    monkeypatch.setenv("RVQSPEC_CACHE", str(tmp_path / "cache"))
    lm = loader.load_model("embedded")
    cal = load_calibration(tree_file("embedded", "heads"))
    ctx = frames_from_shipped(lm, "calibration", max_frames=4).context
    from rvqspec_lib.models import backends as B

    pool = [b for b in ("official", "native") if B.available(b)[0]]  # what synth chooses among
    made = auto_decoder("embedded", lm.code_predictor, cal, ctx, frames=2, repeats=1, shortlist=2, budgets=(4, 8),
                        backends=pool)
    js = tmp_path / "s.json"
    rc = main(["synth", "--model", "embedded", "--text", "Good morning.", "--out", str(tmp_path / "a.wav"),
               "--decoder", "auto", "--max-frames", "4", "--json", str(js)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"--decoder auto chose {made.label}" in err and "(a cached choice, " in err, err
    assert any("--decoder auto chose" in n for n in json.loads(js.read_text())["notes"])


def _default_synth(tmp_path, capsys, monkeypatch, store: dict | None):
    """``synth --model embedded`` with no --decoder, the auto cache in ``tmp_path`` holding ``store``, timing
    forbidden; returns (stderr, the JSON)."""
    from rvqspec_lib.eval import budget

    cache = tmp_path / "auto.json"
    if store is not None:
        cache.write_text(json.dumps(store))
    monkeypatch.setattr(budget, "cache_file", lambda: cache)
    monkeypatch.setattr(budget, "choose_decoder", lambda *a, **k: pytest.fail("the default synth timed decoders"))
    js = tmp_path / "s.json"
    rc = main(["synth", "--model", "embedded", "--text", "Good morning.", "--out", str(tmp_path / "a.wav"),
               "--max-frames", "3", "--json", str(js)])
    err = capsys.readouterr().err
    assert rc == 0, err
    return err, json.loads(js.read_text())


def test_synth_default_without_a_timed_choice_does_not_time(tmp_path, capsys, monkeypatch):
    """No --decoder and nothing cached for this machine: AR through native, fused (where native runs), untimed, and
    one note naming the command that times the fastest path."""
    from rvqspec_lib.models import backends as B

    err, stats = _default_synth(tmp_path, capsys, monkeypatch, None)
    native = B.available("native", "float32")[0]
    assert stats["dtype"] == stats["model_dtype"] == "float32"  # --dtype auto: the embedded model's own, on any CPU
    assert stats["decoder"] == "ar" and stats["backend"] == ("native" if native else "official")
    assert stats["fused"] is native
    line = f"note: the default path is ar through {stats['backend']}{', fused' * native}, untimed: "
    assert line + "`rvqspec prepare --model embedded` times the fastest path once" in err, err


def test_synth_default_uses_the_timed_choice(tmp_path, capsys, monkeypatch):
    """No --decoder, and a choice cached for this model, machine, precision and threads (what `rvqspec prepare`
    writes): that choice runs, and the note says so."""
    from rvqspec_lib.eval import budget
    from rvqspec_lib.models import backends as B
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    lm = loader.load_model("embedded")
    pool = ["official"] + ["native"] * B.available("native", "float32")[0]  # what synth looks up
    key = budget.cache_key("embedded", lm.code_predictor, load_calibration(tree_file("embedded", "heads")), "heads",
                           pool)
    store = {json.dumps(key, sort_keys=True): {"decoder": "chain:3", "backend": "official", "fused": False,
                                               "reason": "chain:3 through official (timed here)"}}
    err, stats = _default_synth(tmp_path, capsys, monkeypatch, store)
    assert stats["decoder"] == "chain:3" and stats["backend"] == "official" and stats["fused"] is False
    assert "note: auto chose chain:3 through official (timed here) (a cached choice, " in err, err


@pytest.mark.parametrize("decoder, lossy", [("ssd-lossy", True), ("chain:4", False)])  # chain: negative control
def test_synth_labels_a_lossy_decoder_and_records_the_dtype(tmp_path, capsys, decoder, lossy):
    js = tmp_path / "x.json"
    assert _synth(tmp_path, "--max-frames", "2", "--decoder", decoder, "--json", str(js)) == 0
    err = capsys.readouterr().err
    stats = json.loads(js.read_text())
    assert ("note: LOSSY: " in err) is lossy, err
    assert any(n.startswith("LOSSY: ") for n in stats["notes"]) is lossy
    assert stats["dtype"] == "float32"


def test_synth_with_the_native_talker_speaks_the_official_greedy_codes(tmp_path, capsys):
    """--talker native runs the talker steps through rvqspec_lib.device.native_talker.NativeTalker: greedy codes equal
    --talker official's (float32), and the JSON records which talker ran."""
    codes = {}
    for talker in ("official", "native"):
        js = tmp_path / f"{talker}.json"
        (tmp_path / talker).mkdir()
        assert _synth(tmp_path / talker, "--greedy", "--max-frames", "4", "--talker", talker, "--json", str(js)) == 0
        stats = json.loads(js.read_text())
        assert stats["talker"] == talker
        codes[talker] = stats["utterances"][0]["codes"] if "utterances" in stats else stats["codes"]
    assert codes["native"] == codes["official"]
    capsys.readouterr()
