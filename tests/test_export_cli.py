"""``rvqspec export`` as a user runs it: bad input is one line before any model loads; an ONNX file is written with
its JSON beside it and checked against eager PyTorch (``rvqspec bench``: tests/test_bench.py).
"""

from __future__ import annotations

import json

import pytest

from rvqspec_lib.cli.main import main


@pytest.mark.parametrize("extra, needle", [
    (["--format", "tflite", "--graph", "verify"], "--format tflite is not a format rvqspec export takes: use onnx or coreml"),
    (["--format", "onnx", "--graph", "loop"], "--graph loop is not a graph rvqspec export takes: use stepped, verify or frame"),
    (["--format", "onnx", "--graph", "verify", "--nodes", "65"], "--nodes must be in 2..64"),
    (["--format", "onnx", "--graph", "frame", "--nodes", "4"], "--nodes is for --graph verify"),
    (["--format", "onnx", "--graph", "stepped", "--decoder", "paper"], "--decoder is for --graph verify"),
    (["--format", "onnx", "--graph", "frame", "--nodes", "4", "--decoder", "tree:0;1"],
     "--decoder and --nodes are for --graph verify"),
    (["--format", "onnx", "--graph", "verify", "--dtype", "int8"], "--dtype int8 is not a precision rvqspec export takes: use float32 or float16"),
    (["--format", "onnx", "--graph", "verify", "--predict"], "--predict is for --format coreml"),
    (["--format", "coreml", "--graph", "verify", "--predict"], "--predict:"),  # off macOS
    (["--format", "onnx", "--graph", "verify", "--decoder", "tree:0;1", "--nodes", "5"],
     "--decoder tree:0;1's tree has 2 nodes, so N = 3"),
    (["--format", "onnx", "--graph", "verify", "--decoder", "ar"], "--decoder ar: a verify graph needs a tree"),
])
def test_export_bad_input_is_one_line_before_loading(tmp_path, capsys, extra, needle, no_load):
    try:
        rc = main(["export", "--model", "tiny-random", "--out", str(tmp_path), *extra])
    except SystemExit as e:  # a value outside the choices: refused by the parser
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("rvqspec: error: ") and needle in err and err.count("\n") == 1, err


def test_export_tree_rank_outside_the_codebook_is_one_line(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--decoder",
                 "tree:0;5000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tree rank 5000 is out of range for this model's codebook of 2048 codes" in err and err.count("\n") == 1
    assert not list(out.glob("*")) if out.exists() else True  # nothing written


def test_export_out_must_be_a_folder_that_can_be_made(tmp_path, capsys, no_load):
    """A file, or a folder to be made under a file, is one line before the model loads (nothing created)."""
    (tmp_path / "f").write_text("x")
    for out, needle in ((tmp_path / "f", "is a file: give a folder"),
                        (tmp_path / "f" / "a" / "b", f"{tmp_path / 'f'} is a file, not a folder")):
        assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--out",
                     str(out)]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_export_creates_the_out_folder_and_its_parents(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "export"
    rc = main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert (out / "verify-n4-float32.onnx").is_file() and (out / "verify-n4-float32.json").is_file()


def test_make_folder_that_cannot_be_made_is_one_line(tmp_path):
    """The creation itself failing (after the check: a race, a full disk) is one line naming the flag."""
    from rvqspec_lib.cli.common import make_folder

    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError) as e:
        make_folder(tmp_path / "f" / "out", "--out")
    msg = str(e.value)
    assert msg.startswith(f"--out {tmp_path / 'f' / 'out'}: cannot create the folder") and "\n" not in msg, msg


def test_export_onnx_verify_graph_writes_a_checked_file(tmp_path, capsys):
    out = tmp_path / "export"
    rc = main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--decoder",
               "tree:0;1;0,0", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "RANDOM weights" in cap.err and "onnxruntime-cpu: max abs logit difference" in cap.out
    info = json.loads((out / "verify-n4-float32.json").read_text())
    assert (out / "verify-n4-float32.onnx").stat().st_size == info["bytes"] > 0
    assert info["tree"] == [[0], [1], [0, 0]] and info["random_weights"] is True and info["ran"] is True
    (agree,) = info["agreement"]
    assert agree["runner"] == "onnxruntime-cpu" and agree["within_tolerance"] is True
    assert info["provenance"]["params"]["threads"] == 1


def test_the_parsers_copies_of_the_names_agree_with_the_library():
    from rvqspec_lib.cli import args
    from rvqspec_lib.models import backends as B
    from rvqspec_lib.device import export_formats as F
    from rvqspec_lib.device import export_graphs as G

    assert args.GRAPHS == tuple(G.GRAPHS) and set(args.FORMATS) == set(F.FORMATS)
    assert args.BACKENDS == B.BACKENDS  # synth --backend
