"""One convention for the public trace files: ../shared/traces/<file>, relative to the repository root.

The README, docs, configs, messages, scripts and tests name a trace file only that way; package code
never builds a path to ../shared (it may name it in a docstring or an error message, as an example).
GPU scripts may look in more places (the GPU machine carries the traces inside the repository) in
their code, not in their usage lines.
"""
import ast
import re

import pytest

from tests import helpers
from tests.helpers import ROOT, TRACES_REL

PACKAGES = ("engine", "sim", "policies", "experiments")
# <anything>traces/<file>: the part before `traces/` must end in ../shared/
TRACE_REF = re.compile(r"([\w$./{}-]*)traces/[\w.-]+\.(?:csv|jsonl|md)\b")


def _files():
    patterns = ("*.md", "docs/*.md", "conf/**/*.yaml", "benchmarks/*.py", "benchmarks/*.sh", "tests/**/*.py",
                ".ci/*") + tuple(f"{p}/**/*.py" for p in PACKAGES)
    seen = set()
    for pattern in patterns:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and path not in seen:
                seen.add(path)
                yield path


def _script_code_line(path, line):
    """A shell script's code (not its comments): where a GPU script may list more candidates."""
    return path.suffix == ".sh" and not line.lstrip().startswith("#")


def test_every_trace_reference_uses_the_convention():
    bad = []
    for path in _files():
        if path.name == "test_trace_paths.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in TRACE_REF.finditer(line):
                if not m.group(1).endswith("../shared/") and not _script_code_line(path, line):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not bad, f"trace paths not of the form {TRACES_REL}/<file>:\n" + "\n".join(bad)


def test_the_pattern_catches_the_other_forms():
    found = [m.group(1) for m in TRACE_REF.finditer("traces/a.csv tmp/traces/b.jsonl shared/traces/README.md "
                                                    "$PWD/../shared/traces/c.csv")]
    assert found == ["", "tmp/", "shared/", "$PWD/../shared/"]


def _message_or_docstring(node, parents) -> bool:
    """A string inside a `raise` statement, or a docstring (a bare string expression)."""
    chain = [node]
    while chain[-1] in parents:
        chain.append(parents[chain[-1]])
    return any(isinstance(a, ast.Raise) for a in chain) or isinstance(parents.get(node), ast.Expr)


def test_package_code_never_builds_a_path_to_shared():
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                    continue
                if node.value.strip("/") == "shared" or "shared/traces" in node.value:
                    if not _message_or_docstring(node, parents):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not bad, "package code refers to ../shared outside docstrings and error messages:\n" + "\n".join(bad)


def test_a_missing_trace_skips_naming_the_convention(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers, "TRACES", tmp_path / "absent")
    with pytest.raises(pytest.skip.Exception, match=r"\.\./shared/traces/x\.csv not found"):
        helpers.trace_file("x.csv")
