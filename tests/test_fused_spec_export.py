"""The fused speculative chain through ONNX Runtime (rvqspec_lib.models.fused_spec_export): one exported graph per
start depth, against the eager fused round (rvqspec_lib.models.fused_spec) in float32.

Exact: for the same uniforms the ONNX Runtime frame gives the eager frame's codes code for code, and takes the same
number of calls, over a 6-codebook tiny model with Chain(4) (start depth 1 has a bonus column, depth 2 not, depths 3
and 4 have fewer drafts than the window: every kind of round graph). Negative control: other uniforms give other
codes (the equality is not vacuous). Bad input: a module not in float32 is refused in one line before any export.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rvqspec_lib.decoding.predictor as P
from rvqspec_lib.models import precision as PR
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.models.fused_spec import FusedChainFrame
from rvqspec_lib.models.fused_spec_export import OrtFusedChainFrame, export_fused_chain


def _small():
    return build_from_config(tiny_config_dict(n_code_groups=6, codebook_size=8), seed=0).talker.code_predictor.eval()


@pytest.mark.slow
def test_onnx_fused_chain_equals_eager_code_for_code(tmp_path):
    small = _small()
    ort = OrtFusedChainFrame(small, 4, work_dir=tmp_path)
    assert set(ort.paths) == {"prefill", 1, 2, 3, 4} and all(p.exists() for p in ort.paths.values())
    ort.compile_all()
    eager = FusedChainFrame(small, 4, compile=False)
    ctx = torch.randn(8, 2, P.talker_hidden_size(small), generator=torch.Generator().manual_seed(0))
    for seed in range(3):
        u = eager.uniforms(8, torch.Generator().manual_seed(seed))
        got = ort(ctx, u)
        assert got.dtype == torch.int64 and torch.equal(got, eager(ctx, u))
        assert ort.last_calls == eager.last_calls
    assert len(set(ort.last_calls)) > 1 or max(ort.last_calls) < P.n_codes(small)  # rows really speculated
    other = ort.decode(ctx, torch.Generator().manual_seed(99))
    assert not torch.equal(other, eager(ctx, eager.uniforms(8, torch.Generator().manual_seed(0))))  # control
    # a round graph is a pure function: the same inputs twice give the same outputs, and the inputs are unchanged
    sess = ort._session(1)
    codes, h, k, v = ort._session("prefill").run(None, {"context": ctx[:1].numpy(), "u": u[:1].numpy()})
    feed = {"codes": codes, "h": h, "k": k, "v": v, "u": u[:1].numpy()}
    k0 = k.copy()
    a, b = sess.run(None, feed), sess.run(None, feed)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and np.array_equal(k, k0)


def test_onnx_fused_chain_refuses_other_precisions_in_one_line(tmp_path):
    small = PR.apply_precision(_small(), "bfloat16", require_native=False)
    with pytest.raises(ValueError, match=r"^the ONNX fused chain is exported in float32; this code predictor is "
                                         r"torch.bfloat16: use --dtype float32") as e:
        export_fused_chain(small, tmp_path)
    assert "\n" not in str(e.value) and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_onnx_fused_tree_equals_eager_code_for_code(tmp_path):
    """The point-mass tree round (its cache compaction a gather inside the graph) through ONNX Runtime."""
    from rvqspec_lib.decoding.decoders import Tree
    from rvqspec_lib.models.fused_tree import FusedTreeFrame

    small = build_from_config(tiny_config_dict(n_code_groups=4, codebook_size=8), seed=0).talker.code_predictor
    tree = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))
    ort = OrtFusedChainFrame(small.eval(), tree=tree, work_dir=tmp_path)
    assert ort.decoder_label == "fused-tree7" and set(ort.paths) == {"prefill", 1, 2}
    eager = FusedTreeFrame(small, tree, compile=False)
    ctx = torch.randn(8, 2, P.talker_hidden_size(small), generator=torch.Generator().manual_seed(0))
    for seed in range(3):
        u = eager.uniforms(8, torch.Generator().manual_seed(seed))
        assert torch.equal(ort(ctx, u), eager(ctx, u)) and ort.last_calls == eager.last_calls
