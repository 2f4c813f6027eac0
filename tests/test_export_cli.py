"""``rvqspec export``, ``rvqspec bench --backend NAME`` and ``scripts/gpu_bench.py --dry-run`` as a user runs them:
bad input is one line before any model loads; an ONNX file is written with its JSON beside it and checked against
eager PyTorch; the backend bench prints every decoder's frame time from one interleaved run; the GPU script's logic
runs on the CPU and writes the JSON notebook 05 reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rvqspec_lib.cli.main import main
from rvqspec_lib.models import loader

ROOT = Path(__file__).resolve().parent.parent


def _no_load(*a, **k):
    raise AssertionError("the model was loaded before the arguments were checked")


@pytest.mark.parametrize("extra, needle", [
    (["--format", "tflite", "--graph", "verify"], "unknown --format 'tflite': use onnx or coreml"),
    (["--format", "onnx", "--graph", "loop"], "unknown --graph 'loop'"),
    (["--format", "onnx", "--graph", "verify", "--nodes", "65"], "--nodes must be in 2..64"),
    (["--format", "onnx", "--graph", "frame", "--nodes", "4"], "--nodes is for --graph verify"),
    (["--format", "onnx", "--graph", "stepped", "--decoder", "paper"], "--decoder is for --graph verify"),
    (["--format", "onnx", "--graph", "frame", "--nodes", "4", "--tree", "0;1"], "--nodes and --tree are for --graph"),
    (["--format", "onnx", "--graph", "verify", "--dtype", "int8"], "unknown --dtype 'int8'"),
    (["--format", "onnx", "--graph", "verify", "--predict"], "--predict is for --format coreml"),
    (["--format", "coreml", "--graph", "verify", "--predict"], "--predict:"),  # off macOS
    (["--format", "onnx", "--graph", "verify", "--tree", "0;1", "--nodes", "5"], "--tree has 2 nodes, so N = 3"),
])
def test_export_bad_input_is_one_line_before_loading(tmp_path, capsys, monkeypatch, extra, needle):
    monkeypatch.setattr(loader, "load_model", _no_load)
    rc = main(["export", "--model", "tiny-random", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("rvqspec: error: ") and needle in err and err.count("\n") == 1, err


def test_export_tree_rank_outside_the_codebook_is_one_line(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--tree", "0;5000",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tree rank 5000 is out of range for this model's codebook of 2048 codes" in err and err.count("\n") == 1
    assert not list(out.glob("*")) if out.exists() else True  # nothing written


def test_export_out_must_be_a_folder_with_a_parent(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader, "load_model", _no_load)
    (tmp_path / "f").write_text("x")
    for out, needle in ((tmp_path / "f", "is a file: give a folder"), (tmp_path / "a" / "b", "does not exist")):
        assert main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--out",
                     str(out)]) == 2
        assert needle in capsys.readouterr().err


def test_export_onnx_verify_graph_writes_a_checked_file(tmp_path, capsys):
    out = tmp_path / "export"
    rc = main(["export", "--model", "tiny-random", "--format", "onnx", "--graph", "verify", "--tree", "0;1;0,0",
               "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "RANDOM weights" in cap.err and "onnxruntime-cpu: max abs logit difference" in cap.out
    info = json.loads((out / "verify-n4-float32.json").read_text())
    assert (out / "verify-n4-float32.onnx").stat().st_size == info["bytes"] > 0
    assert info["tree"] == [[0], [1], [0, 0]] and info["random_weights"] is True and info["ran"] is True
    (agree,) = info["agreement"]
    assert agree["runner"] == "onnxruntime-cpu" and agree["within_tolerance"] is True
    assert info["provenance"]["params"]["threads"] == 1


def test_the_parsers_copies_of_the_names_agree_with_the_library():
    from rvqspec_lib.cli import bench, export
    from rvqspec_lib.eval import export_timing as T
    from rvqspec_lib.models import export_formats as F
    from rvqspec_lib.models import export_graphs as G

    assert bench.BACKENDS == T.BACKENDS
    assert export.GRAPHS == tuple(G.GRAPHS) and set(export.FORMATS) == set(F.FORMATS)


def test_bench_backend_refuses_unknown_and_absent_backends(capsys, monkeypatch):
    monkeypatch.setattr(loader, "load_model", _no_load)
    assert main(["bench", "--model", "tiny-random", "--backend", "tpu"]) == 2
    assert "unknown --backend 'tpu': use one of eager, compile, onnx, coreml, cuda" in capsys.readouterr().err
    assert main(["bench", "--model", "tiny-random", "--backend", "cuda"]) == 2  # this machine has no GPU
    err = capsys.readouterr().err
    assert "--backend cuda is not available here: no CUDA device" in err and err.count("\n") == 1


def test_bench_backend_eager_prints_every_decoder_from_one_run(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "--model", "tiny-random", "--backend", "eager", "--repeats", "2", "--warmup", "0",
               "--no-progress", "--json", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(out.read_text())
    rows = {r["decoder"]: r for r in res["rows"]}
    assert set(rows) == {"AR", "chain4", "tree", "fused-AR", "fused-chain4"} and \
        {r["backend"] for r in rows.values()} == {"eager"}
    assert rows["AR"]["speedup_vs_ar"] == 1.0 and rows["fused-AR"]["speedup_vs_fused"] == 1.0
    for name, r in rows.items():  # the speedups are read off the medians of the same run
        assert r["speedup_vs_ar"] == pytest.approx(rows["AR"]["ms_per_frame"] / r["ms_per_frame"])
        assert f"| {name} | eager |" in cap.out
    assert "backend eager" in cap.out and res["backend"] == "eager"


@pytest.mark.slow
def test_gpu_bench_dry_run_writes_what_notebook_05_reads(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bench.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["format"] == "rvqspec-gpu-bench" and res["dry_run"] is True
    assert res["provenance"]["params"]["model"] == "tiny-random"
    rows = {r["decoder"]: r for r in res["frame_rows"]}
    assert {"AR", "fused-AR"} <= set(rows) and rows["AR"]["speedup_vs_ar"] == 1.0
    assert [r["query_positions"] for r in res["verify_cost"]][0] == 1 and res["verify_cost"][0]["ratio_to_q1"] == 1.0
    # the fused speculative rounds (one graph per start depth; stand-ins in a dry run) beside the fused AR frame
    spec = {r["decoder"]: r for r in res["fused_spec"]}
    assert set(spec) == {"fused-chain2", "fused-chain4", "fused-chain8"} <= set(rows)
    for r in spec.values():
        assert r["fused_ar_ms"] == rows["fused-AR"]["ms_per_frame"] and r["tokens_per_call"] >= 1.0
        assert r["x_fused_ar"] == pytest.approx(r["ms_per_frame"] / r["fused_ar_ms"])
    assert set(res["fused_spec_capture_s"]) == {f"fused-chain{w}-static-eager" for w in (2, 4, 8)}
    assert res["provenance"]["params"]["fused_chains"] == [2, 4, 8]


def test_gpu_bench_refuses_a_window_outside_2_to_8_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bench.py"), "--dry-run", "--fused-chains", "9",
                           "--out", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--fused-chains" in proc.stderr and "2..8" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not (tmp_path / "g.json").exists()


def test_gpu_bench_without_cuda_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bench.py"), "--out", str(tmp_path / "g.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "CUDA" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not (tmp_path / "g.json").exists()


def test_bench_backend_coreml_times_the_packages_call_by_call(tmp_path, capsys, monkeypatch):
    """The macOS path's wiring (Core ML does not run here): the call-by-call timing is what gets printed and saved."""
    from rvqspec_lib.eval import export_timing as T

    seen = {}

    def fake_times(cp, work_dir, *, repeats, warmup, seed, progress):
        seen.update(repeats=repeats, work_dir=work_dir)
        return {"rows": [{"compute_unit": "CPU_AND_NE", "graph": "verify", "nodes": 32, "median_ms": 2.0,
                          "p10_ms": 1.9, "p90_ms": 2.1, "ratio_to_stepped": 1.25}],
                "meta": {"precision": "float16", "macos": "15.1", "machine": "arm64"}}

    monkeypatch.setattr(T, "backend_status", lambda name: (True, ""))
    monkeypatch.setattr(T, "coreml_call_times", fake_times)
    out = tmp_path / "c.json"
    assert main(["bench", "--model", "tiny-random", "--backend", "coreml", "--repeats", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| CPU_AND_NE | verify | 32 |" in text and "Core ML float16, macOS 15.1 arm64" in text
    assert seen["repeats"] == 3 and json.loads(out.read_text())["backend"] == "coreml"


@pytest.mark.parametrize("other, crowded", [(0.9, True), (0.0, False)])  # 0.0: negative control
def test_bench_backend_footer_counts_frames_and_says_oversubscribed(tmp_path, capsys, monkeypatch, other, crowded):
    from rvqspec_lib.eval import speed

    monkeypatch.setattr(speed._LoadMonitor, "describe", lambda self: {"other_cpu_frac": other})
    rc = main(["bench", "--model", "tiny-random", "--backend", "eager", "--repeats", "3", "--warmup", "1",
               "--no-progress", "--decoders", "ar"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 timed frames per decoder (after 1 warm-up frames)" in out, out
    assert ("OVERSUBSCRIBED: other processes used 90% of the CPU" in out) is crowded, out
