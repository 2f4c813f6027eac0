"""Fitting the offline RVQ codec (:class:`rvqspec_lib.models.rvq_codec.RVQCodec`): residual k-means over stacked
log-mel frame vectors, stage after stage on what the previous stages left (SoundStream / EnCodec's residual
quantisation), k-means++ seeding (Arthur & Vassilvitskii 2007), all randomness from an explicit seed.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Iterable

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.models.audio import _load_any
from rvqspec_lib.models.rvq_codec import CodecConfig, RVQCodec, nearest


def kmeans_pp_init(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ seeding, each new centre drawn with probability ~ D(x)^2: ``x`` `(n, dim)` float32, n >= k ->
    `(k, dim)` float32 centres (rows of ``x``); ``gen`` the only randomness."""
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=gen))
    centres = [first]
    x_sq = (x * x).sum(1)
    d2 = (x_sq - 2.0 * (x @ x[first]) + x_sq[first]).clamp_min(0)
    for _ in range(1, k):
        total = float(d2.sum())
        if total <= 0:  # fewer distinct points than k: fill with random rows (duplicates are re-seeded later)
            nxt = int(torch.randint(n, (1,), generator=gen))
        else:
            nxt = int(torch.multinomial(d2, 1, generator=gen))
        centres.append(nxt)
        d2 = torch.minimum(d2, (x_sq - 2.0 * (x @ x[nxt]) + x_sq[nxt]).clamp_min(0))
    return x[torch.tensor(centres)].clone()


def kmeans(x: torch.Tensor, k: int, n_iter: int, gen: torch.Generator, init_points: int | None = None) -> torch.Tensor:
    """`(k, dim)` float32 centroids of ``x`` `(n, dim)` float32 (n >= k): Lloyd's k-means, ``gen`` the only
    randomness, k-means++ seeded on ``init_points`` random rows (``None``: ``min(n, 4 k)``; it is sequential in k);
    an emptied cluster is re-seeded at the worst-served point."""
    n = x.shape[0]
    m = min(n, init_points or 4 * k)
    sub = x if m == n else x[torch.randperm(n, generator=gen)[:m]]
    c = kmeans_pp_init(sub, k, gen)
    for _ in range(n_iter):
        idx, dist = nearest(x, c)
        counts = torch.bincount(idx, minlength=k)
        sums = torch.zeros_like(c).index_add_(0, idx, x)
        empty = counts == 0
        c = torch.where(empty[:, None], c, sums / counts.clamp_min(1)[:, None].to(x.dtype))
        if empty.any():
            far = torch.argsort(dist, descending=True)[: int(empty.sum())]
            c[empty] = x[far]
    return c


def fit_codec(wavs: Iterable, *, config: CodecConfig | None = None, max_vectors: int = 60_000, n_iter: int = 10,
              init_points: int | None = None, progress: bool = False, **config_overrides) -> RVQCodec:
    """Fit the residual codebooks on ``wavs`` (24 kHz mono float arrays or audio paths), on at most ``max_vectors``
    frame vectors (a seeded subsample), ``n_iter`` Lloyd iterations a stage, ``init_points`` as :func:`kmeans`'s;
    ``config_overrides`` replace fields of ``config``. Same audio and seed, same codebooks (single-threaded torch is
    deterministic). Raises ValueError: no audio, or fewer frame vectors than ``codebook_size``."""
    cfg = config or CodecConfig()
    if config_overrides:
        cfg = CodecConfig(**{**asdict(cfg), **config_overrides})
    feats = [RVQCodec.features_for(_load_any(w, cfg.sample_rate), cfg) for w in wavs]
    if not feats:
        raise ValueError("no audio given to fit_codec")
    x = np.concatenate(feats, 0)  # (N, dim)
    if x.shape[0] < cfg.codebook_size:
        raise ValueError(f"{x.shape[0]} frame vectors (= {x.shape[0] / cfg.frame_rate_hz:.1f} s of audio) are "
                         f"fewer than codebook_size={cfg.codebook_size}: give more audio or a smaller codebook_size")
    gen = torch.Generator().manual_seed(cfg.seed)
    xt = torch.from_numpy(x)
    if xt.shape[0] > max_vectors:
        xt = xt[torch.randperm(xt.shape[0], generator=gen)[:max_vectors]]
    xt = xt.contiguous()
    residual = xt.clone()
    books = []
    for _ in progress_bar(range(cfg.n_codebooks), desc="rvq stages", enabled=progress):
        c = kmeans(residual, cfg.codebook_size, n_iter, gen, init_points)
        idx, _ = nearest(residual, c)
        residual -= c[idx]
        books.append(c)
    return RVQCodec(cfg, torch.stack(books))
