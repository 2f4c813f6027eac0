"""The real-checkpoint path, tested as a user would run it (README "Running on the released checkpoint").

No released weights can be downloaded here, so :func:`checkpoints.write_tiny_checkpoint` writes a
tiny checkpoint with RANDOM weights in the official on-disk layout (config.json, generation_config.json,
model.safetensors, a Qwen2 BPE text tokenizer, preprocessor_config.json, speech_tokenizer/ with the official 12 Hz
classes). Then, exactly as with a downloaded ``Qwen3-TTS-12Hz-0.6B-CustomVoice`` folder:

* ``load_model(<folder>)`` goes through the official ``Qwen3TTSModel.from_pretrained`` (a spy proves it) and reports
  the random weights (the ``RANDOM_WEIGHTS`` marker; without it, a plain checkpoint: the negative control);
* ``synthesize`` a few frames and decode them through the official speech tokenizer: a finite float waveform of
  1920 samples a frame at 24 kHz, which depends on the codes;
* greedy frame-loop codes equal the official ``generate``'s; sampled AR equals it under the same seed, and another
  seed differs;
* ``rvqspec synth --model <folder> --decoder chain`` writes a wav;
* the checkpoint's speech tokenizer streams through the official 12 Hz decoder (the library and ``synth --stream``),
  the stream's audio equal to the whole-utterance decode;
* every notebook runs with ``model=<folder>`` and ``smoke=True`` (what ``make paper MODEL=<folder> SMOKE=1``
  passes), on the checkpoint itself: it speaks its own frames (paper.checkpoint, into the run's folder), 00 measures
  its own 12 Hz codec and says what it skips, 03-07 train, calibrate, measure and time it; and notebook 03 with
  ``dataset=`` / ``codec=`` (a tiny saved dataset in VoxPopuli's schema, the checkpoint's own speech tokenizer)
  trains and measures the drafters on the checkpoint itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from checkpoints import RELEASE_DIR, write_tiny_checkpoint
from rvqspec_lib.models.backends import frame_runner
from rvqspec_lib.models.frame import synthesize
from rvqspec_lib.models.loader import RANDOM_WEIGHTS_MARKER, load_model
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling

TEXT = "Hello world. The quick brown fox."
FRAMES = 4
SAMPLES_PER_FRAME, SAMPLE_RATE = 1920, 24000


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "Qwen3-TTS-12Hz-tiny-CustomVoice", seed=0)


@pytest.fixture(scope="module")
def lm(ckpt):
    """float32, so that the frame loop equals the official generate bit for bit (in bfloat16 the two compute in
    different orders and round differently: a greedy tie can break the other way)."""
    return load_model(str(ckpt), dtype="float32")


# ---- the writer ---------------------------------------------------------------------------------------------------
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_official_layout_and_release_keys(ckpt):
    files = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
    assert {"config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json", "vocab.json",
            "merges.txt", "tokenizer.json", "tokenizer_config.json", RANDOM_WEIGHTS_MARKER,
            "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
            "speech_tokenizer/preprocessor_config.json"} <= files
    cfg, rel = json.loads((ckpt / "config.json").read_text()), json.loads((RELEASE_DIR / "config.json").read_text())
    assert set(cfg) == set(rel) and set(cfg["talker_config"]) == set(rel["talker_config"])
    for k in ("codec_language_id", "spk_id", "spk_is_dialect", "codec_eos_token_id", "num_code_groups"):
        assert cfg["talker_config"][k] == rel["talker_config"][k], k
    assert json.loads((ckpt / "generation_config.json").read_text()) == \
        json.loads((RELEASE_DIR / "generation_config.json").read_text())
    st = json.loads((ckpt / "speech_tokenizer" / "config.json").read_text())
    assert (st["output_sample_rate"], st["decode_upsample_rate"], st["encoder_valid_num_quantizers"]) == \
        (SAMPLE_RATE, SAMPLES_PER_FRAME, 16)
    assert sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) < 20e6
    assert not [p for p in ckpt.parent.iterdir() if p != ckpt]  # no temporary folder left beside it


def test_seeded_and_refuses_a_non_empty_folder(ckpt, tmp_path):
    state = torch.random.get_rng_state()
    again = write_tiny_checkpoint(tmp_path / "same", seed=0)
    other = write_tiny_checkpoint(tmp_path / "other", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's global RNG untouched
    for f in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        assert _digest(again / f) == _digest(ckpt / f), f  # same seed, same bytes
        assert _digest(other / f) != _digest(ckpt / f), f  # the negative control
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_tiny_checkpoint(again)
    assert _digest(again / "model.safetensors") == _digest(ckpt / "model.safetensors")  # left as it was


# ---- the loader -----------------------------------------------------------------------------------------------------
def test_load_model_goes_through_the_official_from_pretrained(ckpt, tmp_path, monkeypatch):
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer

    calls = []
    real = Qwen3TTSModel.from_pretrained.__func__

    def spy(cls, name, **kw):
        calls.append((name, kw))
        return real(cls, name, **kw)

    monkeypatch.setattr(Qwen3TTSModel, "from_pretrained", classmethod(spy))
    lm = load_model(str(ckpt), dtype="float32")
    assert [c[0] for c in calls] == [str(ckpt)] and calls[0][1]["dtype"] is torch.float32
    assert "torch_dtype" not in calls[0][1]  # deprecated in transformers
    assert lm.kind == "random-checkpoint" and lm.is_random and lm.describe()["random_weights"] is True
    assert isinstance(lm.speech_tokenizer, Qwen3TTSTokenizer)  # the official 12 Hz tokenizer, from the folder
    assert (lm.frame_rate_hz, lm.sample_rate_hz, lm.n_code_groups, lm.codebook_size) == (12.5, SAMPLE_RATE, 16, 2048)
    assert next(lm.model.parameters()).dtype == torch.float32  # bfloat16 on disk, converted as asked
    assert (lm.device, lm.dtype, lm.describe()["device"]) == ("cpu", "float32", "cpu")
    # the negative control: the same folder without the marker is a (trained) checkpoint to the loader
    plain = tmp_path / "plain"
    shutil.copytree(ckpt, plain)
    (plain / RANDOM_WEIGHTS_MARKER).unlink()
    assert load_model(str(plain)).kind == "checkpoint" and not load_model(str(plain)).is_random


# ---- device and dtype ------------------------------------------------------------------------------------------------
def test_a_checkpoint_loads_in_its_own_dtype_where_the_cpu_runs_it(ckpt, monkeypatch):
    """The rule (docs/model.md#device-and-dtype): bfloat16 on disk -> bfloat16 on a CPU with native bfloat16, float32
    on one without; the flags faked both ways, so the test is the same on every machine."""
    from rvqspec_lib.common import machine
    from rvqspec_lib.models.loader import stored_dtype

    assert stored_dtype(ckpt) is torch.bfloat16 and stored_dtype(ckpt / "speech_tokenizer") is torch.float32
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(machine, "native_bfloat16", lambda native=native: native)
        lm = load_model(str(ckpt))
        assert next(lm.model.parameters()).dtype is want and lm.dtype == str(want).split(".")[1]
        assert lm.device == "cpu"
    assert load_model("embedded").dtype == "float32"  # our own model: float32 (stored in float16 for size)


def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    """The device resolver with the GPUs faked (no GPU here): auto takes CUDA, then MPS, then the CPU; a device not
    present is a one-line ValueError naming those that are; the dtype rule per device."""
    from rvqspec_lib.common import machine

    def fake(cuda, mps, bf16=True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    fake(True, True)
    assert machine.present_devices() == ("cuda", "mps", "cpu") and machine.resolve_device("auto") == "cuda"
    assert machine.resolve_device("mps") == "mps" and machine.resolve_device("CPU") == "cpu"
    assert machine.load_dtype(torch.bfloat16, "cuda") is torch.bfloat16
    assert machine.load_dtype(torch.float16, "mps") is torch.float16
    fake(True, False, bf16=False)  # an older NVIDIA GPU: bfloat16 emulated -> float32
    assert machine.load_dtype(torch.bfloat16, "cuda") is torch.float32
    fake(False, True)
    assert machine.resolve_device("auto") == "mps" and machine.load_dtype(torch.bfloat16, "mps") is torch.bfloat16
    with pytest.raises(ValueError, match=r"^--device cuda is not present on this machine \(it has mps, cpu\)"):
        machine.resolve_device("cuda")
    fake(False, False)
    assert machine.resolve_device("auto") == "cpu"
    assert machine.load_dtype(torch.float16, "cpu") is torch.float32  # CPUs emulate float16
    for bad in ("tpu", "mps:1", "cuda:x"):
        with pytest.raises(ValueError, match="unknown device"):
            machine.resolve_device(bad)


def test_native_bfloat16_from_the_cpu_flags(tmp_path, monkeypatch):
    """The CPU's flags say whether bfloat16 is native; oneDNN capped below it (make paper's pinned notebooks) says it
    is not, whatever the flags; a cap that keeps bfloat16 (or none, ALL) is no cap."""
    from rvqspec_lib.common.machine import native_bfloat16

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    cases = {"x86 avx512_bf16": ("flags\t\t: fpu sse2 avx512f avx512_bf16\n", True),
             "x86 amx_bf16": ("flags\t\t: fpu amx_bf16 amx_tile\n", True),
             "x86 without": ("flags\t\t: fpu sse2 avx2 avx512f\n", False),
             "arm bf16": ("Features\t: fp asimd bf16 i8mm\n", True), "arm without": ("Features\t: fp asimd\n", False)}
    for i, (name, (text, want)) in enumerate(cases.items()):
        f = tmp_path / f"cpuinfo{i}"
        f.write_text("processor\t: 0\n" + text)
        assert native_bfloat16(f) is want, name
        for isa, pinned in (("AVX2", True), ("avx512_core", True), ("ALL", False), ("AVX512_CORE_BF16", False),
                            ("AVX512_CORE_AMX", False)):
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
            assert native_bfloat16(f) is (want and not pinned), (name, isa)
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert native_bfloat16(tmp_path / "absent") is False


# ---- frames and audio ------------------------------------------------------------------------------------------------
def test_synthesize_and_decode_through_the_official_speech_tokenizer(lm):
    res = synthesize(lm, TEXT, max_frames=FRAMES, generator=torch.Generator().manual_seed(0),
                     language="english", speaker="vivian")
    codes = res.codes[0]
    assert codes.shape == (FRAMES, 16) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < 2048
    wavs, sr = lm.speech_tokenizer.decode([{"audio_codes": codes}])
    wav = np.asarray(wavs[0])
    assert sr == SAMPLE_RATE and wav.dtype in (np.float32, np.float64)
    assert wav.shape == (FRAMES * SAMPLES_PER_FRAME,) and np.isfinite(wav).all()
    assert np.sqrt(np.mean(wav.astype(np.float64) ** 2)) > 1e-3  # audible, not silence
    other = codes.clone()
    other[:, 5] = (other[:, 5] + 1) % 2048  # one codebook changed: the audio must change (the decoder reads codes)
    assert np.abs(np.asarray(lm.speech_tokenizer.decode([{"audio_codes": other}])[0][0]) - wav).max() > 1e-4


def test_decode_audio_is_the_official_decode_in_bounded_chunks(lm, monkeypatch):
    """decode_audio (synth's and the evaluations' codes to audio): on the CPU the official 12 Hz decoder streamed in
    DECODE_CHUNK_FRAMES-frame chunks gives the official one-call decode's samples up to float rounding (relative RMS
    below 2e-5, as tests/test_streaming_codec.py bounds the stream), for a length that is not a multiple of the chunk;
    negative control: other codes give other audio; another codec's decode is used as is."""
    from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
    from rvqspec_lib.device.streaming_layers import onednn_available
    from rvqspec_lib.models.speech_tokenizers import DECODE_CHUNK_FRAMES, CodecSpeechTokenizer, decode_audio

    pushed, push = [], StreamingCodecDecoder.push
    monkeypatch.setattr(StreamingCodecDecoder, "push", lambda self, c, *a, **k: pushed.append(c.shape[-1]) or
                        push(self, c, *a, **k))
    n = 2 * DECODE_CHUNK_FRAMES + 3
    codes = torch.randint(0, 2048, (n, 16), generator=torch.Generator().manual_seed(1))
    wavs, sr = lm.speech_tokenizer.decode([{"audio_codes": codes}])
    ref = np.asarray(wavs[0], dtype=np.float64)
    wav, rate = decode_audio(lm.speech_tokenizer, codes)
    if onednn_available()[0]:  # the stream ran, in chunks (else the official decode, compared with itself)
        assert pushed == [DECODE_CHUNK_FRAMES, DECODE_CHUNK_FRAMES, 3], pushed
    np.testing.assert_array_equal(decode_audio(lm.speech_tokenizer, codes)[0], wav)  # the kept stream starts afresh
    assert rate == sr == SAMPLE_RATE and wav.dtype == np.float32 and wav.shape == (n * SAMPLES_PER_FRAME,)
    assert np.sqrt(np.mean(ref ** 2)) > 1e-3
    assert np.sqrt(np.mean((wav - ref) ** 2) / np.mean(ref ** 2)) < 2e-5
    other = codes.clone()
    other[n - 1, 7] = (other[n - 1, 7] + 1) % 2048  # the last chunk's last frame: its audio must change
    assert np.abs(decode_audio(lm.speech_tokenizer, other)[0] - wav).max() > 1e-4
    codec = load_model("embedded").speech_tokenizer
    assert isinstance(codec, CodecSpeechTokenizer)
    small = torch.randint(0, codec.codec.config.codebook_size, (5, 16), generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(decode_audio(codec, small)[0], codec.decode([{"audio_codes": small}])[0][0])


def test_stream_a_checkpoint_through_the_official_12hz_decoder(lm):
    """The loaded speech tokenizer (the official Qwen3TTSTokenizer) streams through StreamingCodecDecoder: the stream's
    audio is the official whole-utterance decode of its codes, frame for frame."""
    from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
    from rvqspec_lib.models.speech_tokenizers import official_decoder, streaming_decoder
    from rvqspec_lib.models.streaming import codec_stream_for, synthesize_stream

    assert official_decoder(lm.speech_tokenizer) is lm.speech_tokenizer.model.decoder
    assert official_decoder(lm.model) is lm.speech_tokenizer.model.decoder  # the model holding it, too
    assert isinstance(codec_stream_for(lm), StreamingCodecDecoder)
    with pytest.raises(ValueError, match="no streaming decoder for a str"):  # the negative control
        streaming_decoder("not a codec")
    stream = synthesize_stream(lm, TEXT, max_frames=FRAMES, generator=torch.Generator().manual_seed(0),
                               language="english", speaker="vivian")
    audio = torch.cat([c.audio for c in stream]).numpy()
    codes = stream.codes(0)
    assert codes.shape == (FRAMES, 16) and audio.shape == (FRAMES * SAMPLES_PER_FRAME,)
    whole = np.asarray(lm.speech_tokenizer.decode([{"audio_codes": codes}])[0][0], dtype=np.float32)
    assert np.abs(audio - whole).max() < 1e-4 and np.sqrt(np.mean(whole.astype(np.float64) ** 2)) > 1e-3


def _official(lm, *, greedy: bool, seed: int | None = None):
    """The official ``generate`` (max_new_tokens = FRAMES + 1 gives FRAMES frames with codes, tests/test_frame.py)."""
    if seed is not None:
        torch.manual_seed(seed)
    kw = dict(do_sample=False, subtalker_dosample=False) if greedy else {}
    with torch.inference_mode():
        codes, _ = lm.model.generate(input_ids=[lm.tokenizer(TEXT)], languages=["english"], speakers=["vivian"],
                                     non_streaming_mode=True, max_new_tokens=FRAMES + 1, **kw)
    return codes[0]


@pytest.mark.parametrize("decoder", [AR(), Chain(4), Tree()], ids=repr)
def test_greedy_frame_loop_equals_official_generate(lm, decoder):
    ref = _official(lm, greedy=True)
    g = Sampling(greedy=True)
    ours = synthesize(lm, TEXT, runner=frame_runner("official", lm.code_predictor, decoder, sampling=g),
                      talker_sampling=g, max_frames=FRAMES,
                      language="english", speaker="vivian").codes[0]
    assert ours.shape == ref.shape == (FRAMES, 16) and torch.equal(ours, ref)


def test_sampled_ar_equals_official_same_seed_and_not_another(lm):
    ref = _official(lm, greedy=False, seed=5)
    same = synthesize(lm, TEXT, max_frames=FRAMES, generator=torch.Generator().manual_seed(5),
                      language="english", speaker="vivian").codes[0]
    other = synthesize(lm, TEXT, max_frames=FRAMES, generator=torch.Generator().manual_seed(6),
                       language="english", speaker="vivian").codes[0]
    assert torch.equal(same, ref) and not torch.equal(other, ref)


# ---- the command line ----------------------------------------------------------------------------------------------
def test_cli_synth_chain_writes_a_wav(ckpt, tmp_path, capsys):
    import soundfile as sf

    from rvqspec_lib.cli.main import main

    out = tmp_path / "hello.wav"
    rc = main(["synth", "--model", str(ckpt), "--text", TEXT, "--out", str(out), "--decoder", "chain:4",
               "--max-frames", str(FRAMES), "--seed", "0", "--json", str(tmp_path / "stats.json")])
    err = capsys.readouterr().err
    assert rc == 0, err
    wav, sr = sf.read(out)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert sr == SAMPLE_RATE and wav.shape == (stats["frames"] * SAMPLES_PER_FRAME,) and np.isfinite(wav).all()
    assert 1 <= stats["frames"] <= FRAMES and np.load(tmp_path / "hello.npy").shape == (stats["frames"], 16)
    assert "RANDOM weights" in err  # the random-weights note, from the marker


def test_cli_synth_streams_a_checkpoint(ckpt, tmp_path, capsys):
    """`rvqspec synth --model <folder> --stream`: a WAV of whole frames and the codes beside it."""
    import soundfile as sf

    from rvqspec_lib.cli.main import main

    out = tmp_path / "a.wav"
    rc = main(["synth", "--model", str(ckpt), "--text", "Hi", "--stream", "--out", str(out), "--max-frames",
               str(FRAMES), "--seed", "0", "--json", str(tmp_path / "s.json")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    wav, sr = sf.read(out)
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["stream"] is True and 1 <= stats["frames"] <= FRAMES
    assert sr == SAMPLE_RATE and wav.shape == (stats["frames"] * SAMPLES_PER_FRAME,) and np.isfinite(wav).all()
    assert np.load(tmp_path / "a.npy").shape == (stats["frames"], 16) and "streamed" in captured.out


# ---- the notebooks (make paper MODEL=<folder> SMOKE=1) ---------------------------------------------------------------
#: the notebooks that take a model (the rule by hand, 02_the_lossless_rule, runs on a toy and has no `model`)
NOTEBOOKS = [p for p in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))
             if re.search(r"^model = ", p.read_text(), re.M)]


def test_a_checkpoint_is_told_apart_and_what_it_skips_is_said(ckpt, capsys):
    from paper.checkpoint import is_checkpoint, not_here
    from tests.test_results_doc import problems

    assert is_checkpoint(str(ckpt)) and is_checkpoint("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    assert not any(is_checkpoint(m) for m in ("embedded", "tiny-random", "qwen3-tts-0.6b-random"))
    e = not_here("00", "the corpus table", "needs the embedded corpus", "00_metrics.json")
    assert problems([e]) == [] and e["value"] == NOT_HERE  # a well-formed docs/results.md entry
    assert "00: not on this checkpoint: the corpus table (needs the embedded corpus)" in capsys.readouterr().err


def test_cpu_sizes_cap_a_full_run_on_the_cpu_only_and_say_what_changed(ckpt, monkeypatch, capsys):
    """paper.checkpoint.cpu_sized: numbers capped (0, "all", becomes the cap), tuples replaced, one line naming each
    change; nothing when it does not apply or the sizes are empty (`make paper CPU_SIZES=0`); a misspelt name is a
    KeyError naming the notebook's sizes. on_cpu: auto resolves to the CPU only without CUDA and MPS;
    takes_cpu_sizes: a full run of a checkpoint on the CPU with sizes given, and no other (negative controls)."""
    from paper.checkpoint import cpu_sized, on_cpu, takes_cpu_sizes

    values = {"n_train_frames": 1200, "n_sentences": 0, "epochs": 4, "tree_budgets": (2, 4, 8, 16, 32, 64)}
    caps = {"n_train_frames": 400, "n_sentences": 2, "epochs": 6, "tree_budgets": [8, 32]}
    got = cpu_sized("03", values, caps, applies=True)
    assert got == {"n_train_frames": 400, "n_sentences": 2, "epochs": 4, "tree_budgets": (8, 32)}
    assert values["n_train_frames"] == 1200  # the caller's dict is not modified
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "03: sized for a checkpoint on the CPU" in err
    assert "n_train_frames 1200 -> 400" in err and "tree_budgets 2,4,8,16,32,64 -> 8,32" in err
    assert "epochs" not in err  # unchanged: not named
    for applies, sizes in ((False, caps), (True, None), (True, {})):  # negative controls
        assert cpu_sized("03", values, sizes, applies=applies) == values
    assert capsys.readouterr().err == ""
    with pytest.raises(KeyError, match="n_train_frame.*does not size: use one of n_train_frames"):
        cpu_sized("03", values, {"n_train_frame": 1}, applies=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert on_cpu() and on_cpu("cpu")
    ckpt = str(ckpt)
    assert takes_cpu_sizes(ckpt, smoke=False, cpu_sizes=caps)
    for model, smoke, sizes in ((ckpt, True, caps), (ckpt, False, None), (ckpt, False, {}), ("embedded", False, caps)):
        assert not takes_cpu_sizes(model, smoke=smoke, cpu_sizes=sizes), (model, smoke, sizes)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert not on_cpu() and on_cpu("cpu") and not on_cpu("mps")
    assert not takes_cpu_sizes(ckpt, smoke=False, cpu_sizes=caps) and takes_cpu_sizes(ckpt, smoke=False, cpu_sizes=caps,
                                                                                     device="cpu")


@pytest.mark.parametrize("model, folder", [("/data/models/Qwen3-TTS-12Hz-0.6B-CustomVoice/",
                                            "Qwen3-TTS-12Hz-0.6B-CustomVoice"),
                                           ("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "Qwen3-TTS-12Hz-1.7B-CustomVoice"),
                                           ("qwen3-tts-1.7b-random", "qwen3-tts-1.7b-random")])
def test_the_figures_folder_is_named_after_the_model(model, folder):
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("needs make")
    repo = Path(__file__).resolve().parent.parent
    for smoke, where in (("1", f"build/smoke_figures/{folder}/"), ("0", f"figures/{folder}/")):
        run = subprocess.run(["make", "-n", "-C", str(repo), "-o", ".venv/.installed", "paper-run", f"MODEL={model}",
                              f"SMOKE={smoke}", "NB_SRC=notebooks/02_the_lossless_rule.py"],
                             capture_output=True, text=True)
        assert where in run.stdout and "_data_models" not in run.stdout, run.stdout[-2000:]


@pytest.fixture(scope="module")
def nb_out(tmp_path_factory) -> Path:
    """One output folder for every notebook, as ``make paper`` gives them: the checkpoint's small preparation (its
    own frames, offsets, trees and evaluation split, under ``<out>/checkpoint_cache``) is made once and reused."""
    return tmp_path_factory.mktemp("nb_out")


NOT_HERE = "not measured on this checkpoint"


def _outputs(executed: Path) -> str:
    """The text of an executed notebook's outputs (its source left out)."""
    cells = json.loads(executed.read_text())["cells"]
    return json.dumps([o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])])


@pytest.mark.slow
@pytest.mark.parametrize("src", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_runs_on_the_checkpoint(src, ckpt, nb_out):
    from test_notebooks import _execute

    prefix = src.stem.split("_", 1)[0]
    extra = {}
    if prefix == "03":  # the checkpoint's path is tested here; the other losses are test_notebooks' smoke run's
        extra = dict(train_kl=False, train_tv=False, train_medusa=False, train_medusa_tv=False, offsets_lrs=[1e-2])
    elif prefix == "05":  # the checkpoint's path is tested here; free running is the smoke run's (test_notebooks)
        extra = dict(free_running=False)
    elif prefix == "06":  # the checkpoint's path is what is tested here; every backend runs in test_notebooks' smoke run
        extra = dict(backends=["eager"])
    executed = _execute(src, nb_out, {"model": str(ckpt), **extra})
    metrics = json.loads((nb_out / f"{prefix}_metrics.json").read_text())
    assert metrics["provenance"]["params"]["smoke"] is True
    text = _outputs(executed)
    assert "embedded model instead" not in text and "is not an embedded-model build" not in text
    skipped = [h["text"] for h in metrics.get("headline", []) if h["value"] == NOT_HERE]
    if prefix == "01":  # the timing notebook times the checkpoint itself, and says its weights are random
        assert metrics["model"] == str(ckpt) and metrics["random_weights"] is True
        assert metrics["n_code_groups"] == 16 and metrics["frame_rate_hz"] == 12.5
        assert [r["model"] for r in metrics["compared"]] == [str(ckpt)] and metrics["t_inner_ms"] > 0
        assert metrics["own_tokens_per_call_meta"]["model"] == str(ckpt)  # its own frames' tokens per call
    elif prefix == "00":  # the checkpoint's own 12 Hz codec on its own speech; the embedded corpus is said skipped
        assert metrics["model"] == str(ckpt) and len(metrics["round_trip"]["rows"]) == 16
        assert 0 <= metrics["round_trip"]["rows"][-1]["prefix_kept"] <= metrics["round_trip"]["rows"][0]["prefix_kept"]
        assert len(skipped) == 3 and not (nb_out / "00_codec_quality.md").exists()
    elif prefix == "03":  # the offsets trained on the checkpoint's own frames
        assert metrics["run_model"] == str(ckpt) and metrics["model_info"]["code_predictor_hidden"] == 48
    elif src.stem == "04_calibrating_the_tree":  # the checkpoint's trees calibrated, its own call timed
        assert metrics["model"] == str(ckpt)
        assert {r["model"] for r in metrics["verify_cost"]} == {str(ckpt)}
    elif prefix == "05":  # WER parity on the checkpoint's speech (babble: said meaningless), other languages skipped
        assert metrics["model"] == str(ckpt) and metrics["languages"] == ["en"] and metrics["n_utterances"]["en"] > 0
        assert "meaningless" in text and len(skipped) == 1
    elif prefix == "06":  # the checkpoint's own paper decoder, and the checkpoint in the embedded model's place
        assert metrics["provenance"]["params"]["model"] == str(ckpt)
        assert "embedded" not in metrics["provenance"]["params"]["pipeline_models"]
        assert metrics["paper_decoder"]["model"] == str(ckpt) and "is taken from" not in text
    elif src.stem == "07_device_engineering":  # the checkpoint's call and talker step against their floors
        assert metrics["model"] == str(ckpt) and metrics["random_weights"] is True
        assert metrics["floor"] and metrics["talker"]
        assert metrics["provenance"]["params"]["small_model"] == str(ckpt)
    else:  # a new notebook: it must at least have run on the checkpoint's path
        assert str(ckpt) in json.dumps(metrics["provenance"]["params"])
    assert not any((ckpt / f).exists() for f in ("drafters", "trees", "utterances.safetensors"))  # smoke: not beside


def _voxpopuli_dataset(path: Path) -> Path:
    """A tiny local dataset in VoxPopuli's schema (16 kHz audio, raw_text, normalized_text, ...), three splits of a
    few seconds of tones, saved with save_to_disk as a user's downloaded VoxPopuli would be."""
    datasets = pytest.importorskip("datasets")
    sf = pytest.importorskip("soundfile")
    rng = np.random.default_rng(0)
    (path.parent / "wav").mkdir(parents=True, exist_ok=True)

    def rows(n, seconds, start):
        out = {"audio_id": [], "audio": [], "raw_text": [], "normalized_text": [], "speaker_id": []}
        for i in range(start, start + n):
            t = np.arange(int(16000 * seconds)) / 16000
            wav = 0.3 * np.sin(2 * np.pi * (150 + 40 * i) * t) + 0.01 * rng.standard_normal(t.size)
            f = path.parent / "wav" / f"utt{i}.wav"
            sf.write(f, wav.astype(np.float32), 16000)
            for k, v in dict(audio_id=f"utt{i}", audio=str(f), raw_text=f"Sentence number {i} of the tiny set.",
                             normalized_text=f"sentence number {i} of the tiny set", speaker_id=str(i % 2)).items():
                out[k].append(v)
        return datasets.Dataset.from_dict(out).cast_column("audio", datasets.Audio(sampling_rate=16000))

    dd = datasets.DatasetDict({"train": rows(3, 2.0, 0), "validation": rows(2, 1.0, 10), "test": rows(3, 1.5, 20)})
    dd.save_to_disk(str(path))
    return path


@pytest.mark.slow
def test_notebook_03_trains_drafters_on_the_checkpoint_with_a_dataset(ckpt, tmp_path):
    """What `make paper MODEL=<folder> DATASET=<saved dataset> CODEC=<folder>/speech_tokenizer SMOKE=1` runs."""
    from test_notebooks import _execute

    src = next(p for p in NOTEBOOKS if p.stem.startswith("03_training"))
    ds = _voxpopuli_dataset(tmp_path / "vox")
    out = tmp_path / "out"
    out.mkdir()
    executed = _execute(src, out, {"model": str(ckpt), "dataset": str(ds), "codec": str(ckpt / "speech_tokenizer")})
    metrics = json.loads((out / "03_metrics.json").read_text())
    assert metrics["run_model"] == str(ckpt) and metrics["random_weights"] is True
    assert "RANDOM weights" in executed.read_text()
    assert metrics["model_info"]["code_predictor_hidden"] == 48  # the checkpoint's code predictor, not embedded's
    assert 0 < metrics["n_train_frames"] <= 128 and 0 < metrics["n_val_frames"] <= 32 and metrics["n_eval_frames"] > 0
    for lab, tpc in metrics["tokens_per_call"].items():
        assert all(1.0 <= v <= 15.0 for v in tpc.values()), (lab, tpc)
    assert not (ckpt / "drafters").exists()  # a smoke run writes nothing beside the model
