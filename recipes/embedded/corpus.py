"""An offline speech corpus (docs/offline.md#speech-audio, #natural-text): clean English sentences from Debian's
fortunes, the standard library's docstrings and ``/usr/share/doc`` plus a shipped multilingual set; Table 1 splits by
a hash of the text (:func:`split_of`); audio rendered by flite, festival and espeak-ng, deterministically
(:data:`RENDER_RECIPE`, docs/reproducibility.md). The synthesisers: ``sudo bash scripts/apt-voices.sh``.
"""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
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
from rvqspec_lib.device.kernels.build import cache_dir as cache_dir_of_kernels

EVAL_TEXT_DIR = DATA_DIR / "eval_texts"
APT_HINT = "run `make voices` (scripts/apt-voices.sh: apt-get install flite festival festvox-us-slt-hts " \
           "festvox-kallpc16k espeak-ng sox)"

#: The paper's Table 1 roles, in table order.
SPLITS = ("training", "validation", "calibration", "evaluation")
#: What each split is used for in this project (the "role" column of the Table 1 analogue, notebook 00).
SPLIT_ROLES = {
    "training": "fit the codec; train the embedded model and the drafters",
    "validation": "held out from training: loss and teacher-forced accuracy",
    "calibration": "choose the draft tree (acceptance by rank and offset)",
    "evaluation": "held out everywhere: acceptance, WER, codec quality",
}
#: Where the text of each ``Sentence.source`` comes from (for tables).
SOURCE_DESCRIPTIONS = {
    "fortunes": "Debian fortunes / fortunes-min (apt-get download, dpkg -x)",
    "stdlib": "Python standard-library docstrings (parsed with ast)",
    "doc": "plain-text docs under /usr/share/doc",
    "written": "written for this project (data/eval_texts/multilingual.tsv)",
}
#: Fractions of English sentences per split: calibration and evaluation get more than Table 1's, so that both are
#: large enough to measure acceptance and WER on.
DEFAULT_FRACTIONS = {"training": 0.86, "validation": 0.08, "calibration": 0.03, "evaluation": 0.03}
#: Salt of the split hash: changing it reshuffles every split (never do that silently).
SPLIT_SALT = "rvqspec-split-v1"

#: fortunes files left out: ASCII art (not sentences), and files of jokes built on ethnic or gender stereotypes.
FORTUNE_EXCLUDE = ("ascii-art", "ethnic", "men-women", "translate-me")
FORTUNE_PACKAGES = ("fortunes", "fortunes-min")


# ---- Sentences -------------------------------------------------------------------------------------------------------
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


_WORD = re.compile(r"^[A-Za-z]+(?:['-][A-Za-z]+)*$")
_SENTENCE_CHARS = re.compile(r"^[A-Z][A-Za-z ,;:'-]*[A-Za-z][.!?]$")
_SPLITTER = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")


def sentence_key(text: str) -> str:
    """What makes two sentences the same: lowercase letters and digits of any script, single-spaced."""
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def is_clean(sentence: str, min_words: int = 4, max_words: int = 15) -> bool:
    """Whether ``sentence`` is speakable English of ``min_words``..``max_words`` words: ASCII letters and ``, ; : '
    -``, ending in ``. ! ?``, no acronyms or identifiers (a synthesiser spells them out)."""
    if not _SENTENCE_CHARS.match(sentence) or "  " in sentence or "--" in sentence:
        return False
    words = sentence[:-1].split(" ")
    if not min_words <= len(words) <= max_words:
        return False
    for w in words:
        core = w[:-1] if w[-1:] in ",;:" else w  # one punctuation mark may end a word
        if not _WORD.match(core):
            return False
        if any(ch.isupper() for ch in core[1:]):  # acronyms (HTTP), identifiers (TypeError)
            return False
        if len(core) == 1 and core not in ("a", "A", "I"):  # variables ("if x is")
            return False
    return True


def clean_sentences(text: str, min_words: int = 4, max_words: int = 15) -> list[str]:
    """All clean sentences (:func:`is_clean`) of a plain-text document, in order, duplicates kept."""
    text = re.sub(r".\x08", "", text).replace("\t", " ")
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(("--", ">>>", "..."))]
        joined = " ".join(" ".join(lines).split())
        for s in (s.strip() for s in _SPLITTER.split(joined) if s.strip()):  # at . ! ? before a capital
            s = s.replace('"', "").strip("()[]'` ")
            s = " ".join(s.split())
            if is_clean(s, min_words, max_words):
                out.append(s)
    return out


def dedupe(sentences: Iterable[Sentence]) -> list[Sentence]:
    """First occurrence of each :func:`sentence_key`, order kept."""
    first: dict[tuple, Sentence] = {}
    for s in sentences:
        first.setdefault((s.language, sentence_key(s.text)), s)
    return list(first.values())


# ---- Sources ---------------------------------------------------------------------------------------------------------
def fetch_debian_package(package: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Unpack a Debian package into ``<cache>/debian/<package>/`` (reused) without installing it: ``apt-get
    download`` + ``dpkg -x``. Raises FileNotFoundError: not Debian-based; RuntimeError: the download failed."""
    root = Path(cache_dir or cache_dir_of_kernels()) / "debian"
    dest = root / package
    if (dest / ".complete").is_file():
        return dest
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} not found: fetching {package} needs a Debian-based system")
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True, text=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if r.returncode != 0 or not found:
        raise RuntimeError(f"apt-get download {package} failed ({r.stderr.strip()[-300:]}): run `apt-get update` "
                           "first (the package lists are needed), or check the network to the Debian mirror")
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run(["dpkg", "-x", str(found[-1]), str(dest)], check=True, capture_output=True)
    (dest / ".complete").write_text(found[-1].name + "\n")
    return dest


def parse_fortune_file(path: str | os.PathLike) -> list[str]:
    """The fortunes of a strfile source file (entries separated by lines holding ``%``)."""
    raw = Path(path).read_bytes().decode("latin-1")
    return [e.strip("\n") for e in re.split(r"^%\s*$", raw, flags=re.M) if e.strip()]


def fortune_sentences(cache_dir: str | os.PathLike | None = None, packages: Sequence[str] = FORTUNE_PACKAGES,
                      exclude: Sequence[str] = FORTUNE_EXCLUDE) -> list[Sentence]:
    """Clean sentences of Debian's fortune packages (fetched with :func:`fetch_debian_package`)."""
    out = []
    for pkg in packages:
        root = fetch_debian_package(pkg, cache_dir)
        d = root / "usr" / "share" / "games" / "fortunes"
        for f in sorted(d.glob("*")) if d.is_dir() else []:
            if f.suffix in (".dat", ".u8") or f.is_symlink() or not f.is_file() or f.name in exclude:
                continue
            origin = f"{pkg}:{f.relative_to(root).as_posix()}"
            for fortune in parse_fortune_file(f):
                out += [Sentence(s, "en", "fortunes", origin) for s in clean_sentences(fortune)]
    return out


_STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "ensurepip", "turtledemo", "site-packages", "__pycache__",
                "pydoc_data", "config-3"}


def stdlib_sentences(max_files: int | None = None, stdlib_dir: str | os.PathLike | None = None) -> list[Sentence]:
    """Clean sentences of the docstrings of the running Python's standard library (parsed, never imported)."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    tag = f"python{sys.version_info.major}.{sys.version_info.minor}"
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP and not d.startswith("config-"))
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    out = []
    for f in files[:max_files]:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        origin = f"{tag}:{f.relative_to(root).as_posix()}"
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    out += [Sentence(s, "en", "stdlib", origin) for s in clean_sentences(doc)]
    return out


def _is_doc_text(name: str) -> bool:
    low = name.lower()
    if low.startswith(("copyright", "changelog", "license", "copying")) or "debian" in low:
        return False
    base = low[:-3] if low.endswith(".gz") else low
    return base.startswith(("readme", "news", "todo", "faq", "usage")) or base.endswith((".txt", ".md", ".rst"))


def doc_sentences(root: str | os.PathLike = "/usr/share/doc", max_files: int | None = None,
                  max_bytes: int = 1_000_000) -> list[Sentence]:
    """Clean sentences of plain-text package documentation (READMEs, NEWS, ``*.txt`` ..., gzipped or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        files += [Path(dirpath) / f for f in sorted(filenames) if _is_doc_text(f)]
    out = []
    for f in files[:max_files]:
        try:
            if f.is_symlink() or not f.is_file():
                continue
            data = gzip.open(f).read(max_bytes) if f.suffix == ".gz" else f.open("rb").read(max_bytes)
        except (OSError, EOFError):
            continue
        if b"\x00" in data[:4096]:
            continue
        out += [Sentence(s, "en", "doc", f.as_posix()) for s in clean_sentences(data.decode("utf-8", "replace"))]
    return out


def multilingual_sentences(path: str | os.PathLike | None = None) -> list[Sentence]:
    """The shipped non-English evaluation sentences (``data/eval_texts/multilingual.tsv``)."""
    p = Path(path) if path else EVAL_TEXT_DIR / "multilingual.tsv"
    pairs = [line.split("\t", 1) for line in p.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    return [Sentence(text.strip(), lang.strip(), "written", "data/eval_texts/multilingual.tsv") for lang, text in pairs]


SOURCES = {"fortunes": fortune_sentences, "stdlib": stdlib_sentences, "doc": doc_sentences}


def gather_sentences(sources: Sequence[str] = ("fortunes", "stdlib", "doc"), cache_dir=None,
                     multilingual: bool = True) -> list[Sentence]:
    """All clean sentences of the chosen sources (in that order), deduplicated, plus the multilingual set."""
    out: list[Sentence] = []
    for name in sources:
        if name not in SOURCES:
            raise ValueError(f"unknown source {name!r}: choose from {sorted(SOURCES)}")
        out += SOURCES[name](cache_dir) if name == "fortunes" else SOURCES[name]()
    if multilingual:
        out += multilingual_sentences()
    return dedupe(out)


# ---- Splits ----------------------------------------------------------------------------------------------------------
def split_of(sentence: Sentence | str, fractions: Mapping[str, float] | None = None, language: str = "en") -> str:
    """The Table 1 role (one of :data:`SPLITS`) of a sentence or a text in ``language``, a pure function of its
    normalised text (non-English: ``evaluation``; ``fractions`` default :data:`DEFAULT_FRACTIONS`). Raises
    ValueError: fractions not summing to 1."""
    text, lang = (sentence.text, sentence.language) if isinstance(sentence, Sentence) else (sentence, language)
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


def assign_splits(sentences: Iterable[Sentence], fractions: Mapping[str, float] | None = None
                  ) -> dict[str, list[Sentence]]:
    """Group sentences by :func:`split_of`; every split key present (possibly empty)."""
    out: dict[str, list[Sentence]] = {s: [] for s in SPLITS}
    for s in sentences:
        out[split_of(s, fractions)].append(s)
    return out


def save_sentences(sentences: Iterable[Sentence], path: str | os.PathLike) -> Path:
    """Write sentences as TSV (``text language source origin``, with a header)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        w.writerow(["text", "language", "source", "origin"])
        for s in sentences:
            w.writerow([s.text, s.language, s.source, s.origin])
    return p


def load_sentences(path: str | os.PathLike) -> list[Sentence]:
    """Read a TSV written by :func:`save_sentences`."""
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


# ---- Voices and rendering --------------------------------------------------------------------------------------------
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


def render_one(text: str, voice: str | Voice, out_path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> int:
    """Render one text to a mono 16-bit wav at ``sample_rate``, atomically, the same bytes on every run; returns its
    length in samples. Raises MissingVoiceError; RuntimeError: the synthesiser failed (its stderr quoted)."""
    v = check_voice(voice)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rvqspec-tts-", dir=out.parent) as tmp:
        txt, raw, res = Path(tmp) / "text.txt", Path(tmp) / "raw.wav", Path(tmp) / "out.wav"
        txt.write_text(text.strip() + "\n", encoding="utf-8")
        for cmd in (v.command(str(txt), str(raw)),
                    ["sox", *SOX_ARGS, str(raw), "-r", str(sample_rate), "-c", "1", "-b", "16", str(res)]):
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
    """Render a manifest row (``(row, out_dir, sample_rate, reuse)``) unless reused; its lengths added."""
    row, out_dir, sample_rate, reuse = job
    path = Path(out_dir) / row["path"]
    if reuse and path.is_file():
        samples = sf.info(str(path)).frames  # resume: keep what an earlier run rendered with this recipe
    else:
        samples = render_one(row["text"], row["voice"], path, sample_rate)
    return {**row, "samples": samples, "seconds": round(samples / sample_rate, 4),
            "frames": n_frames(samples, FRAME_SAMPLES * sample_rate // SAMPLE_RATE)}


def render_files(items: Iterable[tuple[str, str, str | os.PathLike]], folder: str | os.PathLike, *,
                 processes: int = 2, sample_rate: int = SAMPLE_RATE, progress: bool = False,
                 desc: str = "render") -> list[int]:
    """Render ``(text, voice, path)`` items into ``folder`` (paths inside it), reusing files only under this
    :data:`RENDER_RECIPE`, ``processes`` synthesisers at once (no effect on the result). Returns each length in
    samples. Raises ValueError: a path outside ``folder``; MissingVoiceError (checked first); RuntimeError."""
    out = Path(folder)
    items = [(str(t), str(v), out / p) for t, v, p in items]
    outside = [str(p) for _, _, p in items if not p.resolve().is_relative_to(out.resolve())]
    if outside:
        raise ValueError(f"{outside[0]} is not inside {out}: give paths relative to the folder whose "
                         f"{RECIPE_FILE} records how they were rendered")
    rows = [{"text": t, "voice": v, "path": str(p)} for t, v, p in items]
    done = _render_rows(rows, out, processes=processes, sample_rate=sample_rate, progress=progress, desc=desc)
    _write_recipe(out)
    return [d["samples"] for d in done]


def _render_rows(rows: list[dict], out: Path, *, processes: int, sample_rate: int, progress: bool,
                 desc: str) -> list[dict]:
    """Render manifest rows into ``out``, every voice checked first, files reused only under this recipe."""
    for v in sorted({r["voice"] for r in rows}):
        check_voice(v)
    out.mkdir(parents=True, exist_ok=True)
    reuse = render_recipe_current(out)
    jobs = [(r, str(out), sample_rate, reuse) for r in rows]
    with ThreadPoolExecutor(max_workers=max(1, processes)) as ex:
        return list(progress_bar(ex.map(_render_job, jobs), total=len(jobs), desc=desc, unit="utt",
                                 enabled=progress))


def plan_renders(sentences: Iterable[Sentence], voices: Sequence[str] = DEFAULT_VOICES, one_voice_each: bool = False,
                 fractions: Mapping[str, float] | None = None) -> list[dict]:
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
            h = int(hashlib.sha1(sentence_key(s.text).encode()).hexdigest()[:8], 16)
            mine = [mine[h % len(mine)]]
        for v in mine:
            uid = utterance_id(s, v.name)
            rows.append({"id": uid, "split": split_of(s, fractions), "language": s.language, "voice": v.name,
                         "text": s.text, "source": s.source, "origin": s.origin,
                         "path": f"wav/{v.name}/{uid}.wav"})
    return rows


def render_corpus(sentences: Iterable[Sentence], out_dir: str | os.PathLike, voices: Sequence[str] = DEFAULT_VOICES,
                  one_voice_each: bool = False, processes: int = 2, sample_rate: int = SAMPLE_RATE,
                  fractions: Mapping[str, float] | None = None, progress: bool = True) -> list[dict]:
    """Render sentences (:func:`plan_renders`) to ``<out_dir>/wav/<voice>/<id>.wav`` (a rerun resumes) and write
    ``<out_dir>/manifest.jsonl``. Returns its rows: ``id, split, language, voice, text, source, origin, path``
    (relative), ``samples, seconds, frames`` (12.5 Hz), ``sample_rate``. Raises MissingVoiceError."""
    out = Path(out_dir)
    rows = [{**r, "sample_rate": sample_rate} for r in plan_renders(sentences, voices, one_voice_each, fractions)]
    done = _render_rows(rows, out, processes=processes, sample_rate=sample_rate, progress=progress, desc="render")
    write_text_atomic(out / "manifest.jsonl",
                      "".join(json_text(dict(r), indent=None, ensure_ascii=False) + "\n" for r in done))
    _write_recipe(out)
    return done


def read_manifest(path: str | os.PathLike) -> list[dict]:
    """Rows of a ``manifest.jsonl`` with ``path`` made absolute (relative to the manifest's folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}: render a corpus first "
                                "(recipes.embedded.corpus.render_corpus)")
    rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{**r, "path": str((p.parent / r["path"]).resolve())} for r in rows]


def corpus_table(manifest: str | os.PathLike | Iterable[Mapping]) -> list[dict]:
    """Table 1 analogue of a manifest (path, folder or rows): a row ``{"split", "language", "samples" (utterances),
    "hours", "frames", "voices", "sources"}`` per (split, language) in Table 1 order (English first)."""
    rows = read_manifest(manifest) if isinstance(manifest, (str, os.PathLike)) else list(manifest)
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["split"], r["language"]), {"samples": 0, "seconds": 0.0, "frames": 0,
                                                            "voices": set(), "sources": set()})
        g["samples"] += 1
        g["seconds"] += float(r["seconds"])
        g["frames"] += int(r["frames"])
        g["voices"].add(r["voice"])
        g["sources"].add(r.get("source", ""))
    order = {s: i for i, s in enumerate(SPLITS)}
    keys = sorted(groups, key=lambda k: (order.get(k[0], 99), k[1] != "en", k[1]))
    return [{"split": s, "language": lang, "samples": groups[(s, lang)]["samples"],
             "hours": round(groups[(s, lang)]["seconds"] / 3600, 4), "frames": groups[(s, lang)]["frames"],
             "voices": ",".join(sorted(groups[(s, lang)]["voices"])),
             "sources": ",".join(sorted(x for x in groups[(s, lang)]["sources"] if x))} for s, lang in keys]
