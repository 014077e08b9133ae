"""The package's layout: whose room is whose, and which floor may import which.

At the top of kvlib/ stand only the learner's modules (one per notebook) and the package's own
__init__/__main__. The floors, bottom up (LAYERS): core < course < the learner's modules < variants
< study < measure < checks < grading < app. Every import, at module level or inside a function, goes
down or sideways, never up (ALLOWED names each exception and why); a learner's module imports only
earlier notebooks' modules; the floors above the learner's import its modules only inside a
function, marked as late binding; no module imports itself back through a circle.
"""

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest
from conftest import ROOT

from kvlib.app import cli
from kvlib.course.exercises import EXERCISES

PACKAGE = ROOT / "kvlib"
TESTS = ROOT / "tests"
LEARNER = {ex.module for ex in EXERCISES}
SUBPACKAGES = {"core", "course", "variants", "study", "measure", "checks", "grading", "app"}
# The floors, bottom up; "learner" is kvlib.<module> for every module of the exercise table. The
# package's __init__ stands with course (every `import kvlib.<name>` runs it), its __main__ with app.
LAYERS = ["core", "course", "learner", "variants", "study", "measure", "checks", "grading", "app"]
# The floors that run the learner's code from outside it (the benchmarks and studies run what the
# learner wrote): they import a learner module only inside a function, when it runs, marked thus.
LATE_BINDING_FLOORS = ("variants", "study", "measure")
LATE_BINDING = "# noqa: PLC0415 (late binding"
# Every deliberate import inside a function says why, in one form (pyproject.toml, [tool.ruff.lint]).
NOQA_REASONS = (
    "late binding",
    "optional dependency",
    "start-up time",
    "not in learners' folders",
    "isolated child",
    "against the floors",
    "kept from the stub",  # inside a solution block: the learner's stub shows no import that points at the route
)
# Imports against the order, each with its reason. The test fails on one not listed here, and on a
# listed one that no import uses any more (delete it then); an entry naming a module that no longer
# exists (it moved) is ignored.
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """The kvlib modules a file imports: `from kvlib.<a> import <b>` counts kvlib.<a>.<b> when <b> is a module."""
    return {name for _, name, at_top in import_nodes(path) if at_top or not top_level_only}


def test_top_of_kvlib_holds_only_the_learners_modules():
    """Check that kvlib/ holds the learner's modules, __init__, __main__ and the job subpackages, nothing else."""
    files = {p.stem for p in PACKAGE.glob("*.py")}
    assert files == LEARNER | {"__init__", "__main__"}, (
        f"not a learner's module: {sorted(files - LEARNER - {'__init__', '__main__'})}"
    )
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= SUBPACKAGES, f"not a floor of LAYERS: {sorted(folders - SUBPACKAGES)}"
    # kvlib/variants/ (notebook 06's attention ways, notebook 08's caches) may not be there yet
    assert SUBPACKAGES - folders <= {"variants"}, f"missing: {sorted(SUBPACKAGES - folders - {'variants'})}"


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


def layer(name: str) -> int:
    """The floor of a kvlib module, by its dotted name (an index into LAYERS)."""
    if name == "kvlib":
        return LAYERS.index("course")
    if name == "kvlib.__main__":
        return LAYERS.index("app")
    parts = name.split(".")
    if parts[1] in LEARNER:
        return LAYERS.index("learner")
    assert parts[1] in LAYERS, f"{name} is on no floor: add kvlib/{parts[1]}/ to LAYERS in tests/test_layout.py"
    return LAYERS.index(parts[1])


def import_nodes(path: Path):
    """Every import statement of a file that names a kvlib module, with whether it is at module level:
    (node, imported module, at_top)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in imports_of(node):
                yield node, name, id(node) in top


def imports_of(node) -> set[str]:
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names if a.name.split(".")[0] == "kvlib"}
    elif node.module and node.module.split(".")[0] == "kvlib" and node.level == 0:
        found = set()
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            found.add(sub if sub in MODULES else node.module)
    else:
        found = set()
    return {name for name in found if name in MODULES}


def test_every_import_goes_down_the_floors():
    """Check that no kvlib module imports one on a floor above its own, at module level or inside a
    function, except the imports ALLOWED names; and that every ALLOWED entry is still needed."""
    against, used = [], set()
    for name, path in MODULES.items():
        for node, imported, _ in import_nodes(path):
            if layer(imported) <= layer(name):
                continue
            if (name, imported) in ALLOWED:
                used.add((name, imported))
                continue
            against.append(
                f"{path.relative_to(ROOT)}:{node.lineno}: {name} ({LAYERS[layer(name)]}) imports {imported} "
                f"({LAYERS[layer(imported)]}), a floor above it"
            )
    assert not against, (
        "imports against the floors (core < course < learner < variants < study < measure < checks < "
        "grading < app); move the code down, or add the pair to ALLOWED with its reason:\n  " + "\n  ".join(against)
    )
    stale = [pair for pair in ALLOWED if pair not in used and all(m in MODULES for m in pair)]
    assert not stale, f"ALLOWED names imports that no longer happen; delete them: {stale}"


def test_learner_modules_import_only_earlier_notebooks():
    """Check that a learner's module builds only on the notebooks before it (04's kv_cache may use 01's
    attention, never 06's gqa), so the course can be taken in order."""
    first = {}
    for ex in EXERCISES:
        first.setdefault(ex.module, int(ex.notebook.split("-")[0]))
    for module in LEARNER:
        for path in (PACKAGE / f"{module}.py", ROOT / "solutions" / "kvlib" / f"{module}.py"):
            later = {
                m
                for m in imports(path)
                if m.split(".")[1] in LEARNER and m != f"kvlib.{module}" and first[m.split(".")[1]] >= first[module]
            }
            assert not later, f"{path.relative_to(ROOT)} (notebook {first[module]:02d}) imports {sorted(later)}"


def test_floors_above_the_learner_import_its_modules_only_when_they_run():
    """Check that variants, study and measure import a learner's module only inside a function, each such
    import marked as late binding: a learner's unfinished file cannot break them, and the benchmarks
    run what the learner wrote at the moment they run."""
    learner = {f"kvlib.{m}" for m in LEARNER}
    bad = []
    for name, path in MODULES.items():
        if name == "kvlib" or name.split(".")[1] not in LATE_BINDING_FLOORS:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, imported, at_top in import_nodes(path):
            if imported not in learner:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if at_top:
                bad.append(f"{where}: imports {imported} at module level")
            elif not any(LATE_BINDING in line for line in lines[node.lineno - 1 : node.end_lineno]):
                bad.append(f"{where}: imports {imported} without `{LATE_BINDING}: ...)`")
    assert not bad, "learner modules imported by the floors above them:\n  " + "\n  ".join(bad)


def test_every_import_inside_a_function_says_why_in_one_form():
    """Check that every `# noqa: PLC0415` in kvlib/ and solutions/kvlib/ reads `(<reason>: <detail>)`,
    the reason one of NOQA_REASONS."""
    form = re.compile(r"# noqa: PLC0415 \((?:" + "|".join(map(re.escape, NOQA_REASONS)) + r"): [^)]+\)")
    bad = []
    for path in [*MODULES.values(), *sorted((ROOT / "solutions" / "kvlib").glob("*.py"))]:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "PLC0415" in line and not form.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, f"say why as `# noqa: PLC0415 (<reason>: <detail>)`, a reason of {NOQA_REASONS}:\n  " + "\n  ".join(
        bad
    )


def test_core_imports_only_core():
    """Check that the bottom floor stands on its own: kvlib.core imports nothing else of kvlib."""
    for name, path in MODULES.items():
        if name.startswith("kvlib.core"):
            above = {m for m in imports(path) if not m.startswith("kvlib.core")}
            assert not above, f"{name} (the bottom floor) imports {sorted(above)}"


def test_learner_modules_import_only_core_course_and_each_other():
    """Check that a learner's module builds on the floors below it, never on checks, grading or the benchmarks."""
    allowed = ("kvlib.core", "kvlib.course.exercises", "kvlib.course.inputs", *(f"kvlib.{m}" for m in LEARNER))
    for module in LEARNER:
        for path in (PACKAGE / f"{module}.py", ROOT / "solutions" / "kvlib" / f"{module}.py"):
            bad = {m for m in imports(path) if not m.startswith(allowed)}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_learner_modules_hold_little_more_than_their_exercises():
    """Check that each learner module (the stub a learner opens) is its exercises and little more: at most 90 lines
    outside its @exercise functions (the module's docstring, imports, the few helpers and classes its notebook
    calls), and each exercise, its contract and stub, at most 30; input checks, measuring and studies live in the
    subpackages. (Counted so, a module grows with its exercises, not with what is not the learner's.)"""
    outside, long = {}, {}
    for m in LEARNER:
        source = (PACKAGE / f"{m}.py").read_text(encoding="utf-8")
        mine = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", "") == "exercise" for d in node.decorator_list
            ):
                start = min(d.lineno for d in node.decorator_list)
                mine |= set(range(start, node.end_lineno + 1))
                if node.end_lineno - start + 1 > 30:
                    long[f"{m}.{node.name}"] = node.end_lineno - start + 1
        outside[m] = len(source.splitlines()) - len(mine)
    assert not {m: n for m, n in outside.items() if n > 90}, f"lines outside the exercises: {outside}"
    assert not long, f"exercises over 30 lines (contract and stub): {long}"


# ---------------------------------------------------------------------------------------------
# Maps that check themselves

FILE_NAME = re.compile(r"(?<![\w/.<])([a-z_][a-z0-9_]*\.py)\b")
KVLIB_PATH = re.compile(r"\bkvlib/(?:[\w]+/)*[\w]+\.py\b")
DOTTED = re.compile(r"\bkvlib(?:\.[A-Za-z_]\w*)+")
# Files named in docstrings and comments that are not kvlib's own: a learner's module of their own,
# the example the course folder's note gives.
NOT_KVLIB_FILES = {"kvlib/my_helpers.py"}
# and modules: the name the reference solutions are loaded under (kvlib.course.exercises.reference_module)
NOT_KVLIB_MODULES = {"kvlib._solutions"}
SUBPACKAGE_INITS = sorted(PACKAGE.glob("*/__init__.py"))


def docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def resolves(dotted: str) -> bool:
    """Whether a dotted kvlib.<a>.<b> name is a module of the repository, or a name one of them defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in MODULES:
            rest = parts[i:]
            if not rest:
                return True
            return hasattr(importlib.import_module(name), rest[0])
    return False


@pytest.mark.parametrize("init", SUBPACKAGE_INITS, ids=lambda p: p.parent.name)
def test_subpackage_docstring_names_each_of_its_files(init):
    """Check that each subpackage's __init__.py docstring is its map: it names every .py file beside it
    (kvlib/checks/ may say `<module>.py` for the learner modules' checks) and no file that is not there."""
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    files = {p.name for p in init.parent.glob("*.py")} - {"__init__.py"}
    named = set(FILE_NAME.findall(doc))
    if init.parent.name == "checks" and "<module>.py" in doc:
        named |= {f"{m}.py" for m in LEARNER}
    where = init.relative_to(ROOT)
    assert not files - named, f"{where}'s docstring does not name {sorted(files - named)}"
    assert not named - files - {f"{m}.py" for m in LEARNER}, (
        f"{where}'s docstring names {sorted(named - files)}, not there"
    )


def test_cli_docstring_names_every_command_and_benchmark():
    """Check that the `kvlib` command's docstring (its map) names each subcommand and each `kvlib bench` NAME."""
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    missing = [c for c in commands if f"kvlib {c}" not in cli.__doc__]
    benches = commands["bench"]._subparsers._group_actions[0].choices
    missing += [f"bench {b}" for b in benches if not re.search(rf"\b{b}\b", cli.__doc__.split("kvlib bench")[1])]
    assert not missing, f"kvlib/app/cli.py's docstring does not name: {missing}"


def test_docstrings_and_comments_name_only_files_and_modules_that_exist():
    """Check that no docstring or comment in kvlib/, solutions/kvlib/ or tests/ names a kvlib file
    (kvlib/<path>.py) or module (kvlib.<a>.<b>) that is not in the repository: a map left behind by a move."""
    stale = []
    sources = [*MODULES.values(), *sorted((ROOT / "solutions" / "kvlib").glob("*.py")), *sorted(TESTS.glob("*.py"))]
    for path in sources:
        for line, text in docstrings_and_comments(path):
            for name in KVLIB_PATH.findall(text):
                if not (ROOT / name).is_file() and name not in NOT_KVLIB_FILES:
                    stale.append(f"{path.relative_to(ROOT)}:{line}: {name}")
            for match in DOTTED.finditer(text):
                name = match.group(0)
                if text[match.end() : match.end() + 1] in ("<", "{") or name in NOT_KVLIB_MODULES:
                    continue  # a placeholder: kvlib.measure.bench_<name>, kvlib.{module}
                if not resolves(name):
                    stale.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not stale, "names of nothing:\n  " + "\n  ".join(stale)
