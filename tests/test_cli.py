"""The `kvlib` command line (kvlib/app/cli.py): its help, its one selector grammar, and its answers to bad input.

Every test here runs the command in this process (kvlib.app.cli.main) and starts nothing: a bad input is
refused before any work, so the table of bad inputs costs no server, notebook or model.
"""

import argparse
import ast
import json
import re
import shlex

import pytest
from conftest import ROOT

from kvlib.app import cli
from kvlib.course.exercises import EXERCISES, headings, notebook_files


def _commands(parser: argparse.ArgumentParser, path=()):
    """(argv prefix, parser) of the command and of every subcommand under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(cli.build_parser()))


def _run(argv, capsys) -> tuple[int, str, str]:
    """main(argv)'s exit status (returned or raised), standard output and standard error."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"^\s+(--[\w-]+)", help_text, re.MULTILINE)) - {"--help"}


@pytest.mark.parametrize("argv", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p) or "kvlib")
def test_every_command_has_its_own_help(argv, capsys):
    """Check that `kvlib ... --help` exits 0 with that command's usage and its own description, shared by no
    other command."""
    code, out, _ = _run([*argv, "--help"], capsys)
    assert code == 0
    assert out.startswith(f"usage: kvlib {' '.join(argv)}".rstrip())
    parser = dict(COMMANDS)[argv]
    assert parser.description and " ".join(parser.description.split()) in " ".join(out.split())
    others = [p.description for path, p in COMMANDS if path != argv]
    assert parser.description not in others


@pytest.mark.parametrize("argv", [[], ["bench"], ["course"]], ids=["kvlib", "bench", "course"])
def test_a_bare_command_prints_its_help(argv, capsys):
    """Check that `kvlib`, `kvlib bench` and `kvlib course` without a subcommand print their help and exit 0."""
    code, out, err = _run(argv, capsys)
    assert (code, err) == (0, "") and out.startswith(f"usage: kvlib {' '.join(argv)}".rstrip())
    assert "COMMAND" in out or "NAME" in out


def test_version_names_the_package_and_the_course_folder(capsys):
    """Check that `kvlib --version` prints kvlib's installed version and the course folder it runs."""
    from importlib.metadata import version

    code, out, _ = _run(["--version"], capsys)
    assert code == 0 and out.strip() == f"kvlib {version('kvlib')}, course folder {ROOT}"


def test_each_benchmark_offers_only_the_options_its_function_takes(capsys):
    """Check that `kvlib bench NAME --help` lists the common options and, beyond them, only options that bench_NAME
    takes as parameters (--device where it takes a device, cache's --ways), never another benchmark's (class's
    --students, --db, --via)."""
    common = {"--json", "--threads", "--quick", "--reference", "--quiet"}
    for name in cli.BENCHES:
        tree = ast.parse((ROOT / "kvlib" / "measure" / f"bench_{name}.py").read_text(encoding="utf-8"))
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f"bench_{name}")
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        params |= {"device"} if "devices" in params else set()  # memory's --device is one of its devices
        assert {"threads", "quick"} <= params
        code, out, _ = _run(["bench", name, "--help"], capsys)
        own = _options(out) - common
        assert code == 0 and common <= _options(out), name
        assert {o.removeprefix("--") for o in own} <= params, f"bench {name} offers {own}, bench_{name} takes {params}"
        assert ("--device" in own) == cli.BENCHES[name].device, name
    assert [name for name, b in cli.BENCHES.items() if b.device] == ["memory", "gqa"]
    code, out, _ = _run(["bench", "class", "--help"], capsys)
    assert _options(out) == {"--json", "--students", "--assignment", "--jobs", "--db", "--via"}


def _documented_commands():
    """(file, line number, argv) of every `kvlib` command in the bash blocks of README.md and docs/*.md."""
    for doc in [ROOT / "README.md", *sorted(ROOT.glob("README.*.md")), *sorted((ROOT / "docs").glob("*.md"))]:
        language = None
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("```"):
                language = None if language is not None else line.strip()[3:] or "text"
            elif language == "bash" and (m := re.match(r"^\s*(?:[A-Z_]+=\S+\s+)*kvlib\s+(.*)$", line)):
                command = re.split(r"\s*(?:\s#\s|&&|\||>|;)", m.group(1))[0]  # the comment, what follows
                yield doc.relative_to(ROOT).as_posix(), n, shlex.split(command)


def test_every_documented_command_parses_as_written(capsys):
    """Check that each `kvlib` command of the README's and the docs' bash blocks is one the command line takes
    as written (no option its subcommand lacks), and that the README's benchmarks for presenters name
    --reference, which a fresh clone's stubs need."""
    found = list(_documented_commands())
    assert len(found) >= 15
    for doc, n, argv in found:
        try:
            args, extra = cli.build_parser().parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{doc}:{n}: kvlib {' '.join(argv)}: {capsys.readouterr().err.strip()}")
        assert not extra, f"{doc}:{n}: kvlib {' '.join(argv)}: {extra} is not an option of kvlib {args.parser.prog}"
    benches = [argv for doc, _, argv in found if doc == "README.md" and argv[0] == "bench"]
    assert len(benches) == len(cli.BENCHES) and all("--reference" in argv for argv in benches)


# ---------------------------------------------------------------------------------------------
# One selector grammar


def test_every_exercise_heading_is_the_exercise_tables():
    """Check that every exercise's heading in its solution notebook reads `Exercise X.Y — <the table's title>`,
    once, and that the learner notebooks hold the same headings."""
    found = {}
    for path in notebook_files(folder="solutions"):
        for ex_id, title in headings(path).items():
            assert ex_id not in found, f"Exercise {ex_id} has a heading in {found[ex_id][0]} and {path}"
            found[ex_id] = (path, title)
    wrong = {ex.id: (found.get(ex.id, (None, None))[1], ex.title) for ex in EXERCISES}
    wrong = {k: v for k, v in wrong.items() if v[0] != v[1]}
    assert not wrong, f"notebook headings that are not the table's titles (heading, table): {wrong}"
    for path, _ in found.values():
        learner = ROOT / "notebooks" / path.relative_to(ROOT / "solutions")
        assert headings(learner) == headings(path), f"{learner} is older than {path}: run kvlib course release"


@pytest.mark.parametrize(
    ("selector", "ids", "solution_files"),
    [
        ("1.2", ["1.2"], ["01-attention/attention.ipynb"]),
        ("2.5", ["2.5"], ["02-generation/layer.ipynb"]),
        ("01", ["1.1", "1.2", "1.3", "1.4", "1.5"], ["01-attention/attention.ipynb"]),
        (
            "8",
            ["8.1", "8.2", "8.7", "8.5", "8.6", "8.8", "8.3", "8.4"],
            ["08-compress/compress.ipynb", "08-compress/mla.ipynb", "08-compress/window.ipynb"],
        ),
        ("02b", ["2.4", "2.5", "2.6", "2.8"], ["02-generation/layer.ipynb"]),
        ("08b", ["8.5", "8.6", "8.8"], ["08-compress/mla.ipynb"]),
        ("07c", ["7.5"], ["07-serving/sharing.ipynb"]),
        ("notebooks/02-generation/generation.ipynb", ["2.1", "2.2", "2.3", "2.7"], None),
        ("solutions/06-gqa", ["6.1", "6.2", "6.3", "6.4", "6.5"], ["06-gqa/gqa.ipynb", "06-gqa/quality.ipynb"]),
    ],
)
def test_one_selector_names_the_same_notebooks_everywhere(
    selector, ids, solution_files, capsys, monkeypatch, learner_mode
):
    """Check that a selector picks the same exercises in `kvlib check` as the notebooks that `kvlib present
    --check` runs and `kvlib lab` opens (a path names itself; a number opens its first part)."""
    monkeypatch.chdir(ROOT)
    code, out, _ = _run(["check", selector, "--json"], capsys)
    assert code in (0, 1) and [r["id"] for r in json.loads(out)] == ids
    if solution_files is not None:
        from kvlib.app import lab

        files = [p.relative_to(ROOT / "solutions").as_posix() for p in lab.solution_notebooks(selector)]
        assert files == solution_files
        assert lab.resolve_open(selector, folder="solutions") in (f"solutions/{solution_files[0]}", selector)


def test_check_titles_are_whole_on_a_100_column_terminal(capsys, monkeypatch, learner_mode):
    """Check that `kvlib check`'s table shows every title whole on a 100-column terminal (the longest title
    included) and names each row's status."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = _run(["check", "03"], capsys)
    assert code == 1
    for ex in [ex for ex in EXERCISES if ex.notebook == "03-recompute"]:
        assert re.search(rf"^{re.escape(ex.id)}\s+todo\s+03-recompute\s+{re.escape(ex.title)}", out, re.MULTILINE)
    assert max(len(line) for line in out.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2, never a traceback

A_FILE = "pyproject.toml"  # an existing file where a folder is wanted (paths are relative to ROOT)
BAD_INPUTS = [
    (["nope"], "invalid choice: 'nope'"),
    (["--nope"], "unrecognized arguments: --nope"),
    (["check", "9.9"], "no exercise '9.9'"),
    (["check", "99"], "no notebook '99'"),
    (["check", "02c"], "no part '02c': 02-generation has 2 notebook(s): 02a, 02b"),
    (["check", "/"], "outside the course folder"),
    (["check", A_FILE], "is not a notebook"),
    (["check", "no-such-thing"], "no exercise, notebook or path 'no-such-thing'"),
    (["check", "1.2", "extra"], "kvlib check: unrecognized arguments: extra"),
    (["hint", "12.1"], "no exercise '12.1'"),
    (["hint", "1.2", "--level", "0"], "--level: expected a whole number of at least 1, got '0'"),
    (["hint", "1.2", "--level", "99"], "has hints 1 to"),
    (["hint"], "the following arguments are required: exercise"),
    (["generate", "hi", "--threads", "0"], "--threads: expected a whole number of at least 1, got '0'"),
    (["generate", "hi", "--max-new-tokens", "-1"], "--max-new-tokens: expected a whole number"),
    (["generate", "hi", "--temperature", "-1"], "--temperature: expected a number of at least 0"),
    (["generate", "hi", "--temperature", "nan"], "--temperature: expected a number of at least 0"),
    (["generate", ""], "the prompt is empty"),
    (["bench", "nope"], "invalid choice: 'nope'"),
    (["bench", "cache", "--threads", "0"], "--threads: expected a whole number of at least 1"),
    (["bench", "cache", "--device", "cuda"], "kvlib bench cache: unrecognized arguments: --device cuda"),
    (["bench", "spec", "--device", "cuda"], "kvlib bench spec: unrecognized arguments: --device cuda"),
    (["bench", "gqa", "--students", "3"], "kvlib bench gqa: unrecognized arguments: --students 3"),
    (["bench", "memory", "--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["bench", "class", "--jobs", "0"], "--jobs: expected a whole number of at least 1"),
    (["bench", "class", "--students", "x"], "--students: expected a whole number of at least 1, got 'x'"),
    (["lab", "99"], "no notebook '99'"),
    (["lab", "02c"], "no part '02c'"),
    (["lab", "--port", "99999"], "--port: expected a whole number from 1 to 65535, got '99999'"),
    (["lab", "--port", "0"], "--port: expected a whole number from 1 to 65535"),
    (["present", "--figures", "x"], "--figures belongs to a --check run; add --check"),
    (["present", "--timeout", "30"], "--timeout belongs to a --check run; add --check"),
    (["present", "--quiet"], "--quiet belongs to a --check run; add --check"),
    (["present", "--check", "--figures", A_FILE], f"--figures: {A_FILE} is a file, not a folder"),
    (["present", "--check", "99"], "no notebook '99'"),
    (["present", "--check", "--timeout", "0"], "--timeout: expected a whole number of at least 1"),
    (["course", "nope"], "invalid choice: 'nope'"),
    (["course", "init", A_FILE], f"dir: {A_FILE} is a file, not a folder"),
    (["course", "init", "x", "--exchange", A_FILE], f"--exchange: {A_FILE} is a file, not a folder"),
    (
        ["course", "init", "x", "--exchange-service", "hub.example.edu"],
        "--exchange-service 'hub.example.edu': give the",
    ),
    (
        ["course", "init", "x", "--exchange", "docs", "--exchange-service", "https://h/"],
        "--exchange-service (a hub's URL), not",
    ),
    (["course", "autograde", "01-attention", "--jobs", "0"], "--jobs: expected a whole number of at least 1"),
    (["course", "autograde"], "the following arguments are required: assignment"),
    (["course", "site", "--out", A_FILE], f"--out: {A_FILE} is a file, not a folder"),
    (["course", "site", "--timeout", "0"], "--timeout: expected a whole number of at least 1"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=[" ".join(a) or "''" for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_status_2(argv, message, capsys, monkeypatch, tmp_path):
    """Check that each bad input is refused with exit status 2 and one line on stderr that names the command and
    the problem, with no traceback and nothing on stdout."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # kvlib hint's state, never the user's
    code, out, err = _run(argv, capsys)
    assert code == 2, (code, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("kvlib"), err
    assert message in err and "Traceback" not in err
