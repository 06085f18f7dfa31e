"""The engine package's shape: packages by concern, small files, no import circles, no Triton."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "backend" / "specgram"


def _module_name(path: Path, pkg: Path) -> str:
    parts = path.relative_to(pkg.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, pkg: Path) -> set[str]:
    """specgram modules that path imports, anywhere in it: an import deferred into a function still ties the two
    modules together, and so does one for type hints only."""
    name = _module_name(path, pkg)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specgram")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[: len(base) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("specgram"):
                continue
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}  # `from . import loading` names a module
    return found


def _graph(pkg: Path = PKG) -> dict[str, set[str]]:
    files = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    return {m: {i for i in _imports(p, pkg) if i in files and i != m} for m, p in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_circles():
    graph = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_files_are_small_and_the_top_level_is_short():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"over 300 lines: {long}"
    top = [p.name for p in PKG.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 8, top


def test_the_engine_never_imports_triton():
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.startswith(("triton_python_backend_utils", "tritonclient")) for n in names), p


# the packages in layers, lowest first: a module imports from its own package and from the layers below it only
# (the top-level modules: settings, errors, the wire's words, per-request state, faults; and the drafts' shared
# vocabulary); a type hint counts like any import
LAYERS = [
    {"specgram", "specgram.drafting"},  # drafting: what drafts are (declarations, proposals, estimates)
    {"specgram.model", "specgram.grammar"},
    {"specgram.sample"},
    {"specgram.speculation"},
    {"specgram.engine"},
    {"specgram.serving"},
    {"specgram.check_model"},  # a user's tool over the whole engine
]


def _layer(module: str) -> int:
    package = ".".join(module.split(".")[:2]) if module.count(".") >= 2 or module.endswith("__init__") else None
    if package is None:
        package = module if module in set().union(*LAYERS) else "specgram"
    return next(i for i, names in enumerate(LAYERS) if package in names)


def test_no_module_imports_a_layer_above_it():
    graph = _graph()
    files = {_module_name(p, PKG) for p in PKG.rglob("*.py")}
    upward = sorted((m, i) for m, imports in graph.items() for i in imports if _layer(i) > _layer(m) and i in files)
    assert not upward, upward
