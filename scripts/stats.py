"""The library's size and the redesign's counts (``make stats``): lines, function-local imports, and how many places
build a backend or a frame, resolve a decoder name, make a label, parse one back, or run a timed loop.

    .venv/bin/python scripts/stats.py            # a table; --json for a machine-readable record

Counted by reading the code (``ast``), never by running it:

* lines: every line of ``rvqspec_lib/**/*.py`` and ``*.c`` (docstrings and blank lines included; the target counts
  these), and the Python lines by kind (code, docstring, comment, blank) to say where they are;
* function-local imports: ``import`` statements inside a function body, per layer;
* backend and frame constructions outside the registry: calls of the verify-backend and frame classes
  (:data:`BACKEND_CLASSES`) anywhere in the library, the scripts and the notebooks but their own module and
  ``models/backends.py``;
* decoder resolvers and label functions: definitions whose name says they resolve decoder names or make decoder
  labels (:data:`RESOLVER_NAMES`, :data:`LABEL_NAMES`);
* label parse-backs: string splitting or regular expressions applied to a row's ``decoder``/``label`` field or to a
  decoder label variable (a heuristic: ``.split(``, ``.rsplit(``, ``.partition(``, ``re.`` on an expression whose
  text names ``decoder``/``label`` in a subscript or attribute);
* timed loops: ``for``/``while`` loops that read ``time.perf_counter`` outside ``eval/timing.py`` and the modules
  that time a real run of their own (:data:`ALLOWED_TIMED`: a synthesis reports its frames' times).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "rvqspec_lib"
#: class name -> the module allowed to construct it (besides models/backends.py)
BACKEND_CLASSES = {"OfficialBackend": "decoding/predictor.py", "LeanCodePredictor": "device/lean.py",
                   "NativeCodePredictor": "device/native.py", "ExportedBackend": "device/export_formats.py",
                   "FusedARFrame": "device/fused.py", "FusedChainFrame": "device/fused_spec.py",
                   "NativeChainFrame": "device/native_frame.py", "ExportedFrame": "device/export_formats.py"}
#: classes whose internal use of another frame class is part of what they are (an exported frame wraps the eager one)
ALLOWED_INSIDE = {"decoding/decode.py": {"OfficialBackend"}, "device/export_formats.py": {"FusedARFrame"}, "device/export_graphs.py": {"FusedARFrame"},
                  "device/fused_spec.py": {"LeanCodePredictor"}, "device/fused.py": {"LeanCodePredictor"}}
#: modules whose loops read the clock of a real run (a synthesis times its own frames), not a benchmark
ALLOWED_TIMED = {"models/frame.py", "models/streaming.py"}
#: Packages and their line budgets (Python + C, docstrings and blank lines included): the library's core (every layer
#: of rvqspec_lib but device/ and cli/), its fast paths, its commands, the library in all, and the packages beside it.
PACKAGES = {"core": (LIB, ("device", "cli"), 10_000), "device": (LIB / "device", (), 5_000),
            "cli": (LIB / "cli", (), 1_200), "library": (LIB, (), 16_500), "bench": (ROOT / "bench", (), 1_800),
            "paper": (ROOT / "paper", (), 2_600), "recipes": (ROOT / "recipes", (), 2_500),
            "tools": (ROOT / "tools", (), 800)}
RESOLVER_NAMES = ("resolve", "resolve_all", "build_decoder", "named_decoders", "load_named_tree", "parse_decoder")
LABEL_NAMES = ("label", "decoder_label", "runner_label")


def _files(*roots: Path, suffix: str = ".py"):
    for root in roots:
        yield from sorted(p for p in root.rglob(f"*{suffix}") if "__pycache__" not in p.parts)


def _python_kinds(src: str) -> Counter:
    """A Python file's lines by kind: ``code``, ``docstring``, ``comment``, ``blank``."""
    doc: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    kinds: Counter = Counter()
    for i, line in enumerate(src.splitlines(), 1):
        s = line.strip()
        kinds["blank" if not s else "docstring" if i in doc else "comment" if s.startswith("#") else "code"] += 1
    return kinds


def count_lines() -> dict:
    """Lines of the library: Python, C, total; the Python lines by kind (code, docstring, comment, blank)."""
    kinds: Counter = Counter()
    for p in _files(LIB):
        kinds += _python_kinds(p.read_text())
    c = sum(len(p.read_text().splitlines()) for p in _files(LIB, suffix=".c"))
    py = sum(kinds.values())
    return {"python": py, "c": c, "total": py + c, "python_by_kind": dict(kinds)}


def package_lines() -> dict:
    """Lines (Python + C) of each package of :data:`PACKAGES`, with its budget: ``{name: {"lines", "budget"}}``."""
    out = {}
    for name, (root, skip, budget) in PACKAGES.items():
        n = sum(len(f.read_text().splitlines()) for suffix in (".py", ".c") for f in _files(root, suffix=suffix)
                if not (set(f.relative_to(root).parts[:1]) & set(skip)))
        out[name] = {"lines": n, "budget": budget}
    return out


def local_imports() -> Counter:
    """Function-local imports per layer (``rvqspec_lib/<layer>/``)."""
    out: Counter = Counter()
    for p in _files(LIB):
        tree = ast.parse(p.read_text())
        layer = p.relative_to(LIB).parts[0] if len(p.relative_to(LIB).parts) > 1 else "(top)"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        out[layer] += 1
    return out


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def constructions() -> list[str]:
    """``path:line Class`` of every backend or frame construction outside the registry and the class's module."""
    out = []
    for p in [*_files(LIB), *_files(ROOT / "scripts"), *_files(ROOT / "notebooks")]:
        rel = p.relative_to(LIB).as_posix() if LIB in p.parents else p.relative_to(ROOT).as_posix()
        if rel == "models/backends.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and (name := _call_name(node)) in BACKEND_CLASSES:
                if BACKEND_CLASSES[name] == rel or name in ALLOWED_INSIDE.get(rel, ()):
                    continue
                out.append(f"{rel}:{node.lineno} {name}")
    return out


def definitions(names) -> list[str]:
    """``path:line name`` of every function definition (not a method of a test) with one of ``names``."""
    out = []
    for p in _files(LIB):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                out.append(f"{p.relative_to(LIB).as_posix()}:{node.lineno} {node.name}")
    return out


def parse_backs() -> list[str]:
    """``path:line`` of string splitting or regular expressions applied to a decoder label (module docstring)."""
    out = []
    for p in [*_files(LIB), *_files(ROOT / "notebooks")]:
        src = p.read_text()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            target = None
            if isinstance(f, ast.Attribute) and f.attr in ("split", "rsplit", "partition", "rpartition"):
                target = f.value
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "re" and node.args:
                target = node.args[-1]
            if target is None:
                continue
            text = ast.get_source_segment(src, target) or ""
            if any(k in text for k in ('["decoder"]', "['decoder']", '["label"]', "['label']", ".label", "_label")):
                out.append(f"{p.relative_to(ROOT).as_posix()}:{node.lineno}")
    return out


def timed_loops() -> list[str]:
    """``path:line`` of loops that read ``time.perf_counter`` outside ``eval/timing.py``."""
    out = []
    for p in _files(LIB):
        rel = p.relative_to(LIB).as_posix()
        if rel == "eval/timing.py" or rel in ALLOWED_TIMED:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.For, ast.While)):
                if any(isinstance(s, ast.Call) and _call_name(s) == "perf_counter" for s in ast.walk(node)):
                    out.append(f"{rel}:{node.lineno}")
    return out


def stats() -> dict:
    """Everything :mod:`scripts.stats` counts (module docstring)."""
    li = local_imports()
    return {"lines": count_lines(), "packages": package_lines(), "local_imports": sum(li.values()), "local_imports_by_layer": dict(li),
            "constructions_outside_registry": constructions(), "resolvers": definitions(RESOLVER_NAMES),
            "label_functions": definitions(LABEL_NAMES), "label_parse_backs": parse_backs(),
            "timed_loops_outside_harness": timed_loops()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the record as JSON")
    s = stats()
    if ap.parse_args().json:
        print(json.dumps(s, indent=1))
        return 0
    ln = s["lines"]
    print(f"library lines: {ln['total']} (Python {ln['python']}, C {ln['c']})")
    print("lines per package against its budget (Python + C, docstrings and blank lines included):")
    for name, r in s["packages"].items():
        mark = "ok" if r["lines"] <= r["budget"] else f"OVER by {r['lines'] - r['budget']}"
        print(f"    {name:<8} {r['lines']:>6} / {r['budget']:>6}  {mark}")
    print("    Python by kind: " + ", ".join(f"{k} {ln['python_by_kind'].get(k, 0)}"
                                            for k in ("code", "docstring", "comment", "blank")))
    print(f"function-local imports: {s['local_imports']} (target <= 100): "
          + ", ".join(f"{k} {v}" for k, v in sorted(s["local_imports_by_layer"].items())))
    for key, want in (("constructions_outside_registry", 0), ("resolvers", None), ("label_functions", None),
                      ("label_parse_backs", 0), ("timed_loops_outside_harness", 0)):
        items = s[key]
        print(f"{key.replace('_', ' ')}: {len(items)}" + (f" (target {want})" if want is not None else ""))
        for it in items[:20]:
            print(f"    {it}")
        if len(items) > 20:
            print(f"    ... {len(items) - 20} more")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
