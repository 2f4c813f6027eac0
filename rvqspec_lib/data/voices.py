"""Texts and the voices that speak them: sentences with their Table 1 split (a hash of the text, :func:`split_of`),
the texts shipped in ``data/eval_texts/``, and speech rendered by flite, festival and espeak-ng, deterministically
(:data:`RENDER_RECIPE`, docs/reproducibility.md). Evaluation renders references with it; the shipped model's recipe
(recipes/embedded/corpus.py) renders its corpus. The synthesisers: ``sudo bash scripts/apt-voices.sh``.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import soundfile as sf

from rvqspec_lib.common.files import json_text, write_text_atomic
from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.models.audio import FRAME_SAMPLES, SAMPLE_RATE, n_frames


EVAL_TEXT_DIR = DATA_DIR / "eval_texts"


APT_HINT = "run `make voices` (scripts/apt-voices.sh: apt-get install flite festival festvox-us-slt-hts " \
           "festvox-kallpc16k espeak-ng sox)"


#: The paper's Table 1 roles, in table order.
SPLITS = ("training", "validation", "calibration", "evaluation")


#: Fractions of English sentences per split: calibration and evaluation get more than Table 1's, so that both are
#: large enough to measure acceptance and WER on.
DEFAULT_FRACTIONS = {"training": 0.86, "validation": 0.08, "calibration": 0.03, "evaluation": 0.03}


#: Salt of the split hash: changing it reshuffles every split (never do that silently).
SPLIT_SALT = "rvqspec-split-v1"


@dataclass(frozen=True)
class Sentence:
    """One sentence (spoken, and the ASR reference), its ISO 639-1 ``language``, its ``source`` (a key of
    :data:`SOURCE_DESCRIPTIONS`) and ``origin``, the file it came from."""

    text: str
    language: str
    source: str
    origin: str

    @property
    def split(self) -> str:
        """The sentence's Table 1 role (:func:`split_of`)."""
        return split_of(self)


def sentence_key(text: str) -> str:
    """What makes two sentences the same: lowercase letters and digits of any script, single-spaced."""
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def multilingual_sentences() -> list[Sentence]:
    """The shipped non-English evaluation sentences (``data/eval_texts/multilingual.tsv``)."""
    p = EVAL_TEXT_DIR / "multilingual.tsv"
    pairs = [line.split("\t", 1) for line in p.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    return [Sentence(text.strip(), lang.strip(), "written", "data/eval_texts/multilingual.tsv") for lang, text in pairs]


def split_of(sentence: Sentence | str, fractions: Mapping[str, float] | None = None) -> str:
    """The Table 1 role (one of :data:`SPLITS`) of a sentence or an English text, a pure function of its
    normalised text (non-English: ``evaluation``; ``fractions`` default :data:`DEFAULT_FRACTIONS`). Raises
    ValueError: fractions not summing to 1."""
    text, lang = (sentence.text, sentence.language) if isinstance(sentence, Sentence) else (sentence, "en")
    if lang != "en":
        return "evaluation"
    fr = dict(fractions or DEFAULT_FRACTIONS)
    if set(fr) - set(SPLITS) or abs(sum(fr.values()) - 1) > 1e-9 or min(fr.values()) < 0:
        raise ValueError(f"fractions must map some of {SPLITS} to non-negative numbers summing to 1, got {fr}")
    h = hashlib.sha256(f"{SPLIT_SALT}:{sentence_key(text)}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2 ** 64  # uniform in [0, 1)
    acc = 0.0
    for name in SPLITS:
        acc += fr.get(name, 0.0)
        if u < acc:
            return name
    return [s for s in SPLITS if fr.get(s, 0) > 0][-1]


def load_sentences(path: str | os.PathLike) -> list[Sentence]:
    """Read a TSV written by ``recipes/embedded/corpus.py``'s ``save_sentences``."""
    with open(path, encoding="utf-8", newline="") as f:
        return [Sentence(r["text"], r["language"], r["source"], r["origin"])
                for r in csv.DictReader(f, delimiter="\t")]


def shipped_sentences(split: str = "evaluation", language: str | None = None) -> list[Sentence]:
    """Sentences shipped in ``data/eval_texts/`` (``en_<split>.tsv``, plus the multilingual set for evaluation)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: choose from {SPLITS}")
    out = []
    p = EVAL_TEXT_DIR / f"en_{split}.tsv"
    if p.is_file():
        out += load_sentences(p)
    if split == "evaluation":
        out += multilingual_sentences()
    return [s for s in out if language is None or s.language == language]


class MissingVoiceError(FileNotFoundError):
    """A synthesiser (or one of its voices) is not installed; the message names the apt command."""


@dataclass(frozen=True)
class Voice:
    """A synthesiser voice: its ``name`` (manifests, :data:`VOICES`), the ISO 639-1 ``language`` it reads, ``engine``
    (a key of :data:`ENGINES`) called with ``arg``, from Debian ``package``; ``data_dir``: a folder that must exist
    for it (festival voices), or ``""``."""

    name: str
    language: str
    engine: str
    arg: str
    package: str
    data_dir: str = ""

    def command(self, text_file: str, out_wav: str) -> list[str]:
        """The command line that renders the UTF-8 text in ``text_file`` to ``out_wav`` at the engine's rate."""
        return [a.format(arg=self.arg, text=text_file, wav=out_wav) for a in ENGINES[self.engine]]

    @property
    def binary(self) -> str:
        """The program the engine runs (checked by :func:`check_voice`)."""
        return ENGINES[self.engine][0]


#: Each engine's command line (``{arg}``: the voice's argument).
ENGINES = {"flite": ("flite", "-voice", "{arg}", "-f", "{text}", "-o", "{wav}"),
           "festival": ("text2wave", "-eval", "{arg}", "-o", "{wav}", "{text}"),
           "espeak-ng": ("espeak-ng", "-v", "{arg}", "-b", "1", "-f", "{text}", "-w", "{wav}")}


VOICES: dict[str, Voice] = {v.name: v for v in [
    Voice("slt", "en", "flite", "slt", "flite"),
    Voice("kal16", "en", "flite", "kal16", "flite"),
    Voice("awb", "en", "flite", "awb", "flite"),
    Voice("rms", "en", "flite", "rms", "flite"),
    Voice("slt-hts", "en", "festival", "(voice_cmu_us_slt_arctic_hts)", "festvox-us-slt-hts",
          "/usr/share/festival/voices/us/cmu_us_slt_arctic_hts"),
    Voice("kal-diphone", "en", "festival", "(voice_kal_diphone)", "festvox-kallpc16k",
          "/usr/share/festival/voices/english/kal_diphone"),
    Voice("espeak-en", "en", "espeak-ng", "en-us", "espeak-ng"),
    Voice("espeak-de", "de", "espeak-ng", "de", "espeak-ng"),
    Voice("espeak-es", "es", "espeak-ng", "es", "espeak-ng"),
    Voice("espeak-ru", "ru", "espeak-ng", "ru", "espeak-ng"),
    Voice("espeak-ja", "ja", "espeak-ng", "ja", "espeak-ng"),
    Voice("espeak-zh", "zh", "espeak-ng", "cmn", "espeak-ng"),
]}


#: Default voices: the four flite English voices and one espeak-ng voice per multilingual language.
DEFAULT_VOICES = ("slt", "kal16", "awb", "rms", "espeak-de", "espeak-es", "espeak-ru", "espeak-ja", "espeak-zh")


def get_voice(voice: str | Voice) -> Voice:
    """The :class:`Voice` of a name of :data:`VOICES` (a Voice as it is); else ValueError listing them."""
    if isinstance(voice, Voice):
        return voice
    if voice not in VOICES:
        raise ValueError(f"unknown voice {voice!r}: choose from {sorted(VOICES)}")
    return VOICES[voice]


def check_voice(voice: str | Voice) -> Voice:
    """The :class:`Voice`, its synthesiser, data and ``sox`` checked; else MissingVoiceError naming the apt command."""
    v = get_voice(voice)
    for binary, pkg in ((v.binary, v.package if v.engine != "festival" else "festival"), ("sox", "sox")):
        if shutil.which(binary) is None:
            raise MissingVoiceError(f"voice {v.name!r} needs `{binary}` (Debian package {pkg}), which is not "
                                    f"installed: {APT_HINT}")
    if v.data_dir and not Path(v.data_dir).is_dir():
        raise MissingVoiceError(f"voice {v.name!r} needs the Debian package {v.package} ({v.data_dir} is missing): "
                                f"{APT_HINT}")
    return v


def utterance_id(sentence: Sentence, voice: str) -> str:
    """``<voice>-<12 hex digits of the sentence's hash>``: stable across runs and machines."""
    h = hashlib.sha1(f"{sentence.language}:{sentence.text}".encode()).hexdigest()[:12]
    return f"{voice}-{h}"


#: sox's options for resampling: ``-D`` no dither (clock-seeded, it made two renderings differ), ``-R`` repeatable.
SOX_ARGS = ("-q", "-R", "-D")


#: How :func:`render_one` makes a file, recorded in each rendered folder: files under another recipe are re-rendered.
RENDER_RECIPE = "synthesiser at its own rate -> sox " + " ".join(SOX_ARGS) + " -r <rate> -c 1 -b 16 (no dither)"


RECIPE_FILE = ".render-recipe"


def render_one(text: str, voice: str | Voice, out_path: str | os.PathLike) -> int:
    """Render one text to a mono 16-bit wav at :data:`SAMPLE_RATE`, atomically, the same bytes on every run; returns its
    length in samples. Raises MissingVoiceError; RuntimeError: the synthesiser failed (its stderr quoted)."""
    v = check_voice(voice)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rvqspec-tts-", dir=out.parent) as tmp:
        txt, raw, res = Path(tmp) / "text.txt", Path(tmp) / "raw.wav", Path(tmp) / "out.wav"
        txt.write_text(text.strip() + "\n", encoding="utf-8")
        for cmd in (v.command(str(txt), str(raw)),
                    ["sox", *SOX_ARGS, str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(res)]):
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if r.returncode != 0 or not Path(cmd[-1] if cmd[0] == "sox" else raw).is_file():
                raise RuntimeError(f"{cmd[0]} failed for voice {v.name!r} (exit {r.returncode}): "
                                   f"{(r.stderr or r.stdout).strip()[-400:]}")
        os.replace(res, out)
    return sf.info(str(out)).frames


def render_recipe_current(folder: str | os.PathLike) -> bool:
    """Whether the files under ``folder`` were rendered with this :data:`RENDER_RECIPE` (``False`` without a record)."""
    p = Path(folder) / RECIPE_FILE
    return p.is_file() and p.read_text(encoding="utf-8").strip() == RENDER_RECIPE


def _write_recipe(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / RECIPE_FILE, RENDER_RECIPE + "\n")


def _render_job(job: tuple) -> dict:
    """Render a manifest row (``(row, out_dir, reuse)``) unless reused; its lengths added."""
    row, out_dir, reuse = job
    path = Path(out_dir) / row["path"]
    if reuse and path.is_file():
        samples = sf.info(str(path)).frames  # resume: keep what an earlier run rendered with this recipe
    else:
        samples = render_one(row["text"], row["voice"], path)
    return {**row, "samples": samples, "seconds": round(samples / SAMPLE_RATE, 4),
            "frames": n_frames(samples, FRAME_SAMPLES)}


def render_files(items: Iterable[tuple[str, str, str | os.PathLike]], folder: str | os.PathLike, *,
                 progress: bool = False, desc: str = "render") -> list[int]:
    """Render ``(text, voice, path)`` items into ``folder`` (paths inside it), reusing files only under this
    :data:`RENDER_RECIPE`, 2 synthesisers at once (no effect on the result). Returns each length in
    samples. Raises ValueError: a path outside ``folder``; MissingVoiceError (checked first); RuntimeError."""
    out = Path(folder)
    items = [(str(t), str(v), out / p) for t, v, p in items]
    outside = [str(p) for _, _, p in items if not p.resolve().is_relative_to(out.resolve())]
    if outside:
        raise ValueError(f"{outside[0]} is not inside {out}: give paths relative to the folder whose "
                         f"{RECIPE_FILE} records how they were rendered")
    rows = [{"text": t, "voice": v, "path": str(p)} for t, v, p in items]
    done = _render_rows(rows, out, processes=2, progress=progress, desc=desc)
    _write_recipe(out)
    return [d["samples"] for d in done]


def _render_rows(rows: list[dict], out: Path, *, processes: int, progress: bool, desc: str) -> list[dict]:
    """Render manifest rows into ``out``, every voice checked first, files reused only under this recipe."""
    for v in sorted({r["voice"] for r in rows}):
        check_voice(v)
    out.mkdir(parents=True, exist_ok=True)
    reuse = render_recipe_current(out)
    jobs = [(r, str(out), reuse) for r in rows]
    with ThreadPoolExecutor(max_workers=max(1, processes)) as ex:
        return list(progress_bar(ex.map(_render_job, jobs), total=len(jobs), desc=desc, unit="utt",
                                 enabled=progress))


def voice_of(text: str, names: Sequence[str]) -> str:
    """The one voice of ``names`` (a non-empty sequence of voice names) that speaks ``text`` when each sentence gets
    one: chosen by a hash of the sentence's key, so the same sentence always gets the same voice (what
    :func:`plan_renders` with ``one_voice_each`` and the learned codec's data stage choose). ValueError: no names."""
    if not names:
        raise ValueError("no voices to choose from: give at least one voice name")
    return names[int(hashlib.sha1(sentence_key(text).encode()).hexdigest()[:8], 16) % len(names)]


def plan_renders(sentences: Iterable[Sentence], voices: Sequence[str] = DEFAULT_VOICES,
                 one_voice_each: bool = False) -> list[dict]:
    """Manifest rows (no lengths yet) rendering ``sentences`` with every voice of their language, or
    ``one_voice_each`` (chosen by a hash). Raises ValueError: a language no chosen voice speaks."""
    vs = [get_voice(v) for v in voices]
    rows = []
    for s in sentences:
        mine = [v for v in vs if v.language == s.language]
        if not mine:
            raise ValueError(f"no voice for language {s.language!r} among {list(voices)}: add one of "
                             f"{sorted(n for n, v in VOICES.items() if v.language == s.language)}")
        if one_voice_each:
            one = voice_of(s.text, [v.name for v in mine])
            mine = [v for v in mine if v.name == one]
        for v in mine:
            uid = utterance_id(s, v.name)
            rows.append({"id": uid, "split": split_of(s), "language": s.language, "voice": v.name,
                         "text": s.text, "source": s.source, "origin": s.origin,
                         "path": f"wav/{v.name}/{uid}.wav"})
    return rows


def render_corpus(sentences: Iterable[Sentence], out_dir: str | os.PathLike, voices: Sequence[str] = DEFAULT_VOICES,
                  one_voice_each: bool = False, processes: int = 2, progress: bool = True) -> list[dict]:
    """Render sentences (:func:`plan_renders`) to ``<out_dir>/wav/<voice>/<id>.wav`` (a rerun resumes) and write
    ``<out_dir>/manifest.jsonl``. Returns its rows: ``id, split, language, voice, text, source, origin, path``
    (relative), ``samples, seconds, frames`` (12.5 Hz), ``sample_rate``. Raises MissingVoiceError."""
    out = Path(out_dir)
    rows = [{**r, "sample_rate": SAMPLE_RATE} for r in plan_renders(sentences, voices, one_voice_each)]
    done = _render_rows(rows, out, processes=processes, progress=progress, desc="render")
    write_text_atomic(out / "manifest.jsonl",
                      "".join(json_text(dict(r), indent=None, ensure_ascii=False) + "\n" for r in done))
    _write_recipe(out)
    return done

