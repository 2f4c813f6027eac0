"""The trainer's alignment with inference, on tiny-random.

(a) teacher forcing reproduces greedy inference: on codes the model itself generated greedily, the teacher-forced
    talker logits (after the official code-0 processors) give back every code 0, and the code predictor's argmax gives
    back codes 1..15; the training prompt equals the inference prompt bit for bit;
(b) negative controls: labels shifted by one frame (or one codebook) do not match; the official code-predictor loss
    is double-shifted;
(c) a few dozen steps of overfitting two utterances, then the saved checkpoint, loaded with ``load_model``, speaks
    exactly the training codes (and stops) under greedy ``synthesize``: the loop learned what inference uses.
"""

from __future__ import annotations

import json
import shutil
from typing import Sequence

import pytest
import torch
import torch.nn.functional as F

from recipes.embedded.train import (
    bucket_batches,
    code_predictor_metrics,
    code_predictor_states,
    losses,
    small_config_dict,
    teacher_force,
    train,
    train_code_predictor,
)
from rvqspec_lib.models.configs import build_from_config, config_dict
from rvqspec_lib.models.frame import (
    _PromptCaptured,
    build_prompt,
    default_speaker,
    synthesize,
)
from rvqspec_lib.models.frontend import (
    ByteTokenizer,
    EspeakMissingError,
    PhonemeTokenizer,
    tokenizer_from_spec,
)
from rvqspec_lib.models.loader import LoadedModel, load_model, save_checkpoint
from rvqspec_lib.data.teacher import Utterance, batch_prompt
from rvqspec_lib.decoding.sampling import Sampling, code0_processors
from recipes.embedded.schedule import lr_at


TOY_WORDS = ("the cat sat on a mat while two dogs ran far away from old red barns near green hills "
             "and blue lakes under bright warm sun every quiet morning").split()


def toy_corpus(n: int, *, seed: int = 0, n_code_groups: int = 16, codebook_size: int = 2048,
               words: Sequence[str] = TOY_WORDS, min_words: int = 3, max_words: int = 8) -> list[Utterance]:
    """A learnable stand-in for speech codes, for runs of the trainer in tests (no audio, no codec).

    Each text is random words; frame t "speaks" character ``2t`` of the text (two characters a frame, plus two
    silent frames), so the talker must learn a monotonic text-to-frame alignment, as in TTS:
    ``code0[t] = (7 * byte(text[2t]) + 13 * (t % 3)) mod K``; the residual codes are a fixed function of code 0
    (``code_j = (code0 * (2j + 1) + 31 j) mod K``), so the code predictor has something to learn. Held-out texts
    follow the same rules, so held-out accuracy measures generalisation.
    """
    gen = torch.Generator().manual_seed(seed)
    k = codebook_size
    out = []
    for _ in range(n):
        m = int(torch.randint(min_words, max_words + 1, (1,), generator=gen))
        text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (m,), generator=gen)) + "."
        b = text.encode("utf-8")
        frames = len(b) // 2 + 2
        t = torch.arange(frames)
        chars = torch.tensor([b[min(2 * i, len(b) - 1)] if 2 * i < len(b) else 32 for i in range(frames)])
        code0 = (7 * chars + 13 * (t % 3)) % k
        j = torch.arange(n_code_groups)
        codes = (code0[:, None] * (2 * j + 1) + 31 * j) % k
        out.append(Utterance(text, codes.long()))
    return out


GREEDY = Sampling(greedy=True)
TEXTS = ["Hello world.", "A somewhat longer sentence, to pad the batch."]
FRAMES = 12
HAS_ESPEAK = shutil.which("espeak-ng") is not None


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def greedy_utts(lm):
    """Codes the model generated itself (greedy, with the default repetition penalty 1.05)."""
    res = synthesize(lm, TEXTS, sampling=GREEDY, talker_sampling=GREEDY, max_frames=FRAMES)
    return res, [Utterance(t, c) for t, c in zip(TEXTS, res.codes)]


def processed_argmax(lm, tf, row: int, codes0: torch.Tensor) -> list[int]:
    """Greedy code 0 at each teacher-forced position: the official processors (repetition penalty over the code-0
    history, end-of-speech masked for 2 codes, specials suppressed) applied to the logits, then argmax."""
    procs = code0_processors(lm.model.config.talker_config, repetition_penalty=1.05)
    out = []
    for t in range(int(tf.frames[row]) + 1):
        scores = procs(codes0[:t][None], tf.talker_logits[row:row + 1, t].float())
        out.append(int(scores.argmax()))
    return out


# ---------------------------------------------------------------------------------------------------------- (a)
def test_training_prompt_equals_inference_prompt(lm):
    inf = build_prompt(lm, TEXTS)
    trn = build_prompt(lm, TEXTS, grad=True)
    assert not inf.inputs_embeds.requires_grad and trn.inputs_embeds.requires_grad
    for a, b in [(inf.inputs_embeds, trn.inputs_embeds), (inf.attention_mask, trn.attention_mask),
                 (inf.trailing_text_hidden, trn.trailing_text_hidden), (inf.tts_pad_embed, trn.tts_pad_embed)]:
        assert torch.equal(a, b.detach())
    assert inf.attention_mask[0, 0] == 0  # left padding of the shorter text, as the official batch generate pads
    trn.inputs_embeds.sum().backward()
    for p in (lm.model.talker.get_text_embeddings().weight, lm.model.talker.get_input_embeddings().weight):
        assert p.grad is not None and p.grad.abs().sum() > 0  # text track and codec tags both learn
    lm.model.zero_grad(set_to_none=True)


def test_mixed_language_batch_prompt_equals_one_official_call(lm):
    """Groups of (language, speaker) are built separately and re-padded; the result equals ONE official call."""
    langs = ["auto", "english", "auto"]
    texts = ["Hi.", "Second text here.", "A third, longer, sentence."]
    utts = [Utterance(t, torch.zeros(2, 16, dtype=torch.long), default_speaker(lm), g) for t, g in zip(texts, langs)]
    mine = batch_prompt(lm, utts, grad=False)

    def capture(**kw):
        raise _PromptCaptured(kw)

    lm.model.talker.generate = capture
    try:
        with torch.inference_mode():
            lm.model.generate(input_ids=[lm.tokenizer(t) for t in texts], languages=langs,
                              speakers=[default_speaker(lm)] * 3, non_streaming_mode=True)
    except _PromptCaptured as c:
        ref = c.args[0]
    finally:
        del lm.model.talker.generate
    assert torch.equal(mine.inputs_embeds, ref["inputs_embeds"])
    assert torch.equal(mine.attention_mask, ref["attention_mask"])
    assert torch.equal(mine.trailing_text_hidden, ref["trailing_text_hidden"])


def test_teacher_forcing_reproduces_greedy_inference(lm, greedy_utts):
    res, utts = greedy_utts
    with torch.no_grad():
        tf = teacher_force(lm, utts)
    eos = lm.model.config.talker_config.codec_eos_token_id
    for i, u in enumerate(utts):
        n = int(res.frames[i])
        pred = processed_argmax(lm, tf, i, u.codes[:, 0])
        assert pred[:n] == u.codes[:, 0].tolist()  # every code 0
        if bool(res.ended[i]):
            assert pred[n] == eos
    assert torch.equal(tf.cp_logits.argmax(-1), tf.cp_labels)  # every code 1..15 of every frame
    assert torch.equal(tf.cp_labels, torch.cat([u.codes[:, 1:] for u in utts]))
    # labels: code 0 of each frame, then end of speech, then ignored
    n0 = int(res.frames[0])
    assert tf.talker_labels[0, :n0].tolist() == utts[0].codes[:, 0].tolist() and tf.talker_labels[0, n0] == eos


# ---------------------------------------------------------------------------------------------------------- (b)
def test_negative_control_shifted_labels_do_not_match(lm, greedy_utts):
    res, utts = greedy_utts
    with torch.no_grad():
        tf = teacher_force(lm, utts)
    for i, u in enumerate(utts):
        n = int(res.frames[i])
        pred = torch.tensor(processed_argmax(lm, tf, i, u.codes[:, 0])[:n])
        c0 = u.codes[:, 0]
        assert (pred[1:] == c0[:-1]).float().mean() < 0.5  # labels one frame late
        assert (pred[:-1] == c0[1:]).float().mean() < 0.5  # labels one frame early
    arg = tf.cp_logits.argmax(-1)
    n0 = int(res.frames[0])
    assert (arg[1:n0] == tf.cp_labels[: n0 - 1]).float().mean() < 0.5  # code-predictor labels one frame late
    assert (arg[:, :-1] == tf.cp_labels[:, 1:]).float().mean() < 0.5  # one codebook late


def test_official_code_predictor_loss_is_double_shifted(lm, greedy_utts):
    """``forward_sub_talker_finetune``'s logits are aligned (head j at position j predicts code j), but its loss
    shifts the labels once more (transformers' causal-LM loss): it scores head j against code j+1 and drops code 15."""
    _, utts = greedy_utts
    with torch.no_grad():
        tf = teacher_force(lm, utts)
    v = tf.cp_logits.shape[-1]
    double = F.cross_entropy(tf.cp_logits[:, :-1].reshape(-1, v), tf.cp_labels[:, 1:].reshape(-1))
    aligned = F.cross_entropy(tf.cp_logits.reshape(-1, v), tf.cp_labels.reshape(-1))
    assert float(tf.official_cp_loss) == pytest.approx(float(double), rel=1e-5)
    assert abs(float(tf.official_cp_loss) - float(aligned)) > 0.1
    assert losses(tf)["cp_loss"] == pytest.approx(float(aligned), rel=1e-6)


# ---------------------------------------------------------------------------------------------------------- (c)
def test_overfit_two_utterances_then_greedy_synthesis_reproduces_them(tmp_path):
    lm = load_model("tiny-random", seed=5)
    g = torch.Generator().manual_seed(0)
    utts = [Utterance("Hello world.", torch.randint(0, 2048, (8, 16), generator=g)),
            Utterance("Another, longer one.", torch.randint(0, 2048, (5, 16), generator=g))]
    out = train(lm, utts, steps=60, lr=1e-2, batch_size=2, eval_every=30, warmup_steps=10, weight_decay=0.0,
                val_dataset=utts[:1], out_dir=tmp_path / "ckpt", progress=False)
    curve = out["curve"]
    assert [r["step"] for r in curve] == [30, 60]
    assert curve[-1]["train_loss"] < 0.05 and curve[-1]["train_code0_acc"] == 1.0 and curve[-1]["train_cp_acc"] == 1.0
    saved = json.loads((tmp_path / "ckpt" / "curve.json").read_text())
    assert saved["curve"][-1]["step"] == 60 and saved["meta"]["steps"] == 60
    for f in ("model.safetensors", "config.json", "generation_config.json", "rvqspec_model.json"):
        assert (tmp_path / "ckpt" / f).exists() and (tmp_path / "ckpt" / "best" / f).exists()
    loaded = load_model(str(tmp_path / "ckpt"))
    assert loaded.kind == "checkpoint" and isinstance(loaded.tokenizer, ByteTokenizer)
    res = synthesize(loaded, [u.text for u in utts], sampling=GREEDY, talker_sampling=GREEDY, max_frames=20)
    assert res.ended.all()
    for u, c in zip(utts, res.codes):
        assert torch.equal(c, u.codes)


# ---------------------------------------------------------------------------------------------------------- pieces
def test_checkpoint_roundtrip_same_weights_and_outputs(lm, greedy_utts, tmp_path):
    _, utts = greedy_utts
    save_checkpoint(lm, tmp_path)
    back = load_model(str(tmp_path))
    sd, sd2 = lm.model.state_dict(), back.model.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    with torch.no_grad():
        a, b = teacher_force(lm, utts), teacher_force(back, utts)
    assert torch.equal(a.talker_logits, b.talker_logits) and torch.equal(a.cp_logits, b.cp_logits)
    assert json.loads((tmp_path / "rvqspec_model.json").read_text())["tokenizer"] == {"kind": "bytes"}
    assert back.generation["subtalker_top_k"] == 50


def test_small_config_two_speakers_train_step():
    cfg = small_config_dict(talker_layers=1, talker_hidden=64, code_predictor_layers=1, code_predictor_hidden=32,
                            head_dim=16, text_hidden=32, speakers=("slt", "awb"))
    assert cfg["talker_config"]["rope_scaling"]["mrope_section"] == [4, 2, 2]
    model = build_from_config(cfg).train()
    lm = LoadedModel("small", "checkpoint", model, ByteTokenizer(256, 257, 258))
    assert json.loads(json.dumps(config_dict(model)))["talker_config"]["spk_id"] == {"slt": 3000, "awb": 3001}
    utts = [Utterance(u.text, u.codes, spk) for u, spk in zip(toy_corpus(4, seed=1), ["slt", "awb", "awb", "slt"])]
    r = losses(teacher_force(lm, utts, feedback_noise=0.5, generator=torch.Generator().manual_seed(0)))
    r["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert r["n_talker"] == sum(u.codes.shape[0] + 1 for u in utts)


def test_feedback_noise_changes_inputs_not_labels(lm, greedy_utts):
    _, utts = greedy_utts
    with torch.no_grad():
        a = teacher_force(lm, utts)
        b = teacher_force(lm, utts, feedback_noise=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.talker_labels, b.talker_labels) and torch.equal(a.cp_labels, b.cp_labels)
    assert torch.equal(a.talker_logits[:, 0], b.talker_logits[:, 0])  # the prompt's last position sees no frame
    assert not torch.equal(a.talker_logits[:, 1:], b.talker_logits[:, 1:])


def test_cp_fraction_trains_the_code_predictor_on_a_subset_of_the_same_frames(lm, greedy_utts):
    _, utts = greedy_utts
    with torch.no_grad():
        full = teacher_force(lm, utts)
        sub = teacher_force(lm, utts, cp_fraction=0.25, generator=torch.Generator().manual_seed(0))
    n = full.cp_labels.shape[0]
    assert sub.cp_labels.shape[0] == -(-n // 4)
    assert torch.equal(sub.talker_logits, full.talker_logits)  # the talker still sees and scores every frame
    for h, lab, lo in zip(sub.talker_hidden, sub.cp_labels, sub.cp_logits):
        i = int(((full.talker_hidden - h).abs().sum(1)).argmin())
        assert torch.equal(full.cp_labels[i], lab) and torch.allclose(full.cp_logits[i], lo, atol=1e-5)
    with pytest.raises(ValueError, match="generator"):
        teacher_force(lm, utts, cp_fraction=0.5)


def test_bucket_batches_cover_each_index_once_and_are_seeded():
    lengths = [int(x) for x in torch.randint(1, 100, (103,), generator=torch.Generator().manual_seed(0))]
    a = bucket_batches(lengths, 8, torch.Generator().manual_seed(1), bucket_batches_n=4)
    b = bucket_batches(lengths, 8, torch.Generator().manual_seed(1), bucket_batches_n=4)
    assert a == b and sorted(i for bt in a for i in bt) == list(range(103))
    assert all(len(bt) <= 8 for bt in a)
    spread = sum(max(lengths[i] for i in bt) - min(lengths[i] for i in bt) for bt in a) / len(a)
    assert spread < 30  # random batches of 8 would spread about 70


def test_schedule_and_budget_errors(lm):
    assert lr_at(0, 0.0, lr=1.0, warmup_steps=10, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr_at(10, 0.0, lr=1.0, warmup_steps=10, min_lr_ratio=0.1) == pytest.approx(1.0)
    assert lr_at(50, 1.0, lr=1.0, warmup_steps=10, min_lr_ratio=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="exactly one"):
        train(lm, toy_corpus(2), steps=1, minutes=1.0, progress=False)
    with pytest.raises(ValueError, match="exactly one"):
        train(lm, toy_corpus(2), progress=False)
    with pytest.raises(ValueError, match="codes must be"):
        teacher_force(lm, [Utterance("hi", torch.zeros(16, dtype=torch.long))])
    with pytest.raises(ValueError, match="in 0..2047"):
        teacher_force(lm, [Utterance("hi", torch.full((3, 16), 2048))])
    with pytest.raises(ValueError, match="must be"):
        teacher_force(lm, [Utterance("hi", torch.zeros(3, 8, dtype=torch.long))])


def test_toy_corpus_is_a_function_of_the_text():
    a, b = toy_corpus(5, seed=0), toy_corpus(5, seed=0)
    assert all(x.text == y.text and torch.equal(x.codes, y.codes) for x, y in zip(a, b))
    u = a[0]
    assert u.codes.shape == (len(u.text.encode()) // 2 + 2, 16) and int(u.codes.max()) < 2048


# ---------------------------------------------------------------------------------------------------------- phonemes
def test_phoneme_tokenizer_missing_espeak_is_a_clear_error():
    tok = PhonemeTokenizer(256, 257, 258, espeak="/nonexistent/espeak-ng")
    with pytest.raises(EspeakMissingError, match="apt-get install -y espeak-ng"):
        tok("Hello world.")
    with pytest.raises(ValueError, match="alphabet"):
        PhonemeTokenizer(256, 257, 258, alphabet="klingon")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_spec({"kind": "letters"}, {"im_start_token_id": 1, "im_end_token_id": 2,
                                                  "assistant_token_id": 3})


@pytest.mark.skipif(not HAS_ESPEAK, reason="espeak-ng is not installed (apt-get install -y espeak-ng)")
def test_phoneme_tokenizer_layout_and_checkpoint(lm, tmp_path):
    tok = PhonemeTokenizer(256, 257, 258, voice="en-us")
    ph = tok.phonemize("Hello world, how are you?")
    assert "h@l'oU" in ph and " | " in ph and ph.endswith("?")
    ids = tok("Hello world, how are you?")[0].tolist()
    assert ids[:3] == [256, 258, 10] and ids[-5:] == [257, 10, 256, 258, 10]
    assert bytes(ids[3:-5]).decode() == ph and max(ids[3:-5]) < 256
    ipa = PhonemeTokenizer(256, 257, 258, alphabet="ipa").phonemize("Hello world.")
    assert "həlˈoʊ" in ipa
    with pytest.raises(ValueError, match="espeak-ng failed"):
        PhonemeTokenizer(256, 257, 258, voice="zz")("Hello.")
    with pytest.raises(ValueError, match="empty"):
        tok("  ")
    # stored with the checkpoint, rebuilt by load_model: a user needs only the directory (and espeak-ng)
    mine = LoadedModel("p", "checkpoint", lm.model, tok, lm.generation)
    save_checkpoint(mine, tmp_path)
    back = load_model(str(tmp_path))
    assert isinstance(back.tokenizer, PhonemeTokenizer) and back.tokenizer.spec() == tok.spec()
    assert torch.equal(back.tokenizer("Hello world."), tok("Hello world."))
    res = synthesize(back, "Hello world.", sampling=GREEDY, talker_sampling=GREEDY, max_frames=2)
    assert res.codes[0].shape == (2, 16)


# ---------------------------------------------------------------------------------------------------------- cp stage
def test_code_predictor_states_are_the_teacher_forced_hidden_states(lm, greedy_utts):
    _, utts = greedy_utts
    st = code_predictor_states(lm, utts, batch_size=1, progress=False)
    with torch.no_grad():
        tf = teacher_force(lm, utts)
    assert len(st) == sum(u.codes.shape[0] for u in utts) == tf.talker_hidden.shape[0]
    # batched by length (different padding), same states up to float noise; rows in length order
    order = sorted(range(len(utts)), key=lambda i: utts[i].codes.shape[0])
    codes = torch.cat([utts[i].codes for i in order])
    assert torch.equal(st.codes, codes)
    starts = {i: sum(utts[j].codes.shape[0] for j in range(i)) for i in range(len(utts))}
    ref = torch.cat([tf.talker_hidden[starts[i]: starts[i] + utts[i].codes.shape[0]] for i in order])
    assert torch.allclose(st.hidden, ref, atol=1e-4)
    with pytest.raises(ValueError, match="no utterances"):
        code_predictor_states(lm, [], progress=False)


def test_code_predictor_stage_learns_and_leaves_the_talker_and_embeddings_alone(tmp_path):
    """The stage lowers the code-predictor loss on frames it trains on, and changes no talker weight and no code
    embedding (the talker reads those for frame feedback). Negative control: the code predictor's heads did change."""
    lm = load_model("tiny-random", seed=3)
    g = torch.Generator().manual_seed(0)
    code0 = torch.randint(0, 2048, (24,), generator=g)
    codes = torch.stack([(code0 * (2 * j + 1) + 31 * j) % 2048 for j in range(16)], 1)  # codes 1.. follow code 0
    utts = [Utterance("Hello world.", codes[:12]), Utterance("Another one.", codes[12:])]
    st = code_predictor_states(lm, utts, progress=False)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    m0 = code_predictor_metrics(lm, st)
    r = train_code_predictor(lm, st, st, steps=40, lr=1e-2, batch_frames=24, warmup_steps=2, eval_every=20,
                             out_dir=tmp_path, progress=False)
    m1 = code_predictor_metrics(lm, st)
    assert m1["cp_loss"] < m0["cp_loss"] - 1.0 and m1["cp_acc"] > m0["cp_acc"]
    assert [c["step"] for c in r["curve"]] == [0, 20, 40] and r["frames_seen"] == 40 * 24
    assert r["best"]["cp_loss"] == pytest.approx(m1["cp_loss"], rel=1e-5)  # the best weights are the ones left
    after = lm.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "negative control: training changed nothing"
    assert all(k.startswith("talker.code_predictor.") and "codec_embedding" not in k for k in changed)
    assert any("lm_head" in k for k in changed)
    assert all(p.requires_grad for p in lm.model.parameters())  # restored for later training
    saved = json.loads((tmp_path / "cp_curve.json").read_text())
    assert saved["meta"]["steps"] == 40 and saved["meta"]["params_trained"] == r["params_trained"] > 0


def test_code_predictor_stage_errors(lm, greedy_utts):
    _, utts = greedy_utts
    st = code_predictor_states(lm, utts, progress=False)
    with pytest.raises(ValueError, match="exactly one budget"):
        train_code_predictor(lm, st)
    with pytest.raises(ValueError, match="exactly one budget"):
        train_code_predictor(lm, st, steps=1, minutes=1)
    with pytest.raises(ValueError, match="batch_frames"):
        train_code_predictor(lm, st, steps=1, batch_frames=0)
