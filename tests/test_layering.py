"""The layers of gnnc, enforced: every import, including those inside functions, goes down.

    gnnc (api, cli, inspect, testing)        may import anything
    gnnc.passes        gnnc.runtime          never each other
    gnnc.frontend, gnnc.grammar              the front end: .gnn text to IR
    gnnc.plan > gnnc.graph > gnnc.ir         the core, plus gnnc.errors, gnnc.files, gnnc.cluster, gnnc.host,
                                             gnnc.parallel

Within the core, `ir` imports neither `graph` nor `plan`, and `graph` does
not import `plan`. Within gnnc.passes, four sub-layers, bottom up:

    passes.analysis   gnnc.passes.analysis, gnnc.passes.partition, gnnc.passes.context
    passes.cost       gnnc.passes.cost: the cost model, which never imports a planner or a pass
    passes.planner    gnnc.passes.planner: the searches, pricing with the cost model
    passes            every other module of gnnc.passes: the registered passes and their manager

and no import between modules of gnnc.passes is deferred into a function (the
sub-layers leave no cycle for one to break). docs/architecture.md draws the same picture.

An import inside a function is allowed only to break a real import cycle or
to defer a heavy or optional dependency, and says which with a comment on
its line or above the run of imports it belongs to.
"""
from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

CORE_BASE = ("gnnc.errors", "gnnc.files", "gnnc.cluster", "gnnc.host", "gnnc.parallel")
# layer name -> module prefixes in it (a module is in the layer of its longest matching prefix)
LAYERS: dict[str, tuple[str, ...]] = {
    "base": CORE_BASE,
    "ir": ("gnnc.ir",),
    "graph": ("gnnc.graph",),
    "plan": ("gnnc.plan",),
    "frontend": ("gnnc.frontend", "gnnc.grammar"),
    # gnnc.passes in sub-layers, bottom up (the pass context with its analysis cache is an analysis's input)
    "passes.analysis": ("gnnc.passes.analysis", "gnnc.passes.partition", "gnnc.passes.context"),
    "passes.cost": ("gnnc.passes.cost",),
    "passes.planner": ("gnnc.passes.planner",),
    "passes": ("gnnc.passes",),
    "runtime": ("gnnc.runtime",),
    "top": ("gnnc",),
}
CORE = {"base", "ir", "graph", "plan"}
# layer -> the layers it may import (itself included)
MAY_IMPORT: dict[str, set[str]] = {
    "base": {"base"},
    "ir": {"base", "ir"},
    "graph": {"base", "ir", "graph"},
    "plan": CORE,
    "frontend": {"base", "ir", "graph", "frontend"},
    "passes.analysis": CORE | {"passes.analysis"},
    "passes.cost": CORE | {"passes.analysis", "passes.cost"},
    "passes.planner": CORE | {"passes.analysis", "passes.cost", "passes.planner"},
    "passes": CORE | {"passes.analysis", "passes.cost", "passes.planner", "passes"},
    "runtime": {"base", "ir", "graph", "plan", "runtime"},
    "top": set(LAYERS),
}


def layer_of(module: str) -> str:
    best, best_len = "top", 0
    for layer, prefixes in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def package_dirs() -> dict[str, Path]:
    """Import package -> source folder, from pyproject's package-dir (gnnc = compiler, ...)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {pkg: ROOT / folder for pkg, folder in config["package-dir"].items()}


def source_modules() -> dict[str, Path]:
    """Every gnnc module and the file it is read from."""
    dirs = package_dirs()
    out: dict[str, Path] = {}
    for pkg, folder in dirs.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path  # runtime/kernels is found twice, as the same module
    return out


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    nested: bool  # inside a function
    reason: bool  # a comment on its line or the line above


def _run_has_comment(lines: list[str], index: int) -> bool:
    """Whether the run of import lines that line `index` (0-based) belongs to starts below a comment."""
    k = index - 1
    while k >= 0 and (lines[k].lstrip().startswith(("from ", "import ")) or lines[k].startswith((" " * 8, "\t"))
                      and not lines[k].strip().startswith("#") and lines[k].strip().endswith((",", ")"))):
        k -= 1
    return k >= 0 and lines[k].strip().startswith("#")


def imports_of(module: str, path: Path) -> list[Import]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    targets = [".".join(base + ([child.module] if child.module else []))]
                else:
                    mod = child.module or ""
                    # `from gnnc.ir import ops` imports a module: count the module, not the package
                    targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in child.names]
                reason = "#" in lines[child.lineno - 1] or _run_has_comment(lines, child.lineno - 1)
                for t in dict.fromkeys(targets):  # once per statement and module
                    if t == "gnnc" or t.startswith("gnnc."):
                        found.append(Import(module, t, child.lineno, nested, reason))
            visit(child, inner)

    visit(tree, False)
    return found


MODULES = source_modules()
ALL_IMPORTS = [imp for name, path in sorted(MODULES.items()) for imp in imports_of(name, path)]


def where(imp: Import) -> str:
    path = MODULES.get(imp.importer)
    return f"{path.relative_to(ROOT) if path else imp.importer}:{imp.line}"


def violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        src, dst = layer_of(imp.importer), layer_of(imp.target)
        if dst not in MAY_IMPORT[src]:
            bad.append(f"{where(imp)}: {imp.importer} ({src}) imports "
                       f"{imp.target} ({dst})")
    return bad


def test_every_source_file_is_a_known_module() -> None:
    assert "gnnc.ir.core" in MODULES and "gnnc.passes.manager" in MODULES and "gnnc.runtime.executor" in MODULES
    assert {"gnnc.passes.analysis.layers", "gnnc.passes.cost.inputs", "gnnc.passes.planner.search"} <= set(MODULES)
    assert len(ALL_IMPORTS) > 100  # the walk found the imports (a walk that finds none would pass anything)


def test_imports_go_down() -> None:
    bad = violations(ALL_IMPORTS)
    assert not bad, "imports against the layers (see docs/architecture.md):\n" + "\n".join(bad)


def test_imports_inside_functions_say_why() -> None:
    bad = [f"{where(i)}: import of {i.target} inside a function"
           for i in ALL_IMPORTS if i.nested and not i.reason]
    assert not bad, ("an import inside a function breaks a cycle or defers a heavy dependency, and says which "
                     "in a comment:\n" + "\n".join(bad))


@pytest.mark.parametrize("importer,target", [
    ("gnnc.runtime.executor", "gnnc.passes.cost.symbols"),
    ("gnnc.passes.lower", "gnnc.runtime.comm"),
    ("gnnc.ir.core", "gnnc.graph.storage"),
    ("gnnc.graph.storage", "gnnc.plan.rows"),
    ("gnnc.plan.rows", "gnnc.runtime.comm"),
    ("gnnc.plan.shards", "gnnc.passes.manager"),
    ("gnnc.frontend.elaborate", "gnnc.passes.manager"),
    ("gnnc.ir.ops", "gnnc.api"),
])
def test_an_upward_import_is_caught(importer: str, target: str) -> None:
    assert violations([Import(importer, target, 1, True, True)])


def test_a_nested_import_inside_a_function_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from gnnc.runtime import comm\n    return comm\n")
    [imp] = imports_of("gnnc.passes.m", path)
    assert imp.nested and not imp.reason and imp.target == "gnnc.runtime.comm"
    assert violations([imp])


@pytest.mark.parametrize("module,layer", [
    ("gnnc.passes.analysis.layers", "passes.analysis"),
    ("gnnc.passes.partition.stats", "passes.analysis"),
    ("gnnc.passes.context", "passes.analysis"),
    ("gnnc.passes.cost.ops", "passes.cost"),
    ("gnnc.passes.planner.search", "passes.planner"),
    ("gnnc.passes.choose_strategy", "passes"),
    ("gnnc.passes.manager", "passes"),
])
def test_passes_sub_layer_of(module: str, layer: str) -> None:
    assert module in MODULES and layer_of(module) == layer


@pytest.mark.parametrize("importer,target", [
    ("gnnc.passes.cost.ops", "gnnc.passes.planner.search"),  # the cost model asking the planner
    ("gnnc.passes.cost.schedule", "gnnc.passes.planner.search"),
    ("gnnc.passes.cost.fit", "gnnc.passes.predict_bytes"),  # the cost model reading a pass
    ("gnnc.passes.analysis.layers", "gnnc.passes.cost.symbols"),  # an analysis reading the cost model
    ("gnnc.passes.partition.stats", "gnnc.passes.cost.symbols"),
    ("gnnc.passes.context", "gnnc.passes.manager"),
    ("gnnc.passes.planner.sampled", "gnnc.passes.choose_strategy"),  # a planner reading a pass
    ("gnnc.passes.planner.segment_dp", "gnnc.passes.manager"),
])
def test_an_upward_import_inside_passes_is_caught(importer: str, target: str) -> None:
    assert violations([Import(importer, target, 1, False, False)])


@pytest.mark.parametrize("importer,target", [
    ("gnnc.passes.choose_strategy", "gnnc.passes.planner.search"),
    ("gnnc.passes.planner.search", "gnnc.passes.cost.inputs"),
    ("gnnc.passes.cost.inputs", "gnnc.passes.partition.stats"),
    ("gnnc.passes.cost.ops", "gnnc.passes.analysis.layers"),
])
def test_a_downward_import_inside_passes_is_allowed(importer: str, target: str) -> None:
    assert not violations([Import(importer, target, 1, False, False)])


def test_an_upward_import_in_a_cost_module_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from gnnc.passes.planner.search import choose\n")
    [imp] = imports_of("gnnc.passes.cost.m", path)
    assert not imp.nested and imp.target == "gnnc.passes.planner.search"
    assert violations([imp]) == [f"gnnc.passes.cost.m:1: gnnc.passes.cost.m (passes.cost) imports "
                                 f"gnnc.passes.planner.search (passes.planner)"]


def test_no_import_between_passes_modules_is_deferred() -> None:
    """A deferred import between two modules of gnnc.passes was there to hold a cycle open; the sub-layers
    leave none (a heavy dependency deferred into a function is torch or matplotlib, never a pass module)."""
    bad = [f"{where(i)}: import of {i.target} inside a function" for i in ALL_IMPORTS
           if i.nested and layer_of(i.importer).startswith("passes") and layer_of(i.target).startswith("passes")]
    assert not bad, "\n".join(bad)


def import_cycle(imports: list[Import]) -> list[str] | None:
    """A cycle of the modules' imports (those inside functions too), or None."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := cycle_from(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := cycle_from(start, [])):
            return found
    return None


def test_the_passes_import_no_cycle() -> None:
    found = import_cycle([i for i in ALL_IMPORTS
                          if layer_of(i.importer).startswith("passes") and layer_of(i.target).startswith("passes")])
    assert found is None, "an import cycle in gnnc.passes: " + " -> ".join(found)


def test_no_import_cycle_anywhere() -> None:
    """No deferred import holds a cycle open: with the imports inside functions counted, gnnc's modules import
    each other without a cycle (the package `gnnc`, whose names load on first use, aside)."""
    found = import_cycle([i for i in ALL_IMPORTS if "gnnc" not in (i.importer, i.target)])
    assert found is None, "an import cycle: " + " -> ".join(found)


def test_a_cycle_held_open_by_a_deferred_import_is_found(tmp_path: Path) -> None:
    fusion, rng = tmp_path / "fusion.py", tmp_path / "rng.py"  # as fusion and the executor were
    fusion.write_text("from gnnc.runtime import rng\n")
    rng.write_text("def f():\n    from gnnc.runtime import fusion  # deferred: fusion imports this module\n")
    found = import_cycle([*imports_of("gnnc.runtime.fusion", fusion), *imports_of("gnnc.runtime.rng", rng)])
    assert found is not None and set(found) == {"gnnc.runtime.fusion", "gnnc.runtime.rng"}


def test_the_run_time_memory_check_reads_analyses_and_the_cost_model_only() -> None:
    reads = {layer_of(i.target) for i in ALL_IMPORTS if i.importer == "gnnc.memory_check"}
    passes = {layer for layer in reads if layer.startswith("passes")}
    assert passes and passes <= {"passes.analysis", "passes.cost"}, passes
