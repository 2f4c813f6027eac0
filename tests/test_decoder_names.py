"""The one decoder grammar (rvqspec_lib.decoding.decoder_names) and the paper's decoder (``paper``: the offsets shipped
beside the model + their own calibrated point-mass tree), through every command that takes a decoder: bad names,
drafters that are not shipped, budgets outside 2..64 and damaged calibration files are one-line errors BEFORE the
model loads; ``paper`` decodes with the offsets and the offsets' tree, not the heads'."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import rvqspec_lib.models.loader as loader
from rvqspec_lib.cli.main import main
from rvqspec_lib.decoding import decoder_names as N
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree

REPO = Path(__file__).resolve().parent.parent
EMBEDDED = REPO / "data" / "embedded" / "model"


# --------------------------------------------------------------------------------------------------------------------
# the grammar (pure)
# --------------------------------------------------------------------------------------------------------------------
def test_every_form_parses_to_its_spec():
    p = N.parse_decoder_name
    assert p("ar") == N.DecoderName("ar", "ar")
    assert (p("chain").window, p("chain:6").window, p("chain:best").best_window) == (4, 6, True)
    assert p("tree").paths == ((0,), (1,), (0, 0), (0, 0, 0)) and not p("tree").sampled
    assert p("tree:0;1;0,0").paths == ((0,), (1,), (0, 0))
    assert p("tree-sampled:0;0,0").sampled
    for text, kind, n in (("tree:calibrated:8", None, 8), ("tree:calibrated-sampled", "sampled", 16),
                          ("calibrated-point-mass:64", "point-mass", 64)):
        d = p(text)
        assert (d.kind, d.tree_kind, d.budget, d.drafter) == ("calibrated", kind, n, "heads"), text
    assert p("tree:calibrated-point-mass:16@offsets").drafter == "offsets"
    assert p("chain:3@offsets-tv").drafter == "offsets-tv"
    assert p("ssd-lossy").beta == 0.4 and p("ssd-lossy:0.2").beta == 0.2
    assert p("auto").kind == "auto" and p("auto").needs == {"calibration"}
    paper = p("paper")
    assert (paper.kind, paper.drafter, paper.tree_kind, paper.budget, paper.budget_given) == \
        ("paper", "offsets", "point-mass", 32, False)
    assert p("paper:16").budget == 16 and p("paper:16").budget_given and p("paper").label == "paper:32"


@pytest.mark.parametrize("bad, needle", [
    ("beam", "unknown decoder 'beam': use ar, chain[:N]"),
    ("paperx", "paper[:N]"),
    ("chain:9", "2..8"), ("chain:1", "2..8"), ("chain:x", "2..8"),
    ("paper:65", "outside 2..64"), ("paper:1", "outside 2..64"), ("tree:calibrated:99", "outside 2..64"),
    ("calibrated-beam:8", "unknown tree name"), ("tree:0;;1", "empty path"),
    ("ssd-lossy:2", "beta"), ("ssd-lossy:x", "beta"),
    ("paper@heads", "paper always drafts with the offsets"), ("ar@offsets", "ar drafts nothing"),
    ("chain:4@Off!", "drafter"), ("", "empty decoder name"),
])
def test_bad_names_are_one_line_naming_the_fix(bad, needle):
    with pytest.raises(ValueError) as e:
        N.parse_decoder_name(bad)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_name_lists_the_grammar():
    with pytest.raises(ValueError) as e:
        N.parse_decoder_name("beam:4")
    for form in ("ar", "chain[:N]", "tree:calibrated", "ssd-lossy", "auto", "paper[:N]", "@DRAFTER"):
        assert form in str(e.value), form


def _cal(budgets):
    order = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0]] + [[3 + i] for i in range(60)]
    return {"budgets": list(budgets), "best_kind": {str(b): "sampled" for b in budgets},
            "point-mass": {"order": order}, "sampled": {"order": order}}


def _built(text, **kw):
    """(final label, decoder) of a name built from a calibration dict and a drafter (no files)."""
    d = N.parse_decoder_name(text)
    dec = d.decoder(**kw)
    return d.resolved(dec).label, dec


def test_decoders_built_from_names_carry_their_drafter():
    marker = object()  # any drafter object: the decoder must carry exactly it
    assert _built("chain:3") == ("chain:3", Chain(3))
    label, dec = _built("chain:3@offsets", drafter=marker)
    assert label == "chain:3@offsets" and dec.drafter is marker and dec != Chain(3)  # negative control: not equal
    label, dec = _built("paper", calibration=_cal(range(2, 25)), drafter=marker)
    assert label == "paper:24" and len(dec.paths) == 23 and not dec.sampled and dec.drafter is marker  # capped to 24
    assert _built("paper", calibration=_cal(range(2, 65)), drafter=marker)[0] == "paper:32"
    with pytest.raises(ValueError, match="node budget 32"):
        _built("paper:32", calibration=_cal(range(2, 25)), drafter=marker)  # an explicit N is not capped
    with pytest.raises(ValueError, match="load it first"):
        _built("paper", calibration=_cal(range(2, 65)))  # the offsets are needed
    assert _built("ssd-lossy:0.2") == ("ssd-lossy:0.2", LossySSD(beta=0.2)) and _built("ar") == ("ar", AR())
    assert _built("chain:best", best_chain=5) == ("chain:5", Chain(5))
    assert N.calibration_budgets(["paper", "paper:8", "tree:calibrated", "ar"]) == [8, 16, 32]


def test_auto_keeps_its_drafter_in_the_label():
    """Every label reads back as the same name: auto@offsets too (it once lost its drafter)."""
    assert N.parse_decoder_name("auto@offsets").label == "auto@offsets" and N.parse_decoder_name("auto").label == "auto"
    for text in ("auto@offsets", "chain:best@offsets", "tree:calibrated:8@offsets", "ssd-lossy:0.25"):
        d = N.parse_decoder_name(text)
        assert N.parse_decoder_name(d.label) == dataclasses.replace(d, text=d.label), text


# --------------------------------------------------------------------------------------------------------------------
# every command: bad input before the model loads
# --------------------------------------------------------------------------------------------------------------------
def _one_line_error(capsys, rc, needle):
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("decoder, needle", [
    ("beam", "unknown decoder 'beam'"),
    ("paper:65", "outside 2..64"),
    ("tree:calibrated:1", "outside 2..64"),
    ("tree:calibrated:8@nosuch", "the 'nosuch' drafter is not shipped beside embedded"),
    ("chain:4@nosuch", "shipped: offsets"),
    ("chain:4@nosuch", "or use @heads (the reused heads, no training)"),
    ("paper:1", "decoder 'paper:1': node budget 1 is outside 2..64"),
    ("tree:0,5000", "decoder 'tree:0,5000': tree rank 5000 is out of range"),
    ("", "--decoder is empty"),
    ("  ", "--decoder is empty"),
])
def test_synth_refuses_bad_decoders_before_loading(tmp_path, capsys, decoder, needle, no_load):
    rc = main(["synth", "--model", "embedded", "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
               "--decoder", decoder])
    _one_line_error(capsys, rc, needle)


def test_paper_needs_a_model_that_ships_the_offsets(tmp_path, capsys, no_load):
    rc = main(["synth", "--model", "tiny-random", "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
               "--decoder", "paper"])
    _one_line_error(capsys, rc, "the 'offsets' drafter is not shipped beside tiny-random")


@pytest.mark.parametrize("argv, needle", [
    (["eval-wer", "--model", "embedded", "--decoders", "ar,paper:70"], "outside 2..64"),
    (["eval-wer", "--model", "embedded", "--decoders", "ar,chain:4@nosuch"], "'nosuch' drafter is not shipped"),
    (["eval-wer", "--model", "embedded", "--decoders", "ar,beam"], "unknown decoder 'beam'"),
    (["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--decoders", "ar,paper"],
     "'offsets' drafter is not shipped beside tiny-random"),
    (["bench", "frames", "--model", "embedded", "--backends", "eager", "--decoders", "paper:0"], "outside 2..64"),
    (["bench", "latency", "--model", "embedded", "--decoders", "paper"],  # decoders are timed as frames only
     "--decoders is a flag of rvqspec bench frames, not of bench latency: drop it, or run rvqspec bench frames"),
    (["bench", "--model", "embedded", "--decoders", "paper"],  # no job named: one line listing the jobs
     "is not an rvqspec bench command: use latency, precisions, frames, table or pipeline"),
    (["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--decoder", "paper"],
     "'offsets' drafter is not shipped beside tiny-random"),
    (["export", "--model", "embedded", "--format", "onnx", "--graph", "verify", "--decoder", "paper:99"],
     "outside 2..64"),
    (["export", "--model", "embedded", "--format", "onnx", "--graph", "verify", "--decoder", "paper",
      "--nodes", "8"], "N = 32; --nodes 8 disagrees"),
])
def test_other_commands_refuse_bad_decoders_before_loading(tmp_path, capsys, argv, needle, no_load):
    extra = ["--out", str(tmp_path)] if argv[0] == "export" else []
    try:
        rc = main(argv + extra)
    except SystemExit as e:  # the parser's own errors (a flag the job lacks) exit 2 as argparse does
        rc = e.code
    _one_line_error(capsys, rc, needle)


# --------------------------------------------------------------------------------------------------------------------
# damaged calibration files: the file and the recalibrate command, before loading
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def model_copy(tmp_path):
    """The embedded model's folder with links to its files (weights, drafters) and COPIES of its tree files."""
    d = tmp_path / "model"
    (d / "trees").mkdir(parents=True)
    for f in EMBEDDED.iterdir():
        if f.name != "trees":
            (d / f.name).symlink_to(f)
    for f in (EMBEDDED / "trees").glob("*.json"):
        shutil.copy(f, d / "trees" / f.name)
    return d


def _damage(path: Path, how: str) -> None:
    cal = json.loads(path.read_text())
    if how == "garbage":
        path.write_bytes(b"\x00\xff\xfe binary")
        return
    if how == "missing key":
        del cal["point-mass"]
    elif how == "wrong type":
        cal["budgets"] = "2..64"
    elif how == "bad path":
        cal["point-mass"]["order"][3] = [-1]
    elif how == "orphan path":
        cal["point-mass"]["order"][0] = [5, 3]
    elif how == "budgets below order":  # budgets cut to 2..3, the order still 63 nodes long
        cal["budgets"] = [2, 3]
    elif how == "other drafter":
        cal["drafter"] = "medusa" if path.stem != "medusa" else "heads"
    path.write_text(json.dumps(cal))


class _Loaded(Exception):
    pass


def _reached_load(*a, **k):
    raise _Loaded


@pytest.mark.parametrize("how", ["garbage", "missing key", "wrong type", "bad path", "orphan path",
                                 "budgets below order", "other drafter"])
@pytest.mark.parametrize("decoder, file", [(["--decoder", "tree:calibrated:8"], "heads.json"),
                                           (["--decoder", "auto"], "heads.json"),
                                           (["--decoder", "paper"], "offsets.json")])
def test_damaged_calibration_is_one_line_before_loading(model_copy, tmp_path, capsys, how, decoder, file, no_load):
    path = model_copy / "trees" / file
    _damage(path, how)
    rc = main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav"), *decoder])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and f"rvqspec prepare --model {model_copy}" in err, err


@pytest.mark.parametrize("decoder", [["--decoder", "tree:calibrated:8"], ["--decoder", "auto"],
                                     ["--decoder", "paper"]])
def test_sound_calibration_reaches_the_model_load(model_copy, tmp_path, monkeypatch, decoder):
    """Negative control of the test above: the same folder with sound files passes every check."""
    monkeypatch.setattr(loader, "load_model", _reached_load)
    with pytest.raises(_Loaded):
        main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav"), *decoder])


def _cut_budgets(path: Path, top: int) -> None:
    """A sound calibration holding budgets 2..top only (what calibrate writes for BUDGETS = 2..top)."""
    cal = json.loads(path.read_text())
    cal["budgets"] = list(range(2, top + 1))
    for kind in ("point-mass", "sampled"):
        cal[kind]["order"] = cal[kind]["order"][: top - 1]
    path.write_text(json.dumps(cal))


@pytest.mark.parametrize("top, capped", [(3, True), (64, False)])  # 64: negative control, N 32 is held
def test_paper_says_when_its_budget_is_capped(model_copy, tmp_path, capsys, monkeypatch, top, capped):
    monkeypatch.setattr(loader, "load_model", _reached_load)
    _cut_budgets(model_copy / "trees" / "offsets.json", top)
    with pytest.raises(_Loaded):
        main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
              "--decoder", "paper"])
    err = capsys.readouterr().err
    want = (f"paper: the offsets calibration ({model_copy / 'trees' / 'offsets.json'}) holds budgets up to 3; using "
            f"N 3 (recalibrate: rvqspec prepare --model {model_copy})")
    assert (want in err) is capped and ("using N" in err) is capped, err


def test_shipped_calibration_files_are_sound_and_per_drafter():
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    heads = load_calibration(tree_file("embedded", "heads"), n_codes=15, codebook_size=2048)
    offsets = load_calibration(tree_file("embedded", "offsets"), n_codes=15, codebook_size=2048)
    assert (heads["drafter"], offsets["drafter"]) == ("heads", "offsets")
    assert offsets["n_frames"] == heads["n_frames"] and offsets["budgets"] == heads["budgets"]  # same settings
    assert offsets["provenance"]["params"]["script"] == "scripts/calibrate_trees.py"


# --------------------------------------------------------------------------------------------------------------------
# the paper's decoder decodes with the offsets and the offsets' own tree
# --------------------------------------------------------------------------------------------------------------------
def test_paper_decodes_with_the_offsets_and_their_tree():
    from rvqspec_lib.data.frame_sources import frames_from_shipped
    from rvqspec_lib.decoding.decode import decode_frame
    from rvqspec_lib.decoding.drafters import PositionOffsets, ReusedHeads
    from rvqspec_lib.models.drafter_files import load_drafter
    from rvqspec_lib.models.named_decoders import resolve
    from rvqspec_lib.models.tree_files import load_calibration

    lm = loader.load_model("embedded")
    assert lm.folder == EMBEDDED
    named = resolve("paper", lm)
    dec, drafter = named.decoder, named.drafter
    offsets = load_drafter(EMBEDDED / "drafters" / "offsets.safetensors", lm.code_predictor)
    assert isinstance(drafter, PositionOffsets) and dec.drafter is drafter
    assert torch.equal(drafter.offsets, offsets.offsets)
    own = load_calibration(EMBEDDED / "trees" / "offsets.json")["point-mass"]["order"][:31]
    heads = load_calibration(EMBEDDED / "trees" / "heads.json")["point-mass"]["order"][:31]
    assert [list(p) for p in dec.paths] == own and not dec.sampled and len(dec.paths) == 31  # N = 32
    assert set(map(tuple, own)) != set(map(tuple, heads))  # the two drafters' trees differ: the check can fail

    ctx = frames_from_shipped(lm, "calibration", max_frames=48).context

    def run(decoder, drafter=None):
        return decode_frame(lm.code_predictor, ctx, decoder=decoder, generator=torch.Generator().manual_seed(3),
                            drafter=drafter)

    mine = run(dec, drafter=ReusedHeads())  # the decoder's own drafter wins over the caller's default
    same = run(Tree(dec.paths), drafter=offsets)
    assert torch.equal(mine.codes, same.codes) and torch.equal(mine.calls, same.calls)
    with_heads = run(Tree(dec.paths), drafter=ReusedHeads())
    assert not torch.equal(mine.calls, with_heads.calls)  # negative control: the drafter matters


def test_synth_speaks_with_the_papers_decoder(tmp_path, capsys):
    js = tmp_path / "s.json"
    rc = main(["synth", "--model", "embedded", "--text", "The weather is fine today.", "--out",
               str(tmp_path / "a.wav"), "--decoder", "paper:16", "--max-frames", "5", "--json", str(js)])
    assert rc == 0, capsys.readouterr().err
    stats = json.loads(js.read_text())
    assert stats["decoder_name"] == "paper:16" and stats["drafter"] == "offsets"
    assert stats["tokens_per_call"] > 1.0 and stats["choose_s"] >= 0


# --------------------------------------------------------------------------------------------------------------------
# a damaged .safetensors beside the model: the error names the file, the drafter's before the model loads
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cut", [True, False])  # False: negative control, the same copy uncut reaches the load
def test_damaged_drafter_file_is_named_before_loading(model_copy, tmp_path, capsys, monkeypatch, cut):
    monkeypatch.setattr(loader, "load_model", _reached_load)
    (model_copy / "drafters").unlink()
    shutil.copytree(EMBEDDED / "drafters", model_copy / "drafters")
    f = model_copy / "drafters" / "offsets.safetensors"
    if cut:
        f.write_bytes(f.read_bytes()[:1000])
        rc = main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
                   "--decoder", "paper"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and f"drafter file {f} is damaged" in err, err
        assert "retrain" in err
    else:
        with pytest.raises(_Loaded):
            main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav"),
                  "--decoder", "paper"])


def test_damaged_model_weights_are_named(model_copy, tmp_path, capsys):
    w = model_copy / "model.safetensors"
    w.unlink()
    w.write_bytes((EMBEDDED / "model.safetensors").read_bytes()[:100_000])
    rc = main(["synth", "--model", str(model_copy), "--text", "Hi.", "--out", str(tmp_path / "a.wav")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"model weights {w} are damaged" in err, err


# --------------------------------------------------------------------------------------------------------------------
# an unknown decoder is answered with the forms THIS command accepts
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, absent, present", [
    (["synth", "--model", "tiny-random", "--text", "Hi."], "chain:best", "auto"),
    (["eval-wer", "--model", "embedded", "--decoders", "beam"], "auto", "chain:best"),
    (["bench", "frames", "--model", "tiny-random", "--backends", "eager", "--decoders", "beam"], "chain:best", "auto"),
    (["bench", "frames", "--model", "tiny-random", "--decoders", "beam"], "ssd-lossy", "paper"),
])
def test_unknown_decoder_lists_what_the_command_accepts(tmp_path, capsys, argv, absent, present, no_load):
    extra = ["--out", str(tmp_path / "a.wav"), "--decoder", "beam"] if argv[0] == "synth" else []
    rc = main(argv + extra)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "unknown decoder 'beam'" in err, err
    listed = err.split("unknown decoder 'beam': use ", 1)[1]
    assert absent not in listed and present in listed, listed


def test_the_full_grammar_lists_every_form():
    """Control: without exclusions every form is listed (the library's own GRAMMAR)."""
    assert all(text in N.GRAMMAR for _, text in N.FORMS) and N.grammar() == N.GRAMMAR
    assert "chain:best" not in N.grammar(("chain:best",)) and "auto" not in N.grammar(("auto",))
