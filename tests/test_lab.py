"""kvlib lab / kvlib present (kvlib/app/lab.py), and that every figure of the course comes from kvlib.course.plotting.

The real browser is tests/test_browser.py; these tests need no browser and start no server.
"""

import ast
import io
import json
import re

import nbformat
import pytest
from conftest import ROOT, on_a_terminal, shown_progress

from kvlib.app import lab
from kvlib.app import release as course

SOLUTION_NOTEBOOKS = [p for name in course.assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]
LEARNER_NOTEBOOKS = [p for name in course.assignments() for p in sorted((ROOT / "notebooks" / name).glob("*.ipynb"))]


# ---------------------------------------------------------------------------------------------
# The learner view and the launch command


def test_learner_config_hides_the_instructor_tools_and_keeps_validate(tmp_path):
    """Check that the learner view disables nbgrader's instructor plugins and server extensions, not Validate."""
    lab.write_learner_config(tmp_path)
    page = json.loads((tmp_path / "labconfig" / "page_config.json").read_text())
    disabled = {name for name, off in page["disabledExtensions"].items() if off}
    assert {
        "@jupyter/nbgrader:formgrader",
        "@jupyter/nbgrader:create-assignment",
        "@jupyter/nbgrader:course-list",
    } <= disabled
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    server = json.loads((tmp_path / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert server["nbgrader.server_extensions.formgrader"] is False
    assert "nbgrader.server_extensions.validate_assignment" not in server


def test_lab_env_sets_reference_mode_only_for_presenters(tmp_path):
    """Check that presenter mode sets KVLIB_SOLUTIONS=1, the learner's mode clears it, and the view comes first."""
    base = {"KVLIB_SOLUTIONS": "1", "JUPYTER_CONFIG_PATH": "/elsewhere"}
    learner = lab.lab_env(tmp_path, reference=False, base=base)
    presenter = lab.lab_env(tmp_path, reference=True, base={})
    assert "KVLIB_SOLUTIONS" not in learner and presenter["KVLIB_SOLUTIONS"] == "1"
    assert learner["JUPYTER_CONFIG_PATH"].split(":") == [str(tmp_path), "/elsewhere"]
    assert presenter["JUPYTER_CONFIG_PATH"] == str(tmp_path)


def test_lab_command_serves_the_course_folder_and_opens_the_notebook():
    """Check that the jupyter lab command line has the course as root and opens the requested path."""
    cmd = lab.lab_command(open_path="solutions/01-attention/attention.ipynb", port=8999, browser=False, token="")
    assert f"--ServerApp.root_dir={ROOT}" in cmd
    assert "--LabApp.default_url=/lab/tree/solutions/01-attention/attention.ipynb" in cmd
    assert "--ServerApp.port=8999" in cmd and "--no-browser" in cmd and "--IdentityProvider.token=" in cmd


@pytest.mark.parametrize("name", course.assignments())
def test_resolve_open_finds_every_notebook_by_number(name):
    """Check that `kvlib lab NN` and `kvlib present NN` open that notebook, learner and solved."""
    number = name.split("-")[0]
    assert lab.resolve_open(number, folder="solutions").startswith(f"solutions/{name}/")
    if list((ROOT / "notebooks" / name).glob("*.ipynb")):  # a notebook being written has no release yet
        assert lab.resolve_open(number, folder="notebooks").endswith(".ipynb")
    assert lab.resolve_open(None, folder="solutions") == "solutions"


def test_resolve_open_names_the_problem():
    """Check that an unknown notebook number or a path outside the course gets an error that says so."""
    with pytest.raises(ValueError, match=r"no notebook '99'.*01"):
        lab.resolve_open("99", folder="notebooks")
    with pytest.raises(ValueError, match="outside the course"):
        lab.resolve_open("/", folder="notebooks")
    with pytest.raises(ValueError, match=r"no part '02c': 02-generation has 2 notebook\(s\): 02a, 02b"):
        lab.resolve_open("02c", folder="notebooks")


def test_resolve_open_picks_a_part_by_letter():
    """Check that 02a and 02b open notebook 02's two parts, in order, and 02 the first."""
    assert lab.resolve_open("02", folder="notebooks") == "notebooks/02-generation/generation.ipynb"
    assert lab.resolve_open("02a", folder="notebooks") == "notebooks/02-generation/generation.ipynb"
    assert lab.resolve_open("02b", folder="notebooks") == "notebooks/02-generation/layer.ipynb"
    assert lab.resolve_open("8b", folder="solutions") == "solutions/08-compress/mla.ipynb"


def test_present_check_covers_every_assignment():
    """Check that `kvlib present --check` runs every solution notebook of every assignment, in course order (02, 04 and
    08 hold two parts each: both run)."""
    names = [p.parent.name for p in lab.solution_notebooks()]
    assert list(dict.fromkeys(names)) == course.assignments()
    assert [p.name for p in lab.solution_notebooks("02")] == ["generation.ipynb", "layer.ipynb"]
    assert [p.name for p in lab.solution_notebooks("02b")] == ["layer.ipynb"]
    assert lab.solution_notebooks("4.2") == lab.solution_notebooks("04a")  # an exercise names the part that asks it
    assert lab.solution_notebooks("4.5") == lab.solution_notebooks("04b") and len(lab.solution_notebooks("04")) == 2
    with pytest.raises(ValueError, match="no exercise, notebook or path 'attention'"):
        lab.solution_notebooks("attention")


def test_present_check_reports_the_first_error_the_figures_and_its_progress(tmp_path, monkeypatch):
    """Check that the presenter check names a failing cell's error, collects the figures shown before it, prints
    one line for the notebook and, on a terminal, shows a bar counting the cells run."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from kvlib.course import plotting\nplotting.attention_weights(['a', 'b'], [0.25, 0.75], [1.0, 2.0])"
        ),
        nbformat.v4.new_code_cell("raise ValueError('the third cell is broken')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setattr(lab, "solution_notebooks", lambda selector=None: [path])
    out = io.StringIO()
    with on_a_terminal() as err:
        [run] = lab.check_course(timeout=60, out=out)
    assert run.error is not None and "the third cell is broken" in run.error
    assert out.getvalue().startswith(str(path)) and "FAILED: " in out.getvalue()
    assert shown_progress(err.getvalue(), "kvlib present --check") and "/3 [" in err.getvalue()
    figures = run.figures()
    assert [i for i, _ in figures] == [0] and figures[0][1].startswith(b"\x89PNG")


# ---------------------------------------------------------------------------------------------
# Every figure comes from kvlib.course.plotting

PLOTTING_LIBS = {"matplotlib", "seaborn", "plotly", "bokeh", "altair", "pylab"}
# pyplot and friends, magics, and pandas-style .plot() / .hist() on data (kvlib.course.plotting's names never match)
DIRECT_CALLS = re.compile(r"\b(plt|pyplot|sns|px)\s*\.|%matplotlib|%pylab|\.(plot|hist|scatter|imshow|bar|barh)\(")


def _code(cell_source: str) -> str:
    """A code cell without IPython magics and shell lines, which ast cannot parse."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines())


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", SOLUTION_NOTEBOOKS + LEARNER_NOTEBOOKS, ids=lambda p: f"{p.parts[-3]}/{p.parent.name}")
def test_notebook_figures_come_from_kvlib_plotting(path):
    """Check that no notebook cell imports or calls a plotting library: every figure is a kvlib.course.plotting function."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        direct = DIRECT_CALLS.search(cell.source)
        assert not direct, (
            f"{path.relative_to(ROOT)} cell {i} draws with {direct.group(0)!r}: add a function to kvlib/course/figures/"
        )
        libs = _imports(_code(cell.source)) & PLOTTING_LIBS
        assert not libs, (
            f"{path.relative_to(ROOT)} cell {i} imports {sorted(libs)}: figures come from kvlib.course.plotting"
        )


def test_only_kvlib_plotting_imports_matplotlib():
    """Check that kvlib's modules and the reference solutions leave every figure to kvlib/course/figures/."""
    files = sorted((ROOT / "kvlib").rglob("*.py")) + sorted((ROOT / "solutions" / "kvlib").glob("*.py"))
    offenders = [
        f.relative_to(ROOT).as_posix()
        for f in files
        if f.parent.name != "figures" and _imports(f.read_text(encoding="utf-8")) & PLOTTING_LIBS
    ]
    assert not offenders, f"these import a plotting library; move the figure to kvlib/course/figures/: {offenders}"
