"""``rvqspec synth --text-file``: several texts at once (issue 18), one wav + npy each named from --out with an index,
decoded as batches through the library's frame loop; every output checked before work and written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rvqspec_lib.cli.main import main

LINES = ["Hello there.", "", "  The weather is fine today.  ", "Good night."]


def _synth(tmp_path, *extra):
    return main(["synth", "--model", "tiny-random", "--out", str(tmp_path / "out.wav"), "--greedy",
                 "--max-frames", "3", *extra])


def test_text_file_writes_one_wav_and_codes_each_equal_to_single_runs(tmp_path, capsys, tiny_with_audio):
    f = tmp_path / "texts.txt"
    f.write_text("\n".join(LINES) + "\n")
    js = tmp_path / "all.json"
    assert _synth(tmp_path, "--text-file", str(f), "--batch-size", "2", "--json", str(js)) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["all.json", "out_000.npy", "out_000.wav", "out_001.npy", "out_001.wav", "out_002.npy",
                     "out_002.wav", "texts.txt"]  # blank line skipped, no temporary file left
    stats = json.loads(js.read_text())
    assert [u["text"] for u in stats["utterances"]] == ["Hello there.", "The weather is fine today.", "Good night."]
    assert stats["n_utterances"] == 3 and stats["batch_size"] == 2
    assert stats["frames"] == sum(u["frames"] for u in stats["utterances"])
    # greedy rows of a batch equal single runs (the frame loop's batching changes nothing)
    for i, u in enumerate(stats["utterances"]):
        single = tmp_path / f"single{i}"
        single.mkdir()
        assert main(["synth", "--model", "tiny-random", "--out", str(single / "x.wav"), "--greedy", "--max-frames",
                     "3", "--text", u["text"]]) == 0
        assert np.array_equal(np.load(tmp_path / f"out_{i:03d}.npy"), np.load(single / "x.npy")), u["text"]
    assert "3 texts" in capsys.readouterr().out


@pytest.mark.parametrize("content, needle", [
    ("\n  \n\n", "has no sentence (only blank lines)"),
    (b"caf\xe9\n", "is not UTF-8 text"),
    (None, "does not exist"),
])
def test_bad_text_files_are_one_line_before_loading(tmp_path, capsys, content, needle, no_load):
    f = tmp_path / "texts.txt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    rc = _synth(tmp_path, "--text-file", str(f))
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys, no_load):
    f = tmp_path / "texts.txt"
    f.write_text("One.\nTwo.\nThree.\n")
    (tmp_path / "out_001.wav").mkdir()  # the second line's audio would land on a folder
    rc = _synth(tmp_path, "--text-file", str(f))
    err = capsys.readouterr().err
    assert rc == 2 and "out_001.wav is a folder" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out_001.wav", "texts.txt"]  # nothing written


def test_text_and_text_file_are_exclusive_and_batch_size_checked(tmp_path, capsys, no_load):
    f = tmp_path / "texts.txt"
    f.write_text("One.\n")
    with pytest.raises(SystemExit) as e:
        _synth(tmp_path, "--text", "Hi.", "--text-file", str(f))
    assert e.value.code == 2 and "--text-file and --text exclude each other: give one of them" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # out of range: refused by the parser
        _synth(tmp_path, "--text-file", str(f), "--batch-size", "0")
    assert e.value.code == 2 and "--batch-size must be in 1..64" in capsys.readouterr().err


def test_one_line_file_names_its_outputs_as_the_single_text_does(tmp_path, tiny_with_audio):
    """Negative control of the indexed names: one sentence keeps --out's own name."""
    f = tmp_path / "texts.txt"
    f.write_text("\nJust one.\n\n")
    assert _synth(tmp_path, "--text-file", str(f)) == 0
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["out.npy", "out.wav", "texts.txt"]
