"""Does a text look like English? The heuristic behind ``rvqspec synth``'s note that a model trained on English only
will not speak another language (:func:`non_english_evidence`): a letter outside the Latin script; else at least two
words, or half the words, holding a Latin letter English does not use or one of :data:`FUNCTION_WORDS`. Not a
language identifier: a text it misses only loses a note (tests/test_messages.py).
"""

from __future__ import annotations

import re

#: Frequent function words of other Latin-script languages that are not English words (lower case; ``die``, ``was``,
#: ``also``, ``con``, ``van`` ... left out on purpose).
FUNCTION_WORDS = {
    "german": {"und", "ist", "nicht", "ich", "du", "wie", "geht", "es", "dir", "mir", "mich", "ein", "eine", "einen",
               "der", "das", "zu", "auf", "sie", "wir", "ihr", "bitte", "danke", "guten", "morgen", "heute", "nein",
               "sehr", "auch", "noch", "nur", "oder", "aber", "wenn", "schon", "hier", "gern", "gerne", "wo", "zum",
               "im", "vom", "beim", "meine", "mein", "deine", "einem", "einer", "seit", "viele", "jahr", "sich"},
    "french": {"le", "les", "et", "est", "je", "tu", "il", "nous", "vous", "une", "des", "qui", "avec", "dans",
               "bonjour", "merci", "mais", "au", "aux", "ce", "cette", "sont", "suis", "c'est", "j'ai", "ne", "oui"},
    "spanish": {"el", "los", "las", "y", "es", "que", "del", "por", "para", "una", "hola", "gracias", "muy", "pero",
                "como", "donde", "cuando", "usted", "hoy", "hace", "toda", "todo"},
    "italian": {"il", "della", "che", "sono", "ciao", "grazie", "buongiorno", "questo", "molto", "gli", "di", "perché"},
    "portuguese": {"uma", "com", "muito", "isso", "obrigado", "obrigada", "você", "não", "sim", "bom", "dia"},
    "dutch": {"het", "een", "niet", "ik", "dank", "je", "gaat", "goed", "goedemorgen", "zijn", "wat", "hoe"},
}
_WORDS = frozenset().union(*FUNCTION_WORDS.values())
_TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def _is_foreign_latin(ch: str) -> bool:
    return ch.isalpha() and 0xC0 <= ord(ch) <= 0x24F


def non_english_evidence(text: str) -> str | None:
    """Why ``text`` does not look like English (module docstring), as a short phrase for a note (``"words such as
    'wie', 'geht'"``), or ``None`` when it does (or has no letters)."""
    if any(ch.isalpha() and ord(ch) > 0x24F for ch in text):
        return "letters outside the Latin script"
    words = _TOKEN.findall(text.lower())
    if not words:
        return None
    hits = [w for w in words if w in _WORDS or any(_is_foreign_latin(c) for c in w)]
    if len(hits) < 2 and 2 * len(hits) < len(words):
        return None
    named = [w for w in dict.fromkeys(hits) if w in _WORDS][:3]
    if named:
        return "words such as " + ", ".join(f"'{w}'" for w in named)
    letters = dict.fromkeys(c for w in hits for c in w if _is_foreign_latin(c))
    return "letters such as " + ", ".join(f"'{c}'" for c in list(letters)[:3])


def english_only_note(model: str, text: str) -> str | None:
    """The note ``rvqspec synth`` prints for a model trained on English only, or ``None`` when ``text`` looks English
    (:func:`non_english_evidence`)."""
    why = non_english_evidence(text)
    if why is None:
        return None
    return (f"{model} was trained on English only and this text looks like another language ({why}): it goes through "
            "the English front end and will not sound like that language")
