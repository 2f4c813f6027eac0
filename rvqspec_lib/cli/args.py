"""The flags of every ``rvqspec`` command but ``bench``: one light function per command, ``add(parser)``, so that
``--help`` and the parser's one-line errors never import torch (docs/cli.md says more of each flag). Names repeated
here from heavy modules (backends, export graphs) are checked equal to them by tests/test_export_cli.py."""

from __future__ import annotations

import argparse

from rvqspec_lib.cli.common import SEED_MAX, add_threads_arg, number
from rvqspec_lib.common.machine import DEVICES
from rvqspec_lib.decoding.decoder_names import MAX_BUDGET, MIN_BUDGET, grammar

#: ``synth --backend`` values: :data:`rvqspec_lib.models.backends.BACKENDS`.
BACKENDS = ("official", "eager", "compile", "onnx", "native")
#: Audio formats ``synth --out`` writes (soundfile, by extension).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
#: Largest --batch-size of ``synth --text-file`` (rows decoded together by the frame loop).
MAX_BATCH = 64
#: ``export`` values (tests/test_export_cli.py: equal to the library's).
FORMATS, GRAPHS = ("onnx", "coreml"), ("stepped", "verify", "frame")
#: ``eval-wer --decoders`` default.
DEFAULT_DECODERS = "ar,chain:best,tree:calibrated-point-mass:16,tree:calibrated-sampled:16,ssd-lossy"
DRAFTERS = ("offsets", "medusa")
#: ``prepare --stages`` values, in order (:data:`rvqspec_lib.training.prepare.STAGES`; here so --help needs no torch).
STAGES = ("speak", "offsets", "trees", "auto")
#: ``type=`` of the counts that are at least 1 (one line when not: :func:`~rvqspec_lib.cli.common.number`).
POSITIVE = number(int, 1)


def _common(p: argparse.ArgumentParser, *flags: str) -> None:
    """The flags several commands share, by name (``dataset`` adds ``--codec``); ``--threads`` always."""
    flags_of = {
        "model": [("--model", dict(required=True, help="embedded, tiny-random, qwen3-tts-0.6b-random, "
                                   "qwen3-tts-1.7b-random, a checkpoint folder or a hub id"))],
        "seed": [("--seed", dict(type=number(int, 0, SEED_MAX, " (2**63 - 1)"), default=0,
                                 help="seed of every explicit generator (0..2**63-1)"))],
        "json": [("--json", dict(help="write every statistic here (atomically)"))],
        "dtype": [("--dtype", dict(default="float32", choices=("float32", "float64", "bfloat16")))],
        "device": [("--device", dict(default="auto", help=f"where the model runs: {', '.join(DEVICES)} or cuda:N "
                                     "(auto: CUDA, then MPS, then the CPU; the CPU for what runs only there)"))],
        "dataset": [("--dataset", dict(help="a datasets folder (save_to_disk) of audio + text, VoxPopuli schema")),
                    ("--codec", dict(help="with --dataset: the model's codec (file or folder)"))],
        "language": [("--language", dict(default="auto", help="with --dataset: prompt language (auto, english, ...)"))]}
    for name in flags:
        for flag, kwargs in flags_of[name]:
            p.add_argument(flag, **kwargs)
    add_threads_arg(p)


def synth(p: argparse.ArgumentParser) -> None:
    """``rvqspec synth``."""
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="sentence to speak (long texts: one sentence per call, or --text-file)")
    text.add_argument("--text-file", help="UTF-8 file, one sentence a line: one audio and codes file each, named from "
                                          "--out with an index (out.wav -> out_000.wav, out_000.npy, ...)")
    p.add_argument("--out", required=True, help=f"output audio: {', '.join(AUDIO_SUFFIXES)}, the codes beside it "
                                                "(.npy); with --stream a .wav, or - for standard output (... | aplay)")
    p.add_argument("--decoder", default=None, help=f"inner-loop decoder: {grammar(('chain:best',))}. auto: the "
                   "fastest here (timed once, cached). Default: the choice `rvqspec prepare` cached, else ar untimed")
    p.add_argument("--backend", default=None, choices=BACKENDS, help="what runs the code-predictor calls (default "
                   "official; with --decoder auto or none, official or native, whichever is faster here)")
    p.add_argument("--talker", default="official", choices=("official", "native"),
                   help="what runs the talker steps (native: one C call a step; docs/precision.md#the-native-talker)")
    p.add_argument("--frame", default="auto", choices=("auto", "fused", "stepped"), help="fused: a frame as one graph "
                   "or C call; stepped: one call per round; auto: fused with --backend native where it can")
    p.add_argument("--stream", action="store_true", help="one --text: write the audio as it is made "
                   "(docs/streaming.md)")
    p.add_argument("--chunk-frames", type=int, default=None, help="--stream: frames decoded to audio at once, "
                   "1..--max-frames (default 1)")
    p.add_argument("--batch-size", type=number(int, 1, MAX_BATCH), default=None, help=f"--text-file: lines decoded "
                   f"together (1..{MAX_BATCH}, default 8)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--max-frames", type=number(int, 1, what=" (frames of 80 ms; 12.5 frames = 1 s)"), default=200,
                   help="frame cap, >= 1 (12.5 frames = 1 s; default 200)")
    p.add_argument("--language", default="auto", help="auto, english, german, ... (the model's config lists them)")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--codes-to-audio", default="auto", choices=("auto", "neural", "table"), help="offline codec "
                   "(embedded): its neural code decoder when shipped (auto), required (neural), or the codebook sum")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float64", "bfloat16", "int8",
                   "int8-dynamic"), help="auto: the model's own where the device runs it well, else float32; int8 "
                   "and int8-dynamic: an int8 code predictor (docs/precision.md)")
    _common(p, "model", "seed", "json", "device")


def prepare(p: argparse.ArgumentParser) -> None:
    """``rvqspec prepare``."""
    p.add_argument("--frames", type=number(int, 1, what=" (calibration frames of 80 ms)"), default=1500, metavar="N",
                   help="calibration frames the model speaks (default 1500)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="the model's dtype while "
                   "preparing (auto: its own where the device runs it well, else float32; docs/model.md)")
    p.add_argument("--auto-dtype", action="append", choices=["float32", "bfloat16"], dest="auto_dtypes",
                   help="a synth --dtype to time --decoder auto for (repeatable; default: a default synth's)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated stages to run, in order (default "
                   f"all: {','.join(STAGES)}; the shipped embedded model needs only auto)")
    _common(p, "model", "seed", "json", "device")


def export(p: argparse.ArgumentParser) -> None:
    """``rvqspec export``."""
    p.add_argument("--format", dest="fmt", required=True, choices=FORMATS, help="onnx (run and checked here) or "
                   "coreml (.mlpackage; predicted on macOS 15+ only)")
    p.add_argument("--graph", required=True, choices=GRAPHS, help="stepped (one position a call), verify (the fused "
                   "verify call of N positions), frame (all codes of a frame)")
    p.add_argument("--nodes", type=number(int, MIN_BUDGET, MAX_BUDGET, " (query positions of one verify call, the root "
                                          "included)"), help="verify graph: node budget N (default 4 or --decoder's)")
    p.add_argument("--decoder", default=None, help="verify graph: the tree of tree:PATHS, chain:N, "
                   "tree:calibrated[-point-mass|-sampled]:N[@DRAFTER] or paper[:N]")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--target", default="macOS15", choices=("macOS15", "iOS18"), help="Core ML deployment target")
    p.add_argument("--predict", action="store_true", help="Core ML: require prediction and timing (macOS 15+)")
    p.add_argument("--out", required=True, help="output folder (created with its parents)")
    p.add_argument("--repeats", type=POSITIVE, default=20, help="Core ML on macOS: timed calls per compute unit")
    p.add_argument("--device", default="auto", help="auto or cpu (export runs its graphs on the CPU)")
    _common(p, "model")


def eval_wer(p: argparse.ArgumentParser) -> None:
    """``rvqspec eval-wer``."""
    p.add_argument("--decoders", default=DEFAULT_DECODERS, help=f"comma-separated decoder names: {grammar(('auto',))}"
                   f"; AR is always added as the reference (default {DEFAULT_DECODERS})")
    p.add_argument("--languages", default="en", help="comma-separated ISO codes among en,de,es,ru,ja,zh")
    p.add_argument("--dataset", help="a Fleurs folder (save_to_disk) or hub id; default for the embedded model: its "
                                     "shipped evaluation split and sentences rendered with espeak-ng")
    p.add_argument("--dataset-kind", default="fleurs", choices=["fleurs", "librispeech", "voxpopuli"])
    p.add_argument("--split", default=None, help="the dataset's split (default test)")
    p.add_argument("--codec", help="with --dataset: the codec of the model")
    p.add_argument("--calibration", help="calibrated trees of the heads (JSON; default <model>/trees/heads.json, else "
                                         "calibrated here)")
    p.add_argument("--calibration-frames", type=POSITIVE, default=1000, help="frames when calibrated here")
    p.add_argument("--sentences", type=POSITIVE, default=None, help="at most this many utterances per language")
    p.add_argument("--replicates", type=POSITIVE, default=1, help="draws per frame for the code-distribution tests")
    p.add_argument("--asr", default="auto", help="recogniser: auto, whisper-tiny.en, whisper[:PATH], pocketsphinx, "
                                                 "pocketsphinx-prompt, parakeet[:PATH], none (docs/cli.md)")
    p.add_argument("--free-running", action="store_true", help="also measure free running (talker sampled too)")
    p.add_argument("--no-null-control", action="store_true", help="skip AR under other seeds (the null control)")
    p.add_argument("--work-dir", default="build/eval_wer", help="rendered audio and the calibration made here")
    _common(p, "model", "seed", "json", "device")


def _frame_source(p: argparse.ArgumentParser, default_frames: int, *more: str) -> None:
    """Where the teacher-forced frames come from (:class:`~rvqspec_lib.data.frame_choice.FrameSource`),
    and the shared flags (``more`` too)."""
    p.add_argument("--frames-file", help="frames saved by Frames.save (.safetensors); default: the utterances that "
                                         "ship with the model (the embedded model), else the model speaks texts")
    p.add_argument("--texts-file", help="texts to speak, one a line (default: a few built-in sentences)")
    p.add_argument("--frames", type=POSITIVE, default=default_frames, help="number of frames to use")
    _common(p, "dataset", "language", "model", "seed", "dtype", "device", *more)


def eval_acceptance(p: argparse.ArgumentParser) -> None:
    """``rvqspec eval-acceptance``."""
    p.add_argument("--drafter", default="heads", choices=("heads", *DRAFTERS), help="drafter to evaluate (heads: the "
                   "reused LM heads)")
    p.add_argument("--drafter-path", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors)")
    p.add_argument("--decoder", default=None, help="chain[:N] (N in 2..8) or tree[:PATHS]; default: every chain "
                   "window 2..8 and the default tree")
    p.add_argument("--max-rank", type=POSITIVE, default=8, help="ranks tabulated for the tree calibration")
    p.add_argument("--teacher-codes", choices=["decoded", "frames"], default="decoded",
                   help="codes the exact tables teacher-force: decoded (samples of p) or the frames' own")
    _frame_source(p, 200, "json")


def _training(p: argparse.ArgumentParser, out_help: str, out_required: bool) -> None:
    """The flags train-drafter and train-drafter-parallel share."""
    p.add_argument("--drafter", required=True, choices=DRAFTERS, help="what to train")
    p.add_argument("--out", required=out_required, help=out_help)
    p.add_argument("--loss", choices=["ce", "kl", "tv"], default="ce", help="ce: ground-truth codes (paper); kl: "
                   "the verifier's warped distribution; tv: one minus the exact acceptance rate")
    p.add_argument("--epochs", type=POSITIVE, default=20, help="maximum epochs (early stopping on validation "
                   "acceptance)")
    p.add_argument("--patience", type=number(int, 0), default=3, help="epochs without validation improvement before "
                   "stopping")
    p.add_argument("--lr", type=number(float, 0, open_=True), help="Adam learning rate (default per drafter)")
    p.add_argument("--force", action="store_true", help="replace an existing drafter file")
    p.add_argument("--K", type=int, help="offsets drafted, 1..(code groups - 2) (default: the paper's, 3)")
    p.add_argument("--val-fraction", type=number(float, 0, 1, open_=True), default=None, help="held out for early "
                   "stopping (default 0.1; not with a shipped validation split)")
    p.add_argument("--batch-size", type=POSITIVE, default=64, help="frames per step (the global batch, split over "
                   "processes)")


def train_drafter(p: argparse.ArgumentParser) -> None:
    """``rvqspec train-drafter``."""
    _training(p, "drafter file (default <model_dir>/drafters/<drafter>.safetensors)", False)
    p.add_argument("--val-frames", type=POSITIVE, help="validation frames from the shipped validation split (default "
                   "500; embedded models)")
    p.add_argument("--curve-json", help="training curve (default: the drafter file with .curve.json)")
    _frame_source(p, 2000)


def extract_frames(p: argparse.ArgumentParser) -> None:
    """``rvqspec extract-frames``."""
    p.add_argument("--out", required=True, help="folder for the shards and index.json")
    p.add_argument("--split", default="training", help="the model's shipped split (training, validation, "
                                                       "calibration, evaluation)")
    p.add_argument("--max-utterances", type=POSITIVE, default=None, help="the first utterances (rows) only")
    p.add_argument("--batch-size", type=POSITIVE, default=8, help="utterances per talker pass")
    _common(p, "dataset", "language", "model", "device")


def train_drafter_parallel(p: argparse.ArgumentParser) -> None:
    """``rvqspec train-drafter-parallel``."""
    _training(p, "drafter file (.safetensors)", True)
    p.add_argument("--frames", required=True, help="training frames: a folder of shards (extract-frames) or a "
                                                   "frames file (.safetensors)")
    p.add_argument("--val-frames", help="validation frames (same forms); default: --val-fraction of --frames")
    _common(p, "model", "seed", "device")
