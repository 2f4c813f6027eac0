"""Every JSON the project writes is strict JSON (RFC 8259): no NaN, Infinity or -Infinity, which strict parsers (a
browser's ``JSON.parse``, most languages' standard ones) refuse. One writer (``rvqspec_lib.common.files.json_text``)
turns non-finite floats into ``null``; every other ``json.dump``/``json.dumps`` in the project either refuses them
(``allow_nan=False``) or makes no file (a key, a digest, a line of text). Checked here: the writer on a record full of
non-finite numbers, the source rule over every package, and the files the CLI commands write (``synth --stream`` with
a chunk longer than the utterance once wrote ``"frame_ms": NaN``)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rvqspec_lib.cli.main import main
from rvqspec_lib.common.files import json_text, write_json_atomic
from rvqspec_lib.common.provenance import provenance, save_json, save_table

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("rvqspec_lib", "bench", "paper", "tools", "recipes", "scripts")
#: json.dump(s) calls that write no file: (path, the call's first argument as source) -> why
NOT_FILES = {
    ("rvqspec_lib/eval/budget.py", "{k: calibration.get(k) for k in KINDS}"): "a digest of the calibration",
    ("rvqspec_lib/eval/budget.py", "key"): "a key inside the timing store (a string)",
    ("rvqspec_lib/training/prepare.py", "key"): "the same key of the timing store, looked up",
    ("recipes/embedded/model_card.py", "m.get('tokenizer')"): "a name quoted in the model card's prose",
    ("scripts/stats.py", "s"): "line counts printed to the terminal",
}


def _strict(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (as JSON.parse does)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_the_strict_parser_refuses_what_pythons_json_writes_by_default():  # the negative control
    with pytest.raises(ValueError, match="NaN"):
        _strict(json.dumps({"frame_ms": math.nan}))
    with pytest.raises(ValueError, match="Infinity"):
        _strict(json.dumps([-math.inf]))


def test_the_writer_turns_every_non_finite_number_into_null(tmp_path):
    record = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "np": np.float32("nan"), "np64": np.float64(np.inf),
              "torch": torch.tensor(float("nan")), "array": np.array([1.0, np.nan, -np.inf]), "ok": 0.5, "n": 3,
              "nested": [{"x": (math.nan, 2.0)}], "path": tmp_path, 7: True}
    got = _strict(json_text(record))
    assert got == {"nan": None, "inf": None, "-inf": None, "np": None, "np64": None, "torch": None,
                   "array": [1.0, None, None], "ok": 0.5, "n": 3, "nested": [{"x": [None, 2.0]}],
                   "path": str(tmp_path), "7": True}
    assert _strict(write_json_atomic(tmp_path / "r.json", record).read_text()) == got
    prov = provenance({"rate": math.inf})
    side = save_table([{"a": math.nan}], tmp_path / "t", prov)["provenance"]
    assert _strict(side.read_text())["params"] == {"rate": None}
    assert _strict(save_json({"m": -math.inf}, tmp_path / "m.json", prov).read_text())["m"] is None


def _json_calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("dump", "dumps") \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json":
            yield node


def test_every_json_writer_goes_through_the_strict_writer():
    """Outside ``common/files.py`` a ``json.dump(s)`` call either refuses non-finite numbers (``allow_nan=False``) or
    is one of :data:`NOT_FILES`; a new file writer must use ``json_text``/``write_json_atomic``."""
    loose, seen = [], set()
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "rvqspec_lib/common/files.py":
                continue
            for call in _json_calls(path):
                strict = any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
                             for k in call.keywords)
                key = (rel, ast.unparse(call.args[0]) if call.args else "")
                if key in NOT_FILES:
                    seen.add(key)
                elif not strict:
                    loose.append(f"{rel}:{call.lineno}")
    assert not loose, f"json.dump(s) that may write NaN or Infinity into a file (use json_text): {loose}"
    assert seen == set(NOT_FILES), f"stale entries of NOT_FILES: {set(NOT_FILES) - seen}"


def test_the_cli_writes_strict_json_also_when_a_number_is_undefined(tmp_path, capsys):
    """``synth --stream`` with one chunk longer than the utterance has no steady period: ``frame_ms`` is ``null``
    with the reason under ``undefined``; then synth without --stream, eval-acceptance and train-drafter."""
    js = tmp_path / "s.json"
    assert main(["synth", "--model", "embedded", "--text", "Hello there.", "--stream", "--max-frames", "40",
                 "--chunk-frames", "40", "--out", str(tmp_path / "s.wav"), "--json", str(js)]) == 0
    stats = _strict(js.read_text())
    assert stats["frame_ms"] is None and "no period between chunks" in stats["undefined"]["frame_ms"]
    assert stats["frames"] < 40 and stats["rtf"] > 0  # the model ended in the one chunk; the rest is measured
    assert main(["synth", "--model", "tiny-random", "--text", "Hi there.", "--out", str(tmp_path / "a.wav"),
                 "--max-frames", "2", "--json", str(tmp_path / "a.json")]) == 0
    assert main(["eval-acceptance", "--model", "tiny-random", "--frames", "4", "--decoder", "chain:4", "--json",
                 str(tmp_path / "e.json")]) == 0
    assert main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "8", "--epochs", "1",
                 "--out", str(tmp_path / "d.safetensors")]) == 0
    capsys.readouterr()
    written = sorted(tmp_path.rglob("*.json"))
    assert {p.name for p in written} >= {"s.json", "a.json", "e.json", "d.json"}
    for p in written:
        _strict(p.read_text())
