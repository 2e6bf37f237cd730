"""What the package declares matches what it does: every third-party module its code (and the
lab's) imports is a declared dependency (core or an extra), the wheel ships the engine and the
adapters but not the lab, the licence file is the one pyproject names, and no module imports a
POSIX-only module (the package installs on Windows too)."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "langchain_ensemble", "llamaindex_ensemble")
LAB = "lab"
POSIX_ONLY = {"resource", "fcntl", "termios", "pwd", "grp", "posix", "tty", "pty"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imports(path: Path) -> set[str]:
    """Top-level module names a file imports (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _package_files(*extra: str) -> list[Path]:
    return [f for package in (*PACKAGES, *extra) for f in (ROOT / package).rglob("*.py")]


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_every_imported_third_party_module_is_declared():
    project = _project()
    declared = {
        _canonical(Requirement(r).name)
        for r in project["dependencies"]
        + [r for extra in project["optional-dependencies"].values() for r in extra]
    }
    providers = packages_distributions()
    # the suite's own modules: lab.scripts.serve_error_table reuses its request rows
    ours = {*PACKAGES, LAB, *(p.stem for p in (ROOT / "tests").glob("*.py"))}
    missing = {}
    for path in _package_files(LAB):
        for module in _imports(path) - set(sys.stdlib_module_names) - ours:
            owners = {_canonical(d) for d in providers.get(module, [module])}
            if not owners & declared:
                missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_wheel_ships_the_engine_and_adapters_not_the_lab():
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert wheel["targets"]["wheel"]["packages"] == list(PACKAGES)
    assert (ROOT / LAB / "__init__.py").is_file() and LAB not in PACKAGES
    assert any((ROOT / "core" / "testbed" / "models").rglob("model.safetensors"))


def test_no_module_imports_a_posix_only_module():
    found = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & POSIX_ONLY)
        for path in _package_files()
        if _imports(path) & POSIX_ONLY
    }
    assert not found


def test_the_licence_file_is_the_declared_licence():
    assert _project()["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a pointer to it
