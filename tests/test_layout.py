"""The package's layout: whose room is whose, and which floor may import which.

At the top of kvlib/ stand only the learner's modules (one per notebook) and the package's own
__init__/__main__; core/ and measure/ import nothing of the learner's at import time; no module
imports itself back through a circle of imports, at module level or inside a function.
"""

import ast
from pathlib import Path

from conftest import ROOT

from kvlib.course.exercises import EXERCISES

PACKAGE = ROOT / "kvlib"
LEARNER = {ex.module for ex in EXERCISES}
SUBPACKAGES = {"core", "measure", "study", "course", "checks", "grading", "app"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """The kvlib modules a file imports: `from kvlib.x import y` counts kvlib.x.y when y is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kvlib"}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "kvlib"
            and node.level == 0
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name in MODULES}


def test_top_of_kvlib_holds_only_the_learners_modules():
    """Check that kvlib/ holds the learner's modules, __init__, __main__ and the job subpackages, nothing else."""
    files = {p.stem for p in PACKAGE.glob("*.py")}
    assert files == LEARNER | {"__init__", "__main__"}, (
        f"not a learner's module: {sorted(files - LEARNER - {'__init__', '__main__'})}"
    )
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == SUBPACKAGES, folders


def test_no_import_circles():
    """Check that no kvlib module reaches itself through its imports (module level or inside functions)."""
    graph = {name: imports(path) - {name} for name, path in MODULES.items()}
    state, circles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n  " + "\n  ".join(circles)


def test_core_and_measure_import_no_learner_module_at_import_time():
    """Check that the model, its weights and the measuring code stand on their own: no learner module
    at module level (core imports none at all), so a learner's unfinished file cannot break them."""
    learner = {f"kvlib.{m}" for m in LEARNER}
    for name, path in MODULES.items():
        if name.startswith("kvlib.core"):
            assert not imports(path) & learner, f"{name} imports {sorted(imports(path) & learner)}"
            above = {m for m in imports(path) if not m.startswith("kvlib.core")}
            assert not above, f"{name} (the bottom floor) imports {sorted(above)}"
        if name.startswith("kvlib.measure") or name.startswith("kvlib.study"):
            assert not imports(path, top_level_only=True) & learner, f"{name} imports a learner module at import time"


def test_learner_modules_import_only_core_course_and_each_other():
    """Check that a learner's module builds on the floors below it, never on checks, grading or the benchmarks."""
    allowed = ("kvlib.core", "kvlib.course.exercises", "kvlib.course.inputs", *(f"kvlib.{m}" for m in LEARNER))
    for module in LEARNER:
        for path in (PACKAGE / f"{module}.py", ROOT / "solutions" / "kvlib" / f"{module}.py"):
            bad = {m for m in imports(path) if not m.startswith(allowed)}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_learner_modules_hold_little_more_than_their_exercises():
    """Check that each learner module (the stub a learner opens) is 150 lines or less: its exercises and
    the few helpers its notebook calls; input checks, measuring and studies live in the subpackages."""
    long = {m: n for m in LEARNER if (n := len((PACKAGE / f"{m}.py").read_text(encoding="utf-8").splitlines())) > 150}
    assert not long, f"learner modules over 150 lines: {long}"
