"""The graphs exported to ONNX and run with ONNX Runtime on this CPU (rvqspec_lib.device.export_formats), against
eager PyTorch: the official module in float32.

Stated tolerances (rvqspec_lib.device.export_check.RELATIVE_TOLERANCE): max abs logit difference over the largest
reference logit <= 1e-5 in float32 (summation order only; measured ~3e-7 on tiny-random) and <= 2e-2 in float16
(measured ~5e-4). Beyond single calls: decode_frame through the ONNX Runtime verify backend equals the official
module draw for draw (AR, chain, tree; greedy and sampled; batch 1 and 3), a greedy frame driven through the exported
fused verify graph equals AR, and the exported frame graph gives the eager fused frame's codes for the same noise.
Negative control: a file checked against a module changed after export fails the tolerance.
"""

from __future__ import annotations

import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.device import export_check as T
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree

pytestmark = pytest.mark.slow
TREE = DraftTree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)])


@pytest.fixture(scope="module")
def files(cp, small, tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    for graph, model in (("stepped", cp), ("verify", cp), ("frame", small)):
        for dt in ("float32", "float16"):
            path = d / f"{graph}-{dt}.onnx"
            out[(graph, dt)] = F.export_graph(model, graph, "onnx", path, dtype=dt,
                                              tree=TREE if graph == "verify" else None)
    return out


@pytest.mark.parametrize("graph", ["stepped", "verify"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_onnx_graph_equals_eager_pytorch(cp, files, graph, dtype):
    res = files[(graph, dtype)]
    assert res["declared"] == res["written"] and res["bytes"] > 0
    rows = T.check_file(cp, graph, res["path"], dtype=dtype, tree=TREE if graph == "verify" else None,
                        seeds=(0, 1, 2))
    assert len(rows) == 1 and rows[0]["runner"] == "onnxruntime-cpu" and rows[0]["ran"]
    r = rows[0]
    assert r["within_tolerance"] and r["relative_diff"] <= T.RELATIVE_TOLERANCE[dtype], r
    if dtype == "float32":  # summation order only: far inside the stated tolerance
        assert r["relative_diff"] < 1e-6 and r["max_abs_cache_diff"] < 1e-5


def test_float16_weights_are_half_the_size(files):
    for graph in ("stepped", "verify"):
        ratio = files[(graph, "float16")]["bytes"] / files[(graph, "float32")]["bytes"]
        assert 0.45 < ratio < 0.6, (graph, ratio)


def test_a_changed_module_fails_the_check(cp, files):
    """Negative control: the float32 file checked against the module whose first head is scaled by 1.0001 (10x the tolerance)."""
    changed = load_model("tiny-random").code_predictor.eval()
    with torch.no_grad():
        changed.lm_head[0].weight.mul_(1.0001)
    r = T.check_file(changed, "stepped", files[("stepped", "float32")]["path"])[0]
    assert not r["within_tolerance"] and r["relative_diff"] > T.RELATIVE_TOLERANCE["float32"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_onnx_frame_graph_gives_the_eager_codes(small, files, dtype):
    res = files[("frame", dtype)]
    assert res["declared"] == res["written"]
    frame = F.ExportedFrame(small, res["path"])
    eager = FusedARFrame(small, compile=False)
    ctx = torch.randn(1, 2, P.talker_hidden_size(small), generator=torch.Generator().manual_seed(0))
    equal = 0
    for s in range(20):
        noise = eager.noise(1, torch.Generator().manual_seed(s))
        got = frame(ctx, noise)
        assert got.dtype == torch.int64 and got.shape == (1, P.n_codes(small))
        equal += int(torch.equal(got, eager(ctx, noise)))
    if dtype == "float32":
        assert equal == 20
    else:  # float16 may flip a near-tie of the Gumbel-perturbed scores; most frames agree
        assert equal >= 15, equal


def test_greedy_frame_through_the_onnx_verify_graph(cp, tmp_path):
    from test_export_graphs import greedy_frame_through_verify_graph

    path = F.export_graph(cp, "verify", "onnx", tmp_path / "v.onnx", nodes=4)["path"]
    g = F.OrtGraph(path)
    for seed in range(3):
        ctx = torch.randn(1, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(seed))
        ref = decode_frame(cp, ctx, sampling=Sampling(greedy=True)).codes
        got, _ = greedy_frame_through_verify_graph(cp, g, 4, ctx)
        assert torch.equal(got, ref)


@pytest.fixture(scope="module")
def ort_backend(cp):
    return F.ExportedBackend(cp)


@pytest.mark.parametrize("decoder", [AR(), Chain(4), Tree(((0,), (1,), (0, 0), (0, 0, 0))),
                                     Tree(((0,), (1,), (0, 0), (1, 0)), sampled=True)],
                         ids=["ar", "chain4", "tree", "sampled-tree"])
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
def test_decode_frame_through_onnx_runtime_equals_the_official_draw_for_draw(cp, ort_backend, decoder, greedy,
                                                                             batch):
    sampling = Sampling(greedy=greedy)
    ctx = torch.randn(batch, 2, P.talker_hidden_size(cp), generator=torch.Generator().manual_seed(batch))
    for seed in range(3):
        ref = decode_frame(cp, ctx, decoder=decoder, sampling=sampling, generator=torch.Generator().manual_seed(seed))
        got = decode_frame(cp, ctx, decoder=decoder, sampling=sampling, generator=torch.Generator().manual_seed(seed),
                           backend=ort_backend)
        assert torch.equal(got.codes, ref.codes) and torch.equal(got.calls, ref.calls)
        assert torch.equal(got.committed, ref.committed)


def test_one_onnx_file_serves_every_query_size(cp, ort_backend):
    """The backend's hidden-state graph has symbolic batch, query and slot dimensions: every call shape runs."""
    from rvqspec_lib.device.export_formats import file_interface

    ins = dict((n, s) for n, s, _ in file_interface(ort_backend.path)["inputs"])
    assert all(isinstance(d, str) for d in ins["inputs_embeds"][:2]) and isinstance(ins["k_cache"][3], str)
    lean_like = P.OfficialBackend(cp)
    for q in (1, 2, 17, 64):
        s = 16 + q
        x = torch.randn(1, q, int(cp.config.hidden_size), generator=torch.Generator().manual_seed(q))
        pos = torch.arange(q)[None].clamp(max=15)
        allow = torch.ones(q, s, dtype=torch.bool).tril(0)[None]
        w = torch.arange(q)[None]
        with torch.no_grad():
            a = ort_backend.forward(x, pos, allow, ort_backend.new_cache(1, s), w)
            b = lean_like.forward(x, pos, allow, lean_like.new_cache(1, s), w)
        assert float((a - b).abs().max()) < 1e-5


def test_float16_onnx_backend_decodes_close_to_float32(cp):
    """The float16 hidden-state graph: hidden states within float16 rounding of the official module's."""
    be = F.ExportedBackend(cp, dtype="float16")
    ref = P.OfficialBackend(cp)
    x = torch.randn(1, 4, int(cp.config.hidden_size), generator=torch.Generator().manual_seed(0))
    pos, w = torch.arange(4)[None], torch.arange(4)[None]
    allow = torch.ones(4, 20, dtype=torch.bool).tril(0)[None]
    with torch.no_grad():
        a = be.forward(x, pos, allow, be.new_cache(1, 20), w)
        b = ref.forward(x, pos, allow, ref.new_cache(1, 20), w)
    assert a.dtype == torch.float32 and float((a - b).abs().max()) <= 2e-2 * float(b.abs().max())
