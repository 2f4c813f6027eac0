"""The offline corpus: sentence cleaning, hash splits that never share a sentence, rendering, Table 1 rows."""

import itertools
import os

import pytest
import soundfile as sf

from recipes.embedded import corpus

from rvqspec_lib.data import voices
from recipes.embedded.corpus import assign_splits, clean_sentences, corpus_table, dedupe, is_clean, parse_fortune_file, stdlib_sentences
from recipes.embedded.corpus import read_manifest, save_sentences
from rvqspec_lib.data.voices import SPLITS, VOICES, MissingVoiceError, Sentence, check_voice, load_sentences, multilingual_sentences, plan_renders, render_corpus, render_one, sentence_key, shipped_sentences, split_of


def en(text, source="written", origin="test"):
    return Sentence(text, "en", source, origin)


# ---------------------------------------------------------------------------------------------------- cleaning
@pytest.mark.parametrize("text, ok", [
    ("The quick brown fox jumps over the lazy dog.", True),
    ("It's a fine day, isn't it?", True),
    ("Never put off till tomorrow what you can do today!", True),
    ("Too short.", False),                                              # < 4 words
    ("One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen.", False),
    ("Return True if x is set.", False),                                # a variable
    ("The HTTP server runs here.", False),                              # an acronym
    ("Raise a TypeError when it fails.", False),                        # an identifier
    ("Call foo() to begin the run.", False),                            # code
    ("There were 42 of them in the room.", False),                      # digits
    ("See e.g. the manual for this.", False),                           # inner period
    ("lowercase start is not a sentence.", False),
    ("No final punctuation here at all", False),
    ("Caf\u00e9 culture is quite nice indeed.", False),                 # not ASCII
])
def test_is_clean(text, ok):
    assert is_clean(text) is ok


def test_clean_sentences_splits_and_strips():
    text = ('"Hello there, my friend." He said it twice. Then he left the room quietly.\n'
            "\n        -- Mark Twain\n\nA second paragraph spans\ntwo lines of text.\n>>> x = 1\n")
    assert clean_sentences(text) == ["Hello there, my friend.", "He said it twice.",
                                     "Then he left the room quietly.", "A second paragraph spans two lines of text."]
    assert clean_sentences("B\x08Bo\x08ol\x08ld words are overstruck here.") == ["Bold words are overstruck here."]


def test_dedupe_ignores_case_and_punctuation():
    s = [en("Hello there, my old friend."), en("hello there my old friend!"), en("Another one goes here.")]
    assert [x.text for x in dedupe(s)] == ["Hello there, my old friend.", "Another one goes here."]


def test_parse_fortune_file(tmp_path):
    p = tmp_path / "f"
    p.write_text("First fortune here.\n%\nSecond one,\nover two lines.\n\t-- Someone\n%\n")
    assert parse_fortune_file(p) == ["First fortune here.", "Second one,\nover two lines.\n\t-- Someone"]


def test_stdlib_sentences_record_their_origin():
    got = stdlib_sentences(max_files=40)
    assert len(got) > 20
    assert all(s.source == "stdlib" and s.origin.startswith("python3.") and s.origin.endswith(".py") for s in got)
    assert all(is_clean(s.text) for s in got)


# ---------------------------------------------------------------------------------------------------- splits
def test_split_is_a_pure_function_of_the_text():
    assert split_of("Hello there, my old friend.") == split_of(en("hello there my old friend!"))
    assert split_of(Sentence("Heute scheint die Sonne.", "de", "written", "x")) == "evaluation"
    with pytest.raises(ValueError, match="summing to 1"):
        split_of("Any text will do here.", {"training": 0.5})


def test_splits_never_share_a_sentence():
    sents = stdlib_sentences(max_files=80) + multilingual_sentences() + shipped_sentences("calibration")
    # near-duplicates of each other must land together
    sents += [en(s.text.upper()[0] + s.text.lower()[1:].rstrip(".!?") + "!") for s in sents[:50] if s.language == "en"]
    groups = assign_splits(sents)
    keys = {name: {(s.language, sentence_key(s.text)) for s in group} for name, group in groups.items()}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not keys[a] & keys[b], (a, b)
    assert sum(len(g) for g in groups.values()) == len(sents)
    assert len(groups["training"]) > len(groups["validation"]) > 0


def test_shipped_texts_match_their_split():
    # the shipped files were written with the current hash salt: if this fails the salt or the key changed
    for split in ("evaluation", "calibration"):
        got = shipped_sentences(split, language="en")
        assert len(got) > 500
        assert all(split_of(s) == split for s in got)
        assert {s.source for s in got} <= {"fortunes", "stdlib", "doc"}
    langs = {s.language for s in shipped_sentences("evaluation")}
    assert {"en", "de", "es", "ru", "ja", "zh"} <= langs
    assert shipped_sentences("training") == []


def test_sentences_tsv_roundtrip(tmp_path):
    s = [en("A tab\tinside is quoted fine.", "doc", "/usr/share/doc/x"), multilingual_sentences()[-1]]
    assert load_sentences(save_sentences(s, tmp_path / "s.tsv")) == s


# ---------------------------------------------------------------------------------------------------- voices
def test_render_one_flite_slt_is_24khz_mono(tmp_path):
    n = render_one("Hello world, this is a test.", "slt", tmp_path / "a.wav")
    info = sf.info(str(tmp_path / "a.wav"))
    assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "PCM_16")
    assert info.frames == n and 0.8 < n / 24000 < 5


def test_render_corpus_manifest_and_table(tmp_path):
    sents = [en("Hello world, this is a test."), en("The quick brown fox jumps over the lazy dog."),
             Sentence("Heute scheint die Sonne.", "de", "written", "test")]
    rows = render_corpus(sents, tmp_path, voices=["slt", "kal16", "espeak-de"], progress=False)
    assert len(rows) == 5 and {r["voice"] for r in rows} == {"slt", "kal16", "espeak-de"}
    back = read_manifest(tmp_path)
    for r in back:
        info = sf.info(r["path"])
        assert info.samplerate == 24000 and info.frames == r["samples"]
        assert r["frames"] == -(-r["samples"] // 1920) and r["split"] == split_of(Sentence(
            r["text"], r["language"], r["source"], r["origin"]))
    table = corpus_table(tmp_path / "manifest.jsonl")
    assert sum(t["samples"] for t in table) == 5
    assert sum(t["frames"] for t in table) == sum(r["frames"] for r in rows)
    assert table[-1]["language"] == "de" and table[-1]["split"] == "evaluation"
    # a rerun keeps what is there
    mtimes = [os.path.getmtime(r["path"]) for r in back]
    render_corpus(sents, tmp_path, voices=["slt", "kal16", "espeak-de"], progress=False)
    assert [os.path.getmtime(r["path"]) for r in read_manifest(tmp_path)] == mtimes


@pytest.mark.parametrize("voice,text", [("slt", "The quick brown fox jumps over the lazy dog."),
                                        ("espeak-de", "Heute scheint die Sonne über dem Fluss.")])
def test_rendering_is_byte_identical_run_to_run(tmp_path, voice, text):
    # sox dithered its 16-bit output with clock-seeded noise: two renderings differed in ~44% of their samples
    a, b = render_one(text, voice, tmp_path / "a.wav"), render_one(text, voice, tmp_path / "b.wav")
    assert a == b and (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_a_folder_rendered_under_another_recipe_is_rendered_again(tmp_path):
    from rvqspec_lib.data.voices import RECIPE_FILE, render_files, render_recipe_current

    items = [("Hello world, this is a test.", "slt", "wav/slt/a.wav")]
    assert render_files(items, tmp_path) == [sf.info(str(tmp_path / "wav/slt/a.wav")).frames]
    assert render_recipe_current(tmp_path)
    good = (tmp_path / "wav/slt/a.wav").read_bytes()
    (tmp_path / "wav/slt/a.wav").write_bytes(good[:-64])  # stands in for a file of an older recipe
    render_files(items, tmp_path)  # same recipe: reused as it is
    assert (tmp_path / "wav/slt/a.wav").read_bytes() == good[:-64]
    (tmp_path / RECIPE_FILE).unlink()  # a folder from before the recipe was recorded
    assert not render_recipe_current(tmp_path)
    render_files(items, tmp_path)
    assert (tmp_path / "wav/slt/a.wav").read_bytes() == good and render_recipe_current(tmp_path)
    with pytest.raises(ValueError, match="not inside"):
        render_files([("Hello there, my friend.", "slt", tmp_path.parent / "x.wav")], tmp_path)


def test_plan_renders_one_voice_each_is_deterministic():
    sents = [en(f"This is sentence number {w} of the set.") for w in ("one", "two", "three", "four", "five", "six")]
    a = plan_renders(sents, ["slt", "awb", "rms"], one_voice_each=True)
    assert a == plan_renders(sents, ["slt", "awb", "rms"], one_voice_each=True)
    assert len(a) == 6 and len({r["voice"] for r in a}) > 1
    with pytest.raises(ValueError, match="espeak-ja"):
        plan_renders([Sentence("\u3053\u3093\u306b\u3061\u306f\u3002", "ja", "written", "x")], ["slt"])


def test_every_voice_is_installed_here():
    # CI installs them with scripts/apt-voices.sh; a failure here means that script is out of date
    for name in VOICES:
        assert check_voice(name).name == name


def test_missing_binary_names_the_apt_script(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingVoiceError, match="scripts/apt-voices.sh"):
        check_voice("slt")
    with pytest.raises(ValueError, match="unknown voice"):
        check_voice("nobody")


def test_missing_festival_voice_names_the_package(monkeypatch):
    fake = voices.Voice("x-hts", "en", "festival", "(voice_x)", "festvox-x", "/nonexistent/voice/dir")
    with pytest.raises(MissingVoiceError, match="festvox-x.*apt-voices"):
        check_voice(fake)


def test_apt_download_failure_says_apt_get_update(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("apt-get", "dpkg"):
        (bin_dir / tool).write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(RuntimeError, match="apt-get update"):
        corpus.fetch_debian_package("fortunes", tmp_path / "cache")


def test_every_split_has_a_role_and_every_source_a_description():
    assert tuple(corpus.SPLIT_ROLES) == SPLITS and all(corpus.SPLIT_ROLES.values())
    sources = {s.source for split in ("calibration", "evaluation") for s in voices.shipped_sentences(split)}
    assert sources <= set(corpus.SOURCE_DESCRIPTIONS) and set(corpus.SOURCES) < set(corpus.SOURCE_DESCRIPTIONS)
