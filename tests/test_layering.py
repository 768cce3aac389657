"""The file tree is the architecture: the import graph of the four packages, read from the source.

Every import counts, also one deferred into a function body (a cycle held together by deferred
imports is still a cycle); only `if TYPE_CHECKING:` imports, never executed, do not.
Layers: the torch-free core (engine/core) imports neither torch, the
GPU runtime, sim nor experiments (it may import the policies' base contracts); policies import
only the core and themselves; sim imports no experiments and no
torch; nothing imports experiments but experiments; and the graph has no cycles.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "policies", "experiments")
CORE = "engine.core"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules (and third-party top-level names) `path` imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for guard in ast.walk(tree):      # `if TYPE_CHECKING:` imports are annotations, never executed
        if isinstance(guard, ast.If) and "TYPE_CHECKING" in ast.unparse(guard.test):
            guard.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rpartition(".")[0]
            out.add(t)
    out.discard(name)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def _under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_the_core_imports_no_torch_runtime_sim_or_experiments(graph):
    core = [m for m in graph if _under(m, CORE)]
    assert core, f"{CORE} is missing"
    for m in core:
        bad = sorted(t for t in graph[m] if t.split(".")[0] in ("sim", "experiments", "torch", "triton")
                     or (_under(t, "engine") and not _under(t, CORE)))
        assert not bad, f"{m} (the torch-free core) imports {bad}"


def test_policies_import_only_the_core_and_themselves(graph):
    for m in (m for m in graph if _under(m, "policies")):
        bad = sorted(t for t in graph[m] if t.split(".")[0] in (*PACKAGES, "torch")
                     and not (_under(t, CORE) or _under(t, "policies")))
        assert not bad, f"{m} imports {bad}"


def test_sim_imports_neither_experiments_nor_the_gpu_runtime(graph):
    for m in (m for m in graph if _under(m, "sim")):
        bad = sorted(t for t in graph[m] if t.split(".")[0] in ("experiments", "torch")
                     or (_under(t, "engine") and not _under(t, CORE)))
        assert not bad, f"{m} imports {bad}"


def test_only_experiments_imports_experiments(graph):
    for m in (m for m in graph if not _under(m, "experiments")):
        assert not [t for t in graph[m] if _under(t, "experiments")], m


def test_the_import_graph_has_no_cycles(graph):
    project = {m: {t for t in deps if t in graph} for m, deps in graph.items()}
    # A package's __init__ importing its own submodules is how a package exports them, not a cycle.
    for m, deps in project.items():
        deps -= {t for t in deps if _under(t, m) and t != m}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(project[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(project):
        if m not in state:
            visit(m)
