"""No import cycles among the project's modules, nor among its packages.

The test reads every ``.py`` file of ``workbench/`` and ``kernels/`` (imported as ``workbench_kernels``) with
``ast`` and collects every import statement wherever it stands: at the top, inside a function (a "late" import
hides a cycle, it does not remove it) or under ``if TYPE_CHECKING:``. Two graphs must be acyclic:

- modules: ``a`` imports ``b``;
- packages: a module of directory ``A`` imports one of directory ``B`` (``workbench.engine`` and
  ``workbench.draft_training`` are different packages; a top-level module such as ``workbench.config`` is a
  package of its own), so that each package can be read, and tested, before the ones that use it.

A package's ``__init__`` being run on the way to one of its modules is not counted as an import.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"workbench": ROOT / "workbench", "workbench_kernels": ROOT / "kernels"}


def project_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project modules ``name`` imports, each with the line of its first import."""
    found: dict[str, int] = {}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            # "from a import b" imports the module a.b when there is one, else a name defined in a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            if target in modules and target != name:
                found.setdefault(target, node.lineno)
    return found


def package_of(name: str, modules: dict[str, Path]) -> str:
    """The directory a module lives in, or the module itself for a top-level module of ``workbench``."""
    if modules[name].name == "__init__.py" or name.count(".") == 1 and name.startswith("workbench."):
        return name
    return name.rsplit(".", 1)[0]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None; depth-first with an explicit stack."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def describe(cycle: list[str], sites: dict[tuple[str, str], str]) -> str:
    return "\n".join(f"  {a} -> {b}   ({sites[a, b]})" for a, b in zip(cycle, cycle[1:], strict=False))


@cache
def import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[tuple[str, str], str]]:
    modules = project_modules()
    by_module: dict[str, set[str]] = {name: set() for name in modules}
    by_package: dict[str, set[str]] = {package_of(name, modules): set() for name in modules}
    sites: dict[tuple[str, str], str] = {}  # (from, to) -> where the import is
    for name, path in modules.items():
        for target, line in imported_modules(name, path, modules).items():
            by_module[name].add(target)
            site = f"{path.relative_to(ROOT)}:{line} imports {target}"
            sites.setdefault((name, target), site)
            a, b = package_of(name, modules), package_of(target, modules)
            if a != b:
                by_package[a].add(b)
                sites.setdefault((a, b), site)
    return by_module, by_package, sites


def test_no_module_imports_itself_through_others():
    by_module, _, sites = import_graphs()
    assert len(by_module) > 100  # the walk found the project
    cycle = find_cycle(by_module)
    assert cycle is None, "import cycle among modules:\n" + describe(cycle, sites)


def test_no_package_imports_itself_through_others():
    _, by_package, sites = import_graphs()
    assert {"workbench.engine", "workbench.spec", "workbench.cache", "workbench_kernels"} <= set(by_package)
    cycle = find_cycle(by_package)
    assert cycle is None, "import cycle among packages:\n" + describe(cycle, sites)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
