"""The import rules of docs/architecture.md, checked on the source: what must never import what.

Every module's imports are read with `ast` (nothing is imported). "anywhere" rules count imports
inside functions too; "module level" rules only the imports that run when the module loads (the
CLI and the reports may import heavy packages inside the function that needs them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "policies", "traces", "sim", "backend", "reports", "validation", "cli", "api")
# package -> the dsd packages it may import anywhere (itself included)
ALLOWED: dict[str, set[str]] = {
    "common": {"common"},
    "policies": {"common", "policies"},
    "traces": {"common", "traces"},
    "sim": {"common", "policies", "traces", "sim"},
    "backend": {"common", "policies", "traces", "sim", "backend"},
    "reports": {"common", "policies", "traces", "sim", "reports"},
    "validation": {"common", "policies", "traces", "sim", "backend", "reports", "validation"},
    "api": {"common", "policies", "traces", "sim", "backend", "reports", "validation"},
    "cli": {"common", "cli", "api"},
}
# package -> the dsd packages and third-party roots it must not import at module level
NOT_AT_MODULE_LEVEL: dict[str, set[str]] = {
    "reports": {"torch"},
    "validation": {"backend", "torch"},
    "api": {"backend", "torch"},
    "cli": {"api", "torch", "numpy", "pandas", "scipy", "simpy"},
}
NO_TORCH = ("common", "policies", "traces", "sim", "reports")
# validation's modules that run the real engine (they import backend and torch when loaded);
# the rest of validation loads without torch, so `import dsd.api` stays light
ENGINE_MODULES = {"validation/cells.py", "validation/retime.py"}


def _source_files(package: str) -> list[Path]:
    if package == "api":
        return [REPO / "dsd" / "api.py"]
    folder = REPO / "dsd" / package if package in ("common", "cli") else REPO / package
    return sorted(folder.rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) for every import statement of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top_level))
    return found


def _dsd_package(module: str) -> str | None:
    """The dsd package a module name belongs to (`dsd.sim.engine` -> `sim`)."""
    parts = module.split(".")
    if parts[0] != "dsd" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in PACKAGES else None


def _is_type_checking_only(path: Path, module: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module == module:
                    return True
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_map_allows(package: str) -> None:
    bad = []
    for path in _source_files(package):
        for module, at_top in _imports(path):
            target = _dsd_package(module)
            if target is not None and target not in ALLOWED[package]:
                bad.append(f"{path.relative_to(REPO)} imports {module}")
            root = module.split(".")[0] if target is None else target
            if (
                at_top
                and root in NOT_AT_MODULE_LEVEL.get(package, set())
                and not _is_type_checking_only(path, module)
                and str(path.relative_to(REPO)) not in ENGINE_MODULES
            ):
                bad.append(f"{path.relative_to(REPO)} imports {module} at module level")
            if package in NO_TORCH and module.split(".")[0] == "torch":
                bad.append(f"{path.relative_to(REPO)} imports torch")
    assert not bad, "\n".join(bad)


def test_every_source_module_is_in_a_package_of_the_map() -> None:
    known = {path for package in PACKAGES for path in _source_files(package)}
    for folder in (
        "common",
        "policies",
        "traces",
        "sim",
        "backend",
        "reports",
        "validation",
        "cli",
    ):
        root = REPO / "dsd" / folder if folder in ("common", "cli") else REPO / folder
        assert set(root.rglob("*.py")) <= known, folder
    # __main__.py only calls the CLI (`python -m dsd`).
    loose = {p.name for p in (REPO / "dsd").glob("*.py")} - {"__init__.py", "api.py", "__main__.py"}
    assert not loose, f"dsd/ holds modules outside the map: {sorted(loose)}"


def _dsd_imports(paths: list[Path]) -> list[tuple[Path, str]]:
    return [
        (path, module)
        for path in paths
        for module, _at_top in _imports(path)
        if module.startswith("dsd.")
    ]


def test_the_models_know_nothing_of_the_loop() -> None:
    """sim/models/ prices and draws steps; the loop (engine, scheduler, build, ...) uses them,
    never the other way round."""
    models = sorted((REPO / "sim" / "models").glob("*.py"))
    allowed = ("dsd.sim.models", "dsd.sim.types", "dsd.sim.config")
    bad = [
        f"{path.relative_to(REPO)} imports {module}"
        for path, module in _dsd_imports(models)
        if module.startswith("dsd.sim") and not module.startswith(allowed)
    ]
    assert not bad, "\n".join(bad)


def test_only_tests_and_benchmarks_import_the_test_machinery() -> None:
    """sim/testing/ (the stateful machine, the reference scheduler, fakes) is not part of any
    run: no source module outside it imports it (checking a user's policy imports it inside
    the function that runs the machine)."""
    sources = [
        path
        for package in PACKAGES
        for path in _source_files(package)
        if "sim/testing" not in str(path.relative_to(REPO))
    ]
    bad = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sources
        for module, at_top in _imports(path)
        if module.startswith("dsd.sim.testing") and at_top
    ]
    assert not bad, "\n".join(bad)
