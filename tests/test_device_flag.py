"""``--device`` on every command that runs a model, with the devices faked (``torch.cuda.is_available`` and MPS's
patched), so the suite asserts the same on a CPU machine and on a GPU one:

* a device not present is refused in one line, exit status 2, before the model loads (every command);
* ``synth --device cpu`` runs and its JSON and printout name the device and the model's dtype;
* what runs on the CPU only (``synth --backend native|onnx``, ``--talker native``, ``export``) takes ``auto`` as the
  CPU and refuses a GPU in one line naming the fix, before loading;
* under ``accelerate launch`` a process takes accelerate's device with ``auto`` and refuses another kind.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from rvqspec_lib.cli import common
from rvqspec_lib.cli.main import main
from rvqspec_lib.models import loader
from rvqspec_lib.training.distributed import Parallel


def _devices(monkeypatch, cuda: bool, mps: bool = False) -> None:
    """Fake which GPUs are present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.fixture
def no_loading(monkeypatch):
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded the model"))


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv", [
    ["synth", "--model", "tiny-random", "--text", "hello", "--out", "{tmp}/a.wav"],
    ["eval-acceptance", "--model", "embedded", "--frames", "4"],
    ["train-drafter", "--model", "tiny-random", "--drafter", "offsets", "--out", "{tmp}/d.safetensors"],
    ["eval-wer", "--model", "embedded", "--asr", "none", "--sentences", "1"],
    ["extract-frames", "--model", "embedded", "--out", "{tmp}/frames"],
    ["train-drafter-parallel", "--model", "tiny-random", "--drafter", "offsets", "--out", "{tmp}/d.safetensors",
     "--frames", "{tmp}/f.safetensors"],
])
def test_a_device_not_present_is_one_line_before_loading(argv, tmp_path, capsys, monkeypatch, no_loading):
    _devices(monkeypatch, cuda=False)
    (tmp_path / "f.safetensors").write_bytes(b"")  # train-drafter-parallel checks --frames exists, first
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main([*argv, "--device", "cuda"]) == 2
    assert _one_line(capsys) == ("rvqspec: error: --device cuda is not present on this machine (it has cpu): use "
                                 "--device auto or one of those")


def test_synth_on_the_cpu_names_the_device_in_its_json_and_printout(tmp_path, capsys):
    out = tmp_path / "a.wav"
    assert main(["synth", "--model", "tiny-random", "--text", "hello", "--out", str(out), "--max-frames", "2",
                 "--device", "cpu", "--json", str(tmp_path / "a.json")]) == 0
    stats = json.loads((tmp_path / "a.json").read_text())
    assert (stats["device"], stats["model_dtype"], stats["dtype"]) == ("cpu", "float32", "float32")
    assert "on cpu (float32)" in capsys.readouterr().out


@pytest.mark.parametrize("flags, what", [
    (["--backend", "native"], "--backend native"),
    (["--backend", "onnx"], "--backend onnx"),
    (["--talker", "native"], "--talker native"),
])
def test_cpu_only_runners_refuse_a_gpu_in_one_line(flags, what, tmp_path, capsys, monkeypatch, no_loading):
    _devices(monkeypatch, cuda=True)  # present, but what was asked for runs on the CPU alone
    assert main(["synth", "--model", "tiny-random", "--text", "hello", "--out", str(tmp_path / "a.wav"),
                 "--device", "cuda", *flags]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"rvqspec: error: {what} runs on the CPU only, not --device cuda: give --device cpu "
                          "(or auto), or --backend official"), err


def test_export_traces_on_the_cpu_and_refuses_a_gpu(tmp_path, capsys, monkeypatch, no_loading):
    _devices(monkeypatch, cuda=True)
    assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "stepped", "--out",
                 str(tmp_path / "x"), "--device", "cuda"]) == 2
    assert _one_line(capsys) == ("rvqspec: error: export (it traces and checks its graphs on the CPU) runs on the "
                                 "CPU only, not --device cuda: give --device cpu (or auto)")


def test_auto_is_the_best_device_present_and_the_cpu_for_cpu_only_runners(monkeypatch):
    _devices(monkeypatch, cuda=True)
    assert common.check_device(argparse.Namespace(device="auto")) == "cuda"
    assert common.check_device(argparse.Namespace(device="auto"), "--backend native") == "cpu"
    _devices(monkeypatch, cuda=False, mps=True)
    assert common.check_device(argparse.Namespace(device="auto")) == "mps"
    _devices(monkeypatch, cuda=False)  # negative control: nothing but the CPU
    assert common.check_device(argparse.Namespace(device="auto")) == "cpu"


def test_a_process_under_accelerate_takes_its_device(monkeypatch):
    monkeypatch.setattr(Parallel, "detect", classmethod(lambda cls: cls(1, 2, "cuda:1")))
    args = argparse.Namespace(device="auto")
    assert common.parallel_device(args).device == "cuda:1" and args.device == "cuda:1"
    assert common.parallel_device(argparse.Namespace(device="cuda")).device == "cuda:1"
    with pytest.raises(ValueError, match=r"^--device cpu: accelerate launch runs this process on cuda:1; give "):
        common.parallel_device(argparse.Namespace(device="cpu"))
