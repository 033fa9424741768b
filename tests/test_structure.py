"""The package's shape: no import circle (between modules, or between packages: passes and templates in
one direction), the dependency direction docs/architecture.md states, no module but ``config`` reading
the environment, one call protocol that every compiled graph derives from, and no module (of the
package or of the tests) over ~600 lines. The import graph is read from the source (``ast``),
module-level and function-level imports alike: an import inside a function is still a dependency, only
a later one. And of the tests themselves: no ``monkeypatch.setattr`` that newer pytest undoes by
deleting, and the test extras' version ranges those of requirements.txt."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "minicomp"
PACKAGE = "minicomp"

# docs/architecture.md, "Dependencies": `ir` imports nothing of ours; `frontend` imports `ir`;
# `templates` imports `ir`; `passes` import `ir` and `templates`; `codegen` imports `ir` and `templates`;
# `runtime` imports nothing of ours; `graphs/` (what a compiled graph is) and the top-level modules
# (backend.py, ...) wire them and may import anything. `config` (every setting, declared once) and
# `aot_shims` (AOTAutograd's internals) import nothing of ours, and every layer may read them.
EVERYWHERE = ("config", "aot_shims")
ALLOWED = {
    "ir": ("ir",),
    "frontend": ("frontend", "ir"),
    "templates": ("templates", "ir"),
    "passes": ("passes", "ir", "templates"),
    "codegen": ("codegen", "ir", "templates"),
    "runtime": ("runtime",),
}
# Edges that break the rules today, each with who removes it; delete an entry once its edge is gone
# (the test fails on a stale entry, so the list cannot outlive the code).
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()
MAX_LINES = 600
KNOWN_LARGE: set[str] = set()
TESTS = Path(__file__).resolve().parent

# The modules that may touch the process environment, and why. Every MINICOMP_* setting is read in
# config; triton_shims sets Triton's own TRITON_INTERPRET around importing generated code (Triton reads
# it when ``@triton.jit`` runs: which of a kernel's two forms to build), not a setting of minicomp's.
ENVIRONMENT = {
    "minicomp.config": "every MINICOMP_* setting, declared once",
    "minicomp.runtime.triton_shims": "Triton's TRITON_INTERPRET, set around importing a generated module",
}
_ENVIRONMENT_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules) -> str | None:
    """The module of ours that ``name`` (a module, or a name inside one) refers to; None if not ours."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, modules) -> set[str]:
    """The modules of ours that ``module`` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}  # annotations only: not a dependency
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, the module mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            target = _resolve(t, modules)
            if target is not None and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ALLOWED else None


def _allowed(module: str, target: str) -> bool:
    layer = _layer(module)
    if layer is None:
        return True
    inside = target[len(PACKAGE) + 1:]
    return any(inside == a or inside.startswith(a + ".") for a in ALLOWED[layer] + EVERYWHERE)


def test_the_import_graph_sees_imports_anywhere():
    graph = import_graph()
    assert "minicomp.frontend.rules" in graph["minicomp.frontend.lowering"]       # from . import rules
    assert "minicomp.frontend.registry" in graph["minicomp.frontend.rules"]       # from .registry import ...
    assert "minicomp.ir.graph" in graph["minicomp.passes.simplify"]               # from ..ir.graph import ...
    assert "minicomp.ir.kernel" not in graph["minicomp.ir.graph"]                # under TYPE_CHECKING
    assert "minicomp.backend" in graph["minicomp"]                               # inside a function


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle():
    graph = {m: targets - {t for (s, t) in KNOWN_EXCEPTIONS if s == m} for m, targets in import_graph().items()}
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_dependency_direction():
    graph = import_graph()
    wrong = sorted((m, t) for m, targets in graph.items() for t in targets
                   if not _allowed(m, t) and (m, t) not in KNOWN_EXCEPTIONS)
    assert not wrong, "imports against docs/architecture.md's direction: " + ", ".join(f"{m} -> {t}" for m, t in wrong)


TOP = "explain"  # minicomp.explain reads everything; nothing but the package's doors imports it
DOORS = (PACKAGE, f"{PACKAGE}.__main__")


def test_nothing_but_the_doors_imports_explain():
    graph = import_graph()
    inside = f"{PACKAGE}.{TOP}"
    wrong = sorted(m for m, targets in graph.items() if m not in DOORS and not (m == inside or m.startswith(inside + "."))
                   and any(t == inside or t.startswith(inside + ".") for t in targets))
    assert not wrong, f"{inside} sits at the top: only {', '.join(DOORS)} import it, not {', '.join(wrong)}"


def test_config_and_aot_shims_import_nothing_of_ours():
    graph = import_graph()
    assert all(not graph[f"{PACKAGE}.{m}"] for m in EVERYWHERE)


def _units(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between packages and top-level modules (``minicomp.passes``, ``minicomp.backend``):
    an arrow where some module of one imports some module of the other."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])
    units: dict[str, set[str]] = {}
    for m, targets in graph.items():
        units.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
    return units


def test_no_import_circle_between_packages():
    cycle = _cycle(_units(import_graph()))
    assert cycle is None, "packages that import each other: " + " -> ".join(cycle)


def test_passes_and_templates_in_one_direction():
    """The passes choose templates (schedule, tune, ...); templates never import a pass: what both need
    (a group's placements, ``Group``) lives in ``ir``."""
    graph = import_graph()

    def arrows(a: str, b: str) -> list[str]:
        return sorted(f"{m} -> {t}" for m, targets in graph.items() if m.startswith(f"{PACKAGE}.{a}.")
                      for t in targets if t.startswith(f"{PACKAGE}.{b}"))
    assert arrows("passes", "templates"), "the passes no longer use templates: the rule is stale"
    assert not arrows("templates", "passes"), "templates import passes: " + ", ".join(arrows("templates", "passes"))


def _environment_lines(path: Path) -> list[int]:
    """The lines where a module touches the process environment (``os.environ``, ``os.getenv``, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENT_NAMES and ast.unparse(node.value) == "os":
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in _ENVIRONMENT_NAMES for a in node.names):
            found.append(node.lineno)
    return found


def test_only_config_reads_the_environment():
    """A setting read anywhere else is one the config's fingerprint (every cache key) cannot see."""
    readers = {m: lines for m, p in _modules().items() if (lines := _environment_lines(p))}
    wrong = {m: lines for m, lines in readers.items() if m not in ENVIRONMENT}
    assert not wrong, f"read the environment through minicomp.config (a Setting) instead: {wrong}"
    assert set(ENVIRONMENT) <= set(readers), f"stale ENVIRONMENT entries: {set(ENVIRONMENT) - set(readers)}"


def _graph_modules() -> list:
    return [importlib.import_module(m) for m in _modules() if m.startswith(f"{PACKAGE}.graphs.")]


def test_every_compiled_graph_derives_from_the_one_call_protocol():
    """What AOTAutograd or Dynamo calls is a ``graphs.base.GraphCallable``: the boxed call, the last-call
    fast path, the whole-graph fallback, the CUDA-graph wrap and the naming are written once there."""
    from minicomp.graphs.base import GraphCallable
    from minicomp.graphs.cached import CachedGraph
    from minicomp.graphs.compiled import CompiledGraph
    from minicomp.graphs.dynamic import DynamicGraph, SizedPart
    from minicomp.graphs.frozen import FrozenGraph
    callables = {obj for module in _graph_modules() for obj in vars(module).values()
                 if inspect.isclass(obj) and obj.__module__ == module.__name__
                 and any("__call__" in vars(k) for k in obj.__mro__[:-1])}
    assert {CompiledGraph, DynamicGraph, SizedPart, FrozenGraph, CachedGraph} <= callables
    assert not [c for c in callables if not issubclass(c, GraphCallable)]
    assert not [c for c in callables if c is not GraphCallable and "__call__" in vars(c)], "a kind re-implements the call"
    boxed = [m for m, p in _modules().items() if "_boxed_call" in p.read_text()]
    assert boxed == [f"{PACKAGE}.graphs.base"], f"a callable declared boxed outside the protocol: {boxed}"


def test_known_exceptions_still_exist():
    graph = import_graph()
    stale = [e for e in KNOWN_EXCEPTIONS if e[1] not in graph.get(e[0], ())]
    assert not stale, f"remove these from KNOWN_EXCEPTIONS, the imports are gone: {stale}"


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py")))
def test_module_size(rel):
    lines = len((ROOT.parent / rel).read_text().splitlines())
    if rel in KNOWN_LARGE:
        pytest.skip(f"{rel}: {lines} lines, known to be split by another change")
    assert lines <= MAX_LINES, f"{rel} has {lines} lines (at most {MAX_LINES}): split it by what it holds"


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")))
def test_test_module_size(rel):
    lines = len((TESTS / rel).read_text().splitlines())
    assert lines <= MAX_LINES, f"tests/{rel} has {lines} lines (at most {MAX_LINES}): split it by topic"


def test_known_large_modules_are_still_large():
    small = [rel for rel in KNOWN_LARGE if len((ROOT.parent / rel).read_text().splitlines()) <= MAX_LINES]
    assert not small, f"remove these from KNOWN_LARGE, they are under the cap now: {small}"


def _torch_object(dotted: str):
    """The object a dotted name rooted at ``torch`` or ``triton`` stands for (None: not one)."""
    parts = dotted.split(".")
    if parts[0] not in ("torch", "triton"):
        return None
    obj = importlib.import_module(parts[0])
    for part in parts[1:]:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except (ImportError, AttributeError):
                return None
    return obj


def _undone_by_delattr(obj, name: str) -> bool:
    """pytest >= 9.2's ``monkeypatch.setattr`` records the attribute as absent, so that its undo is
    ``delattr``, unless ``obj`` is a class, ``name`` a data descriptor of its type or in its
    ``__dict__``. A torch config module keeps its values elsewhere: the undo deletes the setting."""
    if inspect.isclass(obj):
        return False
    for klass in type(obj).__mro__:
        if name in vars(klass):
            attr = vars(klass)[name]
            if hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"):
                return False
            break
    return name not in getattr(obj, "__dict__", {})


def test_no_monkeypatch_setattr_that_newer_pytest_undoes_by_deleting():
    """(torch._dynamo.config.patch or tests/utils.py's ``assigned`` instead.) Targets are read from
    dotted names rooted at torch or triton; a local variable is not resolved."""
    wrong = []
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "setattr" and ast.unparse(node.func.value) in ("monkeypatch", "mp")):
                continue
            args = node.args
            if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                target, _, name = args[0].value.rpartition(".")  # setattr("torch.x.y", value)
            elif len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                target, name = ast.unparse(args[0]), args[1].value
            else:
                continue
            obj = _torch_object(target)
            if obj is not None and _undone_by_delattr(obj, name):
                wrong.append(f"{path.name}:{node.lineno}: {target}.{name}")
    assert not wrong, "monkeypatch.setattr that pytest >= 9.2 undoes with delattr: " + ", ".join(wrong)


def _requirements(lines) -> dict[str, str]:
    """name -> version range, from requirement strings (comments and blank lines skipped)."""
    reqs = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)(.*)", line).groups()
            reqs[name.lower()] = spec.replace(" ", "")
    return reqs


def test_test_extras_have_the_ranges_of_requirements_txt():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = ROOT.parent
    pinned = _requirements((root / "requirements.txt").read_text().splitlines())
    extras = _requirements(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"])
    assert {name: pinned.get(name) for name in extras} == extras
