"""Text to ids in the official chat layout (``<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n``, as
the official ``_build_assistant_text``): the official processor of a real checkpoint (:class:`ProcessorTokenizer`),
UTF-8 bytes (:class:`ByteTokenizer`: models without a processor offline, and our own), or espeak-ng phonemes written as
bytes (:class:`PhonemeTokenizer`, the same 256-entry vocabulary). Our own models store theirs in ``rvqspec_model.json``
(rebuilt by :func:`tokenizer_from_spec`). espeak-ng prints one line per clause and drops punctuation: clauses are
joined with :data:`CLAUSE_BREAK` and the final ``.``, ``?`` or ``!`` kept.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import torch

#: espeak-ng flags per alphabet.
ALPHABETS = {"ascii": ["-x"], "ipa": ["--ipa"]}
CLAUSE_BREAK = " | "


def _checked(text) -> str:
    """``text`` when it is a non-empty string; else ValueError (one line)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text is empty: pass the sentence to speak, e.g. --text 'Hello world.'")
    return text


class ByteTokenizer:
    """Offline text tokenizer: UTF-8 bytes as ids 0..255 plus the config's special ids, in the chat layout. Used by
    ``tiny-random`` and the real-size random architectures (which have no processor offline)."""

    def __init__(self, im_start: int, im_end: int, assistant: int):
        self.im_start, self.im_end, self.assistant = im_start, im_end, assistant
        self.newline = ord("\n")

    def __call__(self, text: str) -> torch.Tensor:
        """Encode one text. Returns ``(1, L)`` int64 ids. Raises ``ValueError`` on empty text."""
        body = list(_checked(text).encode("utf-8"))
        ids = [self.im_start, self.assistant, self.newline, *body, self.im_end, self.newline,
               self.im_start, self.assistant, self.newline]
        return torch.tensor([ids], dtype=torch.long)


class ProcessorTokenizer:
    """Wraps the official processor of a real checkpoint (Qwen2 BPE) with the official chat layout."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, text: str) -> torch.Tensor:
        full = f"<|im_start|>assistant\n{_checked(text)}<|im_end|>\n<|im_start|>assistant\n"
        ids = self.processor(text=full, return_tensors="pt", padding=True)["input_ids"]
        return ids if ids.dim() == 2 else ids.unsqueeze(0)


class EspeakMissingError(RuntimeError):
    """espeak-ng is not installed (or not where the tokenizer was told to find it)."""


class PhonemeTokenizer(ByteTokenizer):
    """Text -> espeak-ng phonemes -> UTF-8 bytes, in the official chat layout (like :class:`ByteTokenizer`).

    Args:
        im_start, im_end, assistant: the config's special text ids. voice: an espeak-ng voice (``en-us``, ``de``
            ...). alphabet: ``"ascii"`` (``-x`` mnemonics) or ``"ipa"``. espeak: the program (on PATH or a path).

    One process per text, cached; :meth:`prefetch` fills the cache with a few processes at once.
    """

    def __init__(self, im_start: int, im_end: int, assistant: int, *, voice: str = "en-us",
                 alphabet: str = "ascii", espeak: str = "espeak-ng"):
        super().__init__(im_start, im_end, assistant)
        if alphabet not in ALPHABETS:
            raise ValueError(f"unknown phoneme alphabet {alphabet!r}: use one of {', '.join(ALPHABETS)}")
        self.voice, self.alphabet, self.espeak = voice, alphabet, espeak
        self._cache: dict[str, str] = {}

    def spec(self) -> dict:
        """What ``rvqspec_model.json`` stores to rebuild this tokenizer."""
        return {"kind": "phonemes", "voice": self.voice, "alphabet": self.alphabet}

    def _program(self) -> str:
        exe = shutil.which(self.espeak)
        if exe is None:
            raise EspeakMissingError(
                f"espeak-ng not found ({self.espeak!r}): this model reads phonemes made by espeak-ng. Install it "
                "(Debian/Ubuntu: apt-get install -y espeak-ng; macOS: brew install espeak-ng) or pass espeak=PATH.")
        return exe

    def phonemize(self, text: str) -> str:
        """Phoneme string of one text (cached). Raises ``ValueError`` on empty text or an unknown voice."""
        if _checked(text) in self._cache:
            return self._cache[text]
        flat = " ".join(text.split())  # newlines would end clauses
        proc = subprocess.run([self._program(), "-q", "-v", self.voice, *ALPHABETS[self.alphabet], "--stdin"],
                              input=flat.encode("utf-8"), capture_output=True, timeout=60)
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise ValueError(f"espeak-ng failed for voice {self.voice!r}: {err or 'exit ' + str(proc.returncode)}")
        lines = [ln.strip() for ln in proc.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
        out = CLAUSE_BREAK.join(lines)
        end = re.search(r"[.?!]+[\"')\]]*\s*$", flat)
        if end:
            out += end.group(0).strip()[0]
        if not out.strip():  # a text of punctuation only: keep something speakable rather than nothing
            out = flat
        self._cache[text] = out
        return out

    def prefetch(self, texts) -> None:
        """Phonemise many texts in 4 parallel processes and cache them (for a training corpus)."""
        todo = sorted({t for t in texts if t not in self._cache})
        self._program()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self.phonemize, todo))

    def __call__(self, text: str) -> torch.Tensor:
        """Encode one text. Returns ``(1, L)`` int64 ids (phoneme bytes in the chat layout)."""
        return super().__call__(self.phonemize(text))


def tokenizer_spec(tokenizer) -> dict:
    """The ``rvqspec_model.json`` entry of a tokenizer. Raises ``ValueError`` for a tokenizer we cannot store."""
    if isinstance(tokenizer, PhonemeTokenizer):
        return tokenizer.spec()
    if isinstance(tokenizer, ByteTokenizer):
        return {"kind": "bytes"}
    raise ValueError(f"cannot store a {type(tokenizer).__name__} in rvqspec_model.json: use bytes or phonemes")


def tokenizer_from_spec(spec: dict, config: dict) -> ByteTokenizer:
    """Rebuild a tokenizer from its ``rvqspec_model.json`` entry and the model's ``config.json`` (special ids)."""
    ids = (int(config["im_start_token_id"]), int(config["im_end_token_id"]), int(config["assistant_token_id"]))
    kind = (spec or {}).get("kind", "bytes")
    if kind == "bytes":
        return ByteTokenizer(*ids)
    if kind == "phonemes":
        return PhonemeTokenizer(*ids, voice=spec.get("voice", "en-us"), alphabet=spec.get("alphabet", "ascii"))
    raise ValueError(f"unknown tokenizer kind {kind!r} in rvqspec_model.json: use 'bytes' or 'phonemes'")
