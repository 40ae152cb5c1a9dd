"""The layer contract of the package, read from the source with ``ast`` (no import of edgekv needed).

Layers, lowest first; a module may import its own layer and the layers its rule names, nothing above:

    errors, version,     the exceptions, the version string and the heavy third-party modules' accessors:
    heavy                import nothing from edgekv
    core                 pure: stdlib, gguf constants, numpy; no I/O modules, no llama_cpp, no processes, no CLI
    sources, runtime,    core and these three ("the edges"): each module owns one outside thing: model bytes and
    machine              paths (sources), llama.cpp and processes (runtime), readings of this machine (machine)
    child                core, the edges, child: code run inside a measured child; never a use case
    records              core, sources.safepath: the results schema and store
    prediction, sweep,   core, the edges, records and these four ("the use cases"): what one command computes
    calibration, quality
    output               core, records, the use cases, output, and edges that start nothing (never
                         runtime.engine / runtime.process: presentation starts no dry runs and no processes)
    cli                  anything
    edgekv (__init__)    the public facade: anything but the CLI; only the CLI may import the facade itself

Function-level ("lazy") imports count like module-level ones, and so do imports under ``if TYPE_CHECKING:``:
never executed, but a type the core names from edges, or two modules that name each other's types, tie them together
all the same.  No module imports another's private (``_name``) names.  A small AST test rather than
import-linter: the rules above have per-module exceptions (records may use sources.safepath only, output may not
use two edges modules) and the same walk also finds cycles through lazy imports and measures function lengths,
which import-linter does not.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekv"

BASE = {"edgekv.errors", "edgekv.version", "edgekv.heavy"}
EDGES = {"sources", "runtime", "machine"}
USE_CASES = {"prediction", "sweep", "calibration", "quality"}
LAYERS = {
    "core": {"core"},
    **{e: {"core"} | EDGES for e in EDGES},
    "child": {"core", "child"} | EDGES,
    "records": {"core", "records"},
    **{u: {"core", "records"} | EDGES | USE_CASES for u in USE_CASES},
    "output": {"core", "records", "output"} | EDGES | USE_CASES,
    "cli": {"core", "child", "records", "output", "cli", "facade"} | EDGES | USE_CASES,
    "facade": {"core", "child", "records", "output"} | EDGES | USE_CASES,
}
# modules of an allowed layer that a layer may still not import, and single modules allowed across layers
FORBIDDEN = {"output": {"edgekv.runtime.engine", "edgekv.runtime.process"}}
ALSO_ALLOWED = {"records": {"edgekv.sources.safepath"}}
# (importer, imported) pairs that break a rule today, each with the change that removes it.  The test fails
# when a pair is no longer needed, so that the exception goes with it.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
# cycles inside a folder another engineer owns, named until they are broken there (lazy imports both ways)
KNOWN_CYCLES: list[list[str]] = []
# what the pure core never imports (top-level names)
CORE_FORBIDDEN = {"llama_cpp", "subprocess", "typer", "rich", "click", "psutil", "pynvml", "huggingface_hub",
                  "httpx", "httpx2", "urllib", "socket", "shutil", "tempfile", "requests", "matplotlib",
                  "multiprocessing", "signal"}

MAX_LINES = 60
LONG_MARKER = "# long:"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(mod: str) -> str:
    if mod in BASE:
        return "base"
    if mod == "edgekv":
        return "facade"
    return mod.split(".")[1]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                out.update(id(n) for n in ast.walk(sub))
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every check of this file (the checks only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def _import_nodes(mod: str) -> tuple[tuple[ast.Import | ast.ImportFrom, str, str], ...]:
    """(ImportFrom/Import node, the package relative imports start from, 'module'|'lazy'|'typing')."""
    path = MODULES[mod]
    tree = _tree(path)
    typing_only = _type_checking_nodes(tree)
    top = {id(n) for n in tree.body}
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    return tuple((node, pkg, "typing" if id(node) in typing_only else "module" if id(node) in top else "lazy")
                 for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _base(node: ast.ImportFrom, pkg: str) -> str:
    base = node.module or ""
    if node.level:
        base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
    return base


@functools.cache
def _imports(mod: str) -> tuple[tuple[str, int, str], ...]:
    """(imported module or top-level name, line, 'module'|'lazy'|'typing') for every import in ``mod``."""
    out = []
    for node, pkg, where in _import_nodes(mod):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno, where) for a in node.names)
        else:
            base = _base(node, pkg)
            names = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            out.extend((n, node.lineno, where) for n in names or [base])
    return tuple(out)


def _edges() -> list[tuple[str, str, int, str]]:
    return [(m, t, line, where) for m in MODULES for t, line, where in _imports(m) if t.split(".")[0] == "edgekv"]


def _allowed(src: str, dst: str) -> bool:
    ls, ld = _layer(src), _layer(dst)
    if ld == "base":
        return True
    if ls == "base":
        return False
    if dst in FORBIDDEN.get(ls, set()):
        return False
    return ld == ls or ld in LAYERS[ls] or dst in ALSO_ALLOWED.get(ls, set())


def test_every_module_is_in_a_layer():
    unknown = sorted(m for m in MODULES if _layer(m) not in LAYERS and _layer(m) != "base")
    assert not unknown, f"modules outside any layer (add them to a layer folder or to tests/checks/test_layers.py): {unknown}"


def test_imports_go_down_the_layers():
    bad = []
    used = set()
    for src, dst, line, where in _edges():
        if _allowed(src, dst):
            continue
        if (src, dst) in KNOWN_EXCEPTIONS:
            used.add((src, dst))
            continue
        bad.append(f"{MODULES[src].relative_to(ROOT)}:{line}: {src} ({_layer(src)}) imports {dst} ({_layer(dst)}), {where}")
    assert not bad, "imports against the layer contract:\n" + "\n".join(bad)
    stale = sorted(set(KNOWN_EXCEPTIONS) - used)
    assert not stale, f"known exceptions no longer needed, remove them from KNOWN_EXCEPTIONS: {stale}"


def test_core_is_pure():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: imports {name}"
           for m in MODULES if _layer(m) == "core"
           for name, line, _ in _imports(m) if name.split(".")[0] in CORE_FORBIDDEN]
    assert not bad, "the pure core imports I/O, process or CLI modules:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a module importing itself): Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in _edges():
        if dst in MODULES:
            graph.setdefault(src, set()).add(dst)
    found = _cycles(graph)
    assert not [c for c in found if c not in KNOWN_CYCLES], f"import cycles (module-level and lazy imports): {found}"
    stale = [c for c in KNOWN_CYCLES if c not in found]
    assert not stale, f"cycles no longer there, remove them from KNOWN_CYCLES: {stale}"


def _private_imports() -> list[str]:
    """``from edgekv.x import _name`` in another module (dunders such as __version__ are public)."""
    out = []
    for mod in MODULES:
        for node, pkg, _ in _import_nodes(mod):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _base(node, pkg)
            out.extend(f"{MODULES[mod].relative_to(ROOT)}:{node.lineno}: {base}.{a.name}" for a in node.names
                       if base.startswith("edgekv") and base != mod and a.name.startswith("_")
                       and not (a.name.startswith("__") and a.name.endswith("__")))
    return out


def test_no_private_names_imported_across_modules():
    bad = _private_imports()
    assert not bad, "a private name used by another module is part of its interface: make it public\n" + "\n".join(bad)


def test_cycle_finder_finds_a_lazy_cycle():
    """The check above can fail: two modules that import each other, one lazily, are one cycle."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _long_functions() -> tuple[list[str], list[str]]:
    """(functions over MAX_LINES without a reason, functions over MAX_LINES with a ``# long:`` reason)."""
    bare, marked = [], []
    for path in MODULES.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            if n <= MAX_LINES:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            head = lines[first - 2: max(node.lineno, node.body[0].lineno - 1)]     # the line above to the signature
            where = f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has {n} lines"
            (marked if any(LONG_MARKER in x for x in head) else bare).append(where)
    return bare, marked


# A `# long:` reason is accepted only for a parser that mirrors llama.cpp's own order (one branch or one key after
# another, as llama.cpp reads them), and for at most this many functions: the test fails above it, so the marker
# cannot become a way around the rule.
MAX_MARKED = 3


def _markers() -> int:
    return sum(line.lstrip().startswith(LONG_MARKER)
               for p in MODULES.values() for line in p.read_text(encoding="utf-8").splitlines())


def test_no_function_over_60_lines_without_a_reason():
    bare, marked = _long_functions()
    assert not bare, (f"functions over {MAX_LINES} lines; shorten them (or, for a parser in llama.cpp's order, say "
                      f"why on the line above the def with '{LONG_MARKER} <reason>'):\n" + "\n".join(bare))
    assert len(marked) <= MAX_MARKED, (f"{len(marked)} functions over {MAX_LINES} lines carry '{LONG_MARKER}'; at most "
                                       f"{MAX_MARKED} may (split the others):\n" + "\n".join(marked))
    assert _markers() == len(marked), f"a '{LONG_MARKER}' marker above a function that is not long: remove it"


# -- bench/ and tools/: the maintainers' scripts use edgekv as any user of the package would --------------------------

SCRIPT_DIRS = ("bench", "tools")


def _script_problems(source: str, where: str) -> list[str]:
    """In one script: a private edgekv name (imported, or read off an imported edgekv module), an import of the test
    suite (``tests.``), or a change of ``sys.path`` (they run as modules from the root: ``python -m bench.x``)."""
    out, aliases = [], set()
    tree = ast.parse(source, where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tests":
                    out.append(f"{where}:{node.lineno}: imports {a.name} (the test suite)")
                if a.name.split(".")[0] == "edgekv":
                    aliases.add(a.asname or a.name.split(".")[0])
                    out += [f"{where}:{node.lineno}: {a.name}: a private module" for p in a.name.split(".")
                            if p.startswith("_") and not p.startswith("__")]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top = node.module.split(".")[0]
            if top == "tests":
                out.append(f"{where}:{node.lineno}: imports from {node.module} (the test suite)")
            if top == "edgekv":
                out += [f"{where}:{node.lineno}: {node.module}: a private module" for p in node.module.split(".")
                        if p.startswith("_") and not p.startswith("__")]
                for a in node.names:
                    if a.name.startswith("_") and not (a.name.startswith("__") and a.name.endswith("__")):
                        out.append(f"{where}:{node.lineno}: {node.module}.{a.name}: a private name")
                    aliases.add(a.asname or a.name)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and ast.unparse(node.func.value) == "sys.path"):
            out.append(f"{where}:{node.lineno}: sys.path.{node.func.attr}(...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                ast.unparse(t) == "sys.path" for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            out.append(f"{where}:{node.lineno}: assigns sys.path")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}: a private name")
    return out


def _scripts() -> list[Path]:
    """The scripts of bench/ and tools/ (not what their ignored build folders hold, such as bench/.build)."""
    return sorted(p for d in SCRIPT_DIRS for p in (ROOT / d).rglob("*.py")
                  if not any(x.startswith(".") for x in p.relative_to(ROOT).parts))


def test_bench_and_tools_use_public_names_only():
    """bench/ and tools/ import only public edgekv names, nothing of tests/, and leave sys.path alone."""
    assert _scripts(), "no scripts found under bench/ or tools/"
    bad = [x for p in _scripts() for x in _script_problems(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not bad, "bench/ and tools/ use edgekv as its users do (make a name public, or drop the use):\n" + "\n".join(bad)


# the tests of bench/ itself: its harnesses' pure parts and the tables rendered from their results
BENCH_TESTS = {"test_bench_scripts.py", "test_tables.py"}


def test_tests_do_not_import_bench():
    """The suite imports tools/ (llama.cpp's tools, the GGUF writer, the hub stand-in), never bench/: only the tests
    of bench/ itself do."""
    bad = []
    for p in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{p.relative_to(ROOT)}:{node.lineno}: imports {m}" for m in mods if m.split(".")[0] == "bench"
                    and p.name not in BENCH_TESTS]
    assert not bad, "tests/ imports bench/ (move what it needs to tools/ or edgekv/):\n" + "\n".join(bad)


def test_script_check_finds_each_kind_of_problem():
    """The check above can fail: each kind of problem in a snippet is found."""
    src = ("import sys\nfrom edgekv.calibration import speedcal as sc\nfrom edgekv.prediction.api import _checked_shape\n"
           "from tests.tiny.writer import write_spec\nsys.path.insert(0, 'x')\nsc._ctx(1)\nsc.public(2)\n"
           "from edgekv import __version__\n")
    found = _script_problems(src, "s.py")
    assert [x.split(": ", 1)[1] for x in found] == [
        "edgekv.prediction.api._checked_shape: a private name", "imports from tests.tiny.writer (the test suite)",
        "sys.path.insert(...)", "sc._ctx: a private name"]


# -- imports a reader can see: function-level ("lazy") imports -------------------------------------------------------
#
# A module's top says what it depends on: edgekv's own modules and the standard library are imported there.  A
# function-level import is allowed only for
# - a heavy third-party module, in its one accessor in edgekv/heavy.py (what every command would otherwise pay at
#   start-up: tests/checks/test_startup.py checks by name that `import edgekv.cli.main` loads none of them; numpy is not
#   one: gguf, which reads every header, loads it anyway),
# - a module only some platforms have,
# - and the few imports LAZY_ALLOWED names, each with its reason (at most MAX_LAZY_ALLOWED of them).
# A command's module (edgekv/cli/commands/, which imports its implementation at its top) is imported when the command
# is dispatched, by edgekv.cli.main.command (importlib, from its COMMANDS table), so that `edgekv --help` and every other
# command load none of it (tests/checks/test_startup.py checks that by name).
LAZY_HEAVY = {"llama_cpp", "pandas", "scipy", "matplotlib", "huggingface_hub", "httpx2"}
HEAVY_ACCESSORS = "edgekv/heavy.py"
LAZY_PLATFORM = {"fcntl", "msvcrt", "resource", "termios", "pynvml"}
# (file, imported module) -> why it waits for its function
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    ("edgekv/sources/corpus.py", "pydoc_data.topics"):
        "the built-in corpus's text, about 0.7 MB of strings: loaded only when that corpus is built",
    ("edgekv/child/workload.py", "edgekv.machine.environment"):
        "only the device-runtime child reads NVML; at the top it loaded the environment fingerprint's readers "
        "into every measured child, the runtime baseline's included (+1 MiB)",
}
MAX_LAZY_ALLOWED = 10
# Modules whose lazy imports other changes are moving to the top right now (the CLI's adapters, the speed
# calibration), counted as the code stands: a count may only go down, and the table goes when it reaches zero.
# Nothing may be added to it: a new lazy import goes to its module's top, or into LAZY_ALLOWED with its reason.
LAZY_PENDING: dict[str, int] = {}


def _lazy_imports(source: str, where: str, allowed: dict[tuple[str, str], str] = LAZY_ALLOWED) -> list[tuple[int, str]]:
    """(line, imported module) of each import inside a function that the rules above (and ``allowed``) do not
    allow."""
    tree = ast.parse(source, where)
    pkg = ".".join(Path(where).with_suffix("").parts[:-1])
    out: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            if in_function and isinstance(ch, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in ch.names] if isinstance(ch, ast.Import)
                         else [_base(ch, pkg) if ch.level else ch.module or ""])
                for name in names:
                    top = name.split(".")[0]
                    heavy = top in LAZY_HEAVY and where == HEAVY_ACCESSORS
                    if not heavy and top not in LAZY_PLATFORM and (where, name) not in allowed:
                        out.append((ch.lineno, name))
            walk(ch, in_function or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return out


def _lazy_found(allowed: dict[tuple[str, str], str] = LAZY_ALLOWED) -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in MODULES.values():
        where = str(path.relative_to(ROOT))
        if got := _lazy_imports(path.read_text(encoding="utf-8"), where, allowed):
            found[where] = got
    return dict(sorted(found.items()))


def test_imports_are_at_the_top():
    """edgekv's own modules and the standard library are imported at a module's top; a lazy import is a heavy
    third-party module's, a platform's, or one LAZY_ALLOWED names with its reason."""
    found = _lazy_found()
    bad = [f"{f}:{line}: {m}" for f, got in found.items() if f not in LAZY_PENDING for line, m in got]
    more = [f"{f}: {len(found.get(f, []))} lazy imports, {n} recorded: " + ", ".join(
        f"{line}: {m}" for line, m in found.get(f, [])) for f, n in LAZY_PENDING.items() if len(found.get(f, [])) > n]
    assert not bad + more, ("an import inside a function: put it at its module's top (tests/checks/test_layers.py says "
                            "which may stay lazy):\n" + "\n".join(bad + more))
    fewer = {f: (len(found.get(f, [])), n) for f, n in LAZY_PENDING.items() if len(found.get(f, [])) < n}
    table = "LAZY_PENDING = {\n" + "".join(f"    {f!r}: {len(got)},\n" for f, got in found.items()
                                            if f in LAZY_PENDING) + "}"
    assert not fewer, ("fewer lazy imports than recorded (good): lower LAZY_PENDING in tests/checks/test_layers.py:\n"
                       + "\n".join(f"{f}: {n} (recorded {b})" for f, (n, b) in fewer.items()) + "\n" + table)


def test_every_allowed_lazy_import_is_there_and_says_why():
    assert len(LAZY_ALLOWED) <= MAX_LAZY_ALLOWED, f"{len(LAZY_ALLOWED)} lazy imports allowed, at most {MAX_LAZY_ALLOWED}"
    assert all(len(why.split()) >= 5 for why in LAZY_ALLOWED.values()), "each allowed lazy import says why"
    found = {(f, m) for f, got in _lazy_found(allowed={}).items() for _, m in got}
    stale = sorted(set(LAZY_ALLOWED) - found)
    assert not stale, f"allowed lazy imports no longer there, remove them from LAZY_ALLOWED: {stale}"


def test_the_lazy_import_check_allows_only_the_named_kinds():
    """The check can fail: an edgekv module, a sibling, a standard-library module and a heavy module outside its
    accessor, imported in a function, are each found; a platform's module and an allowed import are not."""
    src = ("import os\n\ndef f():\n    import json\n    import pandas as pd\n    from edgekv.core import units\n"
           "    from . import sibling\n    import fcntl\n    from edgekv.prediction.api import load_model\n"
           "    from pydoc_data.topics import topics\n")
    assert _lazy_imports(src, "edgekv/output/x.py") == [(4, "json"), (5, "pandas"), (6, "edgekv.core"),
                                                        (7, "edgekv.output"), (9, "edgekv.prediction.api"),
                                                        (10, "pydoc_data.topics")]
    # the reason is the file's own: the same import elsewhere is found
    assert (10, "pydoc_data.topics") not in _lazy_imports(src, "edgekv/sources/corpus.py")
    # a heavy module waits in its accessor only
    assert (5, "pandas") not in _lazy_imports(src, HEAVY_ACCESSORS)
    # the CLI has no exception: its command modules are imported by edgekv.cli.main.command, and import at the top
    assert len(_lazy_imports(src, "edgekv/cli/main.py")) == 6
    assert len(_lazy_imports(src, "edgekv/cli/commands/bench.py")) == 6


def test_each_heavy_module_has_one_accessor():
    """edgekv/heavy.py: one function per heavy module, which imports it (and its submodules) and nothing else."""
    tree = ast.parse((ROOT / HEAVY_ACCESSORS).read_text(encoding="utf-8"))
    where: dict[str, set[str]] = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    for m in mods:
                        where.setdefault(m.split(".")[0], set()).add(fn.name)
    assert {m: len(f) for m, f in where.items()} == dict.fromkeys(LAZY_HEAVY, 1), where
