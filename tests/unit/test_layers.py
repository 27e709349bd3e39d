"""The package's shape, checked on the source: the import layers that ingest/__init__.py draws,
its module map, and the size limits (no Python file of the repository over 500 lines, no class
over 300: the package, the metastore, the development helpers, the bench and the tests alike).

Imports are read with ``ast`` at every depth: those inside functions (the CLI imports what a
command needs when it runs) and under ``TYPE_CHECKING`` count like the others.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ingest_common", "metastore", "ingest", "ingest_dev")

# Lowest first. A module may import from its own layer and from the rows below it; the layers
# of one row are independent (none imports another). A module belongs to the longest name
# that is its own or a parent of it, so ``ingest`` is the shared top level (errors, config,
# logs, env files, roles, __version__) and ingest.worker, the process that wires the layers
# together, sits above them all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ingest_common",),
    ("metastore",),
    ("ingest",),
    # Record formats behind a schema registry (wire header, registry client, Avro and Protobuf
    # schemas, the Protobuf decoder Spark's Python workers run), then the source specs that
    # name them: every stage reads both; neither knows Spark's session, a split or a stage.
    ("ingest.formats",),
    ("ingest.spec",),
    # The hand-off types of a split's journey (a split, its kill switch): below every stage.
    ("ingest.splits",),
    # The Spark session (local, standalone, Connect) and its jars; the segment files' layout.
    ("ingest.spark", "ingest.segments"),
    # Spark turns splits into segment files nobody sees yet: knows neither the consumer nor
    # published offsets.
    ("ingest.builder",),
    # publish: built splits published in offset order (the futures the build stage returns);
    # ops: what operators see and run, never the worker's runtime; table: the Iceberg
    # committer over published segments; compact: published segments rewritten and replaced.
    ("ingest.publish", "ingest.ops", "ingest.table", "ingest.compact"),
    # The polling thread: hands splits to ingest.publish, counts into ingest.ops.metrics.
    ("ingest.consume",),
    ("ingest.worker",),
    ("ingest.cli",),
    ("ingest.__main__",),
    # Development only (not in the wheel): may use anything; nothing in production imports it.
    ("ingest_dev",),
)

# (importer, imported module) -> why today's code crosses a layer. Empty: every import follows
# the layers. An entry that no longer happens fails the test, so the list stays true.
KNOWN_CROSSINGS: dict[tuple[str, str], str] = {}

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
# What the size limits cover: every Python file of the checkout but those under hidden
# directories (.git, .venv, caches) and under what builds and runs generate, as .gitignore has
# them: the repository's own build output at its root only (a package may be named build), the
# rest wherever they are.
ROOT_GENERATED_DIRS = frozenset({"build", "dist", "demo-data", "bench-results"})
GENERATED_DIRS = frozenset({"__pycache__", "spark-warehouse", "metastore_db"})
# The source trees the walk must find files in (a walk that found none would pass vacuously).
SOURCE_TREES = ("ingest", "ingest_common", "ingest_dev", "metastore", "bench", "tests")
# Classes allowed over the limit ("path:Class"), each with the size it may not grow past: none
# today. An entry whose class is back under the limit fails the test, so the list only shrinks.
CLASS_CEILINGS: dict[str, int] = {}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module


@functools.cache
def modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def _skipped(directory: str, at_root: bool) -> bool:
    generated = directory in GENERATED_DIRS or (at_root and directory in ROOT_GENERATED_DIRS)
    return directory.startswith(".") or generated or directory.endswith(".egg-info")


@functools.cache
def python_files() -> dict[str, Path]:
    """Every Python file of the checkout, by its path relative to the root."""
    found = {}
    for directory, subdirectories, files in os.walk(ROOT):
        at_root = Path(directory) == ROOT
        subdirectories[:] = sorted(d for d in subdirectories if not _skipped(d, at_root))
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(directory, name)
                found[path.relative_to(ROOT).as_posix()] = path
    return found


def imports(module: Module, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (``from a import b`` is ``a.b`` when that is a module)."""
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in out if name.split(".")[0] in PACKAGES}


def layer_of(name: str) -> tuple[int, str]:
    """(row, layer) of a module: its longest enclosing layer name."""
    best: tuple[int, str] | None = None
    for row, layers in enumerate(LAYERS):
        for layer in layers:
            if (name == layer or name.startswith(layer + ".")) and (best is None or len(layer) > len(best[1])):
                best = (row, layer)
    assert best is not None, f"{name} is in no layer"
    return best


def crossings() -> dict[tuple[str, str], str]:
    found = modules()
    known = set(found)
    out = {}
    for module in found.values():
        row, layer = layer_of(module.name)
        for imported in sorted(imports(module, known)):
            their_row, their_layer = layer_of(imported)
            if their_layer == layer or their_row < row:
                continue
            where = "above it" if their_row > row else "beside it (independent layers)"
            out[(module.name, imported)] = f"{layer} imports {their_layer}, {where}"
    return out


def test_imports_follow_the_layers() -> None:
    found = crossings()
    unexpected = {pair: why for pair, why in found.items() if pair not in KNOWN_CROSSINGS}
    assert not unexpected, "imports across the layers (tests/unit/test_layers.py, LAYERS):\n" + "\n".join(
        f"  {a} -> {b}: {why}" for (a, b), why in sorted(unexpected.items())
    )
    stale = sorted(set(KNOWN_CROSSINGS) - set(found))
    assert not stale, f"KNOWN_CROSSINGS lists imports that no longer happen: {stale}"


def test_every_module_is_in_the_module_map() -> None:
    """ingest/__init__.py's docstring names every module of ingest, under its subpackage."""
    doc = ast.get_docstring(modules()["ingest"].tree) or ""
    mapped: set[str] = set()
    package = None
    for line in doc.split("Module map:", 1)[1].splitlines():
        if line.startswith("ingest"):
            package = line.split()[0]
        elif line.startswith("    ") and line.strip() and package is not None:
            short = line.split()[0]
            mapped.add(package if short == "__init__" else f"{package}.{short}")
    # Every module but a package's __init__ (named when it holds code, as ingest.cli's does).
    wanted = {name for name, m in modules().items() if name.startswith("ingest.") and m.path.name != "__init__.py"}
    assert sorted(wanted - mapped) == [], "modules missing from the module map in ingest/__init__.py"
    assert sorted(mapped - set(modules())) == [], "the module map names modules that do not exist"


def test_no_python_file_over_500_lines_and_no_class_over_300() -> None:
    files = python_files()
    assert sorted({rel.split("/")[0] for rel in files} & set(SOURCE_TREES)) == sorted(SOURCE_TREES)
    too_long = {}
    classes = {}
    for rel, path in files.items():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long[rel] = lines
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    classes[f"{rel}:{node.name}"] = size
    assert too_long == {}, f"files over {MAX_MODULE_LINES} lines"
    over = {name: size for name, size in classes.items() if size > CLASS_CEILINGS.get(name, MAX_CLASS_LINES)}
    assert over == {}, f"classes over {MAX_CLASS_LINES} lines (or past their CLASS_CEILINGS entry)"
    assert sorted(set(CLASS_CEILINGS) - set(classes)) == [], "CLASS_CEILINGS entries now under the limit: drop them"


def import_cycles() -> list[list[str]]:
    """The import circles between modules (strongly connected components of more than one
    module; a package and its own modules excluded, as importing a package runs its __init__)."""
    found = modules()
    known = set(found)
    graph = {
        name: sorted(i for i in imports(m, known) if i in known and not name.startswith(i + ".") and i != name)
        for name, m in found.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    """A circle, inside a layer or across one (under TYPE_CHECKING too), is two modules that can
    be neither read nor changed apart: one of them holds what both need."""
    assert import_cycles() == []
