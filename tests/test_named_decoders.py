"""THE resolver (rvqspec_lib.models.named_decoders): every form of the grammar resolves on the embedded model to the
right decoder, drafter and tree, under one label that the grammar reads back as the same decoder; ``paper`` without
``:N`` is capped to what is calibrated, with a note; a missing drafter or calibration is a one-line error naming the
fix; ``check_files`` answers before any model loads; ``resolve_all`` refuses two names of one decoder. Negative
controls: the two drafters' calibrations give different trees, an explicit ``paper:N`` is never capped."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import rvqspec_lib.models.loader as loader
from rvqspec_lib.decoding.decoder_names import DEFAULT_TREE, name_of, parse_decoder_name
from rvqspec_lib.decoding.decoders import AR, Chain, LossySSD, Tree
from rvqspec_lib.decoding.drafters import PositionOffsets
from rvqspec_lib.models import named_decoders as ND

EMBEDDED = Path(__file__).resolve().parent.parent / "data" / "embedded" / "model"


@pytest.fixture(scope="module")
def lm():
    return loader.load_model("embedded")


def _cal(drafter: str) -> dict:
    return json.loads((EMBEDDED / "trees" / f"{drafter}.json").read_text())


def _order(drafter: str, kind: str, n: int) -> list:
    return [tuple(p) for p in _cal(drafter)[kind]["order"][: n - 1]]


def test_every_form_resolves_to_its_decoder_and_label(lm):
    heads_kind8 = _cal("heads")["best_kind"]["8"]
    want = {  # name: (label, decoder without its drafter, drafter shipped?)
        "ar": ("ar", AR(), False),
        "chain": ("chain:4", Chain(4), False),
        "chain:6": ("chain:6", Chain(6), False),
        "chain:3@offsets": ("chain:3@offsets", Chain(3), True),
        "tree": ("tree:0;1;0,0;0,0,0", Tree(DEFAULT_TREE), False),
        "tree:0;1;0,0": ("tree:0;1;0,0", Tree(((0,), (1,), (0, 0))), False),
        "tree-sampled:0;0,0": ("tree-sampled:0;0,0", Tree(((0,), (0, 0)), sampled=True), False),
        "tree:calibrated:8": (f"tree:calibrated-{heads_kind8}:8",
                              Tree(_order("heads", heads_kind8, 8), sampled=heads_kind8 == "sampled"), False),
        "calibrated-point-mass:16": ("tree:calibrated-point-mass:16", Tree(_order("heads", "point-mass", 16)), False),
        "tree:calibrated-sampled:16@offsets": ("tree:calibrated-sampled:16@offsets",
                                               Tree(_order("offsets", "sampled", 16), sampled=True), True),
        "ssd-lossy": ("ssd-lossy:0.4", LossySSD(beta=0.4), False),
        "ssd-lossy:0.2@offsets": ("ssd-lossy:0.2@offsets", LossySSD(beta=0.2), True),
        "paper": ("paper:32", Tree(_order("offsets", "point-mass", 32)), True),
        "paper:16": ("paper:16", Tree(_order("offsets", "point-mass", 16)), True),
    }
    got = {text: ND.resolve(text, lm) for text in want}
    for text, (label, bare, shipped) in want.items():
        nd = got[text]
        assert nd.label == label and nd.fields()["decoder"] == label and nd.note is None, text
        assert isinstance(nd.drafter, PositionOffsets) is shipped, text
        assert getattr(nd.decoder, "drafter", None) is nd.drafter, text  # the decoder carries its drafter
        assert (nd.decoder if nd.drafter is None else dataclasses.replace(nd.decoder, drafter=None)) == bare, text
    assert got["paper"].fields() == {"decoder": "paper:32", "kind": "paper", "drafter": "offsets", "nodes": 32,
                                     "lossy": False, "sampled": False}
    assert got["ssd-lossy"].fields()["lossy"] and not got["chain"].fields()["lossy"]
    assert got["ar"].fields()["nodes"] == 1 and got["tree"].fields()["nodes"] == 5
    # the paper's tree is the offsets' own, not the heads' (negative control: the calibrations differ)
    assert _order("offsets", "point-mass", 32) != _order("heads", "point-mass", 32)
    assert ND.resolve("chain:best", lm, best_chain=5).label == "chain:5"
    assert ND.has_paper_decoder(lm) and ND.drafter_calibration(lm, "no-such-drafter") is None


@pytest.mark.parametrize("text", ["ar", "chain:4", "chain:3@offsets", "tree:0;1;0,0", "tree-sampled:0;0,0",
                                  "tree:calibrated:8", "tree:calibrated-point-mass:16@offsets", "ssd-lossy:0.2",
                                  "paper", "paper:16"])
def test_the_label_round_trips_through_the_grammar(lm, text):
    nd = ND.resolve(text, lm)
    again = ND.resolve(parse_decoder_name(nd.label), lm, drafters={nd.name.drafter: nd.drafter} if nd.drafter else {})
    assert again.label == nd.label and again.decoder == nd.decoder and again.name == parse_decoder_name(
        nd.label).resolved(again.decoder)
    if nd.name.kind not in ("calibrated", "paper"):  # names that read no file: name_of gives the label back too
        assert name_of(nd.decoder).label == nd.label


def test_paper_without_n_is_capped_with_a_note_and_paper_n_is_not(lm):
    cut = _cal("offsets")
    cut["budgets"] = list(range(2, 25))
    nd = ND.resolve("paper", lm, calibrations={"offsets": cut})
    assert nd.label == "paper:24" and len(nd.decoder.paths) == 23
    assert nd.note == ("paper: the offsets calibration holds budgets up to 24; using N 24 (recalibrate: rvqspec "
                       "prepare --model embedded)")
    with pytest.raises(ValueError, match="node budget 32") as e:  # negative control: an explicit N is not capped
        ND.resolve("paper:32", lm, calibrations={"offsets": cut})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model, text, words", [
    ("embedded", "chain:4@nosuch", "the 'nosuch' drafter is not shipped beside embedded"),
    ("embedded", "chain:4@nosuch", "or use @heads"),
    ("tiny-random", "paper", "the 'offsets' drafter is not shipped beside tiny-random"),
    ("tiny-random", "tree:calibrated:8", "tiny-random has no folder to hold them (random weights built in memory): "
                                         "give rank paths"),
    ("embedded", "auto", "rvqspec_lib.eval.budget.auto_decoder"),
    (None, "paper", "give the loaded model, or pass it as drafters={'offsets': ...}"),
    (None, "tree:calibrated:8", "give the loaded model, or pass it as calibrations={'heads': ...}"),
    ("embedded", "chain:best", "chain:best needs calibration frames"),
])
def test_missing_drafter_or_calibration_is_one_line_naming_the_fix(model, text, words):
    lm = loader.load_model(model) if model else None
    with pytest.raises(ValueError) as e:
        ND.resolve(text, lm)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_resolve_all_shares_files_and_refuses_one_decoder_named_twice(lm):
    got = ND.resolve_all(["ar", "paper", "chain:3@offsets"], lm)
    assert list(got) == ["ar", "paper:32", "chain:3@offsets"]
    assert got["paper:32"].drafter is got["chain:3@offsets"].drafter  # the offsets loaded once
    kind = _cal("heads")["best_kind"]["8"]
    for names in (["chain", "chain:4"], ["tree:calibrated:8", f"tree:calibrated-{kind}:8"]):
        with pytest.raises(ValueError) as e:
            ND.resolve_all(names, lm)
        assert f"decoders {names[0]!r} and {names[1]!r} are the same decoder" in str(e.value) and \
            "name it once" in str(e.value)


def test_check_files_answers_before_any_model_loads(tmp_path, no_load):
    assert ND.check_files("paper", "embedded") is None and ND.check_files("ar", "tiny-random") is None
    with pytest.raises(ValueError, match="'nosuch' drafter is not shipped"):
        ND.check_files("chain:4@nosuch", "embedded")
    with pytest.raises(ValueError, match="has no folder to hold them"):
        ND.check_files("tree:calibrated:8", "tiny-random")
    model = tmp_path / "model"
    (model / "trees").mkdir(parents=True)
    (model / "drafters").symlink_to(EMBEDDED / "drafters")
    with pytest.raises(FileNotFoundError, match="rvqspec prepare --model"):  # no trees/offsets.json: the command to make it
        ND.check_files("paper", model)
    cut = _cal("offsets")
    cut["budgets"] = [2, 3]
    for kind in ("point-mass", "sampled"):
        cut[kind]["order"] = cut[kind]["order"][:2]
    shutil.copy(EMBEDDED / "trees" / "heads.json", model / "trees" / "heads.json")
    (model / "trees" / "offsets.json").write_text(json.dumps(cut))
    note = ND.check_files(parse_decoder_name("paper"), model)
    assert note is not None and "holds budgets up to 3; using N 3" in note
    assert ND.check_files("tree:calibrated:8", model) is None  # the heads' file is whole
