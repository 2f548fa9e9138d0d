"""The layer contract, checked over the import graph of the repository's source.

Every module is parsed with :mod:`ast` (nothing is imported, so the check needs no extra and
sees modules whose dependencies are missing). An import counts wherever it is written: at module
level, inside a function, or as a literal module name given to ``importlib.import_module``,
``__import__`` or ``importlib.resources.files``. The rules (DESIGN.md, "Layers"):

1. the privacy layer (``securefed`` and its own subpackages, the files under securefed/) imports
   nothing of securefed.recsys, securefed.rl, securefed.attacks or securefed.bench;
2. securefed.recsys and securefed.rl import nothing of securefed.attacks or securefed.bench;
3. securefed.attacks imports nothing of securefed.bench;
4. no module (tests included) imports the old top-level names recsys, rl, attacks, benchmarks or
   securefed_cli: installed, they are someone else's distributions;
5. no cycle among module-level imports (imports under ``if TYPE_CHECKING:`` never run);
6. no cycle either once the imports inside functions are added: a lazy import that closes a
   loop (``rl/fast.py`` and ``rl/fedhpd.py`` once) hides a cycle, it does not remove it;
7. library code (every layer but securefed.bench) configures nothing process-wide: no thread
   count, plotting backend, pyplot or global seed (the app layer sets what it needs).

The checker is tested on a small synthetic tree with one planted violation of each kind.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

LAYER_PACKAGES = {
    "securefed.recsys": "recsys",
    "securefed.rl": "rl",
    "securefed.attacks": "attacks",
    "securefed.bench": "bench",
}
"""Subpackages of ``securefed`` that are layers of their own; the rest is the privacy layer."""
FORBIDDEN = {
    "privacy": frozenset({"recsys", "rl", "attacks", "bench"}),
    "recsys": frozenset({"attacks", "bench"}),
    "rl": frozenset({"attacks", "bench"}),
    "attacks": frozenset({"bench"}),
    "bench": frozenset(),
    "tests": frozenset(),
}
OLD_NAMES = frozenset({"recsys", "rl", "attacks", "benchmarks", "securefed_cli"})
GLOBAL_SETTERS = frozenset(
    {
        "torch.set_num_threads",
        "torch.set_num_interop_threads",
        "torch.manual_seed",
        "torch.set_default_dtype",
        "matplotlib.use",
        "plt.switch_backend",
        "np.random.seed",
        "numpy.random.seed",
        "random.seed",
    }
)
"""Calls that change the whole process: library code leaves them to the application."""
PENDING_GLOBAL_SETTERS: frozenset[tuple[str, str]] = frozenset()
"""Known process-wide setters in library code still to be moved to the app layer (none now):
each entry must still be there (a stale one fails)."""
DYNAMIC_IMPORTERS = frozenset({"import_module", "__import__", "files"})
"""Calls whose literal first argument names a module they import (``resources.files`` too)."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Import:
    """One import written in ``importer``'s source.

    Attributes:
        importer: the importing module.
        target: the imported module (``from a import b``: ``a.b`` when that is a module).
        line: where it is written.
        scope: ``module`` (runs on import), ``function`` (runs when called), ``typing`` (under
            ``if TYPE_CHECKING:``, never at run time) or ``dynamic`` (a literal module name
            handed to an import function).
        absolute: written as an absolute name (relative imports cannot name a top-level).
    """

    importer: str
    target: str
    line: int
    scope: str
    absolute: bool


def package_dirs(pyproject: Path) -> dict[str, str]:
    """``{package: folder}`` from ``[tool.setuptools.package-dir]``."""
    config = tomllib.loads(pyproject.read_text())
    return dict(config["tool"]["setuptools"]["package-dir"])


def discover(root: Path, mapping: Mapping[str, str], extra: Mapping[str, str]) -> list[Module]:
    """Every ``.py`` file under the mapped folders (and ``extra`` ones such as tests/)."""
    modules = []
    for package, folder in {**mapping, **extra}.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules.append(Module(".".join([package, *parts]), path, is_package))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, scope: str) -> Iterator[tuple[ast.AST, str]]:
    """Every node below ``node`` with the scope its imports run in."""
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function" if scope != "typing" else scope
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            yield child.test, scope
            for grand in child.body:
                yield grand, "typing"
                yield from _walk(grand, "typing")
            for grand in child.orelse:
                yield grand, scope
                yield from _walk(grand, scope)
            continue
        yield child, inner
        yield from _walk(child, inner)


def _dynamic_target(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in DYNAMIC_IMPORTERS or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value.split(":")[0] or None
    return None


def imports_of(module: Module, known: frozenset[str]) -> list[Import]:
    """The imports written in ``module``'s source, resolved against the ``known`` modules."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    found = []
    for node, scope in [(tree, "module"), *_walk(tree, "module")]:
        if isinstance(node, ast.Import):
            found += [Import(module.name, a.name, node.lineno, scope, True) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                target = candidate if candidate in known else source
                found.append(Import(module.name, target, node.lineno, scope, node.level == 0))
        elif isinstance(node, ast.Call):
            target = _dynamic_target(node)
            if target is not None:
                found.append(Import(module.name, target, node.lineno, "dynamic", True))
    return found


def layer_of(name: str) -> str:
    if name == "tests" or name.startswith("tests."):
        return "tests"
    for package, layer in LAYER_PACKAGES.items():
        if name == package or name.startswith(package + "."):
            return layer
    return "privacy" if name == "securefed" or name.startswith("securefed.") else "outside"


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def findings(
    root: Path, mapping: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> list[str]:
    """Every breach of the layer contract in the tree at ``root``, one line each."""
    modules = discover(root, mapping, extra or {})
    known = frozenset(m.name for m in modules)
    by_name = {m.name: m for m in modules}
    out = []
    module_edges: dict[str, set[str]] = {}
    all_edges: dict[str, set[str]] = {}
    for module in modules:
        where = module.path.relative_to(root)
        for imp in imports_of(module, known):
            top = imp.target.partition(".")[0]
            if imp.absolute and top in OLD_NAMES:
                out.append(f"{where}:{imp.line}: {module.name} imports the old name {imp.target}")
                continue
            importer_layer, target_layer = layer_of(module.name), layer_of(imp.target)
            if target_layer in FORBIDDEN.get(importer_layer, frozenset()):
                out.append(
                    f"{where}:{imp.line}: {module.name} ({importer_layer}) imports {imp.target} "
                    f"({target_layer}) [{imp.scope}]"
                )
            target = imp.target if imp.target in known else None
            if target is None or target == module.name:
                continue
            if imp.scope == "module":
                module_edges.setdefault(module.name, set()).add(target)
            if imp.scope in ("module", "function"):
                all_edges.setdefault(module.name, set()).add(target)
    for component in cycles(module_edges):
        out.append(f"import cycle at module level: {' <-> '.join(component)}")
    for component in cycles(all_edges):
        if not any(set(component) <= set(c) for c in cycles(module_edges)):
            files = ", ".join(str(by_name[m].path.relative_to(root)) for m in component)
            out.append(f"import cycle through imports in functions: {files}")
    return out


def _dotted(node: ast.expr) -> str:
    """``torch.set_num_threads`` for that attribute chain ("" for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def global_settings(root: Path, mapping: Mapping[str, str]) -> set[tuple[str, str, int]]:
    """``(file, call, line)`` of every process-wide setting in library code (not the app layer).

    Importing ``matplotlib.pyplot`` counts as ``matplotlib.pyplot``: pyplot keeps global figure
    state and picks a backend for the process.
    """
    found = set()
    for module in discover(root, mapping, {}):
        if layer_of(module.name) == "bench":
            continue
        where = module.path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(module.path.read_text())):
            if isinstance(node, ast.Call) and _dotted(node.func) in GLOBAL_SETTERS:
                found.add((where, _dotted(node.func), node.lineno))
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module == "matplotlib":
                names = [f"matplotlib.{a.name}" for a in node.names]
            if "matplotlib.pyplot" in names:
                found.add((where, "matplotlib.pyplot", node.lineno))
    return found


# -- the repository ------------------------------------------------------------------------------
def _repo_findings() -> list[str]:
    return findings(REPO_ROOT, package_dirs(REPO_ROOT / "pyproject.toml"), {"tests": "tests"})


def test_the_repository_keeps_its_layers():
    assert _repo_findings() == []


def test_library_code_configures_nothing_process_wide():
    mapping = package_dirs(REPO_ROOT / "pyproject.toml")
    found = {(where, call) for where, call, _ in global_settings(REPO_ROOT, mapping)}
    assert found - PENDING_GLOBAL_SETTERS == set()
    assert PENDING_GLOBAL_SETTERS - found == set(), "moved: drop them from PENDING_GLOBAL_SETTERS"


def test_the_check_reads_the_whole_repository():
    mapping = package_dirs(REPO_ROOT / "pyproject.toml")
    assert set(mapping) == {"securefed", *LAYER_PACKAGES}
    names = {m.name for m in discover(REPO_ROOT, mapping, {"tests": "tests"})}
    for expected in (
        "securefed",
        "securefed.transport.secagg",
        "securefed.recsys.fedmf",
        "securefed.rl.fast",
        "securefed.attacks.verify",
        "securefed.bench.cli",
        "tests.test_layers",
    ):
        assert expected in names
    known = frozenset(names)
    fast = next(m for m in discover(REPO_ROOT, mapping, {}) if m.name == "securefed.rl.fast")
    targets = {i.target for i in imports_of(fast, known) if i.scope == "module"}
    assert "securefed.rl.fedhpd" in targets and "torch" in targets


# -- the checker, on a synthetic tree ------------------------------------------------------------
SYNTHETIC_MAPPING = {
    "securefed": "securefed",
    "securefed.recsys": "recsys",
    "securefed.attacks": "attacks",
    "securefed.bench": "benchmarks",
}


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


CLEAN = {
    "securefed/__init__.py": "from securefed.views import View\n",
    "securefed/views.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from securefed import runtime\n"  # typing only: no run-time cycle
        "class View: ...\n"
    ),
    "securefed/runtime.py": "from securefed.views import View\n",
    "recsys/__init__.py": "",
    "recsys/model.py": "from securefed import View\nfrom . import data\n",
    "recsys/data.py": "import numpy\n",
    "attacks/__init__.py": "from securefed.recsys.model import View\n",
    "benchmarks/__init__.py": "",
    "benchmarks/cli.py": (
        "import importlib\n"
        "from securefed.attacks import View\n"
        "def main():\n"
        "    importlib.import_module('securefed.bench.run')\n"
    ),
    "benchmarks/run.py": "from securefed.bench import cli\n",  # cli -> run is dynamic only
    "benchmarks/tables.py": "import json\n",
}
"""A tree that keeps the contract; recsys/data.py and benchmarks/tables.py import nothing of it,
so an upward import planted towards them breaks one rule only (no cycle comes with it)."""


def test_a_clean_tree_has_no_findings(tmp_path):
    assert findings(_tree(tmp_path, CLEAN), SYNTHETIC_MAPPING) == []


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "securefed/views.py",
            "def load():\n    from securefed.recsys import data\n",
            "securefed.views (privacy) imports securefed.recsys.data (recsys) [function]",
        ),
        (
            "recsys/data.py",
            "from ..bench import tables\n",
            "securefed.recsys.data (recsys) imports securefed.bench.tables (bench) [module]",
        ),
        (
            "attacks/__init__.py",
            "from securefed.recsys.model import View\nfrom securefed.bench.tables import json\n",
            "securefed.attacks (attacks) imports securefed.bench.tables (bench) [module]",
        ),
        ("recsys/model.py", "import rl.fedhpd\n", "securefed.recsys.model imports the old name"),
        (
            "recsys/data.py",
            "from importlib import resources\nPATH = resources.files('recsys')\n",
            "securefed.recsys.data imports the old name recsys",
        ),
        (
            "securefed/views.py",
            "from securefed.runtime import run\n",
            "import cycle at module level: securefed.runtime <-> securefed.views",
        ),
        (
            "securefed/views.py",
            "def later():\n    from securefed import runtime\n",
            "import cycle through imports in functions: securefed/runtime.py, securefed/views.py",
        ),
    ],
)
def test_a_planted_violation_is_found(tmp_path, path, source, expected):
    root = _tree(tmp_path, {**CLEAN, path: source})
    found = findings(root, SYNTHETIC_MAPPING)
    assert len(found) == 1 and expected in found[0], found


def test_a_planted_global_setting_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            **CLEAN,
            "recsys/data.py": (
                "import torch\nfrom matplotlib import pyplot\n"
                "def fit():\n    torch.set_num_threads(1)\n"
                "    generator = torch.Generator()\n    generator.manual_seed(0)\n"
            ),
            "benchmarks/tables.py": "import matplotlib\nmatplotlib.use('Agg')\n",  # app layer
        },
    )
    assert global_settings(root, SYNTHETIC_MAPPING) == {
        ("recsys/data.py", "matplotlib.pyplot", 2),
        ("recsys/data.py", "torch.set_num_threads", 4),
    }
    assert global_settings(_tree(tmp_path / "clean", CLEAN), SYNTHETIC_MAPPING) == set()


def test_findings_name_the_file_and_line(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "recsys/data.py": "import numpy\n\nimport benchmarks\n"})
    assert findings(root, SYNTHETIC_MAPPING) == [
        "recsys/data.py:3: securefed.recsys.data imports the old name benchmarks"
    ]


def test_cycles_are_strongly_connected_components():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _names(modules: Sequence[Module]) -> list[str]:
    return [m.name for m in modules]


def test_discovery_maps_folders_to_names(tmp_path):
    root = _tree(tmp_path, CLEAN)
    assert _names(discover(root, {"securefed.recsys": "recsys"}, {})) == [
        "securefed.recsys",
        "securefed.recsys.data",
        "securefed.recsys.model",
    ]
