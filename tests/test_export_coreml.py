"""Core ML packages (rvqspec_lib.device.export_formats.export_coreml), built on this Linux machine.

What can be checked without macOS: the conversion succeeds for every graph and precision, and the written
``.mlpackage`` declares exactly the declared inputs, outputs and states (KV cache as float16 ``StateType`` for the
stepped and verify graphs, none for the frame graph), with the macOS 15 / iOS 18 specification. Prediction is
macOS-only: here asking for it is a one-line error naming where to run it, and check_file reports "not run". The
macOS path (predict, compare, time per compute unit) is the same code as the ONNX path's, run by notebook 06 and
``rvqspec export`` on a Mac.
"""

from __future__ import annotations

import platform

import pytest

from rvqspec_lib.device.export_check import check_file
from rvqspec_lib.eval import export_check as T
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device import export_graphs as G

pytestmark = pytest.mark.slow
#: Core ML specification version of macOS 15 / iOS 18 (the first with states).
SPEC_VERSION_MACOS15 = 9


@pytest.mark.parametrize("graph", ["stepped", "verify", "frame"])
@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_package_declares_its_inputs_outputs_and_states(cp, small, tmp_path, graph, precision):
    import coremltools as ct

    model = small if graph == "frame" else cp
    path = tmp_path / f"{graph}.mlpackage"
    res = F.export_graph(model, graph, "coreml", path, dtype=precision, nodes=5 if graph == "verify" else None)
    assert path.is_dir() and res["bytes"] > 0
    assert res["written"] == res["declared"]
    written = res["written"]
    g = G.build_graph(model, graph, nodes=5 if graph == "verify" else None, state="buffers")
    assert [r[0] for r in written["inputs"]] == [s.name for s in g.input_specs()]
    assert [r[0] for r in written["outputs"]] == [s.name for s in g.output_specs()]
    if graph == "frame":
        assert written["states"] == [] and written["outputs"] == [["codes", [1, 3], "int32"]]
    else:
        n_slots = 16 if graph == "stepped" else 15 + 1 + 5
        assert [(r[0], r[2]) for r in written["states"]] == [("k_cache", "float16"), ("v_cache", "float16")]
        assert all(r[1][3] == n_slots for r in written["states"])
        assert all(r[2] == "float32" for r in written["inputs"] if r[0] in ("inputs_embeds", "attention_mask"))
        assert all(r[2] == precision for r in written["outputs"])
    spec = ct.utils.load_spec(str(path))
    assert spec.specificationVersion >= SPEC_VERSION_MACOS15


def test_ios_target_and_bad_options(cp, tmp_path):
    res = F.export_graph(cp, "stepped", "coreml", tmp_path / "s.mlpackage", dtype="float16", target="iOS18")
    assert res["written"]["states"]
    with pytest.raises(ValueError, match="unknown Core ML target"):
        F.export_graph(cp, "stepped", "coreml", tmp_path / "t.mlpackage", target="iOS17")
    with pytest.raises(ValueError, match="state='buffers'"):
        F.export_coreml(G.SteppedGraph(cp), tmp_path / "u.mlpackage")
    assert not (tmp_path / "t.mlpackage").exists() and not (tmp_path / "u.mlpackage").exists()


@pytest.mark.skipif(platform.system() == "Darwin", reason="the Linux side: prediction must be refused")
def test_prediction_off_macos_is_refused_in_one_line(cp, tmp_path):
    path = F.export_graph(cp, "stepped", "coreml", tmp_path / "s.mlpackage")["path"]
    ok, why = F.coreml_available()
    assert not ok and "macOS" in why and "\n" not in why
    with pytest.raises(RuntimeError, match="macOS 15") as e:
        F.CoreMLGraph(path)
    assert "\n" not in str(e.value)
    rows = check_file(cp, "stepped", path)
    assert rows == [{"runner": "not run", "ran": False, "note": why}]
    with pytest.raises(RuntimeError, match="macOS"):
        T.coreml_call_times(cp, tmp_path / "t")
