"""--decoder auto: the node budget chosen from this device's own measured costs, cached per device/model/dtype."""

from __future__ import annotations

import json

import pytest
import torch

from rvqspec_lib.eval.budget import CACHE_VERSION, auto_decoder, cache_key, candidates, choose_decoder
from rvqspec_lib.eval.calibration import calibrate
from rvqspec_lib.data.frame_sources import frames_from_contexts
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.decoding.drafters import ReusedHeads


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_config_dict(n_code_groups=6, codebook_size=32)
    cp = build_from_config(cfg, seed=0).talker.code_predictor
    with torch.no_grad():
        for head in cp.lm_head:
            head.weight.mul_(10.0)
    ctx = torch.randn(24, 2, cfg["talker_config"]["hidden_size"], generator=torch.Generator().manual_seed(0))
    frames = frames_from_contexts(cp, ctx, seed=1)
    cal = calibrate(cp, ReusedHeads(), frames, budgets=(2, 3, 4, 8), draws=2)
    return cp, cal, ctx


def _labels(cal, **kw):
    return {nd.label for nd, _ in candidates(cal, **kw)}


def test_candidates_cover_ar_chains_and_both_tree_kinds(setup):
    _, cal, _ = setup
    cands = candidates(cal, budgets=(2, 4, 8))
    assert cands[0][0].label == "ar" and "chain:4" in _labels(cal, budgets=(2, 4, 8))
    assert {"tree:calibrated-point-mass:4", "tree:calibrated-sampled:8"} <= _labels(cal, budgets=(2, 4, 8))
    assert all(e >= 1.0 for _, e in cands)
    tree = next(nd for nd, _ in cands if nd.label == "tree:calibrated-sampled:8")
    assert tree.fields() == {"decoder": "tree:calibrated-sampled:8", "kind": "calibrated", "drafter": "heads",
                             "nodes": 8, "lossy": False, "sampled": True}
    assert tree.decoder.sampled and len(tree.decoder.paths) == 7
    with pytest.raises(ValueError, match="offsets"):  # a drafter named, not given: one line naming the fix
        candidates(cal, budgets=(2,), drafter_name="offsets")


def test_choose_decoder_measures_and_picks_the_fastest(setup):
    cp, cal, ctx = setup
    ch = choose_decoder(cp, cal, ctx, budgets=(2, 4, 8), frames=4, repeats=2, shortlist=3)
    measured = [r for r in ch.table if r["ms_per_code"] is not None]
    assert {r["decoder"] for r in measured} >= {"ar"} and len(measured) == 4  # official has no fused frame
    best = min(measured, key=lambda r: r["ms_per_code"])
    assert (ch.label, ch.backend, ch.fused) == (best["decoder"], "official", False)
    assert ch.label in ch.reason and "ms per code" in ch.reason and ch.named.note == ch.reason
    assert all(r["verify_ms"] > 0 for r in ch.table) and {r["nodes"] for r in ch.table} >= {1, 2, 4, 8}


def test_choose_decoder_among_backends_times_fused_frames(setup):
    """Several backends: every shortlisted decoder through each, plus AR and every chain window as each backend's
    fused frame where the registry has one (native: the whole frame in one C call; official: none); the fastest
    (decoder, backend, fused) runner wins, and its row is in the table."""
    cp, cal, ctx = setup
    ch = choose_decoder(cp, cal, ctx, budgets=(2, 4), frames=2, repeats=1, shortlist=2,
                        backends=("official", "native"))
    measured = [r for r in ch.table if r["ms_per_code"] is not None]
    assert {(r["backend"], r["fused"]) for r in measured} == {("official", False), ("native", False),
                                                              ("native", True)}
    whole = {r["decoder"] for r in measured if r["fused"]}
    assert whole == {nd.label for nd, _ in candidates(cal, budgets=(2, 4)) if nd.name.kind in ("ar", "chain")}
    best = min(measured, key=lambda r: r["ms_per_code"])
    assert (ch.label, ch.backend, ch.fused) == (best["decoder"], best["backend"], best["fused"])
    runner = ch.runner(cp)
    assert (runner.backend, runner.fused, runner.name.label) == (ch.backend, ch.fused, ch.label)
    ar = next(r for r in measured if r["decoder"] == "ar" and r["backend"] == "official")
    assert ar["speedup"] == pytest.approx(1.0)  # speedups are over stepped AR through the first backend
    without = choose_decoder(cp, cal, ctx, budgets=(2, 4), frames=2, repeats=1, shortlist=2,
                             backends=("official", "native"), fused=False)
    assert not any(r["fused"] for r in without.table)  # negative control


def _quiet_cpu(monkeypatch, other: float = 0.0):
    """The timings' share of OTHER processes' CPU time, fixed (this machine is shared: the real one varies)."""
    from rvqspec_lib.eval import timing

    monkeypatch.setattr(timing.LoadMonitor, "describe", lambda self: {"other_cpu_frac": other})


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    """Every test here: a quiet CPU unless it says otherwise (an oversubscribed choice is not cached)."""
    _quiet_cpu(monkeypatch)


def test_auto_decoder_caches_per_key(setup, tmp_path, monkeypatch):
    _quiet_cpu(monkeypatch)
    cp, cal, ctx = setup
    path = tmp_path / "auto.json"
    a = auto_decoder("tiny", cp, cal, ctx, cache=path, budgets=(2, 4), frames=2, repeats=1, shortlist=2)
    store = json.loads(path.read_text())
    entry = next(iter(store.values()))
    assert len(store) == 1 and (entry["decoder"], entry["backend"], entry["fused"]) == (a.label, "official", False)
    assert entry["key"]["version"] == CACHE_VERSION
    b = auto_decoder("tiny", cp, cal, ctx, cache=path, budgets=(2, 4), frames=2, repeats=1, shortlist=2)
    assert (b.label, b.backend, b.fused) == (a.label, a.backend, a.fused) and b.named.name == a.named.name
    assert f"(a cached choice, {path}: delete it or set RVQSPEC_CACHE" in b.reason and b.named.note == b.reason
    auto_decoder("other-model", cp, cal, ctx, cache=path, budgets=(2, 4), frames=2, repeats=1, shortlist=2)
    assert len(json.loads(path.read_text())) == 2  # another key: timed again, stored beside
    key = cache_key("tiny", cp, cal, "heads")
    assert key["dtype"] == "torch.float32" and key["threads"] == torch.get_num_threads()


def test_an_entry_of_another_version_is_timed_again(setup, tmp_path, capsys):
    """A cache written before the choice carried its backend and fusion (version 1: ``label``, no version in the
    key) is a sound file whose entries never match: timed again, no warning, the old entry kept beside."""
    cp, cal, ctx = setup
    path = tmp_path / "auto.json"
    old_key = {k: v for k, v in cache_key("tiny", cp, cal, "heads", ["official"]).items() if k != "version"}
    path.write_text(json.dumps({json.dumps(old_key, sort_keys=True): {"label": "chain:4", "reason": "old"}}))
    a = auto_decoder("tiny", cp, cal, ctx, cache=path, **_FAST)
    assert "(a cached choice, " not in a.reason and capsys.readouterr().err == ""
    assert len(json.loads(path.read_text())) == 2


def test_auto_refuses_what_it_cannot_time(setup):
    cp, cal, ctx = setup
    bad = dict(cal, codebook_size=2048)
    with pytest.raises(ValueError, match="another model"):
        choose_decoder(cp, bad, ctx)
    meta = build_from_config(tiny_config_dict(n_code_groups=6, codebook_size=32)).talker.code_predictor.to("meta")
    with pytest.raises(ValueError, match="meta device"):
        choose_decoder(meta, cal, ctx)


# --------------------------------------------------------------------------------------------------------------------
# the cache: damaged files and unwritable folders are warnings, never tracebacks or lost choices (issue 18)
# --------------------------------------------------------------------------------------------------------------------
_FAST = dict(budgets=(2, 4), frames=2, repeats=1, shortlist=2)


@pytest.mark.parametrize("content", [b"\x00\xff\xfe\x80 garbage", b'["a", "list"]', b'{"key": 3}',
                                     b'{"key": {"reason": "no label"}}', b"{not json"])
def test_a_damaged_cache_is_one_warning_then_timed_again(setup, tmp_path, capsys, content):
    cp, cal, ctx = setup
    path = tmp_path / "auto.json"
    path.write_bytes(content)
    a = auto_decoder("tiny", cp, cal, ctx, cache=path, **_FAST)
    err = capsys.readouterr().err
    assert "(a cached choice, " not in a.reason and a.label in _labels(cal)
    assert err.count("\n") == 1 and str(path) in err and "RVQSPEC_CACHE" in err, err
    b = auto_decoder("tiny", cp, cal, ctx, cache=path, **_FAST)  # the damaged file was replaced by a sound one
    assert "(a cached choice, " in b.reason and b.label == a.label and capsys.readouterr().err == ""


def test_an_unwritable_cache_folder_still_gives_the_choice(setup, tmp_path, capsys, monkeypatch):
    cp, cal, ctx = setup
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")  # unwritable for every user, root included
    monkeypatch.setenv("RVQSPEC_CACHE", str(blocker))
    a = auto_decoder("tiny", cp, cal, ctx, **_FAST)
    err = capsys.readouterr().err
    assert a.label in _labels(cal) and a.decoder is not None
    assert err.count("\n") == 1 and "RVQSPEC_CACHE" in err and "not cached" in err, err
    assert blocker.read_text().startswith("a file")  # nothing written over it


def test_a_sound_cache_gives_no_warning(setup, tmp_path, capsys, monkeypatch):
    """Negative control of the two tests above."""
    cp, cal, ctx = setup
    monkeypatch.setenv("RVQSPEC_CACHE", str(tmp_path / "cache"))
    auto_decoder("tiny", cp, cal, ctx, **_FAST)
    assert auto_decoder("tiny", cp, cal, ctx, **_FAST).reason.endswith("to time again)")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("other, cached", [(0.9, False), (0.0, True)])  # 0.0: negative control, the same call caches
def test_auto_decoder_does_not_cache_an_oversubscribed_choice(setup, tmp_path, monkeypatch, other, cached):
    _quiet_cpu(monkeypatch, other)
    cp, cal, ctx = setup
    path = tmp_path / "auto.json"
    ch = auto_decoder("tiny", cp, cal, ctx, cache=path, budgets=(2, 4), frames=2, repeats=1, shortlist=2)
    assert path.exists() is cached
    assert ("OVERSUBSCRIBED: other processes used 90% of the CPU while timing, so this choice is not cached"
            in ch.reason) is not cached, ch.reason


def test_auto_chooses_among_each_devices_fast_backends(monkeypatch):
    """One list of ``--decoder auto``'s backends for prepare and synth (the cache key names them): native on a CPU
    where it runs, torch.compile on CUDA where triton is installed (faked here: no GPU), the official module alone
    elsewhere; a precision the native forward does not run leaves it out."""
    import importlib.util

    from rvqspec_lib.eval import budget
    from rvqspec_lib.models import backends as B

    native = B.available("native", "float32")[0]
    assert budget.auto_backends("float32", "cpu") == ["official"] + ["native"] * native
    assert budget.auto_backends("float16", "cpu") == ["official"]
    assert budget.auto_backends("bfloat16", "mps") == ["official"]
    real = importlib.util.find_spec
    for triton, want in ((True, ["official", "compile"]), (False, ["official"])):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, _t=triton:
                            (object() if _t else None) if name == "triton" else real(name, *a))
        assert budget.auto_backends("bfloat16", "cuda") == want
        assert B.available("compile", "bfloat16", "cuda")[0] is triton
