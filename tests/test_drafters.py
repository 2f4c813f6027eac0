"""Drafters (paper Table 2): reused heads, Medusa heads, position-aware offsets; their training and statistics.

* offsets at zero ARE the reused heads (bit-exact), fresh Medusa heads equal them up to rounding;
* exact parameter counts for the released 0.6B / 1.7B code predictors, counted on the meta device;
* training on a tiny model built so that offsets CAN help ("drift" model below) lowers the loss and raises the
  measured acceptance on held-out frames; the negative control (targets shuffled, inputs unchanged) does not;
* save / load round trip, loading by name from beside a model, clear errors;
* losslessness does not depend on the drafter: greedy AR == Chain == Tree, and the G-test of tests/test_lossless.py
  (its helpers imported) with random non-zero offsets and Medusa heads on Chain and Tree;
* the teacher-forced passes match the official ``forward_finetune`` and the frame loop's contexts; the dataset path
  on a tiny local dataset in the VoxPopuli schema with a stub codec; ``rvqspec eval-acceptance`` / ``train-drafter``.

The drift model. A tiny code predictor of the official classes (V=32, 15 codes a frame) with its heads x20 (peaked
targets) and two changes that give the hidden states a depth-dependent component, as a trained model's have:
code-predictor input table t gets (t+1) * 0.3 * u added (u a fixed unit vector), and every head gets a rank-one read-out
3 * r_d s^T of the direction s along which the mean teacher-forced hidden state moves with depth (r_d random per head).
A draft for depth k+j from H_k then misplaces that component by about j steps, which a shared offset b_j can undo:
reused heads accept ~0.85 per offset, trained offsets ~0.91. The shuffled-targets control must NOT improve: with the
depth/code relation destroyed there is nothing for the offsets to learn (measured: acceptance falls to ~0.4).
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch
from rvqspec_lib.cli.main import main as cli_main
from test_lossless import (
    ALPHA,
    DEFAULT,
    MIN_POWER,
    TREE_SMALL,
    exact_pmf,
    frames_needed,
    g_test,
    power,
    variant,
)

from rvqspec_lib.eval.acceptance import (
    evaluate_acceptance,
    exact_statistics,
    frame_acceptance,
    predicted_tokens_per_call,
)
from paper.drafter_table import paired_acceptance_difference
from paper.drafter_training import params_added_for_config
from rvqspec_lib.data.frame_sources import frames_from_contexts, frames_from_dataset
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.models import backends
from rvqspec_lib.models import frame as frame_mod
from rvqspec_lib.models.configs import CONFIG_DIR, build_from_config, tiny_config_dict
from rvqspec_lib.models.drafter_files import (
    drafter_path,
    load_drafter,
    make_drafter,
    read_description,
    save_drafter,
)
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.data.teacher import (
    teacher_forced_contexts,
    teacher_forced_hidden,
    verifier_logits,
)
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.drafters import MedusaHeads, PositionOffsets, ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.training.drafters import train_drafter

GREEDY = Sampling(greedy=True)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def _randomised(drafter, seed: int, scale: float):
    """The drafter with random non-zero parameters (so that its drafts differ from the reused heads')."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return drafter


def _ctx(cp, b, seed=0):
    h = cp.model.codec_embedding[0].embedding_dim
    return torch.randn(b, 2, h, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------------
# equalities at initialisation, parameter counts
# ----------------------------------------------------------------------------------------------------------------
def test_offsets_at_zero_are_reused_heads_exactly(tiny):
    cp = tiny.code_predictor
    hidden = torch.randn(6, cp.config.hidden_size, generator=torch.Generator().manual_seed(1))
    depth = torch.tensor([1, 5, 12, 13, 14, 15])  # drafts running past depth 15 included
    off, med = make_drafter("offsets", cp, fresh=True), make_drafter("medusa", cp, fresh=True)
    with torch.no_grad():
        for n_ahead in (1, 3, 7):  # 7 > K: offsets past K are the reused heads
            ref = ReusedHeads().draft_logits(cp, hidden, depth, n_ahead)
            assert torch.equal(off.draft_logits(cp, hidden, depth, n_ahead), ref)
            torch.testing.assert_close(med.draft_logits(cp, hidden, depth, n_ahead), ref, rtol=1e-5, atol=1e-5)
    # and the whole sampled decode is identical with zero offsets
    ctx = _ctx(cp, 4, seed=3)
    for dec in (Chain(4), Tree()):
        a = decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(7))
        b = decode_frame(cp, ctx, decoder=dec, generator=torch.Generator().manual_seed(7), drafter=off)
        assert torch.equal(a.codes, b.codes) and torch.equal(a.committed, b.committed)


@pytest.mark.parametrize("release", ["0.6B", "1.7B"])
def test_params_added_for_the_released_code_predictors(release):
    """K=3: offsets 3 x 1024 = 3,072; Medusa 39 plain heads (k + j <= 15) x 2048 x 1024 = 81,788,928; the paper's
    45 heads (15 positions x 3, "~94 M") = 94,371,840. Counted on the meta device from config.json alone."""
    cfg = json.loads((CONFIG_DIR / f"Qwen3-TTS-12Hz-{release}-CustomVoice" / "config.json").read_text())
    assert params_added_for_config("heads", cfg) == 0
    assert params_added_for_config("offsets", cfg) == 3072
    medusa = params_added_for_config("medusa", cfg)
    per_head = 2048 * 1024
    assert medusa == 39 * per_head == 81_788_928
    assert abs(45 * per_head - 94e6) / 94e6 < 0.005  # the paper's "~94 M" is 45 plain linear heads
    with torch.device("meta"):
        assert len(MedusaHeads(3, 15, 1024, 2048).heads) == 39


def test_params_added_of_built_drafters_match_the_count(tiny):
    cp = tiny.code_predictor
    h, v = cp.config.hidden_size, cp.config.vocab_size
    off, med = make_drafter("offsets", cp, fresh=True, K=4), make_drafter("medusa", cp, fresh=True)
    assert off.params_added == 4 * h
    assert med.params_added == 39 * h * v
    assert ReusedHeads().params_added == 0


# ----------------------------------------------------------------------------------------------------------------
# teacher-forced passes
# ----------------------------------------------------------------------------------------------------------------
def test_teacher_forced_hidden_is_forward_finetune(tiny):
    cp = tiny.code_predictor
    ctx = _ctx(cp, 3)
    codes = torch.randint(0, cp.config.vocab_size, (3, 15), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = verifier_logits(cp, teacher_forced_hidden(cp, ctx, codes))
        emb = torch.stack([cp.model.codec_embedding[j](codes[:, j]) for j in range(14)], 1)
        official = cp.forward_finetune(inputs_embeds=torch.cat([ctx, emb], 1)).logits
    assert torch.equal(ours, official)
    # and H_1 is the prefill's hidden state: lm_head[0](H_1) gives decode_frame's greedy code 1
    res = decode_frame(cp, ctx, sampling=GREEDY)
    assert torch.equal(ours[:, 0].argmax(-1), res.codes[:, 0])


def test_teacher_forced_contexts_equal_the_frame_loops(tiny, monkeypatch):
    seen = []
    real = backends.decode_frame  # what the frame loop's default runner (AR stepped, official) calls

    def spy(cp, context, **kw):
        seen.append(context.clone())
        return real(cp, context, **kw)

    monkeypatch.setattr(backends, "decode_frame", spy)
    text = "Teacher forcing, please."
    res = frame_mod.synthesize(tiny, [text], generator=torch.Generator().manual_seed(0), max_frames=12)
    monkeypatch.undo()
    codes = res.codes[0]
    got = teacher_forced_contexts(tiny, text, codes)
    assert got.shape == (codes.shape[0], 2, 64)
    torch.testing.assert_close(got, torch.cat(seen)[: codes.shape[0]], rtol=1e-4, atol=1e-5)


def test_frames_split_by_utterance_and_round_trip(tmp_path):
    fr = Frames(torch.randn(20, 2, 8), torch.randint(0, 5, (20, 3)), torch.arange(20) // 4, None, {"kind": "t"})
    tr, va = fr.split(0.4, seed=1)
    assert len(tr) + len(va) == 20 and len(va) == 8
    assert not set(tr.utterance.tolist()) & set(va.utterance.tolist())
    back = Frames.load(fr.save(tmp_path / "f.safetensors"))
    assert torch.equal(back.context, fr.context) and back.source == {"kind": "t"}
    with pytest.raises(ValueError, match="utterance"):
        Frames(torch.randn(3, 2, 8), torch.zeros(3, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(FileNotFoundError, match="frames_from_model"):
        Frames.load(tmp_path / "missing.safetensors")


def test_frames_from_dataset_voxpopuli_schema_with_a_stub_codec(tiny, tmp_path):
    """A local dataset with VoxPopuli's columns (16 kHz audio, raw_text, ...), saved with save_to_disk and read back
    through the real path (Audio column decoded with soundfile, resampled to the codec's 24 kHz)."""
    datasets = pytest.importorskip("datasets")
    sf = pytest.importorskip("soundfile")
    rng = np.random.default_rng(0)
    rows = {"audio_id": [], "language": [], "audio": [], "raw_text": [], "normalized_text": [], "gender": [],
            "speaker_id": [], "is_gold_transcript": [], "accent": []}
    for i, (secs, text) in enumerate([(0.5, "Hello there."), (0.3, ""), (0.8, "A second sentence.")]):
        p = tmp_path / f"u{i}.wav"
        sf.write(p, (0.1 * rng.standard_normal(int(16000 * secs))).astype(np.float32), 16000)
        for k, v in dict(audio_id=f"u{i}", language=0, audio=str(p), raw_text=text, normalized_text=text.lower(),
                         gender="female", speaker_id="s1", is_gold_transcript=True, accent="None").items():
            rows[k].append(v)
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(sampling_rate=16000))
    ds.save_to_disk(str(tmp_path / "vox"))

    class StubCodec:
        sample_rate = 24000
        lengths: list = []

        def encode(self, wav):
            self.lengths.append(len(wav))
            t = math.ceil(len(wav) / 1920)
            return np.random.default_rng(len(wav)).integers(0, 2048, size=(t, 16))

    codec = StubCodec()
    fr = frames_from_dataset(tmp_path / "vox", tiny, codec, language="english")
    assert codec.lengths == [12000, 19200]  # 0.5 s and 0.8 s at 24 kHz; the empty-text row skipped
    assert len(fr) == 7 + 10 and fr.codes.shape == (17, 15) and fr.context.shape == (17, 2, 64)
    assert fr.utterance.tolist() == [0] * 7 + [2] * 10 and fr.source["skipped"] == 1
    codes0 = torch.as_tensor(codec.encode(np.zeros(12000)))
    torch.testing.assert_close(fr.context[:7], teacher_forced_contexts(tiny, "Hello there.", codes0,
                                                                       language="english"))
    assert torch.equal(fr.codes[:7], codes0[:, 1:])
    assert len(frames_from_dataset(ds, tiny, codec, language="english", max_frames=5)) == 7  # stops after row 0
    with pytest.raises(ValueError, match="no 'words' column"):
        frames_from_dataset(ds, tiny, codec, text_column="words")
    with pytest.raises(FileNotFoundError, match="save_to_disk"):
        frames_from_dataset(tmp_path / "nope", tiny, codec)


# ----------------------------------------------------------------------------------------------------------------
# frames from utterances (the embedded model's shipped codes and texts)
# ----------------------------------------------------------------------------------------------------------------
def _utterances(n: int, seed: int = 0, lengths=(5, 9, 3, 7, 4, 6)):
    from rvqspec_lib.data.teacher import Utterance

    g = torch.Generator().manual_seed(seed)
    texts = ("Hello there.", "A longer second sentence, with a comma.", "Three.", "Four words in here.")
    return [Utterance(texts[i % len(texts)], torch.randint(0, 2048, (lengths[i % len(lengths)], 16), generator=g))
            for i in range(n)]


def test_frames_from_utterances_are_the_per_utterance_teacher_forced_contexts(tiny):
    """Batched over utterances of different lengths (left-padded prompts), in input order, with the true codes as
    targets; the same contexts as one teacher-forced pass per utterance; a frame limit cuts the last utterance."""
    from rvqspec_lib.data.frame_sources import frames_from_utterances

    utts = _utterances(5)
    fr = frames_from_utterances(tiny, utts, batch_size=3)
    n = sum(u.codes.shape[0] for u in utts)
    assert fr.context.shape == (n, 2, 64) and fr.context.dtype == torch.float32
    assert fr.codes.shape == (n, 15) and fr.codes.dtype == torch.int64
    assert fr.utterance.tolist() == [i for i, u in enumerate(utts) for _ in range(u.codes.shape[0])]
    for i, u in enumerate(utts):
        sel = fr.utterance == i
        torch.testing.assert_close(fr.context[sel], teacher_forced_contexts(tiny, u.text, u.codes),
                                   rtol=1e-4, atol=1e-5)
        assert torch.equal(fr.codes[sel], u.codes[:, 1:])
    cut = frames_from_utterances(tiny, utts, max_frames=12, batch_size=1)  # 5 + 7 of the second's 9 frames
    assert len(cut) == 12 and cut.utterance.tolist() == [0] * 5 + [1] * 7 and cut.source["cut_last"]
    torch.testing.assert_close(cut.context, fr.context[:12], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="codes must be"):
        frames_from_utterances(tiny, [(utts[0].text, utts[0].codes[:, :8])])
    with pytest.raises(ValueError, match="max_frames"):
        frames_from_utterances(tiny, utts, max_frames=0)
    with pytest.raises(ValueError, match="no utterances"):
        frames_from_utterances(tiny, [])


def test_frames_from_utterances_hidden_states_are_what_decode_frame_sees(tiny):
    """Teacher forcing the codes that greedy decode_frame commits from these contexts reproduces them at every depth:
    the hidden states the drafters train on are the ones decoding meets."""
    from rvqspec_lib.data.frame_sources import frames_from_utterances

    fr = frames_from_utterances(tiny, _utterances(2, seed=1))
    cp = tiny.code_predictor
    greedy = decode_frame(cp, fr.context, sampling=GREEDY).codes
    with torch.no_grad():
        again = verifier_logits(cp, teacher_forced_hidden(cp, fr.context, greedy)).argmax(-1)
    assert torch.equal(again, greedy)


def _shipped_tiny(tmp_path):
    """A folder laid out as build_embedded.py writes one: ``model/`` (tiny-random saved as a checkpoint) and
    ``utterances.safetensors`` + ``.jsonl`` with training / validation / evaluation splits."""
    from rvqspec_lib.models.loader import save_checkpoint
    from rvqspec_lib.data.utterances import write_shipped_utterances

    lm = load_model("tiny-random")
    save_checkpoint(lm, tmp_path / "model")
    rows, codes = [], {}
    for split, n in (("training", 6), ("validation", 3), ("evaluation", 3)):
        for i, u in enumerate(_utterances(n, seed=len(rows))):
            uid = f"{split}-{i}"
            rows.append({"id": uid, "split": split, "language": "en", "voice": "tiny", "text": u.text,
                         "source": "test", "seconds": u.codes.shape[0] / 12.5, "frames": u.codes.shape[0]})
            codes[uid] = u.codes.numpy()
    write_shipped_utterances(rows, codes, tmp_path / "utterances.safetensors")
    return tmp_path / "model"


def test_frames_from_shipped_splits_and_seeded_order(tmp_path):
    from rvqspec_lib.data.frame_sources import frames_from_shipped
    from rvqspec_lib.data.utterances import load_shipped_utterances

    model = _shipped_tiny(tmp_path)
    lm = load_model(str(model))
    _, utts = load_shipped_utterances(tmp_path / "utterances.safetensors", splits=["evaluation"])
    fr = frames_from_shipped(lm, "evaluation", seed=None)  # found from the loaded model's own folder
    assert len(fr) == sum(u.codes.shape[0] for u in utts) and fr.source["split"] == "evaluation"
    assert fr.source["file"] == str(tmp_path / "utterances.safetensors")
    assert fr.utterance.tolist() == [i for i, u in enumerate(utts) for _ in range(u.codes.shape[0])]
    shuffled = frames_from_shipped(lm, "evaluation", seed=3)
    for i, u in enumerate(utts):  # same frames, utterance ids still the index in the split
        assert torch.equal(shuffled.codes[shuffled.utterance == i], u.codes[:, 1:])
    limited = frames_from_shipped(lm, "training", max_frames=10, seed=0)
    assert len(limited) == 10 and limited.source["seed"] == 0
    with pytest.raises(ValueError, match="no utterances of split"):
        frames_from_shipped(lm, "calibration")
    with pytest.raises(FileNotFoundError, match="no folder of its own"):  # a model without a folder ships nothing
        frames_from_shipped(load_model("tiny-random"), "training")


def test_cli_defaults_to_the_shipped_utterances_and_the_model_folder(tmp_path, capsys):
    """train-drafter on a model with shipped utterances: training split, validation split for early stopping, the
    drafter written to <model>/drafters/; eval-acceptance finds it there and measures on the evaluation split."""
    model = _shipped_tiny(tmp_path)
    assert cli_main(["train-drafter", "--model", str(model), "--drafter", "offsets", "--frames", "20",
                     "--val-frames", "8", "--epochs", "1"]) == 0
    path = drafter_path(model, "offsets")
    assert path.is_file()
    prov = read_description(path)["provenance"]
    assert prov["data"]["kind"] == "shipped" and prov["data"]["split"] == "training"
    assert prov["n_train_frames"] == 20 and prov["n_val_frames"] == 8
    js = tmp_path / "acc.json"
    assert cli_main(["eval-acceptance", "--model", str(model), "--drafter", "offsets", "--frames", "6",
                     "--decoder", "chain:3", "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    assert rep["frames"]["split"] == "evaluation" and rep["n_frames"] == 6 and rep["params_added"] == 3 * 48
    capsys.readouterr()


def test_embedded_drafters_live_beside_the_embedded_model(tmp_path):
    from rvqspec_lib.models.drafter_files import cache_model_dir, model_drafter_dir
    from rvqspec_lib.models.loader import EMBEDDED_DIR

    assert model_drafter_dir("embedded") == EMBEDDED_DIR / "model"
    assert drafter_path(model_drafter_dir("embedded"), "offsets") == \
        EMBEDDED_DIR / "model" / "drafters" / "offsets.safetensors"
    assert model_drafter_dir(tmp_path) == tmp_path
    assert model_drafter_dir("tiny-random") is None
    assert model_drafter_dir("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") == cache_model_dir(
        "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")  # a hub id: prepared into the project's cache folder


def test_saturation_window_and_acceptance_by_depth():
    from paper.notebook_measures import saturation_window
    from rvqspec_lib.eval.acceptance import acceptance_by_depth

    tpc = {2: 1.5, 3: 1.9, 4: 2.0, 5: 2.01, 6: 1.99}
    assert saturation_window(tpc) == 4 and saturation_window(tpc, rel_tol=0) == 5
    # evaluate_acceptance's output: chains found by their fields (kind, nodes), never by parsing a label
    rows = {f"chain:{w}": {"kind": "chain", "nodes": w, "tokens_per_call": v} for w, v in tpc.items()}
    result = {"decoders": {**rows, "tree:0;1": {"kind": "tree", "nodes": 3, "tokens_per_call": 9.0}}}
    assert saturation_window(result) == 4
    with pytest.raises(ValueError, match="no chain window"):
        saturation_window({"decoders": {"tree:0;1": result["decoders"]["tree:0;1"]}})
    alpha = np.array([[0.9, 0.8], [0.7, np.nan], [np.nan, np.nan]])  # n = 4 codes: start depths 1..3, offsets 1..2
    d = acceptance_by_depth(alpha)
    assert d.shape == (5,) and np.isnan(d[:2]).all()
    assert d[2] == pytest.approx(0.9) and d[3] == pytest.approx((0.8 + 0.7) / 2) and np.isnan(d[4])
    assert acceptance_by_depth(alpha, max_offset=1)[3] == pytest.approx(0.7)
    with pytest.raises(ValueError, match="max_offset"):
        acceptance_by_depth(alpha, max_offset=0)


# ----------------------------------------------------------------------------------------------------------------
# training on the drift model
# ----------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def drift_model():
    """The drift model of the module docstring and its frames: ``(cp, train, held_out)``."""
    cfg = tiny_config_dict(n_code_groups=16, codebook_size=32)
    cp = build_from_config(cfg, seed=0).talker.code_predictor
    g = torch.Generator().manual_seed(100)
    n, h = 15, cfg["talker_config"]["hidden_size"]
    with torch.no_grad():
        for head in cp.lm_head:
            head.weight.mul_(20.0)
        u = torch.randn(h, generator=g)
        u /= u.norm()
        for t, table in enumerate(cp.model.codec_embedding):
            table.weight.add_(0.3 * (t + 1) * u)
        hm = teacher_forced_hidden(cp, torch.randn(256, 2, h, generator=g),
                                   torch.randint(0, 32, (256, n), generator=g)).mean(0)  # (n, H) mean H_d
        pc = torch.arange(n, dtype=torch.float32) - (n - 1) / 2
        s = (pc[:, None] * (hm - hm.mean(0))).sum(0)  # least-squares slope of the mean hidden state over depth
        s /= s.norm()
        for head in cp.lm_head:
            head.weight.add_(3.0 * torch.randn(32, 1, generator=g) * s[None, :])
    frames = frames_from_contexts(cp, torch.randn(1200, 2, h, generator=torch.Generator().manual_seed(0)), seed=0,
                                  frames_per_utterance=10)
    train, held_out = frames.split(0.25, seed=0)
    return cp, train, held_out


def _held_out(cp, drafter, held_out):
    """(exact acceptance by offset, Chain(4) tokens per call) on held-out frames."""
    ex = exact_statistics(cp, drafter, held_out.context, held_out.codes, n_ahead=3)
    res = decode_frame(cp, held_out.context, decoder=Chain(4), generator=torch.Generator().manual_seed(1),
                       drafter=drafter)
    return ex["alpha_by_offset"], float(15 / res.calls.double().mean())


def test_training_offsets_raises_acceptance_and_shuffled_targets_do_not(tmp_path):
    cp, train, held_out = drift_model()
    before = {k: v.clone() for k, v in cp.state_dict().items()}
    base_alpha, base_tpc = _held_out(cp, ReusedHeads(), held_out)
    results = {}
    for loss in ("ce", "kl"):
        off = make_drafter("offsets", cp, fresh=True)
        res = train_drafter(off, cp, train, loss=loss, max_epochs=8, batch_size=64, patience=2,
                            curve_path=tmp_path / f"{loss}.json")
        losses = [c["val_loss"] for c in res.curve]
        assert losses[res.best_epoch] < 0.8 * losses[0], (loss, losses)
        assert res.curve[0]["train_loss"] is None and all(c["train_loss"] > 0 for c in res.curve[1:])
        assert json.loads((tmp_path / f"{loss}.json").read_text())["best_epoch"] == res.best_epoch
        results[loss] = _held_out(cp, off, held_out)
    for loss, (alpha, tpc) in results.items():
        assert (alpha - base_alpha).min() > 0.03, (loss, alpha, base_alpha)
        assert tpc > base_tpc + 0.1, (loss, tpc, base_tpc)
    # negative control: the same training with targets shuffled across frames and depths (inputs unchanged)
    g = torch.Generator().manual_seed(5)
    flat = train.codes.flatten()
    shuffled = Frames(train.context, train.codes, train.utterance,
                      flat[torch.randperm(flat.numel(), generator=g)].reshape(train.codes.shape))
    ctl = make_drafter("offsets", cp, fresh=True)
    train_drafter(ctl, cp, shuffled, loss="ce", max_epochs=8, batch_size=64, patience=2, select="loss")
    alpha, tpc = _held_out(cp, ctl, held_out)
    assert alpha.max() < base_alpha.min() and tpc < base_tpc, (alpha, base_alpha, tpc, base_tpc)
    # selecting the epoch by validation acceptance (the default) keeps the untrained offsets instead
    ctl = make_drafter("offsets", cp, fresh=True)
    res = train_drafter(ctl, cp, shuffled, loss="ce", max_epochs=8, batch_size=64, patience=2)
    assert res.best_epoch == 0 and not ctl.offsets.detach().abs().sum()
    # the code predictor was frozen and is unchanged; its parameters still require grad as before
    assert all(torch.equal(v, before[k]) for k, v in cp.state_dict().items())
    assert all(p.requires_grad for p in cp.parameters())


def test_training_medusa_heads_raises_acceptance():
    cp, train, held_out = drift_model()
    base_alpha, _ = _held_out(cp, ReusedHeads(), held_out)
    med = make_drafter("medusa", cp, fresh=True)
    res = train_drafter(med, cp, train, loss="ce", lr=3e-3, max_epochs=4, batch_size=64)
    assert res.curve[res.best_epoch]["val_loss"] < res.curve[0]["val_loss"]
    alpha, _ = _held_out(cp, med, held_out)
    assert (alpha - base_alpha).min() > 0.01, (alpha, base_alpha)
    prov = med.provenance
    assert prov["loss"] == "ce" and prov["n_train_frames"] + prov["n_val_frames"] == len(train)  # val split inside


def test_acceptance_statistics_exact_and_empirical_agree():
    """On the drift model: predicted tokens per call from the exact tables vs measured; empirical offset-1 acceptance
    of Chain(2) vs exact alpha (exact for j = 1); empirical rank hits vs exact rank masses (same event)."""
    cp, _, held_out = drift_model()
    ctx = held_out.context[:200]
    rep = evaluate_acceptance(cp, ReusedHeads(), ctx, decoders=[Chain(2), Chain(4), Tree(((0,), (1,), (0, 0)))])
    json.dumps(rep)
    assert set(rep["tokens_per_call"]) == {"chain:2", "chain:4", "tree:0;1;0,0"}
    assert {k: (v["kind"], v["nodes"]) for k, v in rep["decoders"].items()} == {
        "chain:2": ("chain", 2), "chain:4": ("chain", 4), "tree:0;1;0,0": ("tree", 4)}
    for label, tpc in rep["tokens_per_call"].items():
        pred = rep["predicted_tokens_per_call"][label]
        assert abs(pred - tpc) < 0.06 * tpc, (label, pred, tpc)
    # offset 1, start depths weighted as the decoder met them (acceptance varies a lot with the start depth)
    tried = np.array(rep["decoders"]["chain:2"]["tried_by_start_offset"])[:, 0]
    exact = float((tried * np.array(rep["exact"]["alpha"], dtype=float)[:, 0]).sum() / tried.sum())
    emp = rep["decoders"]["chain:2"]["acceptance_by_offset"][0]
    assert abs(emp - exact) < 4 * math.sqrt(exact * (1 - exact) / tried.sum()), (emp, exact)
    mass, hit = np.array(rep["exact"]["rank_mass_by_offset"]), np.array(rep["exact"]["rank_hit_by_offset"])
    assert np.abs(mass - hit).max() < 0.03 and mass[0, 0] > mass[0, 1] > mass[0, 2]
    assert rep["per_depth_acceptance"][0] is None and rep["per_depth_acceptance"][1] is None  # nothing drafts 0, 1
    st = rep["decoders"]["chain:4"]
    assert sum(c * k for k, c in enumerate(st["committed_hist"], start=1)) == 200 * 14  # prefill commits code 1
    assert predicted_tokens_per_call({}, AR(), 15) == 1.0


# ----------------------------------------------------------------------------------------------------------------
# losslessness does not depend on the drafter
# ----------------------------------------------------------------------------------------------------------------
def test_greedy_ar_equals_chain_and_tree_with_any_drafter(tiny):
    cp = tiny.code_predictor
    ctx = _ctx(cp, 3, seed=11)
    ar = decode_frame(cp, ctx, decoder=AR(), sampling=GREEDY)
    drafters = {"offsets": _randomised(make_drafter("offsets", cp, fresh=True), 1, 2.0),
                "medusa": _randomised(make_drafter("medusa", cp, fresh=True), 2, 0.05)}
    for name, d in drafters.items():
        for dec in (Chain(2), Chain(4), Chain(8), Tree(), Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))):
            res = decode_frame(cp, ctx, decoder=dec, sampling=GREEDY, drafter=d)
            assert torch.equal(res.codes, ar.codes), (name, dec)
            assert int(res.calls.max()) <= 15


G_CASES = [("offsets", Chain(4)), ("offsets", TREE_SMALL), ("medusa", Chain(4)), ("medusa", TREE_SMALL)]


@pytest.mark.parametrize("name,decoder", G_CASES, ids=[f"{n}-{d!r}".replace(" ", "") for n, d in G_CASES])
def test_joint_distribution_is_exact_with_trained_style_drafters(name, decoder):
    """tests/test_lossless.py's G-test ("sharp" model: drafts far from p, residuals exercised) with random non-zero
    drafter parameters; the drafts must really differ from the reused heads' (else this would repeat that file)."""
    cp, context = variant("sharp")
    d = make_drafter(name, cp, fresh=True)
    _randomised(d, 3, 1.0 if name == "offsets" else 0.5)
    pmf = exact_pmf(cp, context, DEFAULT)
    n = frames_needed(pmf)
    res = decode_frame(cp, context.expand(n, 2, context.shape[-1]), decoder=decoder, sampling=DEFAULT,
                       generator=torch.Generator().manual_seed(4321), drafter=d)
    pval, df, g = g_test(pmf, res.codes)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"G={g:.1f} df={df} p={pval:.2e} N={n}: {name} drafts changed the sampled distribution"
    assert float(res.tokens_per_call.mean()) > 1.0
    with torch.no_grad():
        h = torch.randn(4, cp.config.hidden_size, generator=torch.Generator().manual_seed(0))
        dep = torch.tensor([1, 1, 2, 2])
        assert not torch.allclose(d.draft_logits(cp, h, dep, 2), ReusedHeads().draft_logits(cp, h, dep, 2), atol=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# files, factory, errors
# ----------------------------------------------------------------------------------------------------------------
def test_save_load_round_trip_and_loading_beside_a_model(tiny, tmp_path):
    cp = tiny.code_predictor
    hidden = torch.randn(5, cp.config.hidden_size, generator=torch.Generator().manual_seed(4))
    depth = torch.tensor([1, 3, 9, 13, 14])
    for name, scale in (("offsets", 1.0), ("medusa", 0.05)):
        d = _randomised(make_drafter(name, cp, fresh=True), 9, scale)
        d.provenance = {"loss": "ce", "data": {"kind": "test"}}
        path = save_drafter(d, drafter_path(tmp_path / "model", name))
        assert path == tmp_path / "model" / "drafters" / f"{name}.safetensors"
        side = json.loads(path.with_suffix(".json").read_text())
        assert side == read_description(path)
        assert side["name"] == name and side["params_added"] == d.params_added and side["config"]["K"] == 3
        assert side["provenance"]["data"] == {"kind": "test"}
        assert all(isinstance(s, list) for s in side["tensors"].values())
        for back in (load_drafter(path, cp), make_drafter(name, cp, tmp_path / "model"), make_drafter(name, cp, path)):
            assert type(back) is type(d) and back.provenance == d.provenance
            for (k1, v1), (k2, v2) in zip(d.state_dict().items(), back.state_dict().items()):
                assert k1 == k2 and torch.equal(v1, v2)
            with torch.no_grad():
                assert torch.equal(back.draft_logits(cp, hidden, depth, 3), d.draft_logits(cp, hidden, depth, 3))
    with pytest.raises(ValueError, match="holds a 'offsets' drafter"):
        make_drafter("medusa", cp, tmp_path / "model" / "drafters" / "offsets.safetensors")
    other = build_from_config(tiny_config_dict(code_predictor_hidden=32)).talker.code_predictor
    with pytest.raises(ValueError, match="hidden_size 48 .file. vs 32"):
        load_drafter(tmp_path / "model" / "drafters" / "offsets.safetensors", other)


def test_bad_names_and_missing_files_raise_clear_errors(tiny, tmp_path):
    cp = tiny.code_predictor
    with pytest.raises(ValueError, match="unknown drafter 'eagle'.*heads, offsets, medusa"):
        make_drafter("eagle", cp)
    with pytest.raises(FileNotFoundError, match="rvqspec train-drafter .*--drafter offsets"):
        make_drafter("offsets", cp)
    with pytest.raises(FileNotFoundError, match=r"drafters/medusa.safetensors.*train-drafter"):
        make_drafter("medusa", cp, tmp_path)
    assert isinstance(make_drafter("heads", cp), ReusedHeads)
    with pytest.raises(ValueError, match="has no parameters"):
        save_drafter(ReusedHeads(), tmp_path / "h.safetensors")
    with pytest.raises(ValueError, match=r"\.safetensors"):
        save_drafter(make_drafter("offsets", cp, fresh=True), tmp_path / "o.pt")
    with pytest.raises(ValueError, match="positive integer"):
        PositionOffsets(K=0)
    fr = frames_from_contexts(cp, _ctx(cp, 4), seed=0)
    with pytest.raises(ValueError, match="nothing to train"):
        train_drafter(ReusedHeads(), cp, fr)
    with pytest.raises(ValueError, match="unknown loss 'mse'"):
        train_drafter(make_drafter("offsets", cp, fresh=True), cp, fr, loss="mse")
    with pytest.raises(ValueError, match="not an rvqspec drafter"):
        from safetensors.torch import save_file

        save_file({"x": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
        load_drafter(tmp_path / "x.safetensors", cp)


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------
def test_cli_train_drafter_then_eval_acceptance_writes_the_json(tmp_path, capsys):
    out = tmp_path / "m" / "offsets.safetensors"
    # an explicit --out into a missing folder is refused before any work (as synth and eval-acceptance do)
    assert cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "24",
                     "--epochs", "1", "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err and not out.parent.exists()
    out.parent.mkdir()
    assert cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "24",
                     "--epochs", "1", "--out", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".json").is_file() and out.with_suffix(".curve.json").is_file()
    # a second run never replaces a trained drafter silently: --force says so
    before = out.read_bytes()
    assert cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "24",
                     "--epochs", "1", "--out", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err and out.read_bytes() == before
    assert cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "24",
                     "--epochs", "1", "--out", str(out), "--force", "--seed", "1"]) == 0
    js = tmp_path / "acc.json"
    assert cli_main(["eval-acceptance", "--model", "tiny-random", "--drafter", "offsets", "--drafter-path", str(out),
                     "--frames", "12", "--decoder", "tree:0;1;0,0", "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    for key in ("tokens_per_call", "params_added", "per_depth_acceptance", "predicted_tokens_per_call", "decoders",
                "exact", "drafter", "provenance", "random_weights"):
        assert key in rep, key
    assert rep["params_added"] == 3 * 48 and set(rep["tokens_per_call"]) == {"tree:0;1;0,0"} and rep["n_frames"] == 12
    assert len(rep["per_depth_acceptance"]) == 16 and rep["exact"]["rank_mass_by_offset"]
    js2 = tmp_path / "heads.json"
    assert cli_main(["eval-acceptance", "--model", "tiny-random", "--frames", "12", "--decoder", "chain:3",
                     "--json", str(js2)]) == 0
    rep2 = json.loads(js2.read_text())
    assert rep2["params_added"] == 0 and set(rep2["tokens_per_call"]) == {"chain:3"}
    assert "tokens/call" in capsys.readouterr().out


def test_cli_errors(capsys):
    assert cli_main(["eval-acceptance", "--model", "tiny-random", "--drafter", "offsets", "--frames", "4"]) == 2
    assert "train-drafter" in capsys.readouterr().err
    assert cli_main(["eval-acceptance", "--model", "tiny-random", "--decoder", "chain:9"]) == 2
    assert "window" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["eval-acceptance", "--model", "tiny-random", "--drafter", "eagle"])
    assert "--drafter eagle is not a drafter rvqspec eval-acceptance takes: use heads, offsets or medusa" in \
        capsys.readouterr().err
    assert cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "4"]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_training_offsets_on_total_variation_raises_acceptance():
    """loss="tv" descends one minus the exact acceptance rate (q warped as deployed): acceptance must go up."""
    cp, train, held_out = drift_model()
    base_alpha, base_tpc = _held_out(cp, ReusedHeads(), held_out)
    off = make_drafter("offsets", cp, fresh=True)
    res = train_drafter(off, cp, train, loss="tv", max_epochs=8, batch_size=64, patience=2)
    assert res.best_epoch > 0 and res.curve[res.best_epoch]["val_loss"] < res.curve[0]["val_loss"]
    alpha, tpc = _held_out(cp, off, held_out)
    assert (alpha - base_alpha).min() > 0.03 and tpc > base_tpc + 0.1, (alpha, base_alpha, tpc, base_tpc)
    with pytest.raises(ValueError, match="sampled decoding"):
        train_drafter(make_drafter("offsets", cp, fresh=True), cp, train, loss="tv", sampling=Sampling(greedy=True))


@pytest.mark.parametrize("argv, needle", [
    (["--decoder", "paper"], "eval-acceptance takes chain[:N] or tree[:PATHS]"),
    (["--decoder", "chain:4@offsets"], "(the drafter is --drafter)"),
    (["--drafter-path", "x.safetensors"], "--drafter-path is not used"),
    (["--max-rank", "0"], "--max-rank"),
    (["--max-rank", "100000"], "exceeds the codebook"),
    (["--codec", "c.safetensors"], "--codec is used only with --dataset"),
])
def test_cli_eval_acceptance_rejects_unused_or_bad_flags(capsys, argv, needle):
    try:
        rc = cli_main(["eval-acceptance", "--model", "tiny-random", "--drafter", "heads", "--frames", "4", *argv])
    except SystemExit as e:  # a value out of its range: refused by the parser
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["--codec", "c.safetensors"], "--codec is used only with --dataset"),
    (["--language", "german"], "--language is used only with --dataset"),
    (["--frames-file", "a.safetensors", "--texts-file", "t.txt"], "one frame source"),
    (["--val-frames", "100"], "--val-frames is used only"),
    (["--K", "15"], "K=15 is out of range"),
    (["--K", "0"], "K=0 is out of range"),
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--batch-size", "-5"], "--batch-size must be >= 1"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--patience", "-1"], "--patience must be >= 0"),
    (["--val-fraction", "1.5"], "--val-fraction must be in (0, 1)"),
])
def test_cli_train_drafter_rejects_unused_or_bad_flags(tmp_path, capsys, argv, needle):
    try:
        rc = cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--frames", "4",
                       "--out", str(tmp_path / "d.safetensors"), *argv])
    except SystemExit as e:  # a value out of its range: refused by the parser
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "d.safetensors").exists()


def test_cli_train_drafter_on_shipped_utterances_refuses_val_fraction(tmp_path, capsys):
    model = _shipped_tiny(tmp_path)
    rc = cli_main(["train-drafter", "--model", str(model), "--drafter", "offsets", "--frames", "8",
                   "--val-fraction", "0.2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--val-fraction is not used here" in err


def test_paired_acceptance_difference_finds_a_real_margin_and_not_a_fake_one():
    """Trained offsets on the drift model beat the reused heads with a 95% interval above zero (over held-out
    utterances); the same drafter against itself gives exactly zero (negative control: the interval cannot claim a
    margin that is not there); frame_acceptance averages to exact_statistics' table."""
    cp, train, held_out = drift_model()
    heads = ReusedHeads()
    off = make_drafter("offsets", cp, fresh=True)
    train_drafter(off, cp, train, loss="tv", max_epochs=6, batch_size=64, patience=2)
    r = paired_acceptance_difference(cp, heads, off, held_out)
    assert r["ci_low"] > 0.01 and r["p_value"] < 1e-3 and r["mean_b"] > r["mean_a"], r
    assert r["n_utterances"] == len(torch.unique(held_out.utterance)) and r["n_frames"] == len(held_out)
    same = paired_acceptance_difference(cp, heads, heads, held_out)
    assert same["difference"] == 0 and same["ci_low"] == same["ci_high"] == 0 and same["p_value"] == 1.0
    fa = frame_acceptance(cp, heads, held_out.context, held_out.codes, n_ahead=3)
    ex = exact_statistics(cp, heads, held_out.context, held_out.codes, n_ahead=3)
    np.testing.assert_allclose(fa.nanmean(0).numpy(), ex["alpha"], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="at least 2 utterances"):
        paired_acceptance_difference(cp, heads, off, held_out.subset(held_out.utterance == held_out.utterance[0]))


def test_cli_train_drafter_refuses_a_wrong_out_suffix_before_loading(tmp_path, capsys, monkeypatch):
    import rvqspec_lib.models.loader as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded before the check"))
    rc = cli_main(["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--out", str(tmp_path / "d.txt")])
    assert rc == 2 and "--out must end in .safetensors" in capsys.readouterr().err


def test_cli_shipped_drafter_is_not_overwritten_without_force(tmp_path, capsys):
    model = _shipped_tiny(tmp_path)
    args = ["train-drafter", "--model", str(model), "--drafter", "offsets", "--frames", "12", "--val-frames", "6",
            "--epochs", "1"]
    assert cli_main(args) == 0
    target = model / "drafters" / "offsets.safetensors"
    before = target.read_bytes()
    assert cli_main(args) == 2
    assert "pass --force" in capsys.readouterr().err and target.read_bytes() == before
    assert cli_main(args + ["--force"]) == 0


def test_saved_drafter_is_readable_by_others_as_a_plain_file_would_be(tmp_path):
    import os

    cp = load_model("tiny-random").code_predictor
    path = save_drafter(make_drafter("offsets", cp, fresh=True), tmp_path / "o.safetensors")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask  # safetensors alone writes 0600


# ----------------------------------------------------------------------------------------------------------------
# headroom: the best any H_k-only drafter could do
# ----------------------------------------------------------------------------------------------------------------
def test_optimal_overlap_matches_a_linear_program():
    # max_q (1/S) sum_s sum_x min(p_s(x), q(x)) solved exactly by scipy's LP on random instances, plus the
    # closed cases: equal distributions give 1, S disjoint point masses give 1/S
    from scipy.optimize import linprog

    from paper.headroom import optimal_overlap

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        s, v = 2 + trial % 4, 3 + trial % 5
        p = torch.softmax(3 * torch.randn(s, v, generator=g), -1).double()
        p[0, 0] = 0.0
        p = p / p.sum(-1, keepdim=True)
        # variables: q (v), t (s*v); maximise sum t / s; t_sx <= p_sx, t_sx <= q_x, sum q = 1
        c = np.concatenate([np.zeros(v), -np.ones(s * v) / s])
        a_ub = np.zeros((s * v, v + s * v))
        for i in range(s):
            for x in range(v):
                a_ub[i * v + x, x] = -1.0
                a_ub[i * v + x, v + i * v + x] = 1.0
        bounds = [(0, None)] * v + [(0, float(p[i, x])) for i in range(s) for x in range(v)]
        lp = linprog(c, A_ub=a_ub, b_ub=np.zeros(s * v), A_eq=np.r_[np.ones(v), np.zeros(s * v)][None], b_eq=[1.0],
                     bounds=bounds, method="highs")
        assert lp.status == 0
        assert float(optimal_overlap(p)) == pytest.approx(-lp.fun, abs=1e-9), trial
    same = torch.softmax(torch.randn(1, 7, generator=g), -1).expand(4, 7)
    assert float(optimal_overlap(same)) == pytest.approx(1.0, abs=1e-12)
    assert float(optimal_overlap(torch.eye(4))) == pytest.approx(0.25, abs=1e-12)
    assert optimal_overlap(torch.eye(4).expand(3, 2, 4, 4)).shape == (3, 2)
    assert float(optimal_overlap(np.eye(3))) == pytest.approx(1 / 3)  # arrays too
    for bad in (torch.tensor([0.5, 0.5]), torch.rand(4, 10, generator=g) + 0.1, -torch.eye(3)):
        with pytest.raises(ValueError):
            optimal_overlap(bad)


def test_headroom_ceiling_bounds_every_drafter_and_trained_offsets_close_the_gap():
    from paper.headroom import drafter_headroom

    cp, train, held_out = drift_model()
    off = make_drafter("offsets", cp, fresh=True)
    train_drafter(off, cp, train, loss="ce", max_epochs=8, batch_size=64, patience=2)
    ctx, codes = held_out.context[:64], held_out.codes[:64]
    r = drafter_headroom(cp, ctx, codes, {"heads": ReusedHeads(), "trained": off}, samples=8,
                         generator=torch.Generator().manual_seed(0))
    heads, trained = np.array(r["drafters"]["heads"]), np.array(r["drafters"]["trained"])
    ceiling, marginal = np.array(r["ceiling"]), np.array(r["marginal"])
    assert r["offsets"] == [1, 2, 3] and r["samples"] == 8 and r["n_frames"] == 64
    # in-sample optimum over all q: above every drafter scored on the same continuations (exact, per group)
    assert (ceiling >= heads - 1e-12).all() and (ceiling >= trained - 1e-12).all() and (ceiling <= 1).all()
    # on the drift model the reused heads leave room, and trained offsets take part of it
    assert (marginal - heads).min() > 0.03 and (trained - heads).min() > 0.03, (marginal, heads, trained)
    # the drafters' acceptance on sampled continuations agrees with the exact teacher-forced tables (same frames)
    ex = exact_statistics(cp, ReusedHeads(), ctx, codes, n_ahead=3)["alpha_by_offset"]
    assert np.abs(ex - heads).max() < 0.05, (ex, heads)
    same = drafter_headroom(cp, ctx, codes, {"heads": ReusedHeads()}, samples=8,
                            generator=torch.Generator().manual_seed(0))
    assert same["ceiling"] == r["ceiling"] and same["drafters"]["heads"] == r["drafters"]["heads"]  # seeded
    for bad_samples in (3, 0, 2.0, True):
        with pytest.raises(ValueError, match="samples must be even"):
            drafter_headroom(cp, ctx, codes, samples=bad_samples)
    with pytest.raises(ValueError, match="codes must lie in"):
        drafter_headroom(cp, ctx, codes + 32, samples=2)
    with pytest.raises(ValueError, match="need context"):
        drafter_headroom(cp, ctx, codes[:, :5], samples=2)
    with pytest.raises(ValueError, match="not drafters"):
        drafter_headroom(cp, ctx, codes, {"x": "heads"}, samples=2)
    with pytest.raises(ValueError, match="n_ahead must be in"):
        drafter_headroom(cp, ctx, codes, n_ahead=15)
