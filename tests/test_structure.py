"""The code's structure, read from its source: no private name crosses a module, tests use the
public API only, no module imports one that imports it back (directly or around a loop,
counting imports inside functions and under TYPE_CHECKING), and what ships never imports the lab."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "langchain_ensemble", "llamaindex_ensemble")  # what the wheel ships
LAB = "lab"  # benchmarks, the testbed's build, scripts: a source checkout only
SOURCES = [*PACKAGES, LAB, "tests", "examples"]


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def test_no_private_name_is_imported_or_read_across_modules():
    """`from x import _y`, or `x._y` on a name an import bound (a module, a class or a
    function of another module)."""
    found = []
    for path in _files(*SOURCES):
        tree = ast.parse(path.read_text())
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if isinstance(node, ast.ImportFrom) and _private(alias.name):
                        found.append(f"{_where(path, node)} imports {alias.name}")
                    imported.add((alias.asname or alias.name).split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in imported:
                    found.append(f"{_where(path, node)} reads {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_tests_read_and_write_no_private_attribute():
    """Tests go through the public API: no `obj._x` except on the test's own objects."""
    found = []
    for path in _files("tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not own:
                    found.append(f"{_where(path, node)} uses {ast.unparse(node)}")
    assert not found, "\n".join(found)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                out.add(whole if whole in modules else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return (out & modules) - {module}


def test_no_import_cycle():
    paths = {_module_name(p): p for p in _files(*PACKAGES, LAB)}
    modules = set(paths)
    graph = {m: _imports(p, m, modules) for m, p in paths.items()}
    cycles, state = [], {}  # state: 1 = on the current path, 2 = done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_what_ships_never_imports_the_lab():
    """The engine and the adapters run from the wheel, which has no `lab`."""
    found = []
    for path in _files(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [f"{_where(path, node)} imports {n}" for n in names if n.split(".")[0] == LAB]
    assert not found, "\n".join(found)


def test_one_table_names_every_method():
    """`core.methods.registry` is the only place a method is named: every module that defines a
    `METHOD` is in it, under the name its class gives."""
    from core.methods.registry import METHOD_MODULES, method_class

    defined = set()
    for path in _files("core/methods"):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "METHOD" for t in node.targets)
            for node in tree.body
        ):
            defined.add(_module_name(path).removeprefix("core.methods."))
    assert defined == set(METHOD_MODULES.values())
    assert all(method_class(name).name == name for name in METHOD_MODULES)
