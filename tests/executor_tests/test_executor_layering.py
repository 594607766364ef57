"""The executor's module seams: what ``import executor`` loads, and no private cross-imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import executor

PACKAGE = Path(executor.__file__).parent


def test_import_executor_does_not_load_pyzmq() -> None:
    """pyzmq is for multi-node executors only (executor/remote_nodes.py loads it lazily)."""
    code = ("import sys; import executor; "
            "from executor import MultiprocExecutor, ExecutorConfig; "
            "assert 'zmq' not in sys.modules, sorted(m for m in sys.modules if 'zmq' in m)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("executor"):
            found += [f"{path.name}: from {node.module} import {alias.name}"
                      for alias in node.names if alias.name.startswith("_")]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Local and remote workers share process set-up through a public module."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(path)]
    assert not found, found
