"""Statistical proof that Chain and Tree speculation sample exactly the autoregressive distribution.

Set-up (docs/methods.md#testing-losslessness). A code predictor of the OFFICIAL classes with 4 code groups and
8 codes per codebook (3 codes a frame, 8**3 = 512 joint outcomes) is built from a seeded tiny config. The EXACT
target pmf of the 3 codes is enumerated: one teacher-forced pass of the official ``forward_finetune`` over all 64
prefixes (c1, c2), the same :meth:`Sampling.probs` warpers at each depth, the product of the three conditionals.
Then N frames are drawn by ONE batched :func:`decode_frame` call (rows are independent frames from the same context)
and a G-test (``power_divergence(lambda_="log-likelihood")``) compares the counts of the JOINT outcome with N x pmf,
bins of expected count < 5 pooled. A test fails at p < 1e-3. Outcomes of probability exactly 0 (cut by top-k or
top-p) must never be drawn.

Model variants (the tiny config initialises heads with std 0.02, so logits are ~0.1 wide; sharpening needs a factor
of ~20 here rather than the 3-8 a trained model would need):

* ``peaked``: heads x20 and a shared random offset added to ``small_to_mtp_projection.bias`` (so every position's
  hidden state shares a direction): peaked distributions (largest joint outcome ~0.45) AND reused-head drafts close to
  p (one-step acceptance ~0.97), so the all-accepted / bonus-code path dominates;
* ``sharp``: heads x20 only: peaked, but drafts far from p (one-step acceptance ~0.45), so residual resampling is
  exercised; the negative controls run on it (a broken rule only shows when drafts differ from p);
* ``flat``: heads unchanged: near-uniform distributions (all 512 outcomes populated).

Power (why N is large enough). For a shift of total variation TV between the true pmf P and the sampler's pmf Q on
the pooled bins, Cauchy-Schwarz gives sum|Q-P| = sum (|Q-P|/sqrt(P)) sqrt(P) <= sqrt(sum (Q-P)^2/P), so the
noncentrality of the (asymptotically noncentral chi-square) G statistic is lambda = N sum (Q-P)^2/P >= N (2 TV)^2.
For each case N is the smallest multiple of 10,000 for which ``ncx2.sf(chi2.isf(1e-3, df), df, N (2*0.03)**2) >=
0.9`` at that case's effective df (pooled bins - 1), re-checked in :func:`test_power_of_the_worst_case` and asserted
in every test. With these models the effective df ranges from 5 (peaked, top-p 0.8) to 511 (flat, default
sampling: all 512 outcomes populated); df <= 146 needs 20,000-30,000 frames, flat with top-p 0.8 (df 335) 40,000 and
the worst case df 511 needs 50,000: critical value chi2.isf(1e-3, 511) = 615.5, noncentrality >= 50,000 x 0.06**2 =
180, power 0.968 (40,000 would give 0.838). :func:`test_power_empirically_a_tv_0_03_shift_is_rejected` checks it
on data: AR samples tested against the pmf shifted by TV 0.03 in the least detectable direction are rejected.

False failures. Each test fails with probability 1e-3 (the level) for a random seed, when the sampler is exactly
right (up to the asymptotic chi-square approximation with expected counts >= 5). Seeds here are fixed, so every test
is deterministic: it either always passes or always fails. Over the 32 G-tests of a correct sampler in this file
(19 decoder parametrisations, 5 through the registry's other backends (:data:`BACKEND_RUNS`), 3 of the fused AR
frame, 3 pure-function walk_tree tests, 2 in the empirical power test) a union bound puts the chance that a correct
implementation meets an unlucky seed at 32 x 1e-3 = 3.2 %. Negative controls and the
empirical power test must REJECT at the same level (p < 1e-3); they are deterministic too.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from scipy import stats

import rvqspec_lib.decoding.decode as D
import rvqspec_lib.decoding.verify as verify
from rvqspec_lib.models.configs import build_from_config, tiny_config_dict
from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.models import backends
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR, Chain, Tree
from rvqspec_lib.decoding.sampling import Sampling

ALPHA = 1e-3
TV_SHIFT = 0.03
MIN_POWER = 0.9
N_STEP = 10_000
V = 8
N_GROUPS = 4  # codes 1..3 from the code predictor

DEFAULT = Sampling()  # temperature 0.9, top-k 50, top-p 1.0 (the checkpoints' generation config)
HOT_TOPK3 = Sampling(temperature=1.3, top_k=3)
NUCLEUS = Sampling(temperature=1.0, top_k=0, top_p=0.8)

TREE_SMALL = Tree([(0,), (1,), (0, 0)])
TREE_WIDE = Tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
#: Sampled trees (children drawn from q without replacement, Sequoia's rule). The wide one has 4 children at the root:
#: under top-k 3 the fourth cannot exist (q's support is 3), which exercises children that do not exist.
SAMPLED_SMALL = Tree([(0,), (1,), (0, 0)], sampled=True)
SAMPLED_WIDE = Tree([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0)], sampled=True)


# ----------------------------------------------------------------------------------------------------------------
# model, exact pmf, G-test, power
# ----------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def variant(name: str):
    """``(code_predictor, context (1, 2, H))`` of a model variant (see the module docstring)."""
    cfg = tiny_config_dict(n_code_groups=N_GROUPS, codebook_size=V)
    cp = build_from_config(cfg, seed=0).talker.code_predictor
    with torch.no_grad():
        if name in ("peaked", "sharp"):
            for head in cp.lm_head:
                head.weight.mul_(20.0)
        if name == "peaked":
            bias = cp.small_to_mtp_projection.bias
            bias.add_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(100)))
        elif name not in ("sharp", "flat"):
            raise KeyError(name)
    h = cfg["talker_config"]["hidden_size"]
    context = torch.randn(1, 2, h, generator=torch.Generator().manual_seed(0))
    return cp, context


@torch.no_grad()
def exact_pmf(cp, context: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Exact joint pmf ``(V, V, V)`` of codes 1..3, by teacher forcing all 64 prefixes through the official
    ``forward_finetune`` (position 0/1 = context, position j+1 = codec_embedding[j-1](code j); lm_head[i-1] at i)."""
    emb = cp.model.codec_embedding
    c1 = torch.arange(V).repeat_interleave(V)
    c2 = torch.arange(V).repeat(V)
    h = context.shape[-1]
    x = torch.cat([context.expand(V * V, 2, h), emb[0](c1)[:, None], emb[1](c2)[:, None]], 1)
    logits = cp.forward_finetune(inputs_embeds=x).logits  # (64, 3, V): codes 1, 2, 3
    p = sampling.probs(logits).to(torch.float64)
    p1 = p[0, 0]  # does not depend on the prefix
    p2 = p[::V, 1]  # (c1, c2)
    p3 = p[:, 2].reshape(V, V, V)  # (c1, c2, c3)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    assert abs(float(joint.sum()) - 1.0) < 1e-5
    return joint / joint.sum()


def pooled(expected, observed):
    """Pool bins with expected count < 5 into one bin (grown with the smallest other bins until it reaches 5)."""
    order = sorted(range(len(expected)), key=lambda i: expected[i])
    small = [i for i in order if expected[i] < 5]
    big = [i for i in order if expected[i] >= 5]
    while small and sum(expected[i] for i in small) < 5 and big:
        small.append(big.pop(0))
    e = [expected[i] for i in big]
    o = [observed[i] for i in big]
    if small:
        e.append(sum(expected[i] for i in small))
        o.append(sum(observed[i] for i in small))
    return e, o


def power(n: int, df: int, tv: float = TV_SHIFT) -> float:
    """Power of the level-ALPHA G-test against any shift of total variation ``tv`` (noncentrality >= n (2 tv)^2)."""
    return float(stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, n * (2 * tv) ** 2))


def effective_df(pmf: torch.Tensor, n: int) -> int:
    e = (pmf.flatten() * n).tolist()
    e = [x for x in e if x > 0]
    return len(pooled(e, [0] * len(e))[0]) - 1


def frames_needed(pmf: torch.Tensor) -> int:
    """Smallest multiple of N_STEP whose G-test has power >= MIN_POWER at TV 0.03 (df depends on N via pooling)."""
    n = 2 * N_STEP
    while power(n, effective_df(pmf, n)) < MIN_POWER:
        n += N_STEP
    return n


def g_test(pmf: torch.Tensor, codes: torch.Tensor) -> tuple[float, int, float]:
    """G-test of the joint outcome of ``codes`` (N, 3) against ``pmf`` (V, V, V). Returns (p-value, df, G).

    Draws of an outcome of probability 0 make the p-value 0 (an impossible outcome is proof of a wrong sampler)."""
    n = codes.shape[0]
    flat = pmf.flatten()
    idx = (codes[:, 0] * V + codes[:, 1]) * V + codes[:, 2]
    counts = torch.bincount(idx, minlength=V ** 3).to(torch.float64)
    if float(counts[flat <= 0].sum()) > 0:
        return 0.0, -1, math.inf
    keep = flat > 0
    e, o = pooled((flat[keep] * n).tolist(), counts[keep].tolist())
    g, pval = stats.power_divergence(o, e, lambda_="log-likelihood")
    return float(pval), len(e) - 1, float(g)


def run_case(model: str, decoder, sampling: Sampling, seed: int = 1234):
    return run_on(*variant(model), decoder, sampling, seed)


def run_on(cp, context, decoder, sampling: Sampling, seed: int = 1234):
    """Decode enough frames of one context for the G-test against ``exact_pmf``; ``(pval, df, g, n, result)``."""
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    res = decode_frame(cp, context.expand(n, 2, context.shape[-1]), decoder=decoder, sampling=sampling,
                       generator=torch.Generator().manual_seed(seed))
    assert res.codes.shape == (n, N_GROUPS - 1)
    pval, df, g = g_test(pmf, res.codes)
    return pval, df, g, n, res


# ----------------------------------------------------------------------------------------------------------------
# power of the design
# ----------------------------------------------------------------------------------------------------------------
def test_power_of_the_worst_case():
    """512 outcomes all populated (df 511) is the worst case; N = 50,000 detects TV 0.03 with power >= 0.9."""
    assert power(50_000, 511) >= MIN_POWER
    assert power(40_000, 511) < MIN_POWER  # so flat cases really need the 50,000
    cp, context = variant("flat")
    pmf = exact_pmf(cp, context, DEFAULT)
    n = frames_needed(pmf)
    assert n <= 50_000 and power(n, effective_df(pmf, n)) >= MIN_POWER


def _shifted(pmf: torch.Tensor, tv: float) -> torch.Tensor:
    """pmf moved by exactly ``tv`` in total variation, in the least detectable direction of the Cauchy-Schwarz
    bound (the shift proportional to pmf: +tv spread over half the mass, -tv over the other half)."""
    flat = pmf.flatten()
    order = torch.argsort(flat, descending=True)
    in_a = torch.zeros_like(flat, dtype=torch.bool)
    in_a[order[torch.cumsum(flat[order], 0) <= 0.5]] = True
    a = float(flat[in_a].sum())
    out = torch.where(in_a, flat * (1 + tv / a), flat * (1 - tv / (1 - a)))
    assert abs(0.5 * float((out - flat).abs().sum()) - tv) < 1e-9
    return out.reshape(pmf.shape)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["flat", "peaked"])
def test_power_empirically_a_tv_0_03_shift_is_rejected(model):
    """The same N and test, AR samples of the true pmf against a pmf shifted by TV 0.03: rejected (power >= 0.9)."""
    cp, context = variant(model)
    pmf = exact_pmf(cp, context, DEFAULT)
    n = frames_needed(pmf)
    res = decode_frame(cp, context.expand(n, 2, context.shape[-1]), decoder=AR(), sampling=DEFAULT,
                       generator=torch.Generator().manual_seed(99))
    assert g_test(pmf, res.codes)[0] >= ALPHA
    pval, df, g = g_test(_shifted(pmf, TV_SHIFT), res.codes)
    assert power(n, df) >= MIN_POWER
    assert pval < ALPHA, f"TV 0.03 shift not detected: G={g:.1f} df={df} p={pval:.2e} N={n}"


def test_model_variants_are_what_the_docstring_says():
    """peaked: peaked and drafts close to p; sharp: peaked, drafts far from p; flat: near uniform."""
    for name, lo, hi in (("peaked", 0.3, 1.0), ("sharp", 0.1, 1.0), ("flat", 0.0, 0.02)):
        cp, context = variant(name)
        pmf = exact_pmf(cp, context, DEFAULT)
        assert lo <= float(pmf.max()) <= hi, (name, float(pmf.max()))
    tpc = {}
    for name in ("peaked", "sharp"):
        cp, context = variant(name)
        res = decode_frame(cp, context.expand(4000, 2, context.shape[-1]), decoder=Chain(4),
                           generator=torch.Generator().manual_seed(0))
        # 3 codes: prefill + 1 call if the draft is accepted (3/2 = 1.5 tokens per call), + 2 calls if rejected (1.0)
        tpc[name] = float(res.tokens_per_call.mean())
    assert tpc["peaked"] > 1.4 > 1.3 > tpc["sharp"], tpc


# ----------------------------------------------------------------------------------------------------------------
# positive cases: every decoder x every sampling setting once, models rotated
# ----------------------------------------------------------------------------------------------------------------
CASES = [
    ("peaked", AR(), DEFAULT),
    ("flat", AR(), HOT_TOPK3),
    ("sharp", AR(), NUCLEUS),
    ("sharp", Chain(2), DEFAULT),
    ("peaked", Chain(2), HOT_TOPK3),
    ("flat", Chain(2), NUCLEUS),
    ("peaked", Chain(4), DEFAULT),
    ("sharp", Chain(4), HOT_TOPK3),
    ("peaked", Chain(4), NUCLEUS),
    ("sharp", TREE_SMALL, DEFAULT),
    ("peaked", TREE_SMALL, HOT_TOPK3),
    ("sharp", TREE_SMALL, NUCLEUS),
    ("flat", TREE_WIDE, DEFAULT),
    ("sharp", TREE_WIDE, HOT_TOPK3),
    ("peaked", TREE_WIDE, NUCLEUS),
    ("sharp", SAMPLED_SMALL, DEFAULT),
    ("flat", SAMPLED_SMALL, NUCLEUS),
    ("sharp", SAMPLED_WIDE, HOT_TOPK3),
    ("peaked", SAMPLED_WIDE, DEFAULT),
]


def _id(case):
    model, dec, s = case
    return f"{model}-{dec!r}-T{s.temperature}-k{s.top_k}-p{s.top_p}".replace(" ", "")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_joint_distribution_matches_exact_pmf(case):
    model, decoder, sampling = case
    pval, df, g, n, res = run_case(model, decoder, sampling)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"G={g:.1f} df={df} p={pval:.2e} with N={n}: the decoder does not sample the target"
    # and it really speculated (committed more than one code per call on average) except AR
    tpc = float(res.tokens_per_call.mean())
    assert tpc == 1.0 if isinstance(decoder, AR) else tpc > 1.0


# ----------------------------------------------------------------------------------------------------------------
# the same G-test through every verify backend of the registry (each rounds its own way: the C forward, ONNX Runtime,
# inductor), and for the fused AR frame (Gumbel-max sampling inside one call)
# ----------------------------------------------------------------------------------------------------------------
BACKEND_CASES = [CASES[7], CASES[17]]  # Chain(4) and a wide sampled tree, both with residual resampling (sharp)
#: (backend, case) pairs: every backend of the registry but ``official`` (the CASES above), the native forward on both
#: cases, the others on one (compiling and exporting cost a minute each; eager is bit-identical to official anyway).
BACKEND_RUNS = [("eager", CASES[7]), ("compile", CASES[17]), ("onnx", CASES[7]), ("native", CASES[7]),
                ("native", CASES[17])]
#: Rows per decode_frame call: the exported ONNX verify graph takes batches of at most 64 (its symbolic dimension).
MAX_BATCH = {"onnx": 64}


@pytest.mark.slow
@pytest.mark.parametrize("name,case", BACKEND_RUNS, ids=[f"{n}-{_id(c)}" for n, c in BACKEND_RUNS])
def test_joint_distribution_matches_exact_pmf_through_every_backend(case, name):
    ok, why = backends.available(name)
    if not ok:
        pytest.skip(why)
    model, decoder, sampling = case
    cp, context = variant(model)
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    backend = backends.verify_backend(name, cp)
    gen = torch.Generator().manual_seed(4321)
    batch = min(n, MAX_BATCH.get(name, n))
    ctx = context.expand(batch, 2, context.shape[-1])
    codes = torch.cat([decode_frame(cp, ctx, decoder=decoder, sampling=sampling, generator=gen,
                                    backend=backend).codes for _ in range(-(-n // batch))])[:n]
    pval, df, g = g_test(pmf, codes)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"G={g:.1f} df={df} p={pval:.2e} with N={n}: decoding through {name} misses the target"


FUSED_CASES = [("peaked", DEFAULT), ("flat", HOT_TOPK3), ("sharp", DEFAULT)]


@pytest.mark.slow
@pytest.mark.parametrize("model,sampling", FUSED_CASES, ids=[f"{m}-T{s.temperature}-k{s.top_k}" for m, s in FUSED_CASES])
def test_fused_ar_frame_samples_the_exact_pmf(model, sampling):
    """The fused frame (eager: the same function the compiled graph runs) samples the AR joint distribution."""
    cp, context = variant(model)
    pmf = exact_pmf(cp, context, sampling)
    n = frames_needed(pmf)
    codes = FusedARFrame(cp, sampling, compile=False).decode(context.expand(n, 2, context.shape[-1]),
                                                             torch.Generator().manual_seed(2024))
    pval, df, g = g_test(pmf, codes)
    assert power(n, df) >= MIN_POWER
    assert pval >= ALPHA, f"G={g:.1f} df={df} p={pval:.2e} with N={n}: the fused frame does not sample the target"


@pytest.mark.slow
def test_fused_ar_frame_negative_control_uniform_noise_is_rejected():
    """Negative control: uniform noise in place of Gumbel noise (argmax of logits + U is not a softmax sample)."""
    cp, context = variant("sharp")
    pmf = exact_pmf(cp, context, DEFAULT)
    n = frames_needed(pmf)
    frame = FusedARFrame(cp, DEFAULT, compile=False)
    noise = torch.rand(n, N_GROUPS - 1, V, generator=torch.Generator().manual_seed(2024))
    pval, df, g = g_test(pmf, frame(context.expand(n, 2, context.shape[-1]), noise))
    assert pval < ALPHA, f"uniform noise passed the G-test (G={g:.1f} df={df} p={pval:.2e})"


# ----------------------------------------------------------------------------------------------------------------
# negative controls: the same test must reject deliberately broken rules
# ----------------------------------------------------------------------------------------------------------------
def _always_accept(p_resid, x, q_x):
    return torch.ones_like(x, dtype=p_resid.dtype)


def _inverted_ratio(p_resid, x, q_x):
    p_x = p_resid.gather(1, x[:, None]).squeeze(1) / p_resid.sum(-1).clamp_min(1e-30)
    return torch.clamp(q_x / p_x.clamp_min(1e-30), max=1.0)


def _residual_is_p(p_resid, x, q):
    return p_resid.clone()  # neither norm(max(p - q, 0)) nor the rejected code zeroed


def _drafts_at_temperature_1_5(q, generator):
    # q was warped at temperature 0.9: q ** (0.9 / 1.5) renormalised is the same logits at temperature 1.5
    q2 = q.clamp_min(0) ** (0.9 / 1.5)
    return torch.multinomial(q2 / q2.sum(-1, keepdim=True), 1, generator=generator).squeeze(1)


def _broken_tree_sampler(kind: str):
    """Sampled-tree drafts broken in one way each (negative controls of Sequoia's without-replacement rule).

    ``with-replacement``: siblings drawn i.i.d. from q, but handed to the verifier as if drawn without replacement
    (q_i = q minus the earlier siblings' codes, renormalised); ``not-renormalised``: drawn correctly without
    replacement, but q_i handed over without renormalising after removing the earlier codes."""

    def sampler(q, plan, node_codes, generator):
        b, _, v = q.shape
        m1 = node_codes.shape[1]
        q_nodes = torch.zeros(b, m1, v)
        for t_off, parents, children in plan.sibling_groups:
            n_par, k = children.shape
            qt = q[:, t_off - 1][:, None, :].expand(b, n_par, v)
            flat = qt.reshape(b * n_par, v)
            codes = torch.multinomial(flat, k, replacement=(kind == "with-replacement"), generator=generator)
            codes = codes.reshape(b, n_par, k)
            node_codes[:, children] = codes
            removed = torch.zeros(b, n_par, v, dtype=torch.bool)
            for i in range(k):
                qi = qt.masked_fill(removed, 0.0)
                if kind != "not-renormalised":
                    qi = qi / qi.sum(-1, keepdim=True).clamp_min(1e-30)
                q_nodes[:, children[:, i]] = qi
                removed.scatter_(2, codes[:, :, i:i + 1], True)
        return D.Draft(node_codes, q_nodes, None)

    return sampler


NEGATIVE = [
    ("always-accept-chain", Chain(4), verify, "acceptance_ratio", _always_accept),
    ("always-accept-tree", TREE_WIDE, verify, "acceptance_ratio", _always_accept),
    ("inverted-ratio-chain", Chain(4), verify, "acceptance_ratio", _inverted_ratio),
    ("residual-from-p-chain", Chain(4), verify, "residual", _residual_is_p),
    ("rejected-code-kept-tree", TREE_SMALL, verify, "residual", _residual_is_p),
    ("drafts-at-T1.5-chain", Chain(4), D, "sample_drafts", _drafts_at_temperature_1_5),
    ("with-replacement-sampled-tree", SAMPLED_SMALL, D, "sample_tree_drafts", _broken_tree_sampler("with-replacement")),
    ("not-renormalised-sampled-tree", SAMPLED_SMALL, D, "sample_tree_drafts", _broken_tree_sampler("not-renormalised")),
    ("residual-from-p-sampled-tree", SAMPLED_SMALL, verify, "residual", _residual_is_p),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,decoder,module,attr,broken", NEGATIVE, ids=[c[0] for c in NEGATIVE])
def test_negative_control_is_rejected(monkeypatch, name, decoder, module, attr, broken):
    monkeypatch.setattr(module, attr, broken)
    pval, df, g, n, _ = run_case("sharp", decoder, DEFAULT)
    assert pval < ALPHA, f"{name}: a broken sampler passed (G={g:.1f} df={df} p={pval:.2e}, N={n})"


# ----------------------------------------------------------------------------------------------------------------
# walk_tree as a pure function: hand-made p and q, two depths, exact expected joint
# ----------------------------------------------------------------------------------------------------------------
def _rand_pmf(gen, shape, v, sharp=2.0):
    return torch.softmax(sharp * torch.randn(*shape, v, generator=gen, dtype=torch.float64), -1).to(torch.float32)


def _walk_joint(p1, p2, tree_children, node_depth, node_codes, q, n_rows, gen):
    """Run walk_tree on n_rows rows; complete each row to its two codes (as the next decode round would: sampling
    depth 2 from p2[code 1] when the walk stopped after depth 1's residual). Returns (n_rows, 2) codes."""
    m1 = node_codes.shape[1]
    v = p1.shape[-1]
    p = torch.zeros(n_rows, m1, v)
    p[:, 0] = p1
    d1_nodes = (node_depth == 1).nonzero().flatten()
    for i in d1_nodes.tolist():
        p[:, i] = p2[node_codes[:, i]]
    node_valid = torch.ones(n_rows, m1, dtype=torch.bool)
    has_next = (node_depth < 2)[None].expand(n_rows, m1).clone()
    walk = verify.walk_tree(p, node_codes, tree_children, node_valid, has_next, gen, q)
    rows = torch.arange(n_rows)
    out = torch.full((n_rows, 2), -1, dtype=torch.long)
    for k in range(walk.path.shape[1]):
        on = walk.path[:, k] >= 0
        if bool(on.any()):
            out[rows[on], k] = node_codes[rows[on], walk.path[on, k]]
    na = walk.n_accepted
    has = walk.next_code >= 0
    out[rows[has], na[has]] = walk.next_code[has]
    todo = out[:, 1] < 0
    if bool(todo.any()):
        out[todo, 1] = torch.multinomial(p2[out[todo, 0]], 1, generator=gen).squeeze(1)
    assert bool((out >= 0).all())
    return out, walk


def _g_two(p1, p2, codes):
    joint = (p1.double()[:, None] * p2.double()).flatten()
    v = p1.shape[0]
    counts = torch.bincount(codes[:, 0] * v + codes[:, 1], minlength=v * v).double()
    assert float(counts[joint <= 0].sum()) == 0
    keep = joint > 0
    e, o = pooled((joint[keep] / joint.sum() * codes.shape[0]).tolist(), counts[keep].tolist())
    return float(stats.power_divergence(o, e, lambda_="log-likelihood")[1])


def test_walk_tree_sampled_chain_is_lossless():
    """Chain of two sampled drafts (V=6): joint of the two codes equals p1 x p2 exactly (G-test, 200k rows)."""
    gen = torch.Generator().manual_seed(7)
    v, n = 6, 200_000
    p1, p2 = _rand_pmf(gen, (), v), _rand_pmf(gen, (v,), v)
    q1, q2 = _rand_pmf(gen, (), v), _rand_pmf(gen, (), v)  # drafts do not see the drafted code 1 (reused heads)
    children = torch.tensor([[1], [2], [-1]])
    depth = torch.tensor([0, 1, 2])
    codes = torch.stack([torch.zeros(n, dtype=torch.long), torch.multinomial(q1.expand(n, v), 1, True, generator=gen)
                         .squeeze(1), torch.multinomial(q2.expand(n, v), 1, True, generator=gen).squeeze(1)], 1)
    q = torch.stack([torch.zeros(n, v), q1.expand(n, v), q2.expand(n, v)], 1)
    out, walk = _walk_joint(p1, p2, children, depth, codes, q, n, gen)
    assert 0 < float(walk.n_accepted.float().mean()) < 2
    assert _g_two(p1, p2, out) >= ALPHA
    # sanity: the same walk with always-accept is rejected
    mp = pytest.MonkeyPatch()
    mp.setattr(verify, "acceptance_ratio", _always_accept)
    try:
        bad, _ = _walk_joint(p1, p2, children, depth, codes, q, n, gen)
    finally:
        mp.undo()
    assert _g_two(p1, p2, bad) < ALPHA


def test_walk_tree_point_mass_tree_is_lossless():
    """Tree of top-ranked (point-mass) drafts, V=5: 3 children at the root, 2 below the first, 1 below the second."""
    gen = torch.Generator().manual_seed(8)
    v, n = 5, 200_000
    p1, p2 = _rand_pmf(gen, (), v), _rand_pmf(gen, (v,), v)
    q1, q2 = _rand_pmf(gen, (), v), _rand_pmf(gen, (), v)
    r1, r2 = q1.argsort(descending=True), q2.argsort(descending=True)
    # nodes: 0 root; 1,2,3 = ranks 0,1,2 at depth 1; 4,5 = ranks 0,1 below node 1; 6 = rank 0 below node 2
    children = torch.tensor([[1, 2, 3], [4, 5, -1], [6, -1, -1], [-1] * 3, [-1] * 3, [-1] * 3, [-1] * 3])
    depth = torch.tensor([0, 1, 1, 1, 2, 2, 2])
    row = torch.tensor([0, r1[0], r1[1], r1[2], r2[0], r2[1], r2[0]])
    codes = row[None].expand(n, -1).clone()
    out, walk = _walk_joint(p1, p2, children, depth, codes, None, n, gen)
    assert 0 < float(walk.n_accepted.float().mean()) < 2
    assert _g_two(p1, p2, out) >= ALPHA


def test_walk_tree_sampled_siblings_specinfer_rule():
    """Two root children drawn i.i.d. from q (SpecInfer multi-step rule): still exactly p1 x p2."""
    gen = torch.Generator().manual_seed(9)
    v, n = 4, 200_000
    p1, p2 = _rand_pmf(gen, (), v), _rand_pmf(gen, (v,), v)
    q1 = _rand_pmf(gen, (), v)
    children = torch.tensor([[1, 2], [-1, -1], [-1, -1]])
    depth = torch.tensor([0, 1, 1])
    codes = torch.stack([torch.zeros(n, dtype=torch.long),
                         torch.multinomial(q1.expand(n, v), 1, True, generator=gen).squeeze(1),
                         torch.multinomial(q1.expand(n, v), 1, True, generator=gen).squeeze(1)], 1)
    q = torch.stack([torch.zeros(n, v), q1.expand(n, v), q1.expand(n, v)], 1)
    out, _ = _walk_joint(p1, p2, children, depth, codes, q, n, gen)
    assert _g_two(p1, p2, out) >= ALPHA


def test_walk_tree_exact_outcome_distribution_by_enumeration():
    """Point-mass chain of 2 (V=4), exact: P(accept d1 = a) = p1(a); P(next code x | rejected) = p1(x)/(1-p1(a)) for
    x != a; compared with 400k rows to 4 standard errors per outcome of (n_accepted, path codes, next code)."""
    gen = torch.Generator().manual_seed(10)
    v, n = 4, 400_000
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    p2 = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.0, 0.5, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]])
    a, b = 2, 1  # drafted codes at depth 1 and 2
    children = torch.tensor([[1], [2], [-1]])
    codes = torch.tensor([0, a, b]).expand(n, 3)
    p = torch.zeros(n, 3, v)
    p[:, 0], p[:, 1], p[:, 2] = p1, p2[a], p2[b]  # p after node 2 (unused: depth 2 is the last)
    walk = verify.walk_tree(p, codes, children, torch.ones(n, 3, dtype=torch.bool),
                            torch.tensor([True, True, False]).expand(n, 3), gen, None)
    expected = {}
    for x in range(v):  # rejected at depth 1, next code x
        if x != a:
            expected[(0, x)] = (1 - p1[a]) * p1[x] / (1 - p1[a])
    for x in range(v):  # accepted a, rejected b, next code x
        if x != b:
            expected[(1, x)] = p1[a] * p2[a][x]
    expected[(2, -1)] = p1[a] * p2[a][b]  # both accepted, frame over
    got = {}
    for k, x in zip(walk.n_accepted.tolist(), walk.next_code.tolist()):
        got[(k, x)] = got.get((k, x), 0) + 1
    assert set(got) <= {key for key, val in expected.items() if val > 0}
    for key, pr in expected.items():
        pr = float(pr)
        se = math.sqrt(pr * (1 - pr) / n) + 1e-12
        assert abs(got.get(key, 0) / n - pr) <= 4 * se + 1e-9, (key, got.get(key, 0) / n, pr)


def test_walk_tree_p_equals_q_accepts_every_draft():
    """p == q (dyadic probabilities, so p(x)/q(x) is exactly 1): every sampled draft is accepted and the bonus code
    comes from the last node's p; point-mass drafts on a point-mass p are accepted too."""
    gen = torch.Generator().manual_seed(11)
    n, v = 20_000, 4
    pr = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.125, 0.125, 0.25, 0.5], [0.25, 0.25, 0.25, 0.25]])
    children = torch.tensor([[1], [2], [-1]])
    codes = torch.stack([torch.zeros(n, dtype=torch.long)] + [
        torch.multinomial(pr[i].expand(n, v), 1, True, generator=gen).squeeze(1) for i in (0, 1)], 1)
    p = pr[None].expand(n, 3, v).clone()
    q = torch.stack([torch.zeros(n, v), pr[0].expand(n, v), pr[1].expand(n, v)], 1)
    walk = verify.walk_tree(p, codes, children, torch.ones(n, 3, dtype=torch.bool),
                            torch.ones(n, 3, dtype=torch.bool), gen, q)
    assert bool((walk.n_accepted == 2).all())
    assert bool((walk.last_node == 2).all())
    freq = torch.bincount(walk.next_code, minlength=v).double() / n
    assert torch.allclose(freq, pr[2].double(), atol=0.02)
    # point-mass p and point-mass draft on the same code: accepted with probability 1, deterministic outcome
    one = torch.zeros(n, 3, v)
    one[:, :, 3] = 1.0
    walk = verify.walk_tree(one, torch.tensor([0, 3, 3]).expand(n, 3), children,
                            torch.ones(n, 3, dtype=torch.bool), torch.ones(n, 3, dtype=torch.bool), gen, None)
    assert bool((walk.n_accepted == 2).all()) and bool((walk.next_code == 3).all())


def test_walk_tree_point_mass_target_never_leaves_its_support():
    """p a point mass on code 1 at every depth, drafts elsewhere: every draft is rejected and the code is 1."""
    gen = torch.Generator().manual_seed(12)
    n, v = 5_000, 5
    p = torch.zeros(n, 3, v)
    p[..., 1] = 1.0
    q = _rand_pmf(gen, (n, 3), v)
    q[..., 1] = 0.0
    q = q / q.sum(-1, keepdim=True)
    children = torch.tensor([[1], [2], [-1]])
    codes = torch.stack([torch.zeros(n, dtype=torch.long),
                         torch.multinomial(q[:, 1], 1, generator=gen).squeeze(1),
                         torch.multinomial(q[:, 2], 1, generator=gen).squeeze(1)], 1)
    for qq in (q, None):  # sampled and point-mass drafts
        walk = verify.walk_tree(p, codes, children, torch.ones(n, 3, dtype=torch.bool),
                                torch.ones(n, 3, dtype=torch.bool), gen, qq)
        assert bool((walk.n_accepted == 0).all()) and bool((walk.next_code == 1).all())
    # and a draft ON the point mass is always accepted, whatever q(x) was
    codes2 = torch.tensor([0, 1, 1]).expand(n, 3)
    q2 = torch.full((n, 3, v), 1.0 / v)
    walk = verify.walk_tree(p, codes2, children, torch.ones(n, 3, dtype=torch.bool),
                            torch.ones(n, 3, dtype=torch.bool), gen, q2)
    assert bool((walk.n_accepted == 2).all()) and bool((walk.next_code == 1).all())


def test_broken_tree_samplers_draw_what_they_say():
    """The negative controls' samplers are wired as described: with replacement repeats siblings, the other does not
    (so a pass of the G-test on them could not be blamed on a sampler that never ran)."""
    cp, context = variant("flat")
    n = 4000
    seen = {}
    for kind in ("with-replacement", "not-renormalised"):
        calls = []
        real = _broken_tree_sampler(kind)

        def spy(q, plan, node_codes, generator, real=real, calls=calls):
            d = real(q, plan, node_codes, generator)
            calls.append(d.node_codes[:, 1:3].clone())  # the two root children of SAMPLED_SMALL
            return d

        mp = pytest.MonkeyPatch()
        mp.setattr(D, "sample_tree_drafts", spy)
        try:
            decode_frame(cp, context.expand(n, 2, context.shape[-1]), decoder=SAMPLED_SMALL,
                         generator=torch.Generator().manual_seed(3))
        finally:
            mp.undo()
        kids = torch.cat(calls)
        seen[kind] = float((kids[:, 0] == kids[:, 1]).float().mean())
    assert seen["with-replacement"] > 0.05 and seen["not-renormalised"] == 0.0, seen


def test_sampled_chain_shaped_tree_is_chain_draw_for_draw():
    """With one child per node a sampled Tree is exactly Chain: same seed, same codes, same calls."""
    cp, context = variant("sharp")
    ctx = context.expand(500, 2, context.shape[-1])
    a = decode_frame(cp, ctx, decoder=Chain(3), generator=torch.Generator().manual_seed(5))
    b = decode_frame(cp, ctx, decoder=Tree([(0,), (0, 0)], sampled=True), generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.codes, b.codes) and torch.equal(a.calls, b.calls)


def test_sampled_tree_commits_at_least_as_many_codes_as_its_chain():
    """Extra sampled children only recover residual mass: a sampled tree whose first-child path is Chain(N)'s chain
    commits at least as many codes per call in expectation. 20,000 frames each; the tree's mean must not fall below
    the chain's by more than 4 standard errors of the difference (false-failure rate < 1e-4 if the claim holds)."""
    cp, context = variant("sharp")
    n = 20_000
    ctx = context.expand(n, 2, context.shape[-1])
    chain = decode_frame(cp, ctx, decoder=Chain(3), generator=torch.Generator().manual_seed(1)).tokens_per_call
    tree = decode_frame(cp, ctx, decoder=Tree([(0,), (1,), (2,), (0, 0), (0, 1)], sampled=True),
                        generator=torch.Generator().manual_seed(2)).tokens_per_call
    se = math.sqrt(float(chain.var()) / n + float(tree.var()) / n)
    assert float(tree.mean()) > float(chain.mean()) - 4 * se
    assert float(tree.mean()) > float(chain.mean()) + 2 * se  # and here (drafts far from p) strictly more


def test_sampled_tree_path_needs_its_earlier_siblings():
    with pytest.raises(ValueError, match="needs its sibling"):
        Tree([(0,), (2,)], sampled=True)
    Tree([(0,), (2,)])  # fine for point-mass ranks: try rank 0, then rank 2


def _random_walk_case(seed: int):
    """A random tree (up to 12 nodes, up to 3 children), random p (some codes cut to 0), random q or point mass,
    random valid / has_next masks: one row."""
    import random as pyrandom

    from rvqspec_lib.decoding.trees import DraftTree

    rnd = pyrandom.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    paths: list[tuple[int, ...]] = []
    for _ in range(rnd.randint(1, 12)):
        parent = rnd.choice([()] + paths) if paths else ()
        if len(parent) < 4:
            kids = [p for p in paths if p[:-1] == parent and len(p) == len(parent) + 1]
            if len(kids) < 3:
                paths.append(parent + (len(kids),))
    tree = DraftTree.from_paths(paths)
    m1, v = tree.n_nodes + 1, 6
    p = _rand_pmf(gen, (1, m1), v)
    p = p * (torch.rand(1, m1, v, generator=gen) > 0.2)  # a few codes of probability 0
    p[..., 0] += 1e-3  # never an all-zero row
    p = p / p.sum(-1, keepdim=True)
    q = _rand_pmf(gen, (1, m1), v) if seed % 2 else None
    codes = torch.randint(0, v, (1, m1), generator=gen)
    valid = torch.rand(1, m1, generator=gen) > 0.15
    valid[:, 0] = True
    has_next = torch.rand(1, m1, generator=gen) > 0.2
    return p, codes, tree.children, valid, has_next, q


@pytest.mark.parametrize("seed", range(40))
def test_one_row_walk_equals_the_batched_walk(seed):
    """walk_tree on one row (Python control flow) returns exactly what the batched walk returns and leaves the
    generator in the same state: the same rule, the same random numbers in the same order."""
    p, codes, children, valid, has_next, q = _random_walk_case(seed)
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    a = verify.walk_tree_batched(p, codes, children, valid, has_next, g1, q)
    b = verify.walk_tree_one_row(p, codes, children, valid, has_next, g2, q)
    for x, y in zip((a.path, a.n_accepted, a.last_node, a.next_code), (b.path, b.n_accepted, b.last_node,
                                                                       b.next_code)):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_one_row_walk_comparison_can_fail():
    """Negative control: a one-row walk that skips the rejected child's residual is caught on some case."""
    differs = 0
    for seed in range(40):
        p, codes, children, valid, has_next, q = _random_walk_case(seed)
        a = verify.walk_tree_batched(p, codes, children, valid, has_next, torch.Generator().manual_seed(seed), q)
        mp = pytest.MonkeyPatch()
        mp.setattr(verify, "residual", lambda p_resid, x, q: p_resid.clone())
        try:
            b = verify.walk_tree_one_row(p, codes, children, valid, has_next, torch.Generator().manual_seed(seed), q)
        finally:
            mp.undo()
        differs += not (torch.equal(a.path, b.path) and torch.equal(a.next_code, b.next_code))
    assert differs > 0
