"""End to end: recipes/embedded/build.py --scale smoke into a temporary folder (flite slt only, < 90 s)."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
needs_voices = pytest.mark.skipif(shutil.which("flite") is None or shutil.which("sox") is None
                                  or shutil.which("espeak-ng") is None,
                                  reason="needs flite, sox, espeak-ng: sudo bash scripts/apt-voices.sh")


def _script():
    return importlib.import_module("recipes.embedded.build")


@needs_voices
def test_smoke_build_end_to_end_and_resume(tmp_path, capsys):
    pytest.importorskip("pocketsphinx")
    from rvqspec_lib.models.frame import synthesize
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.rvq_codec import RVQCodec

    out = tmp_path / "embedded"
    build = _script()
    result = build.main(["--scale", "smoke", "--out", str(out), "--voices", "slt", "--quiet"])
    for f in ("codec.safetensors", "eval.json", "MODEL_CARD.md", "model/model.safetensors", "model/config.json",
              "model/rvqspec_model.json", "model/MODEL_CARD.md",
              "work/texts.tsv", "work/corpus/manifest.jsonl", "work/codes.safetensors", "work/train/curve.json"):
        assert (out / f).is_file(), f
    ev = json.loads((out / "eval.json").read_text())
    assert set(ev["wer"]) == {"original", "codec", "inner_loop", "free_running"}
    assert set(ev["wer_diagnostics"]) == {"codec_1_codebook", "codec_4_codebooks", "inner_loop_4_codebooks",
                                          "inner_loop_greedy",
                                          "codec_table_decoder", "inner_loop_table_decoder",
                                          "free_running_table_decoder"}
    # the neural code decoder stage ran and the codec beside the model attaches it
    assert (out / "codec.decoder.safetensors").is_file() and ev["codec"]["decoder"] == "neural"
    assert ev["code_decoder"]["meta"]["steps"] == 6 and "neural code decoder" in (out / "MODEL_CARD.md").read_text()
    assert len(ev["cp_held_out"]["cp_acc_by_depth"]) == 15
    assert ev["free_running"]["n"] == ev["corpus"]["n_eval"] >= 1
    assert 0 <= ev["free_running"]["not_ended"] <= ev["free_running"]["n"]
    assert {"train", "held_out"} <= set(ev["accuracy"]) and 0 <= ev["accuracy"]["held_out"]["code0_acc"] <= 1
    assert result["training"]["steps"] == 40
    # the code-predictor stage ran on top of the joint training and is what ships: its weights moved, the talker's not
    assert ev["code_predictor_stage"]["meta"]["steps"] == 5 and (out / "work/cp/model.safetensors").is_file()
    assert "the code predictor alone" in (out / "MODEL_CARD.md").read_text()
    from safetensors.torch import load_file
    joint, cp_only = load_file(out / "work/train/model.safetensors"), load_file(out / "work/cp/model.safetensors")
    moved = {k for k in joint if not torch.equal(joint[k], cp_only[k])}
    assert moved and all(k.startswith("talker.code_predictor.") and "codec_embedding" not in k for k in moved)
    assert "free_running" in (out / "MODEL_CARD.md").read_text()

    lm = load_model(str(out / "model"))
    codec = RVQCodec.load(out / "codec.safetensors")  # shipped once, beside model/, named by its marker
    assert codec.decoder_kind == "neural" and lm.speech_tokenizer.codec.decoder_kind == "neural"
    assert lm.speech_tokenizer is not None and lm.speech_tokenizer.codec.config == codec.config
    assert lm.codebook_size == codec.config.codebook_size == 32 and lm.n_code_groups == 16
    r = synthesize(lm, "A short test sentence.", speaker="slt", max_frames=6, generator=torch.Generator().manual_seed(0))
    assert r.codes[0].shape[1] == 16 and r.codes[0].shape[0] >= 1
    assert int(r.codes[0].max()) < 32

    capsys.readouterr()
    build.main(["--scale", "smoke", "--out", str(out), "--voices", "slt", "--quiet"])  # resume: every stage skips
    printed = capsys.readouterr().out
    assert all(f"{s}: exists, skipped" in printed for s in build.STAGES)


def test_inner_loop_codes_keep_code0_and_stay_in_range():
    from recipes.embedded.codes import inner_loop_codes
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.data.utterances import utterances_from_manifest

    lm = load_model("tiny-random")
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, lm.codebook_size, (7, lm.n_code_groups), generator=g)
    rows = [{"id": "a", "text": "Hello there.", "split": "evaluation", "voice": "tiny"},
            {"id": "b", "text": "Not encoded.", "split": "evaluation", "voice": "tiny"}]
    utts = utterances_from_manifest(rows, {"a": codes.numpy()}, splits=["evaluation"])
    assert len(utts) == 1 and utts[0].speaker == "tiny"
    out = inner_loop_codes(lm, utts[0], generator=torch.Generator().manual_seed(1))
    assert out.shape == codes.shape and torch.equal(out[:, 0], codes[:, 0])
    assert int(out.min()) >= 0 and int(out.max()) < lm.codebook_size
    again = inner_loop_codes(lm, utts[0], generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again)
