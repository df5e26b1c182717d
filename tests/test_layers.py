"""The architecture of CONTRIBUTING.md ("The layers"), checked by parsing every module of src/specrepro with `ast`
(nothing is imported).

Layers point down only; no import cycles; no module reaches into another's private names; every path is computed in
`paths`. Every import of a package module counts, including the ones inside functions. (No `def`/`class` in
notebooks is checked in test_pipeline.py.)
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "specrepro"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE

# layer of each module: imports may only point to the same or a lower layer
LAYERS = {
    # 0 inputs
    "paths": 0, "data": 0, "sandbox": 0,
    # 1 the algorithm
    "sampling": 1, "kvcache": 1, "protocol": 1, "native": 1, "compiled": 1, "generate": 1,
    # 2 the models
    "models": 2, "drafts": 2, "distill": 2, "train": 2, "kernels": 2, "gemv": 2, "tiny": 2,
    "lens": 2, "ladder": 2, "eagle": 2, "eagle_train": 2, "engines": 2,
    # 3 the measurements
    "theory": 3, "flops": 3, "timing": 3, "bench": 3, "walltime": 3, "numerics": 3, "distribution": 3,
    "acceptance": 3, "equivalence": 3, "batching": 3, "intervals": 3, "quality": 3, "sweep": 3, "verdicts": 3,
    "audit": 3, "served": 3,
    # 4 the reproducibility plumbing
    "report": 4, "pipeline": 4, "reproduce": 4, "summary": 4,
}
# inside layer 0 the order is stricter: paths is the root everyone may import
INPUTS_MAY_IMPORT = {"paths": set(), "sandbox": {"paths"}, "data": {"paths", "sandbox"}}
EXEMPT = {"__init__"}

PATH_FRAGMENTS = ("data/cache", "data/models", "data/prompts", "outputs/")
TOP_FOLDERS = {"data", "outputs"}  # joined onto a root with `/`, they rebuild the layout paths.py owns


@cache
def modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(SRC.glob("*.py"))}


def _target(name: str | None) -> str:
    """Package module named by `name` (a dotted path below the package, or None for the package itself)."""
    return name.split(".")[0] if name else "__init__"


def _from_package(node: ast.ImportFrom) -> tuple[bool, str | None]:
    """(whether `from ... import` reads the package, the dotted module path below the package or None)."""
    if node.level == 1:
        return True, node.module
    if node.level == 0 and node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
        return True, node.module.partition(".")[2] or None
    return False, None


def package_imports(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """(line, imported package module, names taken from it) for every import of the package, at any depth.
    `from . import x` counts as an import of module x when x is a module, else of the package's `__init__`."""
    names = set(modules())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append((node.lineno, _target(alias.name.partition(".")[2] or None), []))
        elif isinstance(node, ast.ImportFrom):
            ours, below = _from_package(node)
            if not ours:
                continue
            if below is None:  # from . import a, b
                for alias in node.names:
                    if alias.name in names:
                        found.append((node.lineno, alias.name, []))
                    else:
                        found.append((node.lineno, "__init__", [alias.name]))
            else:
                found.append((node.lineno, _target(below), [alias.name for alias in node.names]))
    return found


def module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to package modules (`from . import paths`, `import specrepro.theory as theory`)."""
    names = set(modules())
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            ours, below = _from_package(node)
            if ours and below is None:
                bound |= {alias.asname or alias.name: alias.name for alias in node.names if alias.name in names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    if alias.asname:
                        bound[alias.asname] = _target(alias.name.partition(".")[2] or None)
                    else:
                        bound[PACKAGE] = "__init__"
    return bound


def graph() -> dict[str, set[str]]:
    return {name: {dep for _, dep, _ in package_imports(tree) if dep != name} for name, tree in modules().items()}


def test_every_module_has_a_layer():
    unplaced = sorted(set(modules()) - set(LAYERS) - EXEMPT)
    assert not unplaced, (f"modules without a layer: {unplaced}. Add each to LAYERS in tests/test_layers.py "
                          "(0 inputs, 1 algorithm, 2 models, 3 measurements, 4 plumbing; see CONTRIBUTING.md)")
    gone = sorted(set(LAYERS) - set(modules()))
    assert not gone, f"LAYERS names modules that no longer exist: {gone}; remove them from tests/test_layers.py"


def test_imports_point_down_the_layers():
    bad = []
    for name, tree in modules().items():
        if name in EXEMPT or name not in LAYERS:
            continue
        for line, dep, _ in package_imports(tree):
            if dep == name:
                continue
            if dep == "__init__":
                bad.append(f"{name}.py:{line} imports from the package's __init__; import the defining module")
            elif dep not in LAYERS:
                continue  # reported by test_every_module_has_a_layer
            elif LAYERS[dep] > LAYERS[name]:
                bad.append(f"{name}.py:{line} (layer {LAYERS[name]}) imports {dep} (layer {LAYERS[dep]})")
            elif name in INPUTS_MAY_IMPORT and dep not in INPUTS_MAY_IMPORT[name]:
                allowed = sorted(INPUTS_MAY_IMPORT[name]) or "nothing from the package"
                bad.append(f"{name}.py:{line} imports {dep}; {name} may import {allowed}")
    assert not bad, "imports must point to the same or a lower layer:\n" + "\n".join(bad)


def test_no_import_cycles():
    deps = graph()
    # Tarjan's strongly connected components: any component of two or more modules is a cycle
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    detail = [", ".join(f"{a} -> {sorted(deps[a] & set(c))}" for a in c) for c in cycles]
    assert not cycles, "import cycles among package modules (function-level imports included):\n" + "\n".join(detail)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_modules_private_names():
    bad = []
    for name, tree in modules().items():
        for line, dep, taken in package_imports(tree):
            if dep == name:
                continue
            bad += [f"{name}.py:{line} imports {n} from {dep}" for n in taken if _private(n)]
            if _private(dep):
                bad.append(f"{name}.py:{line} imports the private module {dep}")
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, name) != name):
                bad.append(f"{name}.py:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "make a shared helper public (and test it) instead of reaching into a module:\n" + "\n".join(bad)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    owners = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                              ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in owners if n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant) and isinstance(n.body[0].value.value, str)}


def test_no_file_anchoring_outside_paths():
    bad = []
    for name, tree in modules().items():
        if name == "paths":
            continue
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "__file__":
                bad.append(f"{name}.py:{node.lineno} uses __file__")
            # a third-party module's __file__ (where it is installed) is not a path of this repository
            elif (isinstance(node, ast.Attribute) and node.attr == "__file__" and isinstance(node.value, ast.Name)
                  and node.value.id in aliases):
                bad.append(f"{name}.py:{node.lineno} uses {node.value.id}.__file__")
    assert not bad, "anchor paths in specrepro.paths, not on a module's file:\n" + "\n".join(bad)


def test_no_repository_paths_spelled_outside_paths():
    # a string naming a repository folder, without whitespace (prose such as an error or help message that mentions
    # outputs/<name>/ has spaces; docstrings are skipped), or a top folder name joined with `/`
    bad = []
    for name, tree in modules().items():
        if name == "paths":
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                if any(f in text for f in PATH_FRAGMENTS) and not any(c.isspace() for c in text):
                    bad.append(f"{name}.py:{node.lineno} spells the path {text!r}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and side.value in TOP_FOLDERS:
                        bad.append(f"{name}.py:{node.lineno} joins {side.value!r} onto a path")
    assert not bad, "use the locations in specrepro.paths (DATA, MODELS, PROMPTS, CACHE, OUTPUTS):\n" + "\n".join(bad)
