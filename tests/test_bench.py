"""The benchmarks in bench/ still start: each script answers ``--help``, and every name a script imports from
backchannel or from a sibling script exists (also the imports inside functions, which ``--help`` never reaches).

None of the benchmarks is run: they take minutes. A renamed private helper used to break one silently until
someone next measured (bench/pg_cpu.py imported a name bench/server.py no longer had).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODULES = sorted(BENCH.glob("*.py"))
SCRIPTS = [path for path in MODULES if not path.name.startswith("_")]  # _name.py: helpers the scripts import


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """Every ``from module import names`` in ``path``, wherever it stands: (module, names, line)."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.module, [alias.name for alias in node.names], node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and not node.level]


def defined_names(path: Path) -> set[str]:
    """The names a module binds at its top level (without running it)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_benchmark_script_answers_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=BENCH.parent)
    assert done.returncode == 0, f"{script.name} --help failed:\n{done.stderr[-3000:]}"
    assert "usage:" in done.stdout


@pytest.mark.parametrize("module", MODULES, ids=lambda path: path.name)
def test_every_name_a_benchmark_imports_from_backchannel_or_a_sibling_exists(module):
    siblings = {path.stem: path for path in MODULES}
    missing = []
    for source, names, line in imports(module):
        if source in siblings:
            have = defined_names(siblings[source])
        elif source == "backchannel" or source.startswith("backchannel."):
            found = importlib.import_module(source)
            have = {name for name in names if hasattr(found, name)
                    or importlib.util.find_spec(f"{source}.{name}") is not None}
        else:
            continue  # a peer's or the standard library's: installed or not, not ours to keep in step
        missing += [f"{module.name}:{line}: {source}.{name}" for name in names if name not in have]
    assert not missing, "names the benchmark imports that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_a_name_that_is_gone(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def main():\n    from server import _children\n")
    assert ("server", ["_children"], 2) in imports(script)
    assert "_children" not in defined_names(BENCH / "server.py")
    assert "children" in defined_names(BENCH / "server.py")
