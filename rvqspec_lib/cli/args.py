"""The flags of every ``rvqspec`` command but ``bench``: one light function per command, ``add(parser)``, so that
``--help`` and the parser's one-line errors never import torch. Names repeated here from heavy modules (backends,
export graphs) are checked equal to them by tests/test_export_cli.py."""

from __future__ import annotations

import argparse

from rvqspec_lib.cli.common import add_removed_decoder_flags, add_threads_arg
from rvqspec_lib.decoding.decoder_names import grammar

#: ``synth --backend`` values: :data:`rvqspec_lib.models.backends.BACKENDS`.
BACKENDS = ("official", "eager", "compile", "onnx", "native")
#: ``synth --frame``: ``fused`` (the whole frame as one graph per round or one C call), ``stepped`` (``decode_frame``,
#: one backend call per round), ``auto`` (fused where the backend is native and the decoder has a fused frame).
FRAME_KINDS = ("auto", "fused", "stepped")
#: ``synth --dtype`` values (``int8``: int8 weights in the code predictor, bfloat16 elsewhere).
SYNTH_DTYPES = ("float32", "float64", "bfloat16", "int8", "int8-dynamic")
#: Audio formats ``synth --out`` writes (soundfile, by extension).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
#: Largest --batch-size of ``synth --text-file`` (rows decoded together by the frame loop).
MAX_BATCH = 64
#: ``export`` values, checked by the command in one line (tests/test_export_cli.py: equal to the library's).
FORMATS = ("onnx", "coreml")
GRAPHS = ("stepped", "verify", "frame")
EXPORT_DTYPES = ("float32", "float16")
TARGETS = ("macOS15", "iOS18")
#: ``eval-wer --decoders`` default.
DEFAULT_DECODERS = "ar,chain:best,tree:calibrated-point-mass:16,tree:calibrated-sampled:16,ssd-lossy"
MODEL_HELP = "embedded, tiny-random, qwen3-tts-0.6b-random, qwen3-tts-1.7b-random, a checkpoint folder or a hub id"
DECODER_HELP = (f"inner-loop decoder, one name: {grammar(('chain:best',))}. paper is the paper's decoder; auto the "
                "fastest here among AR, chains and the calibrated trees, timed once and cached")


def synth(p: argparse.ArgumentParser) -> None:
    """``rvqspec synth``."""
    p.add_argument("--model", required=True, help=MODEL_HELP)
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="sentence to speak (long texts: one sentence per call, or --text-file)")
    text.add_argument("--text-file", help="UTF-8 file, one sentence a line (blank lines skipped): one audio and codes "
                                          "file each, named from --out with an index (out.wav -> out_000.wav, "
                                          "out_000.npy, ...), decoded in batches of --batch-size")
    p.add_argument("--out", required=True, help=f"output audio: {', '.join(AUDIO_SUFFIXES)} (the codes always go to "
                                                "<out without its extension>.npy beside it); with --stream a .wav, or - "
                                                "for standard output (a WAV stream: ... --out - | aplay)")
    p.add_argument("--decoder", default="ar", help=DECODER_HELP)
    add_removed_decoder_flags(p)
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="what runs the code-predictor calls: official (the official module), eager (the lean "
                        "forward), compile (it under torch.compile), onnx (an exported graph in ONNX Runtime), native "
                        "(one C call over packed weights, docs/precision.md#the-native-forward). Default: official; "
                        "with --decoder auto, official or native, whichever is faster here (timed and cached)")
    p.add_argument("--talker", default="official", choices=("official", "native"),
                   help="what runs the talker steps (code 0 of each frame): official (the official module) or native "
                        "(one C call a step over packed copies of its layers and codec_head, in the talker's "
                        "precision; docs/precision.md#the-native-talker). Default: official")
    p.add_argument("--frame", default="auto", choices=FRAME_KINDS,
                   help="fused: the whole frame as one graph per round or one C call (AR and chains drafting with "
                        "the reused heads); stepped: one backend call per round (any decoder); auto (default): fused "
                        "with --backend native where the decoder has a fused frame, else stepped. The JSON says which")
    p.add_argument("--stream", action="store_true",
                   help="write the audio as it is made: the WAV grows chunk by chunk (always a valid WAV, also after "
                        "Ctrl-C) while generation and codec decoding overlap on two threads; reports time to first "
                        "audio, RTF and underruns (docs/streaming.md). One --text; the model needs a codec")
    p.add_argument("--chunk-frames", type=int, default=None, help="--stream: frames decoded to audio at once, "
                   "1..--max-frames (default 1: an 80 ms chunk as soon as its frame is made)")
    p.add_argument("--batch-size", type=int, default=None, help=f"--text-file: lines decoded together (1..{MAX_BATCH}, "
                                                                "default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the explicit generator (0..2**63-1)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding in both loops")
    p.add_argument("--json", help="write statistics (frames, calls, tokens per call, timings, RTF, codes) here; with "
                                  "--text-file one file for all lines (their statistics under 'utterances')")
    p.add_argument("--max-frames", type=int, default=200, help="frame cap, >= 1 (12.5 frames = 1 s; default 200)")
    p.add_argument("--language", default="auto", help="auto, english, german, ... (the model's config lists them)")
    p.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the model's first)")
    p.add_argument("--dtype", default="float32", choices=SYNTH_DTYPES,
                   help="int8: int8 weights in the code predictor, bfloat16 elsewhere; int8-dynamic: int8 weights and "
                        "per-row int8 activations in the code predictor, float32 elsewhere (docs/precision.md); "
                        "bfloat16 and int8 need AVX512-BF16 or AMX, int8-dynamic VNNI or AMX")
    p.add_argument("--codes-to-audio", default="auto", choices=["auto", "neural", "table"],
                   help="models with the offline codec (embedded): 'auto' decodes with the neural code decoder shipped "
                        "beside the codec (codec.decoder.safetensors) when there is one, 'neural' requires it, "
                        "'table' sums the codebook entries")
    add_threads_arg(p)


def export(p: argparse.ArgumentParser) -> None:
    """``rvqspec export`` (values checked by the command, one-line errors)."""
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--format", dest="fmt", required=True, help="onnx (run and checked here) or coreml (.mlpackage; "
                   "predicted on macOS 15+ only)")
    p.add_argument("--graph", required=True, help="stepped (one position per call, logits of every head), verify "
                   "(the fused verify call of N positions), frame (all codes of a frame, sampling inside)")
    p.add_argument("--nodes", type=int, default=None, help="verify graph: node budget N, the root included (2..64; "
                   "default 4, or the --decoder's size): a chain of N-1 drafts")
    p.add_argument("--decoder", default=None, help="verify graph: the tree of a decoder name: tree:PATHS (e.g. "
                   "tree:0;1;0,0), chain:N, tree:calibrated[-point-mass|-sampled]:N[@DRAFTER] or paper[:N] (the "
                   "calibrated point-mass tree of the offsets shipped beside the model, N default 32)")
    add_removed_decoder_flags(p, ("--tree",))
    p.add_argument("--dtype", default="float32", help="float32 or float16")
    p.add_argument("--target", default="macOS15", help="Core ML deployment target: macOS15 or iOS18 (KV-cache "
                   "states need 15/18)")
    p.add_argument("--predict", action="store_true", help="Core ML: require prediction, comparison and timing "
                   "(macOS 15+; without it a package is only built off macOS)")
    p.add_argument("--out", required=True, help="output folder (created if its parent exists)")
    p.add_argument("--repeats", type=int, default=20, help="Core ML on macOS: timed calls per compute unit")
    add_threads_arg(p)


def eval_wer(p: argparse.ArgumentParser) -> None:
    """``rvqspec eval-wer``."""
    p.add_argument("--model", required=True, help="embedded, a checkpoint folder or a hub id")
    p.add_argument("--decoders", default=DEFAULT_DECODERS,
                   help=f"comma-separated decoder names: {grammar(('auto',))}; chain:best is the window with the best "
                        f"predicted tokens per call on calibration frames; AR is always added as the reference "
                        f"(default {DEFAULT_DECODERS})")
    p.add_argument("--languages", default="en", help="comma-separated ISO codes among en,de,es,ru,ja,zh")
    p.add_argument("--dataset", help="a Fleurs folder (save_to_disk; one config folder per language, e.g. de_de) or "
                                     "hub id; default for the embedded model: its shipped English evaluation split "
                                     "and the multilingual sentences rendered with espeak-ng")
    p.add_argument("--dataset-kind", default="fleurs", choices=["fleurs", "librispeech", "voxpopuli"])
    p.add_argument("--split", default=None, help="the dataset's split (default test)")
    p.add_argument("--codec", help="with --dataset: the codec of the model (e.g. the 12 Hz tokenizer folder)")
    p.add_argument("--calibration", help="calibrated trees of the heads (JSON of rvqspec_lib.eval.calibration); "
                                         "default <model>/trees/heads.json, else calibrated here on the shipped "
                                         "calibration split (other drafters: always <model>/trees/DRAFTER.json)")
    p.add_argument("--calibration-frames", type=int, default=1000,
                   help="calibration frames when the trees are calibrated here (and for chain:best)")
    p.add_argument("--sentences", type=int, default=None, help="at most this many utterances per language")
    p.add_argument("--replicates", type=int, default=1, help="draws per frame for the code-distribution tests")
    p.add_argument("--asr", default="auto",
                   help="recogniser: auto (= whisper-tiny.en for English, none elsewhere), whisper-tiny.en (OpenAI "
                        "Whisper tiny.en offline, CTranslate2), whisper[:PATH] (a CTranslate2 folder or a "
                        "transformers checkpoint, e.g. large-v3-turbo), pocketsphinx (default LM), "
                        "pocketsphinx-prompt (PROMPT-INFORMED: a bigram LM of the reference sentences), "
                        "parakeet[:PATH], none")
    p.add_argument("--free-running", action="store_true", help="also measure free running (talker sampled too)")
    p.add_argument("--no-null-control", action="store_true", help="skip AR under other seeds (the null control)")
    p.add_argument("--seed", type=int, default=0)
    add_threads_arg(p)
    p.add_argument("--work-dir", default="build/eval_wer", help="rendered audio and the calibration made here")
    p.add_argument("--json", help="write the results here")


def frame_source(p: argparse.ArgumentParser, default_frames: int) -> None:
    """Where train-drafter's and eval-acceptance's teacher-forced frames come from (:mod:`rvqspec_lib.cli.frames`)."""
    p.add_argument("--frames-file", help="frames saved by Frames.save (.safetensors); default: the utterances that "
                                         "ship with the model (the embedded model), else the model speaks texts")
    p.add_argument("--dataset", help="a local datasets folder (save_to_disk) of audio + text, VoxPopuli schema")
    p.add_argument("--codec", help="with --dataset: codec file or folder (rvqspec_lib.models.speech_tokenizers)")
    p.add_argument("--language", default="auto", help="with --dataset: prompt language (auto, english, ...)")
    p.add_argument("--texts-file", help="texts to speak, one a line (default: a few built-in sentences)")
    p.add_argument("--frames", type=int, default=default_frames, help="number of frames to use")
    p.add_argument("--seed", type=int, default=0, help="seed of every explicit generator")


def eval_acceptance(p: argparse.ArgumentParser) -> None:
    """``rvqspec eval-acceptance``."""
    p.add_argument("--model", required=True, help="embedded, tiny-random, a checkpoint dir or a hub id")
    p.add_argument("--drafter", default="heads", choices=["heads", "offsets", "medusa"],
                   help="drafter to evaluate (default heads: the reused LM heads, nothing to load)")
    p.add_argument("--drafter-path", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors; "
                                          "embedded: data/embedded/model/drafters/)")
    p.add_argument("--decoder", default=None, help="one decoder: chain[:N] (N in 2..8) or tree[:PATHS] (rank paths, "
                   "e.g. tree:0;1;0,0); default: every chain window 2..8 and the default tree")
    add_removed_decoder_flags(p)
    p.add_argument("--max-rank", type=int, default=8, help="ranks tabulated for the tree calibration")
    p.add_argument("--teacher-codes", choices=["decoded", "frames"], default="decoded",
                   help="codes the exact tables teacher-force: decoded (samples of p) or the frames' own")
    p.add_argument("--json", help="write every statistic here")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    frame_source(p, default_frames=200)
    add_threads_arg(p)


def train_drafter(p: argparse.ArgumentParser) -> None:
    """``rvqspec train-drafter``."""
    p.add_argument("--model", required=True, help="embedded, tiny-random, a checkpoint dir or a hub id")
    p.add_argument("--drafter", required=True, choices=["offsets", "medusa"], help="what to train")
    p.add_argument("--out", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors; embedded: "
                                 "data/embedded/model/drafters/)")
    p.add_argument("--loss", choices=["ce", "kl", "tv"], default="ce",
                   help="ce: ground-truth codes (paper); kl: the verifier's warped distribution (T 0.9, top-k 50); "
                        "tv: one minus the exact acceptance rate, q warped as deployed")
    p.add_argument("--K", type=int, default=None, help="offsets drafted, 1..(code groups - 2) (default: the paper's "
                                                       "K, rvqspec_lib.decoding.drafters.DEFAULT_K)")
    p.add_argument("--epochs", type=int, default=20, help="maximum epochs (early stopping on validation acceptance)")
    p.add_argument("--patience", type=int, default=3, help="epochs without validation improvement before stopping")
    p.add_argument("--batch-size", type=int, default=64, help="frames per step")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate (default per drafter)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="utterances held out for early stopping (default 0.1; models without a shipped validation "
                        "split)")
    p.add_argument("--val-frames", type=int, default=None,
                   help="validation frames for early stopping, from the shipped validation split (default 500; "
                        "embedded models)")
    p.add_argument("--curve-json", help="training curve (default: the drafter file with .curve.json)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing drafter file (e.g. the one shipped beside the embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    frame_source(p, default_frames=2000)
    add_threads_arg(p)


def extract_frames(p: argparse.ArgumentParser) -> None:
    """``rvqspec extract-frames``."""
    p.add_argument("--model", required=True, help="embedded, a checkpoint folder or a hub id")
    p.add_argument("--out", required=True, help="folder for the shards and index.json")
    p.add_argument("--split", default="training", help="the model's shipped split (embedded: training, validation, "
                                                       "calibration, evaluation)")
    p.add_argument("--dataset", help="a datasets folder (save_to_disk) of audio + text, VoxPopuli schema")
    p.add_argument("--codec", help="with --dataset: the model's codec (file or folder)")
    p.add_argument("--language", default="auto", help="with --dataset: prompt language")
    p.add_argument("--max-utterances", type=int, default=None, help="the first utterances (rows) only")
    p.add_argument("--batch-size", type=int, default=8, help="utterances per talker pass")
    add_threads_arg(p)


def train_drafter_parallel(p: argparse.ArgumentParser) -> None:
    """``rvqspec train-drafter-parallel``."""
    p.add_argument("--model", required=True, help="embedded, a checkpoint folder or a hub id")
    p.add_argument("--frames", required=True, help="training frames: a folder of shards (extract-frames) or a "
                                                   "frames file (.safetensors)")
    p.add_argument("--val-frames", help="validation frames (same forms); default: --val-fraction of --frames")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--drafter", required=True, choices=["offsets", "medusa"])
    p.add_argument("--loss", choices=["ce", "kl", "tv"], default="ce")
    p.add_argument("--K", type=int, default=3, help="offsets drafted (paper: 3)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="frames per GLOBAL batch (split over processes)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="drafter file (.safetensors)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    add_threads_arg(p)
