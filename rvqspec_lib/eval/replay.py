"""Acceptance tables for a timing replay (docs/precision.md#timing-replay): read, checked, turned into the oracle.

A timing replay times the speculative frames of a random-weight architecture through its real verify calls with
the acceptance decisions of a trained model (:class:`rvqspec_lib.decoding.replay.AcceptanceOracle`). This module
says where the decisions come from:

* by default (:func:`default_acceptance`) the embedded model's calibration, shipped beside it as
  ``data/embedded/model/trees/heads.json`` (notebook 03; point-mass ``rank_mass`` and sampled ``child_accept`` per
  start depth, offset and child, measured on its calibration split): the acceptance of the drafts of the reused
  heads under the deployed sampling;
* or a file the user passes (:func:`read_acceptance`, ``rvqspec bench --acceptance FILE``), in one of three shapes:

  1. a calibration file (``"format": "rvqspec-trees"``, what ``scripts/calibrate_trees.py`` writes);
  2. JSON ``{"format": "rvqspec-acceptance", "source": "<what was measured>", "point-mass": T, "sampled": T}``
     with at least one of the two kinds; ``T`` is ``[offset][child]`` (the same for every start depth) or
     ``[start depth][offset][child]``, entries in [0, 1] or null (no such node), the children of one node adding
     up to at most 1;
  3. CSV with the header ``kind,start_depth,offset,child,acceptance`` (``kind`` point-mass or sampled,
     ``start_depth`` 1..n-1 or ``*`` for every start depth, ``offset`` >= 1, ``child`` >= 0; missing entries 0).

Every problem with a file is one ValueError line naming the file and the fix, raised before any model loads.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rvqspec_lib.decoding.replay import KINDS, AcceptanceOracle

#: ``"format"`` of the JSON shape of an acceptance table.
FORMAT = "rvqspec-acceptance"
#: Header of the CSV shape.
CSV_COLUMNS = ("kind", "start_depth", "offset", "child", "acceptance")
#: Codes per frame of the architectures replayed (Qwen3-TTS: 16 codebooks, codes 1..15 in the inner loop).
N_CODES = 15
#: What a malformed file's message tells the user to do.
FIX = ("write it as docs/precision.md#timing-replay describes (or pass a calibration file, "
       "data/embedded/model/trees/heads.json), or drop --acceptance for the embedded model's")


@dataclass
class AcceptanceTable:
    """A checked acceptance table: ``tables`` ``{kind: [start depth][offset][child]}`` (n-1 start depths, floats,
    NaN where there is no node), ``label`` (what it is and where it comes from), ``path`` (the file, or None)."""

    tables: dict
    label: str
    path: str | None = None
    n_codes: int = N_CODES
    extra: dict = field(default_factory=dict)

    def oracle(self, seed: int = 0) -> AcceptanceOracle:
        """A fresh :class:`~rvqspec_lib.decoding.replay.AcceptanceOracle` over this table, its generator seeded."""
        return AcceptanceOracle(self.tables, self.label, seed=seed)

    @property
    def text(self) -> str:
        """``timing replay: acceptance of <label>, weights random``."""
        return f"timing replay: acceptance of {self.label}, weights random"

    def describe(self) -> dict:
        """JSON-able summary (provenance): label, path, the kinds and the shape of each table."""
        return {"label": self.label, "path": self.path, "n_codes": self.n_codes,
                "kinds": {k: [len(t), len(t[0]), len(t[0][0])] for k, t in self.tables.items()}}


def _bad(path, what: str) -> ValueError:
    return ValueError(f"--acceptance {path}: {what}: {FIX}")


def _num(v, path, where: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and math.isinf(v)):
        raise _bad(path, f"{where} holds {v!r}, not a probability")
    v = float(v)
    if not math.isnan(v) and not 0.0 <= v <= 1.0:
        raise _bad(path, f"{where} holds {v}, outside [0, 1]")
    return v


def check_table(kind: str, table, path, n_codes: int = N_CODES) -> list:
    """One kind's table, checked and brought to ``[start depth][offset][child]`` (n_codes - 1 start depths).

    Args:
        table: ``[offset][child]`` (broadcast to every start depth) or ``[start depth][offset][child]``.
        path: the file, for messages.

    Raises:
        ValueError: (one line naming the fix) not a rectangular table of 2 or 3 dimensions, a start-depth
            dimension other than n_codes - 1, more offsets than n_codes - 1, a value outside [0, 1], children of
            one node adding up to more than 1.
    """
    def depth_of(x):
        d = 0
        while isinstance(x, list):
            if not x:
                raise _bad(path, f"the {kind} table has an empty list")
            x, d = x[0], d + 1
        return d

    if not isinstance(table, list):
        raise _bad(path, f"the {kind} table is not a list of lists")
    dims = depth_of(table)
    if dims == 2:
        table = [table] * (n_codes - 1)
    elif dims != 3:
        raise _bad(path, f"the {kind} table has {dims} dimensions; give [offset][child] or "
                         f"[start depth][offset][child]")
    if len(table) != n_codes - 1:
        raise _bad(path, f"the {kind} table has {len(table)} start depths; the inner loop has {n_codes - 1} "
                         f"(1..{n_codes - 1})")
    k = len(table[0]) if isinstance(table[0], list) else 0
    c = len(table[0][0]) if k and isinstance(table[0][0], list) else 0
    if not 1 <= k <= n_codes - 1 or c < 1:
        raise _bad(path, f"the {kind} table needs 1..{n_codes - 1} offsets and at least one child per offset")
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


def from_calibration(cal: dict, label: str, path=None) -> AcceptanceTable:
    """An :class:`AcceptanceTable` from a calibration dict (:func:`rvqspec_lib.eval.calibration.calibrate`): both
    kinds' ``by_start_depth`` tables.

    Raises:
        ValueError: not a calibration for 15 codes per frame, or its tables malformed (:func:`check_table`).
    """
    if int(cal.get("n_codes", -1)) != N_CODES:
        raise _bad(path, f"a calibration for n_codes {cal.get('n_codes')}; the replayed architectures have {N_CODES}")
    tables = {}
    for kind in KINDS:
        rows = (cal.get(kind) or {}).get("by_start_depth")
        if rows is None:
            raise _bad(path, f"the calibration has no {kind}.by_start_depth table")
        tables[kind] = check_table(kind, rows, path)
    src = cal.get("source") or {}
    frames = cal.get("n_frames")
    return AcceptanceTable(tables, label, None if path is None else str(path),
                           extra={"n_frames": frames, "drafter": cal.get("drafter"), "split": src.get("split")})


def _read_csv(p: Path) -> dict:
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
            raise _bad(p, f"a CSV header {','.join(reader.fieldnames or [])!r}; it must be {','.join(CSV_COLUMNS)}")
        cells: dict = {}
        for i, row in enumerate(reader, 2):
            kind = (row["kind"] or "").strip()
            if kind not in KINDS:
                raise _bad(p, f"line {i}: kind {kind!r}, not one of {', '.join(KINDS)}")
            try:
                s = None if row["start_depth"].strip() == "*" else int(row["start_depth"])
                t, c, v = int(row["offset"]), int(row["child"]), float(row["acceptance"])
            except (ValueError, AttributeError):
                raise _bad(p, f"line {i}: start_depth, offset and child must be integers (start_depth may be *) and "
                              "acceptance a number") from None
            if (s is not None and not 1 <= s <= N_CODES - 1) or not 1 <= t <= N_CODES - 1 or c < 0:
                raise _bad(p, f"line {i}: start_depth 1..{N_CODES - 1} or *, offset 1..{N_CODES - 1}, child >= 0")
            for sd in (range(1, N_CODES) if s is None else (s,)):
                cells[(kind, sd, t, c)] = v
    if not cells:
        raise _bad(p, "a CSV with no rows")
    out = {}
    for kind in KINDS:
        mine = {k[1:]: v for k, v in cells.items() if k[0] == kind}
        if not mine:
            continue
        k_max = max(t for _, t, _ in mine)
        c_max = max(c for _, _, c in mine) + 1
        out[kind] = [[[mine.get((s, t, c), 0.0) for c in range(c_max)] for t in range(1, k_max + 1)]
                     for s in range(1, N_CODES)]
    return out


def read_acceptance(path) -> AcceptanceTable:
    """Read and check an acceptance table file (module docstring: the three shapes), before any model loads.

    Raises:
        ValueError: one line naming the file and the fix: no such file, unreadable, not JSON or CSV, another
            format, no table of either kind, a table of the wrong shape or with values outside [0, 1].
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--acceptance {p} is a folder: give the acceptance table file in it (a calibration .json, "
                         "or the JSON / CSV shapes of docs/precision.md#timing-replay)")
    if not p.is_file():
        raise ValueError(f"--acceptance {p}: no such file: give an acceptance table (docs/precision.md#timing-replay) "
                         "or drop --acceptance for the embedded model's")
    if p.suffix.lower() == ".csv":
        try:
            tables = _read_csv(p)
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise _bad(p, f"cannot be read as CSV ({type(e).__name__})") from None
        label = p.name
    else:
        try:
            obj = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _bad(p, f"not JSON ({type(e).__name__}; a .csv file is read as CSV)") from None
        if isinstance(obj, dict) and obj.get("format") == "rvqspec-trees":
            return from_calibration(obj, f"{p.name} ({obj.get('drafter', '?')} drafter, {obj.get('n_frames', '?')} "
                                         "calibration frames)", p)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise _bad(p, f"not an acceptance table (\"format\": \"{FORMAT}\") nor a calibration file")
        tables = {k: obj[k] for k in KINDS if obj.get(k) is not None}
        label = str(obj.get("source") or p.name)
    if not tables:
        raise _bad(p, f"no table: give {' and/or '.join(KINDS)}")
    checked = {k: check_table(k, v, p) for k, v in tables.items()}
    return AcceptanceTable(checked, label, str(p))


def default_acceptance(model: str = "embedded", drafter: str = "heads") -> AcceptanceTable:
    """The default replay table: the calibration shipped beside ``model`` (``<model>/trees/<drafter>.json``: for
    the embedded model, ``data/embedded/model/trees/heads.json``), labelled with the model, the drafter and the
    number of calibration frames it was measured on.

    Raises:
        FileNotFoundError, ValueError: no such calibration, or a damaged one (the message names the recalibrate
            command).
    """
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    path = tree_file(model, drafter)
    if path is None:
        raise ValueError(f"{model} has no folder with calibrated trees: pass --acceptance FILE")
    cal = load_calibration(path, n_codes=N_CODES, drafter=drafter)
    label = (f"the {model} model ({drafter} drafter, trees/{path.name}: {cal.get('n_frames', '?')} calibration "
             "frames)")
    return from_calibration(cal, label, path)
