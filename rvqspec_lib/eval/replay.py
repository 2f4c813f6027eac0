"""Timing replay (docs/precision.md#timing-replay): a trained model's acceptance replayed on a random-weight
architecture through the decode round's acceptance hook (:class:`AcceptanceOracle`), every other step run unchanged,
the frame sealed (codes all -1). Tables from the embedded model's calibration (:func:`default_acceptance`) or a file
(:func:`read_acceptance`)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from rvqspec_lib.decoding.verify import WalkResult
from rvqspec_lib.eval.calibration import KINDS
from rvqspec_lib.models.tree_files import load_calibration, tree_file

#: ``"format"`` of the JSON shape of an acceptance table.
FORMAT = "rvqspec-acceptance"
#: Codes per frame of the architectures replayed (Qwen3-TTS: 16 codebooks, codes 1..15 in the inner loop).
N_CODES = 15
#: What a malformed file's message tells the user to do.
FIX = ("write it as docs/precision.md#timing-replay describes (or pass a calibration file, "
       "data/embedded/model/trees/heads.json), or drop --acceptance for the embedded model's")


def _bad(path, what: str) -> ValueError:
    return ValueError(f"--acceptance {path}: {what}: {FIX}" if path else f"acceptance table: {what}")


class AcceptanceOracle:
    """A checked acceptance table, and the acceptance hook of ``decode_frame`` that replays it (module docstring).

    Args:
        tables: ``{"point-mass": T, "sampled": T}`` (either may be absent), ``T`` ``[start depth][offset][child]`` or
            ``[offset][child]``: the probability that child i at offset t from start depth s is accepted once its
            parent is reached (NaN or None: no node; :func:`check_table`).
        label: what the table is (:attr:`text`). path: its file, or ``None``.
        seed: of the oracle's own generator (the decoder's is left to drafts and prefill).

    Raises:
        ValueError: an unknown kind, no table, a table :func:`check_table` refuses (one line).
    """

    def __init__(self, tables, label: str, *, seed: int = 0, path=None):
        if not tables or any(k not in KINDS for k in tables):
            raise _bad(path, f"give a table for some of {', '.join(KINDS)}, got {list(tables)}")
        self.tables = {k: check_table(k, t, path) for k, t in tables.items()}  # [s][t][i], NaN: no node
        self.label, self.seed, self.path = str(label), int(seed), path
        self.generator = torch.Generator().manual_seed(self.seed)
        self._plans: dict = {}

    def oracle(self, seed: int = 0) -> "AcceptanceOracle":
        """A fresh oracle over the same table, its generator seeded with ``seed``."""
        return AcceptanceOracle(self.tables, self.label, seed=seed, path=self.path)

    @property
    def text(self) -> str:
        """The words every output of a replay carries: ``timing replay: acceptance of <label>, weights random``."""
        return f"timing replay: acceptance of {self.label}, weights random"

    def describe(self) -> dict:
        """JSON-able summary (provenance): label, path, the kinds and the shape of each table."""
        return {"label": self.label, "path": None if self.path is None else str(self.path), "n_codes": N_CODES,
                "kinds": {k: [len(t), len(t[0]), len(t[0][0])] for k, t in self.tables.items()}}

    def probability(self, kind: str, start_depth: int, offset: int, index: int) -> float:
        """The entry for (kind, start depth s >= 1, offset t >= 1, child index i >= 0); 0 outside the table and
        where there is no node.

        Raises:
            ValueError: a kind this oracle has no table for.
        """
        if kind not in self.tables:
            raise ValueError(f"this replay has no {kind} acceptance table: pass one with both kinds "
                             "(rvqspec bench frames|table --acceptance FILE; docs/precision.md#timing-replay)")
        t = self.tables[kind]
        if not (1 <= start_depth <= len(t) and 1 <= offset <= len(t[0]) and 0 <= index < len(t[0][0])):
            return 0.0
        v = t[start_depth - 1][offset - 1][index]
        return 0.0 if math.isnan(v) else v

    def _static(self, plan) -> tuple:
        """A plan's children lists, child indices (its last path entry), depths and kind, cached per plan."""
        got = self._plans.get(id(plan))
        if got is None or got[0] is not plan:
            kids = [[c for c in row if c >= 0] for row in plan.children.tolist()]
            got = (plan, kids, [0] + plan.rank.tolist(), plan.depth.tolist(),
                   "sampled" if plan.sampled else "point-mass")
            self._plans[id(plan)] = got
        return got[1:]

    def walk(self, plan, state, drafted, verified) -> WalkResult:
        """The accept step of one round, replayed: the :class:`~rvqspec_lib.decoding.verify.WalkResult` the lossless
        walk returns, decided from the table (one uniform of the oracle's generator per level picks a child, or none;
        the code after the path drawn from the verifier's p there). Arguments: the round's plan, state (``s``: the
        start depth), draft (unused) and verify outcome."""
        kids, index, depth, kind = self._static(plan)
        b, dev = verified.p.shape[0], verified.p.device
        levels = max(plan.tree.max_depth, 1)
        u = torch.rand(b, levels, generator=self.generator, dtype=torch.float64).tolist()
        valid, fed, starts = verified.node_valid.tolist(), verified.fed.tolist(), state.s.tolist()
        path_t = torch.full((b, levels), -1, dtype=torch.long)
        last = []
        for row in range(b):
            cur = 0
            for level in range(levels):
                acc, chosen = 0.0, None
                for c in kids[cur]:
                    if valid[row][c]:
                        acc += self.probability(kind, starts[row], depth[c], index[c])
                        if u[row][level] < acc:
                            chosen = c
                            break
                if chosen is None:
                    break
                cur = path_t[row, level] = chosen
            last.append(cur)
        last_t = torch.tensor(last, dtype=torch.long)
        nxt = torch.tensor([fed[row][last[row]] for row in range(b)], dtype=torch.bool)
        p_last = verified.p[torch.arange(b, device=dev), last_t.to(dev)].float().cpu()
        code = torch.multinomial(torch.where(nxt[:, None], p_last, torch.ones_like(p_last)), 1,
                                 generator=self.generator).squeeze(1)
        code = torch.where(nxt, code, torch.full_like(code, -1))
        return WalkResult(path_t.to(dev), (path_t >= 0).sum(1).to(dev), last_t.to(dev), code.to(dev))

    def seal(self, result):
        """A replayed frame's :class:`~rvqspec_lib.decoding.decode.FrameResult` with codes all -1 and ``replay`` set to
        :attr:`text` (a replay never produces audio)."""
        return dataclasses.replace(result, codes=torch.full_like(result.codes, -1), replay=self.text)

    def __repr__(self) -> str:
        return f"AcceptanceOracle({self.text!r}, seed={self.seed})"


def _num(v, path, where: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and math.isinf(v)):
        raise _bad(path, f"{where} holds {v!r}, not a probability")
    if not math.isnan(v) and not 0.0 <= v <= 1.0:
        raise _bad(path, f"{where} holds {v}, outside [0, 1]")
    return float(v)


def check_table(kind: str, table, path) -> list:
    """One kind's table, checked and brought to ``[start depth][offset][child]`` (:data:`N_CODES` - 1 start depths) from
    ``[offset][child]`` (every start depth alike) or ``[start depth][offset][child]``; ``path``: for messages.

    Raises:
        ValueError: (one line) not rectangular of 2 or 3 dimensions, another number of start depths, too many
            offsets, a value outside [0, 1], children of one node adding up to more than 1.
    """
    if not isinstance(table, list):
        raise _bad(path, f"the {kind} table is not a list of lists")
    dims, x = 0, table
    while isinstance(x, list):
        if not x:
            raise _bad(path, f"the {kind} table has an empty list")
        x, dims = x[0], dims + 1
    if dims not in (2, 3):
        raise _bad(path, f"the {kind} table has {dims} dimensions; give [offset][child] or "
                         f"[start depth][offset][child]")
    table = [table] * (N_CODES - 1) if dims == 2 else table
    if len(table) != N_CODES - 1:
        raise _bad(path, f"the {kind} table has {len(table)} start depths; the inner loop has {N_CODES - 1} "
                         f"(1..{N_CODES - 1})")
    k = len(table[0]) if isinstance(table[0], list) else 0
    c = len(table[0][0]) if k and isinstance(table[0][0], list) else 0
    if not 1 <= k <= N_CODES - 1 or c < 1:
        raise _bad(path, f"the {kind} table needs 1..{N_CODES - 1} offsets and at least one child per offset")
    out = []
    for s, rows in enumerate(table, 1):
        if not isinstance(rows, list) or len(rows) != k:
            raise _bad(path, f"the {kind} table is not rectangular (start depth {s}: not {k} offsets)")
        block = []
        for t, row in enumerate(rows, 1):
            if not isinstance(row, list) or len(row) != c:
                raise _bad(path, f"the {kind} table is not rectangular (start depth {s}, offset {t}: not {c} "
                                 "children)")
            vals = [_num(v, path, f"the {kind} table at start depth {s}, offset {t}") for v in row]
            if sum(v for v in vals if not math.isnan(v)) > 1 + 1e-6:
                raise _bad(path, f"the {kind} table's children at start depth {s}, offset {t} add up to more than 1 "
                                 "(each entry is the probability that THIS child is the one accepted)")
            block.append(vals)
        out.append(block)
    return out


def from_calibration(cal: dict, label: str, path=None) -> AcceptanceOracle:
    """An oracle over a calibration's (:func:`rvqspec_lib.eval.calibration.calibrate`) ``by_start_depth`` tables.

    Raises:
        ValueError: not a calibration for 15 codes per frame, or its tables malformed (:func:`check_table`).
    """
    if int(cal.get("n_codes", -1)) != N_CODES:
        raise _bad(path, f"a calibration for n_codes {cal.get('n_codes')}; the replayed architectures have {N_CODES}")
    return AcceptanceOracle({k: (cal.get(k) or {}).get("by_start_depth") for k in KINDS}, label, path=path)


def read_acceptance(path) -> AcceptanceOracle:
    """Read and check an acceptance table file (a calibration JSON or the acceptance JSON), before any model loads.

    Raises:
        ValueError: one line naming the file and the fix: missing, unreadable, another format, no table, a bad table.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--acceptance {p} is a folder: give the acceptance table file in it (a calibration .json, "
                         "or the JSON shape of docs/precision.md#timing-replay)")
    if not p.is_file():
        raise ValueError(f"--acceptance {p}: no such file: give an acceptance table (docs/precision.md#timing-replay) "
                         "or drop --acceptance for the embedded model's")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(p, f"not JSON ({type(e).__name__})") from None
    if isinstance(obj, dict) and obj.get("format") == "rvqspec-trees":
        return from_calibration(obj, f"{p.name} ({obj.get('drafter', '?')} drafter, {obj.get('n_frames', '?')} "
                                     "calibration frames)", p)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise _bad(p, f"not an acceptance table (\"format\": \"{FORMAT}\") nor a calibration file")
    tables, label = {k: obj[k] for k in KINDS if obj.get(k) is not None}, str(obj.get("source") or p.name)
    if not tables:
        raise _bad(p, f"no table: give {' and/or '.join(KINDS)}")
    return AcceptanceOracle(tables, label, path=p)


def default_acceptance() -> AcceptanceOracle:
    """The default replay table: the embedded model's calibration of the reused heads (``trees/heads.json``),
    labelled with the model, the drafter and its calibration frames.

    Raises:
        FileNotFoundError, ValueError: no such calibration, or a damaged one.
    """
    path = tree_file("embedded", "heads")
    cal = load_calibration(path, n_codes=N_CODES, drafter="heads")
    label = f"the embedded model (heads drafter, trees/{path.name}: {cal.get('n_frames', '?')} calibration frames)"
    return from_calibration(cal, label, path)
