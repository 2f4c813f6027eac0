"""The package's layers show in its folders, and imports only go downwards (docs/architecture.md).

Every ``import`` and ``from ... import`` in ``rvqspec_lib`` and in the packages beside it (``bench``, ``paper``,
``recipes``, ``tools``) is parsed, those inside functions included, so a lazy import cannot hide a cycle. Three
checks: no library module imports a module of a HIGHER layer, the library imports none of the packages beside it
(each of those imports the library and only the neighbours named in :data:`BESIDE`), and the module graph has no
cycle. A negative control proves each check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "rvqspec_lib"

#: Layers of the library from the bottom up: a module may import modules of its own layer or of a lower one.
LAYERS = ("common", "decoding", "device", "models", "data", "eval", "training", "cli")
#: The packages beside the library -> the top-level packages each may import (the library never imports them).
BESIDE = {"bench": {"rvqspec_lib", "bench"}, "paper": {"rvqspec_lib", "bench", "paper"},
          "recipes": {"rvqspec_lib", "recipes"}, "tools": {"rvqspec_lib", "tools"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, me: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """Modules of ``rvqspec_lib`` that module ``me`` (its ``source``) imports anywhere in its body, functions
    included, resolved to the known modules (``from rvqspec_lib.decoding import verify`` is ``rvqspec_lib.decoding.verify``)."""
    package = me if is_package else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # ``from pkg import mod`` depends on pkg.mod; ``from mod import name`` on mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != me:
                out.add(n)
    return out


def graph() -> dict[str, set[str]]:
    files = sorted(f for top in ("rvqspec_lib", *BESIDE) for f in (REPO / top).rglob("*.py"))
    known = {module_name(f) for f in files}
    return {module_name(f): imports_of(f.read_text(), module_name(f), known, is_package=f.name == "__init__.py")
            for f in files}


def layer(module: str) -> int | None:
    """A library module's layer (index in :data:`LAYERS`; -1: in no layer), None for the library's own ``__init__``
    (the public API, above every layer) and for the packages beside the library (checked by :func:`beside_imports`)."""
    parts = module.split(".")
    if parts[0] != "rvqspec_lib" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else -1


def beside_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports that cross between top-level packages against :data:`BESIDE` (the library imports none of them)."""
    bad = []
    for mod, deps in g.items():
        top = mod.split(".")[0]
        allowed = BESIDE.get(top, {"rvqspec_lib"})
        bad += [f"{mod} imports {d}" for d in deps if d.split(".")[0] not in allowed]
    return sorted(bad)


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        lm = layer(mod)
        if lm is None:
            continue
        for d in deps:
            ld = layer(d)
            if d.split(".")[0] == "rvqspec_lib" and (ld is None or ld > lm):
                bad.append(f"{mod} imports {d} (a higher layer)")
    return sorted(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (iterative depth-first search)."""
    state: dict[str, int] = {}
    for root in g:
        if state.get(root):
            continue
        stack = [(root, iter(sorted(g[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            if nxt not in g:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(g[nxt]))))
                path.append(nxt)
    return None


def test_every_module_belongs_to_a_layer():
    orphans = [m for m in graph() if layer(m) == -1]
    assert not orphans, f"modules outside the layers {LAYERS}: {orphans} (move them into a layer's folder)"


def test_imports_only_go_downwards():
    bad = upward_imports(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_lossless_core_imports_no_other_layer():
    g = graph()
    bad = [f"{m} imports {d}" for m, deps in g.items() if m.startswith("rvqspec_lib.decoding") for d in deps
           if not d.startswith("rvqspec_lib.decoding")]
    assert not bad, "rvqspec_lib.decoding must stand on torch and transformers alone:\n" + "\n".join(bad)


def test_the_library_imports_nothing_beside_it():
    bad = beside_imports(graph())
    assert not bad, "imports across the packages (rvqspec_lib imports none of bench, paper, recipes, tools):\n" + "\n".join(bad)


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_can_fail():
    """Negative controls: a planted upward import, a planted cycle, and lazy or relative imports inside a function."""
    g = graph()
    planted = {**g, "rvqspec_lib.decoding.verify": g["rvqspec_lib.decoding.verify"] | {"rvqspec_lib.cli.main"}}
    assert upward_imports(planted) == ["rvqspec_lib.decoding.verify imports rvqspec_lib.cli.main (a higher layer)"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    lazy = "def f():\n    from rvqspec_lib.eval import acceptance\n    from ..models import loader\n    import bench.floor\n"
    found = imports_of(lazy, "rvqspec_lib.decoding.probe", set(g))
    assert found == {"rvqspec_lib.eval.acceptance", "rvqspec_lib.models.loader", "bench.floor"}
    assert upward_imports({**g, "rvqspec_lib.decoding.probe": found})
    assert beside_imports({**g, "rvqspec_lib.decoding.probe": found}) == [
        "rvqspec_lib.decoding.probe imports bench.floor"]
    assert beside_imports({**g, "tools.probe": {"paper.plots"}}) == ["tools.probe imports paper.plots"]


@pytest.mark.parametrize("name", [f"rvqspec_lib/{n}" for n in LAYERS] + list(BESIDE))
def test_each_layer_is_documented(name):
    init = REPO / name / "__init__.py"
    assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{init} needs a docstring saying its job"
