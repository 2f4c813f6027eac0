"""The verify call's attention mask as the decode loop builds it (paper.verify_calls), the figures drawn
from it and from the configs (paper.plots), and table captions (rvqspec_lib.common.provenance)."""

from __future__ import annotations

import json

import pytest
import torch

from paper.verify_calls import record_verify_calls
from rvqspec_lib.decoding.decoders import AR, Tree
from rvqspec_lib.decoding.trees import DraftTree

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


@pytest.fixture(scope="module")
def cp():
    from rvqspec_lib.models.loader import load_model

    return load_model("tiny-random").code_predictor


def _context(cp, seed=0):
    from rvqspec_lib.decoding import predictor as P

    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, P.talker_hidden_size(cp), generator=g)


def test_recorded_mask_is_committed_slots_plus_the_tree_ancestors(cp):
    calls = record_verify_calls(cp, _context(cp), Tree(PATHS))
    assert calls[0]["kind"] == "prefill" and calls[0]["n_query"] == 2
    tree = DraftTree.from_paths(PATHS)
    m1 = tree.n_nodes + 1
    v = calls[1]  # the first verify call: after the prefill's two committed slots
    assert v["kind"] == "verify" and v["n_query"] == m1 and v["allow"].shape[0] == m1
    write = v["write_slots"].tolist()
    assert write == list(range(write[0], write[0] + m1)) and write[0] == 2
    allow = v["allow"]
    assert allow[:, :write[0]].all()  # every query sees the committed codes
    assert torch.equal(allow[:, write[0]:write[0] + m1], tree.ancestors)  # and, among the nodes, its ancestors only
    assert not allow[:, write[0] + m1:].any()  # never a slot past the call's own
    assert v["positions"].tolist() == (tree.depth + 2).tolist()  # RoPE position = depth of the node's code + 1
    # negative control: a chain's mask is lower-triangular, not this tree's
    chain = record_verify_calls(cp, _context(cp), Tree([(0,) * t for t in range(1, m1)]))[1]
    assert not torch.equal(chain["allow"][:, 2:2 + m1], tree.ancestors)


def test_ar_makes_one_query_calls_and_bad_context_is_one_line(cp):
    calls = record_verify_calls(cp, _context(cp), AR())
    assert [c["n_query"] for c in calls[1:]] == [1] * (len(calls) - 1)
    with pytest.raises(ValueError, match="frames.context"):
        record_verify_calls(cp, torch.zeros(2, 2, 8), AR())


def test_figures_1_to_3_draw_from_their_inputs(cp):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from paper import plots
    from paper.notebook_measures import loop_facts
    from rvqspec_lib.models.configs import CONFIG_DIR, RANDOM_MODELS

    rows = [{"model": n, **loop_facts(CONFIG_DIR / d)} for n, d in RANDOM_MODELS.items()]
    assert {(r["n_code_groups"], r["frame_rate_hz"], r["talker_layers"], r["code_predictor_layers"]) for r in rows} \
        == {(16, 12.5, 28, 5)}  # the released configs
    fig = plots.plot_two_loops(rows, title="t")
    assert "1 + 15 = 16 model calls" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[1].texts] == ["200", "200"]  # calls per second from the config
    call = record_verify_calls(cp, _context(cp), Tree(PATHS))[1]
    fig = plots.plot_tree_and_mask(PATHS, call, title="t")
    assert fig.axes[1].images[0].get_array().shape == (len(PATHS) + 1, 2 + len(PATHS) + 1)
    by_offset = [{"offset_t": j, "heads": 0.9 - 0.1 * j, "offsets-ce": 0.92 - 0.1 * j} for j in (1, 2, 3, 4)]
    fig = plots.plot_acceptance_by_offset(by_offset, max_offset=3, drafters=["heads", "offsets-ce"])
    gain = fig.axes[1].lines[0].get_ydata()
    assert gain == pytest.approx([0.02] * 4)
    with pytest.raises(KeyError):
        plots.plot_acceptance_by_offset(by_offset, max_offset=3, drafters=["heads", "medusa"])
    with pytest.raises(FileNotFoundError, match="config.json"):
        loop_facts(CONFIG_DIR)


def test_table_caption_heads_the_markdown_and_the_sidecar(tmp_path):
    from rvqspec_lib.common.provenance import save_table

    out = save_table([{"a": 1}], tmp_path / "t", {"git": "x"}, caption="PROJECTION: inputs named")
    assert out["md"].read_text().startswith("*PROJECTION: inputs named*\n\n| a |")
    assert json.loads(out["provenance"].read_text())["caption"] == "PROJECTION: inputs named"
    assert out["csv"].read_text().splitlines()[0] == "a"  # the CSV stays plain
    plain = save_table([{"a": 1}], tmp_path / "u", {"git": "x"})
    assert plain["md"].read_text().startswith("| a |") and "caption" not in json.loads(plain["provenance"].read_text())
