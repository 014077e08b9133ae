"""Packaging: the installs by role (pyproject.toml's dependencies, [instructor], [dev]) hold what each role runs,
and environment.yml names the same packages."""

import ast
import json
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires

import tomllib
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONDA_NAMES = {"torch": "pytorch"}  # pip name -> conda-forge name, where they differ
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# Run, not imported: `kvlib lab` starts `python -m jupyterlab`, whose notebooks run in ipykernel.
RUN_BY_THE_LEARNER = {"jupyterlab", "ipykernel"}
# Where the learner's code starts: the commands `kvlib lab` and `kvlib check` (and the modules they load), the
# checks; the notebooks' own imports are added from notebooks/.
LEARNER_ENTRY = ["kvlib.app.cli", "kvlib.app.lab", "kvlib.checks"]
# An import the learner's code never reaches, by the reason its PLC0415 comment gives.
NOT_THE_LEARNERS = re.compile(r"noqa: PLC0415 \((optional dependency|not in learners' folders: instructor only)")


def _name(spec: str) -> str:
    return canonicalize_name(re.split(r"[\s<>=!\[~;]", spec.strip(), maxsplit=1)[0])


def _imports(source: str, lines: list[str] | None = None):
    """The modules a source imports (at any depth: a function's lazy import too), but for NOT_THE_LEARNERS."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            said = " ".join(lines[node.lineno - 1 : node.end_lineno]) if lines else ""
            if NOT_THE_LEARNERS.search(said):
                continue
            if isinstance(node, ast.Import):
                yield from (a.name for a in node.names)
            elif node.module and node.level == 0:
                yield node.module
                yield from (f"{node.module}.{a.name}" for a in node.names)  # `from kvlib.core import model`


def _module_file(name: str):
    path = ROOT.joinpath(*name.split("."))
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def learner_imports() -> set[str]:
    """The top-level modules outside kvlib and the standard library that the learner's code imports: every kvlib
    module reachable from LEARNER_ENTRY and the learner notebooks' code cells, followed import by import."""
    todo = list(LEARNER_ENTRY)
    for path in sorted((ROOT / "notebooks").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                code = "".join(cell["source"]).splitlines()
                todo += _imports("\n".join(line for line in code if not line.lstrip().startswith(("%", "!"))))
    seen, outside = set(), set()
    while todo:
        parts = todo.pop().split(".")
        if parts[0] != "kvlib":
            outside.add(parts[0])
            continue
        for i in range(1, len(parts) + 1):  # a module and the packages above it, whose __init__ runs first
            name = ".".join(parts[:i])
            if name not in seen and (path := _module_file(name)) is not None:
                seen.add(name)
                text = path.read_text(encoding="utf-8")
                todo += _imports(text, text.splitlines())
    return outside - set(sys.stdlib_module_names)


def closure(specs: list[str]) -> set[str]:
    """Every distribution that installing specs brings, by the installed packages' own requirements (markers
    evaluated here; a requirement's extras followed)."""
    todo, seen = [Requirement(s) for s in specs], set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            needs = requires(req.name) or []
        except PackageNotFoundError:
            continue
        for spec in needs:
            need = Requirement(spec)
            envs = [{"extra": ""}] + [{"extra": e} for e in req.extras]
            if need.marker is None or any(need.marker.evaluate(env) for env in envs):
                todo.append(need)
    return {name for name, _ in seen}


def test_learner_install_has_what_the_learner_runs():
    """Check that the learner's install (pyproject.toml's dependencies) names, itself, every distribution that
    `kvlib lab`, `kvlib check` and the learner notebooks import or run (statically: kvlib's modules followed
    import by import from the commands and the notebooks' cells)."""
    modules = learner_imports()
    assert {"torch", "numpy", "nbgrader", "transformers"} <= modules  # the scan reaches the notebooks and lab
    of_module = packages_distributions()
    needed = {canonicalize_name(of_module[m][0]) for m in modules} | RUN_BY_THE_LEARNER
    declared = {_name(s) for s in PROJECT["dependencies"]}
    assert not needed - declared, f"the learner imports or runs {sorted(needed - declared)}, not in dependencies"


def test_learner_install_holds_nothing_of_the_contributors_or_instructors():
    """Check that the learner's dependencies, with everything they bring, hold none of [dev]'s and
    [instructor]'s and [site]'s packages (pytest, ruff, playwright, JupyterHub, the PostgreSQL driver, Sphinx ...),
    and that [dev] brings the instructor's stack and the site's, which its tests and CI run."""
    learner = closure(PROJECT["dependencies"])
    assert "jupyterlab" in learner and "nbgrader" in learner
    others = {_name(s) for s in EXTRAS["dev"] + EXTRAS["instructor"] + EXTRAS["site"] + EXTRAS["peers"]} - {"kvlib"}
    assert not learner & others, f"the learner's install brings {sorted(learner & others)}"
    assert "kvlib[instructor,site]" in EXTRAS["dev"]


def test_environment_yml_lists_the_same_packages_as_pyproject():
    """Check that environment.yml installs exactly the learner's, the instructor's, the site's and the dev packages
    of pyproject.toml."""
    pip = {_name(s) for s in PROJECT["dependencies"] + EXTRAS["dev"] + EXTRAS["instructor"] + EXTRAS["site"]} - {
        "kvlib"
    }
    conda = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("\ndependencies:\n", 1)[1].splitlines():
        m = re.match(r"^  - ([A-Za-z][\w.-]*)", line)
        if m and m.group(1) not in {"python", "pip"}:
            conda.add(canonicalize_name(m.group(1)))
    assert conda == {CONDA_NAMES.get(n, n) for n in pip}


def test_declared_torch_range_admits_the_ci_build():
    """Check that the torch range in pyproject.toml admits torch 2.13.0, which CI installs first."""
    import torch

    spec = next(s for s in PROJECT["dependencies"] if _name(s) == "torch")
    low = re.search(r">=\s*([\d.]+)", spec).group(1)
    high = re.search(r"<\s*([\d.]+)", spec).group(1)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split("."))) + (0,)
