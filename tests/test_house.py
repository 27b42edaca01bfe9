"""The house: src/warmstart's imports form no circle, and no module grows past the size a person reads in one go.

The graph is read with `ast` from the source (nothing is imported), the way a reviewer would draw it: an edge
from each module to every warmstart module it imports, at any depth (imports inside functions count too: a lazy
import is still a dependency). Issue 16 untangled a circle of six files; this keeps it untangled.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "warmstart"
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The warmstart modules `path` imports (a `from .x import y` of a module y counts as x.y)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "warmstart"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "warmstart":
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_circle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_are_resolved():
    graph = import_graph()
    # `from .key import ...` in plan.py, `from ..key import ...` in store/placement.py, `from .statuses import ...`.
    assert "warmstart.key" in graph["warmstart.plan"]
    assert "warmstart.key" in graph["warmstart.store.placement"]
    assert "warmstart.report.statuses" in graph["warmstart.report.build"]


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_package_never_imports_vllm_torch_or_the_dev_tools():
    banned = {"vllm", "torch", "triton", "warmstart_dev"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(SRC)}: {n}" for n in names if n.split(".")[0] in banned]
    assert offenders == []


def test_no_module_over_the_size_limit():
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


# Issue 27: vllm/ is a leaf of the wrapper (what vLLM is, nothing of how warmstart runs it), and the
# environment is read in one place.
VLLM_MAY_NOT_IMPORT = ("settings", "variables", "envnames", "engine", "report")


def test_vllm_imports_nothing_of_the_wrapper_above_the_ground_floor():
    graph = import_graph()
    banned = tuple(f"warmstart.{name}" for name in VLLM_MAY_NOT_IMPORT)
    offenders = {
        module: sorted(m for m in imported if m.startswith(banned))
        for module, imported in graph.items()
        if module.startswith("warmstart.vllm")
    }
    assert {m: found for m, found in offenders.items() if found} == {}


def reads_environ(path: Path) -> bool:
    """Whether the module touches `os.environ` or `os.getenv` (any spelling that reaches them)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in {"environ", "getenv", "environb"}
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if {a.name for a in node.names} & {"environ", "getenv", "environb"}:
                return True
    return False


def test_the_environment_reader_spots_every_spelling(tmp_path):
    for text in ("import os\nos.environ.get('X')\n", "import os\nos.getenv('X')\n", "from os import environ\n"):
        (tmp_path / "m.py").write_text(text)
        assert reads_environ(tmp_path / "m.py"), text
    (tmp_path / "m.py").write_text("def f(env, settings):\n    return env.get('X') or settings.environ['X']\n")
    assert not reads_environ(tmp_path / "m.py")


def test_only_settings_reads_the_environment():
    readers = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if reads_environ(p))
    assert readers == ["warmstart.settings"]
