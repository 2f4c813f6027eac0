"""Data-parallel frame extraction and drafter training (rvqspec_lib.training.distributed) under ``accelerate launch``
with 2 CPU processes (gloo), against the single-process run:

* frames: the shards read back in order equal the single-process frames EXACTLY (one utterance per talker pass, so
  every utterance is computed alone in both runs), utterance ids global;
* training: the drafter trained on 2 processes equals the single-process one up to float32 rounding of the gradient
  sums (atol 1e-6), with the same kept epoch and validation curve; a negative control (two halves trained without
  summing their gradients) differs, so the comparison can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rvqspec_lib.training.distributed import Parallel, extract_frames, load_frame_shards, shard_range

REPO = Path(__file__).resolve().parent.parent


def test_shard_range_tiles_in_rank_order():
    for n in (0, 1, 7, 10):
        for world in (1, 2, 3):
            blocks = [shard_range(n, r, world) for r in range(world)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1
    with pytest.raises(ValueError):
        shard_range(3, 2, 2)
    p = Parallel()
    assert p.world == 1 and p.is_main and p.gather(5) == [5] and p.block(4) == (0, 4)


def _accelerate(module: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("accelerate")
    if not exe.exists():
        pytest.skip("accelerate is not installed")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [str(exe), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "-m", module, *args]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    from rvqspec_lib.cli import args as flags
    from rvqspec_lib.cli import train_drafter_parallel
    from rvqspec_lib.models.drafter_files import load_drafter
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng missing (the embedded model's front end)")
    # frames: 2 processes vs 1, shipped validation utterances, one utterance per talker pass
    for split, n in (("validation", 9), ("evaluation", 4)):
        _accelerate("rvqspec_lib.cli.extract_frames", "--model", "embedded", "--split", split, "--max-utterances",
                    str(n), "--batch-size", "1", "--out", str(tmp_path / f"dp-{split}"), tmp_path=tmp_path)
    index = json.loads((tmp_path / "dp-validation" / "index.json").read_text())
    assert index["world"] == 2 and len(index["shards"]) == 2 and all(f > 0 for f in index["frames"])
    lm = load_model("embedded")
    _, utts = load_shipped_utterances(embedded_root("embedded") / "utterances.safetensors", splits=["validation"],
                                      limit=9)
    extract_frames(lm, utts, tmp_path / "one", parallel=Parallel(), batch_size=1)
    one, two = load_frame_shards(tmp_path / "one"), load_frame_shards(tmp_path / "dp-validation")
    assert torch.equal(one.codes, two.codes) and torch.equal(one.utterance, two.utterance)
    assert torch.equal(one.context, two.context)
    assert two.utterance.unique().tolist() == list(range(9))  # global ids across the two shards
    first = load_frame_shards(tmp_path / "dp-validation", rank=0)
    assert len(first) == index["frames"][0] and int(first.utterance.max()) == 4  # block [0, 5) of 9

    # training: offsets, 2 processes vs 1 (the same command, unlaunched)
    common = ["--model", "embedded", "--frames", str(tmp_path / "dp-validation"), "--val-frames",
              str(tmp_path / "dp-evaluation"), "--drafter", "offsets", "--epochs", "2", "--batch-size", "16",
              "--lr", "0.01"]
    _accelerate("rvqspec_lib.cli.train_drafter_parallel", *common, "--out", str(tmp_path / "dp.safetensors"),
                tmp_path=tmp_path)
    p = __import__("argparse").ArgumentParser()
    flags.train_drafter_parallel(p)
    assert train_drafter_parallel.run(p.parse_args(common + ["--out", str(tmp_path / "one.safetensors")]), 1) == 0
    a = load_drafter(tmp_path / "dp.safetensors", lm.code_predictor)
    b = load_drafter(tmp_path / "one.safetensors", lm.code_predictor)
    assert a.provenance["processes"] == 2 and b.provenance["processes"] == 1
    assert a.provenance["best_epoch"] == b.provenance["best_epoch"]
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb
        torch.testing.assert_close(ta, tb, rtol=0, atol=1e-6)
    assert float(b.state_dict()[next(iter(b.state_dict()))].abs().max()) > 0  # it trained
    ca = json.loads((tmp_path / "dp.curve.json").read_text())["curve"]
    cb = json.loads((tmp_path / "one.curve.json").read_text())["curve"]
    for ra, rb in zip(ca, cb):
        assert ra["val_acceptance"] == pytest.approx(rb["val_acceptance"], abs=1e-6)
        assert (ra["train_loss"] is None) == (rb["train_loss"] is None)
        assert ra["train_loss"] is None or ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-5)


def test_negative_control_unsummed_halves_differ_from_one_process():
    """Rank 0 of 2 trained on its half WITHOUT the gradient sum is not the single-process drafter: the equality
    above is a real check."""
    from rvqspec_lib.data.frames import Frames
    from rvqspec_lib.models.drafter_files import make_drafter
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.training.drafters import train_drafter

    class Alone(Parallel):
        def all_reduce_(self, t):
            return t

    lm = load_model("tiny-random")
    cp = lm.code_predictor
    g = torch.Generator().manual_seed(0)
    fr = Frames(torch.randn(64, 2, 64, generator=g), torch.randint(0, 2048, (64, 15), generator=g),
                torch.arange(64) // 8)
    tr, va = fr.subset(torch.arange(48)), fr.subset(torch.arange(48, 64))
    runs = {}
    for name, par in (("one", None), ("half", Alone(rank=0, world=2))):
        d = make_drafter("offsets", cp, fresh=True, K=2)
        runs[name] = train_drafter(d, cp, tr, va, lr=0.05, batch_size=16, max_epochs=1, patience=5,
                                   parallel=par, select="loss").drafter.state_dict()
    assert any(not torch.allclose(runs["one"][k], runs["half"][k], atol=1e-4) for k in runs["one"])
