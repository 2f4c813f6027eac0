"""Does a text look like English? The simple heuristic behind ``rvqspec synth``'s note that a model trained on English
only will not speak another language (its English front end reads the letters as English).

The rule, in order (:func:`non_english_evidence`):

1. a letter outside the Latin script (``ord > 0x24F``: Cyrillic, CJK, kana, Greek, Arabic, ...): not English;
2. otherwise each word counts as a *hit* when it holds a Latin letter English does not use (U+00C0..U+024F, e.g.
   ``ä ö ü ß é è à ñ ç``) or is one of :data:`FUNCTION_WORDS`, frequent short words of German, French, Spanish,
   Italian, Portuguese and Dutch that are not also English words (``die``, ``was``, ``also``, ``pour``, ``con``,
   ``van``... are left out on purpose). The text looks like another language when there are at least two hits, or
   when at least half of its words are hits (so a one-word ``Danke.`` counts, and an English sentence with one
   ``café`` does not).

It is a heuristic, not a language identifier: of the project's 1,609 English evaluation and calibration sentences
(``data/eval_texts/en_*.tsv``) it flags one, the mock-German fortune "Das machine is nicht fur gefingerpoken und
mittengrabben.", while every German and Spanish sentence of ``data/eval_texts/multilingual.tsv`` gets the note
(tests/test_messages.py); a text it misses only loses a note.
"""

from __future__ import annotations

import re

#: Frequent function words of other Latin-script languages that are not English words (lower case).
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
    """Why ``text`` does not look like English (the rule of the module doc), or ``None`` when it does.

    Args:
        text: the text to be spoken (any Unicode string; case and punctuation are ignored).

    Returns:
        a short phrase for a note, ``"letters outside the Latin script"``, ``"words such as 'wie', 'geht'"`` or
        ``"letters such as 'ü'"``; ``None`` for text that looks English (or has no letters).
    """
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
