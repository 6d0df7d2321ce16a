"""The layout tells the story (issue 19): a static check over every module of memforest_gpu/,
kernels/ and bench/, read with ``ast`` (nothing is imported, imports inside functions count):

- no import cycle between modules;
- kernels/ (the package memforest_gpu.kernels) imports nothing of the package's stages;
- no module passes 400 lines, no function 80.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for memforest_gpu/ (without following the kernels link),
    kernels/ (as memforest_gpu.kernels) and bench/ (scripts that import each other by bare name)."""
    out = {}
    for top, prefix in (("memforest_gpu", "memforest_gpu"), ("kernels", "memforest_gpu.kernels"), ("bench", "")):
        base = root / top
        for folder, dirs, files in os.walk(base):  # os.walk does not follow the link memforest_gpu/kernels
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    parts = list((Path(folder) / f).relative_to(base).with_suffix("").parts)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    out[".".join(([prefix] if prefix else []) + parts)] = Path(folder) / f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``name`` imports anywhere in its file (inside functions too).
    ``from pkg import x`` is an edge to ``pkg.x`` when that is a module, else to ``pkg``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle():
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles (lazy imports count too): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_sees_a_cycle_made_of_lazy_imports(tmp_path):
    """The check itself: a cycle closed only by an import inside a function is found."""
    pkg = tmp_path / "memforest_gpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from . import a\n\n    return a\n")
    (pkg / "c.py").write_text("from .a import f\n")
    assert cycles(import_graph(tmp_path)) == [["memforest_gpu.a", "memforest_gpu.b"]]


def test_kernels_import_nothing_of_the_stages():
    graph = import_graph(ROOT)
    bad = {name: sorted(t for t in targets if t.startswith("memforest_gpu") and
                        not t.startswith("memforest_gpu.kernels"))
           for name, targets in graph.items() if name.startswith("memforest_gpu.kernels")}
    assert not {k: v for k, v in bad.items() if v}, f"kernels must import only kernels: {bad}"


@pytest.mark.parametrize("top", ["memforest_gpu", "kernels", "bench"])
def test_modules_and_functions_stay_small(top):
    too_long = []
    for name, path in modules(ROOT).items():
        if not path.is_relative_to(ROOT / top):
            continue
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {n} lines")
    assert not too_long, f"modules must stay under {MAX_MODULE_LINES} lines, functions under " \
                         f"{MAX_FUNCTION_LINES}: {too_long}"


def test_the_kernels_are_one_package_however_the_project_is_installed(tmp_path):
    """kernels/ (the design card's top level) is memforest_gpu.kernels through the committed link
    memforest_gpu/kernels -> ../kernels: this install (editable in CI) imports it from the
    checkout's kernels/, and a wheel built from the checkout carries it as real files."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import memforest_gpu.kernels as k

    link = ROOT / "memforest_gpu" / "kernels"
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "kernels")
    assert Path(k.__file__).resolve() == (ROOT / "kernels" / "__init__.py").resolve()
    src = tmp_path / "src"  # a copy of the checkout (links kept), so the build leaves nothing in it
    src.mkdir()
    for part in ("setup.py", "README.md", "memforest_gpu", "kernels"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, src / part, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / part, src / part)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("memforest_gpu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "kernels").glob("*.py"))
    assert {f"memforest_gpu/kernels/{n}" for n in kernels} <= names
    assert not any(n.startswith("kernels/") for n in names)  # never a top-level `kernels` (PyPI has one)
