"""The shipped model's offline text corpus (docs/offline.md#natural-text): clean English sentences from Debian's
fortunes, the standard library's docstrings and ``/usr/share/doc`` plus the shipped multilingual set, deduplicated
and split into Table 1's roles (:func:`rvqspec_lib.data.voices.split_of`); the voices that render it are
:mod:`rvqspec_lib.data.voices`.
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from rvqspec_lib.device.kernels.build import cache_dir as cache_dir_of_kernels
from rvqspec_lib.data.voices import SPLITS, Sentence, multilingual_sentences, sentence_key, split_of


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


#: fortunes files left out: ASCII art (not sentences), and files of jokes built on ethnic or gender stereotypes.
FORTUNE_EXCLUDE = ("ascii-art", "ethnic", "men-women", "translate-me")


FORTUNE_PACKAGES = ("fortunes", "fortunes-min")


_WORD = re.compile(r"^[A-Za-z]+(?:['-][A-Za-z]+)*$")


_SENTENCE_CHARS = re.compile(r"^[A-Z][A-Za-z ,;:'-]*[A-Za-z][.!?]$")


_SPLITTER = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")


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


def assign_splits(sentences: Iterable[Sentence], fractions: Mapping[str, float] | None = None
                  ) -> dict[str, list[Sentence]]:
    """Group sentences by :func:`split_of`; every split key present (possibly empty)."""
    out: dict[str, list[Sentence]] = {s: [] for s in SPLITS}
    for s in sentences:
        out[split_of(s, fractions)].append(s)
    return out


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


def read_manifest(path: str | os.PathLike) -> list[dict]:
    """Rows of a ``manifest.jsonl`` with ``path`` made absolute (relative to the manifest's folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}: render a corpus first "
                                "(rvqspec_lib.data.voices.render_corpus)")
    rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{**r, "path": str((p.parent / r["path"]).resolve())} for r in rows]
