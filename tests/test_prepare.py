"""``rvqspec prepare`` on a tiny checkpoint in the release's layout (tests/checkpoints.py, random weights):

* before it, ``synth --decoder paper`` and ``--decoder auto`` are refused in one line naming ``rvqspec prepare``;
* it writes the spoken utterances (three splits of different texts, each with its frames), the offsets and the trees
  of every drafter beside the checkpoint, and caches ``auto``'s choice;
* after it, ``synth`` runs ``--decoder paper``, ``--decoder auto`` (the cached choice, no timing) and ``--stream``;
* a second run (the command) skips every stage and changes no file; speaking interrupted after its first batch
  resumes to the very utterances of an uninterrupted run;
* a folder that cannot be written is prepared into the project's cache folder, where the decoders find it.

``auto`` is timed with few frames (``auto_options``) and the oversubscription check off: the machine that runs the
suite is shared, and a choice timed while crowded is (rightly) never cached.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
import torch

from checkpoints import write_tiny_checkpoint
from rvqspec_lib.models.loader import load_model

FRAMES = 24  # calibration frames (training 24, validation 5)
PER_TEXT = 10  # the random model never ends: each text stops at this many frames
AUTO = dict(frames=2, repeats=1, cost_repeats=1, shortlist=1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        d = tmp_path_factory.mktemp("cache")
        mp.setenv("RVQSPEC_CACHE", str(d))
        from rvqspec_lib.eval import budget

        mp.setattr(budget, "oversubscribed_note", lambda meta: "")
        yield d


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "Qwen3-TTS-12Hz-tiny-CustomVoice", seed=0)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def prepared(pristine, cache, tmp_path_factory):
    from rvqspec_lib.training.prepare import prepare

    ckpt = _copy(pristine, tmp_path_factory.mktemp("prep") / "ckpt")
    lm = load_model(str(ckpt), dtype="float32")
    done = prepare(lm, frames=FRAMES, auto_options=AUTO, frames_per_text=PER_TEXT, say=lambda m: None)
    return ckpt, done


def _synth(model, tmp_path, *extra):
    from rvqspec_lib.cli.main import main

    return main(["synth", "--model", str(model), "--text", "Hi", "--max-frames", "4", "--seed", "0",
                 "--json", str(tmp_path / "s.json"), *extra])


@pytest.mark.parametrize("decoder", ["paper", "auto"])
def test_before_prepare_the_refusal_names_it(pristine, cache, tmp_path, capsys, decoder):
    rc = _synth(pristine, tmp_path, "--decoder", decoder, "--out", str(tmp_path / "a.wav"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"rvqspec prepare --model {pristine}" in err, err


def test_prepare_writes_beside_the_checkpoint(prepared, cache):
    from rvqspec_lib.data.utterances import load_shipped_utterances
    from rvqspec_lib.eval import budget
    from rvqspec_lib.models.drafter_files import model_drafter_dir, read_description
    from rvqspec_lib.models.tree_files import load_calibration

    ckpt, done = prepared
    assert done.folder == ckpt == model_drafter_dir(str(ckpt)) and (done.device, done.dtype) == ("cpu", "float32")
    assert [(s.stage, s.skipped) for s in done.stages] == [(s, False) for s in ("speak", "offsets", "trees", "auto")]
    assert done.auto_cached  # timed now, and cached (the fixture's timing is never called oversubscribed)
    rows, utts = load_shipped_utterances(ckpt / "utterances.safetensors")
    by_split = {s: [r for r in rows if r["split"] == s] for s in ("training", "validation", "calibration")}
    for split, want in (("training", FRAMES), ("validation", 5), ("calibration", FRAMES)):
        assert sum(r["frames"] for r in by_split[split]) >= want, split
    texts = {s: {r["text"] for r in rs} for s, rs in by_split.items()}
    assert not (texts["training"] & texts["calibration"]) and not (texts["validation"] & texts["calibration"])
    assert all(u.codes.shape[1] == 16 and 1 <= u.codes.shape[0] <= PER_TEXT for u in utts)
    assert not (ckpt / "utterances.partial.safetensors").exists()
    assert read_description(ckpt / "drafters" / "offsets.safetensors")["name"] == "offsets"
    for drafter in ("heads", "offsets"):
        cal = load_calibration(ckpt / "trees" / f"{drafter}.json", n_codes=15, codebook_size=2048)
        assert cal["drafter"] == drafter and max(cal["budgets"]) == 64
    store = budget.read_cache(budget.cache_file())
    assert [v["key"]["model"] for v in store.values()] == [str(ckpt)]


def test_after_prepare_synth_runs_paper_auto_and_stream(prepared, tmp_path, capsys):
    ckpt, _ = prepared
    for decoder in ("paper", "auto"):
        rc = _synth(ckpt, tmp_path, "--decoder", decoder, "--out", str(tmp_path / f"{decoder}.wav"))
        err = capsys.readouterr().err
        assert rc == 0, err
        stats = json.loads((tmp_path / "s.json").read_text())
        assert stats["frames"] == 4 and (tmp_path / f"{decoder}.wav").is_file()
        if decoder == "auto":  # the choice prepare cached: nothing timed now
            assert "a cached choice" in err, err
        else:
            assert stats["decoder"].startswith("paper")
    rc = _synth(ckpt, tmp_path, "--decoder", "paper", "--stream", "--out", str(tmp_path / "stream.wav"))
    assert rc == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "s.json").read_text())["stream"] is True


def _rule(ckpt: Path) -> str:
    """The dtype the rule picks for ``ckpt`` on this CPU (bfloat16 where it computes in it natively, else float32)."""
    from rvqspec_lib.common.machine import load_dtype
    from rvqspec_lib.models.loader import stored_dtype

    return str(load_dtype(stored_dtype(ckpt), "cpu")).replace("torch.", "")


def test_default_synth_loads_the_rule_dtype_and_finds_prepares_choice(prepared, tmp_path, capsys):
    """No --dtype, no --decoder on the bfloat16 checkpoint: loaded in the rule's dtype (bfloat16 on a CPU with native
    bfloat16), reported as such, and the choice prepare cached (by default for that dtype) runs untimed. Negative
    control: another explicit --dtype has no cached choice, so the default path runs untimed."""
    ckpt, _ = prepared
    want = _rule(ckpt)
    rc = _synth(ckpt, tmp_path, "--out", str(tmp_path / "a.wav"))
    out, err = capsys.readouterr()
    stats = json.loads((tmp_path / "s.json").read_text())
    assert rc == 0 and stats["dtype"] == stats["model_dtype"] == want, err
    assert f"on cpu ({want})" in out, out
    assert "note: auto chose " in err and "(a cached choice, " in err and "untimed" not in err, err
    other = "float32" if want != "float32" else "float64"
    rc = _synth(ckpt, tmp_path, "--out", str(tmp_path / "b.wav"), "--dtype", other)
    err = capsys.readouterr().err
    stats = json.loads((tmp_path / "s.json").read_text())
    assert rc == 0 and stats["dtype"] == stats["model_dtype"] == other, err
    assert "note: the default path is ar through " in err and "a cached choice" not in err, err


def test_a_second_run_skips_every_stage(prepared, tmp_path, capsys):
    from rvqspec_lib.cli.main import main

    ckpt, _ = prepared
    files = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*") if p.is_file()}
    rc = main(["prepare", "--model", str(ckpt), "--frames", str(FRAMES), "--dtype", "float32",
               "--json", str(tmp_path / "p.json")])
    assert rc == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "p.json").read_text())
    assert [s["skipped"] for s in report["stages"]] == [True] * 4 and report["folder"] == str(ckpt)
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*") if p.is_file()} == files
    assert "takes the fastest path timed here" in capsys.readouterr().out  # auto's choice is cached


def test_without_a_cached_choice_the_report_says_synth_runs_untimed(prepared, tmp_path, capsys, monkeypatch):
    from rvqspec_lib.cli.main import main

    ckpt, _ = prepared
    monkeypatch.setenv("RVQSPEC_CACHE", str(tmp_path / "empty"))  # no timed choice here (a busy timing caches none)
    assert main(["prepare", "--model", str(ckpt), "--frames", str(FRAMES), "--dtype", "float32",
                 "--stages", "speak"]) == 0
    out = capsys.readouterr().out
    assert "runs untimed" in out and "--stages auto" in out and "fastest path timed here" not in out


def test_interrupted_speaking_resumes_to_the_same_utterances(prepared, pristine, cache, tmp_path, monkeypatch):
    from rvqspec_lib.data.utterances import load_shipped_utterances
    from rvqspec_lib.training import prepare as P

    ckpt = _copy(pristine, tmp_path / "ckpt")
    lm = load_model(str(ckpt), dtype="float32")
    real, calls = P.synthesize, []

    def once(*a, **k):
        if calls:
            raise KeyboardInterrupt  # Ctrl-C during the second batch
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(P, "synthesize", once)
    with pytest.raises(KeyboardInterrupt):
        P.prepare(lm, frames=FRAMES, stages=("speak",), frames_per_text=PER_TEXT, say=lambda m: None)
    assert (ckpt / P.PARTIAL).is_file() and not (ckpt / "utterances.safetensors").exists()
    monkeypatch.setattr(P, "synthesize", real)
    P.prepare(lm, frames=FRAMES, stages=("speak",), frames_per_text=PER_TEXT, say=lambda m: None)
    got = load_shipped_utterances(ckpt / "utterances.safetensors")
    want = load_shipped_utterances(prepared[0] / "utterances.safetensors")
    assert [r["id"] for r in got[0]] == [r["id"] for r in want[0]]
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(got[1], want[1]))


def test_a_read_only_folder_is_prepared_into_the_cache(pristine, cache, tmp_path, monkeypatch):
    import os

    from rvqspec_lib.models import drafter_files
    from rvqspec_lib.models.named_decoders import check_files
    from rvqspec_lib.training.prepare import prepare

    ro = _copy(pristine, tmp_path / "hub-snapshot")
    before = sorted(p.name for p in ro.iterdir())
    real_access = os.access
    # as a user without write permission sees it (root may write anywhere, so the check is faked for root too)
    monkeypatch.setattr(drafter_files.os, "access", lambda p, mode, *a, **k: False if Path(p) == ro and
                        mode & os.W_OK else real_access(p, mode, *a, **k))
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        where = drafter_files.model_drafter_dir(str(ro))
        assert where == drafter_files.cache_model_dir(str(ro)) and str(where).startswith(str(cache))
        lm = load_model(str(ro), dtype="float32")
        done = prepare(lm, frames=8, stages=("speak", "offsets"), frames_per_text=PER_TEXT, say=lambda m: None)
        assert done.folder == where and (where / "drafters" / "offsets.safetensors").is_file()
        assert sorted(p.name for p in ro.iterdir()) == before  # nothing written beside it
        assert drafter_files.model_drafter_dir(str(ro)) == where  # found there by every command
        with pytest.raises(FileNotFoundError, match=f"no calibrated trees at {where}/trees/offsets.json: "
                                                    f"calibrate them with `rvqspec prepare --model {ro}`"):
            check_files("paper", str(ro))
    finally:
        ro.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("argv, words", [
    (["--model", "tiny-random"], "tiny-random has random weights built in memory and no folder to prepare"),
    (["--frames", "0"], "--frames must be >= 1"),
    (["--stages", "speak,fly"], "--stages 'speak,fly': choose among speak,offsets,trees,auto"),
    (["--device", "tpu"], "unknown device 'tpu'"),
])
def test_bad_input_is_one_line_before_loading(pristine, capsys, monkeypatch, argv, words):
    from rvqspec_lib.cli.main import main
    from rvqspec_lib.models import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    if torch.cuda.is_available():  # the faked absence below must hold on a GPU machine too
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    full = ["prepare", "--model", str(pristine), *argv] if argv[0] != "--model" else ["prepare", *argv]
    try:
        assert main(full) == 2
    except SystemExit as e:  # a value out of its range: refused by the parser
        assert e.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_a_device_not_present_is_refused_naming_those_that_are(pristine, capsys, monkeypatch):
    from rvqspec_lib.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert main(["prepare", "--model", str(pristine), "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == ("rvqspec: error: --device cuda is not present on this machine (it has "
                                               "cpu): use --device auto or one of those")


def test_the_embedded_model_is_prepared_already(cache):
    """Our own model ships its utterances, drafters and trees: prepare skips every stage but auto and writes
    nothing into data/embedded (its shipped trees record no drafter digest and are trusted)."""
    from rvqspec_lib.models.loader import EMBEDDED_DIR
    from rvqspec_lib.training.prepare import prepare

    files = {p: p.stat().st_mtime_ns for p in EMBEDDED_DIR.rglob("*") if p.is_file()}
    done = prepare(load_model("embedded"), stages=("speak", "offsets", "trees"), say=lambda m: None)
    assert done.folder == EMBEDDED_DIR / "model" and [s.skipped for s in done.stages] == [True] * 3
    assert {p: p.stat().st_mtime_ns for p in EMBEDDED_DIR.rglob("*") if p.is_file()} == files


def test_paper_without_offsets_but_with_the_heads_trees_suggests_the_heads_tree(prepared, tmp_path, capsys):
    """A prepared checkpoint whose offsets are gone (its heads' calibrated trees kept): ``--decoder paper``'s
    refusal names the heads' own calibrated tree, and that decoder runs there; the control (the trees gone too)
    names the heads' chain (tests/test_messages.py)."""
    ckpt = _copy(prepared[0], tmp_path / "ckpt")
    (ckpt / "drafters" / "offsets.safetensors").unlink()
    rc = _synth(ckpt, tmp_path, "--decoder", "paper", "--out", str(tmp_path / "a.wav"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    suggested = err.split("or use ")[-1].split(" (")[0]
    assert suggested.startswith("tree:calibrated-point-mass:") and suggested.endswith("@heads"), err
    assert _synth(ckpt, tmp_path, "--decoder", suggested, "--out", str(tmp_path / "b.wav")) == 0
    (ckpt / "trees" / "heads.json").unlink()
    rc = _synth(ckpt, tmp_path, "--decoder", "paper", "--out", str(tmp_path / "a.wav"))
    assert rc == 2 and "or use chain:4 (the reused heads" in capsys.readouterr().err
