"""IsolatedGrading: the autograde step that decides each graded cell's score, out of the
submission's reach.

nbgrader runs it (by configuration) just before SaveAutoGrades. For every grade cell of the
source notebook (as the gradebook records it, not as the submission says) whose grade_id is a
check name, it runs that check here, in the grading process, against the submission's kvlib
functions running in an isolated child (sandbox.py), on inputs drawn from a secret seed per
student. The cell's outputs become the result: a "passed" stream, or an error carrying the
check's message, which SaveAutoGrades turns into full points or 0. Whatever the kernel printed
in that cell, and whatever the submission did to its own notebook or kernel, counts for nothing.
Not here: running the notebook (execute.py), the jail (jail.py), which files of the submission
may be read (submission.py).
"""

from __future__ import annotations

import hashlib
import html
import importlib
import importlib.util
import os
import re
import time
import warnings
from pathlib import Path

import numpy as np
from nbformat.v4 import new_code_cell, new_markdown_cell, new_output, new_raw_cell
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor
from traitlets import Bool, Float, Integer, List, Unicode

from kvlib.checks import checks_of_cell
from kvlib.course.exercises import EXERCISES
from kvlib.course.hints import stuck
from kvlib.grading.checks_registry import isolatable, load_checks
from kvlib.grading.execute import GradingJail
from kvlib.grading.sandbox import Sandbox, SetupError, describe, package_files
from kvlib.grading.submission import helper_modules, read, reserved_names, screen

_MAX_FILE = 1 << 20  # a learner's module larger than 1 MiB is not one
_TORCH = re.compile(r"^\s*(import torch|from torch)", re.M)


def check_rng(secret: bytes, student: str, check: str) -> np.random.Generator:
    """The random inputs of one check for one student: fixed by the course's secret, so grading
    twice gives the same score, and different for every student."""
    digest = hashlib.sha256(b"\0".join([secret, student.encode(), check.encode()])).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


class IsolatedGrading(NbGraderPreprocessor):
    """Scores each graded cell with its check, run on the submission's functions in isolation."""

    call_timeout = Float(10.0, help="seconds one call of a learner's function may take").tag(config=True)
    notebook_timeout = Float(120.0, help="seconds all the isolated checks of one notebook may take").tag(config=True)
    seed = Integer(None, allow_none=True, help="fixes every student's random inputs; default: from secret_file").tag(
        config=True
    )
    secret_file = Unicode(
        "grading_secret", help="file in the course folder holding the secret seed (kvlib course init writes it)"
    ).tag(config=True)
    extra_checks = List(
        Unicode(), help="the instructor's own check modules: importable names, or .py files in the course folder"
    ).tag(config=True)
    preload_torch = Unicode(
        "auto",
        help="import torch in the child before the learner's code: auto (when the exercise modules use it), yes, no",
    ).tag(config=True)
    unknown_cells = Unicode(
        "error",
        help="a grade cell whose grade_id is no check: error (0 points, says so) or kernel (nbgrader's usual scoring, which the submission can fool)",
    ).tag(config=True)
    max_reply_mb = Integer(64, help="largest result a learner's function may return").tag(config=True)

    def preprocess(self, nb, resources):
        ids = resources["nbgrader"]
        student, assignment, notebook = ids["student"], ids["assignment"], ids["notebook"]
        coursedir = CourseDirectory(config=self.config)
        root = Path(coursedir.root)
        registry = load_checks(list(self.extra_checks), root)
        trusted = self._trusted_cells(ids["db_url"], notebook, assignment)
        wanted = [c.metadata.nbgrader.get("grade_id") for c in nb.cells if "nbgrader" in c.metadata]
        used = [
            c
            for g in dict.fromkeys(wanted)
            if g in trusted and trusted[g] is not None
            for c in checks_of_cell(g, registry)
            if isolatable(c)
        ]
        started = time.monotonic()
        sandbox = self._sandbox(coursedir, student, assignment, used) if used else None
        secret = self._secret(root)
        results: dict[str, tuple[bool, str]] = {}  # check name -> (passed, message)
        seen: set[str] = set()
        try:
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader")
                if meta is None:
                    continue
                gid = meta.get("grade_id")
                if gid not in trusted or gid in seen or cell.cell_type != "code":
                    if meta.get("grade") or "points" in meta:  # not a grade cell of the source: earns nothing
                        meta["grade"] = False
                        meta.pop("points", None)
                    continue
                seen.add(gid)
                if trusted[gid] is None:  # a manually graded answer: not ours
                    continue
                meta.update(grade=True, solution=False, points=trusted[gid])
                cell_checks = checks_of_cell(gid, registry)
                if not cell_checks:
                    if self.unknown_cells == "kernel":
                        continue
                    why = (
                        f"no isolated check is named {gid!r}: the instructor must add one "
                        "(IsolatedGrading.extra_checks) or set IsolatedGrading.unknown_cells"
                    )
                    cell.outputs = _outputs(gid, [(gid, False, why)], trusted[gid])
                    continue
                if not all(isolatable(c) for c in cell_checks):  # graded in the (jailed) kernel
                    continue
                for c in cell_checks:
                    if c.name not in results:
                        results[c.name] = self._run(c, sandbox, check_rng(secret, student, c.name))
                whole = any(c.exercise.kind == "fix" for c in cell_checks)  # a bug is fixed or it is not
                verdicts = [(c.name, *results[c.name]) for c in cell_checks]
                cell.outputs = _outputs(gid, verdicts, trusted[gid], whole=whole)
        finally:
            if sandbox is not None:
                sandbox.close()
        if sandbox is not None and sandbox.spawn and sandbox.spawn != "closed":
            self.log.warning(
                "isolated checks of %s/%s/%s: the child could start processes (%s): memory a process it starts "
                "uses is not measured (docs/instructors.md)",
                student,
                assignment,
                notebook,
                sandbox.spawn,
            )
        if sandbox is not None and sandbox.fused and sandbox.fused != "closed":
            self.log.warning(
                "isolated checks of %s/%s/%s: %s: a library attention call holds little memory there, so 6.2's and "
                "9.2's memory cells cannot tell it from attention written by hand (docs/instructors.md)",
                student,
                assignment,
                notebook,
                sandbox.fused,
            )
        if sandbox is not None:
            passed = sum(ok for ok, _ in results.values())
            self.log.info(
                "isolated checks of %s/%s/%s: %d of %d passed in %.1f s (%d child start(s), %d calls)",
                student,
                assignment,
                notebook,
                passed,
                len(results),
                time.monotonic() - started,
                sandbox.starts,
                sandbox.calls,
            )
        return nb, resources

    # -- pieces ------------------------------------------------------------------------------

    def _trusted_cells(self, db_url: str, notebook: str, assignment: str) -> dict[str, float | None]:
        """grade_id -> points of the source notebook's autograded cells (None: manually graded)."""
        with Gradebook(db_url) as gb:
            try:
                source = gb.find_notebook(notebook, assignment)
            except MissingEntry:
                return {}
            manual = {c.name for c in source.solution_cells}
            return {c.name: (None if c.name in manual else float(c.max_score)) for c in source.grade_cells}

    def _secret(self, root: Path) -> bytes:
        if self.seed is not None:
            return str(self.seed).encode()
        path = root / self.secret_file
        if path.is_file():
            return path.read_bytes().strip()
        warnings.warn(
            f"no {path}: every student gets the same inputs (run `kvlib course init` or set IsolatedGrading.seed)",
            stacklevel=2,
        )
        return b"kvlib-course-without-a-secret"

    def _run(self, check, sandbox: Sandbox, rng) -> tuple[bool, str]:
        try:
            check.fn(sandbox.module(check.exercise.module), rng)
        except SetupError:
            raise
        except Exception as err:  # the check's AssertionError, or the learner's code failing
            return False, f"{describe(err)} {stuck(check.exercise.id)}"  # hints never change points
        return True, check.doc

    def _sandbox(self, coursedir: CourseDirectory, student: str, assignment: str, used) -> Sandbox:
        modules = sorted({c.exercise.module for c in used})
        # exercise functions, and the classes whose methods are exercises (KVCache.update: the child makes the object)
        functions = sorted({f"{ex.module}.{ex.name.split('.')[0]}" for ex in EXERCISES if ex.module in modules})
        source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment)) / "kvlib"
        if not source.is_dir():  # a course folder not made by `kvlib course init`: the installed stubs
            source = Path(importlib.import_module("kvlib").__file__).parent
        files = package_files(source)
        learner = {f"kvlib/{m}.py" for m in modules}
        exclude = dict(self.config.Autograde.get("exclude_overwriting", {})).get(assignment, [])
        learner |= {rel for rel in exclude if re.fullmatch(r"kvlib/\w+\.py", rel)}
        submitted = Path(coursedir.format_path(coursedir.submitted_directory, student, assignment))
        screened = screen(
            submitted, top=os.path.normpath(coursedir.format_path(coursedir.submitted_directory, ".", "."))
        )
        broken = []
        for rel in sorted(learner):
            try:
                files[rel] = read(screened, rel, _MAX_FILE)
            except FileNotFoundError:
                files.pop(rel, None)
                broken.append(f"{rel} is missing from the submission")
            except PermissionError as err:
                files.pop(rel, None)
                broken.append(str(err))
        # the learner's own modules beside them (kvlib/my_helpers.py), under kvlib's own names never
        installed = Path(importlib.import_module("kvlib").__file__).parent
        helpers, refused = helper_modules(screened, reserved_names(source, installed) | {rel[6:-3] for rel in learner})
        files.update(helpers)
        settings = GradingJail(config=self.config)
        torch = self.preload_torch == "yes" or (
            self.preload_torch == "auto"
            and any(
                _TORCH.search(files.get(f"kvlib/{m}.py", b"").decode("utf-8", "replace"))
                or _TORCH.search(
                    (source / f"{m}.py").read_text("utf-8", "replace") if (source / f"{m}.py").is_file() else ""
                )
                for m in modules
            )
        )
        mode = settings.mode
        sandbox = Sandbox(
            files,
            modules,
            functions,
            mode=mode,
            python=settings.interpreter() if mode != "plain" else None,
            uid=settings.uid,
            call_timeout=self.call_timeout,
            budget=self.notebook_timeout,
            torch=bool(torch),
            limits=settings.limits(),
            max_reply_mb=self.max_reply_mb,
            binds=settings.binds() if mode != "plain" else None,
        )
        if broken:
            sandbox.broken = "; ".join(broken)
        if refused:  # said when the import fails (a learner module that imports a refused helper)
            sandbox.import_note = "; ".join(f"{rel} was not graded: {why}" for rel, why in refused.items())
        return sandbox


class RestoreCells(NbGraderPreprocessor):
    """Sanitizing, before nbgrader's OverwriteCells: the source notebook's locked, graded and
    solution cells, as the gradebook records them, whatever the submission did to them.

    A cell whose grade_id the source does not have, or repeats, loses its nbgrader metadata (it
    can earn nothing); a known cell gets its flags, points and checksum back (and, if locked, its
    source); a deleted one is put back after the source cell that precedes it. nbgrader's own
    OverwriteCells.add_missing_cells fails when the cell before a deleted test cell is a locked
    markdown cell, and a flipped "grade" flag makes OverwriteCells stop on a checksum mismatch:
    either failure would leave the submission ungraded.
    """

    def preprocess(self, nb, resources):
        ids = resources["nbgrader"]
        with Gradebook(ids["db_url"]) as gb:
            try:
                source = gb.find_notebook(ids["notebook"], ids["assignment"])
            except MissingEntry:
                return nb, resources
            cells = [(c.name, c.cell_type, c.source, c.checksum, bool(c.locked)) for c in source.source_cells]
            points = {c.name: float(c.max_score) for c in source.grade_cells}
            solution = {c.name for c in source.solution_cells}
            task = {c.name for c in source.task_cells}
        known = {c[0]: c for c in cells}

        def metadata(name):
            _, cell_type, _, checksum, locked = known[name]
            meta = {
                "grade": name in points,
                "grade_id": name,
                "locked": locked,
                "schema_version": 3,
                "solution": name in solution,
                "task": name in task,
                "checksum": checksum,
            }
            if name in points:
                meta["points"] = points[name]
            return meta

        seen: set[str] = set()
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if meta is None:
                continue
            name = meta.get("grade_id")
            if name not in known or name in seen:
                del cell.metadata["nbgrader"]
                continue
            seen.add(name)
            cell.metadata["nbgrader"] = metadata(name)
            if known[name][4] and cell.cell_type == known[name][1]:
                cell.source = known[name][2]
        order = [c[0] for c in cells]
        for i, name in enumerate(order):
            if name in seen:
                continue
            _, cell_type, text, _, locked = known[name]
            new = {"code": new_code_cell, "markdown": new_markdown_cell}.get(cell_type, new_raw_cell)(text)
            new.metadata["nbgrader"] = metadata(name)
            if locked:
                new.metadata.update(deletable=False, editable=False)
            at = 0
            for prev in reversed(order[:i]):
                idx = next(
                    (j for j, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == prev), None
                )
                if idx is not None:
                    at = idx + 1
                    break
            nb.cells.insert(at, new)
            seen.add(name)
            self.log.warning("Cell %s was missing from the submission: put it back", name)
        return nb, resources


class NoteRefusedFiles(NbGraderPreprocessor):
    """Sanitizing, after RestoreCells: tells the learner, at the top of the graded notebook, which files of
    their submission the grader refused and why (kvlib.grading.autograde screened them before
    nbgrader copied anything). A notebook that was not screened is not graded at all."""

    def preprocess(self, nb, resources):
        refused = resources.get("nbgrader", {}).get("refused")
        if refused is None:
            raise RuntimeError(
                "this submission was not screened for links before nbgrader copied it: nbgrader_config.py "
                "must call kvlib.grading.autograde.install() (`kvlib course init --force` writes it)"
            )
        if refused:
            lines = [f"- {_plain(rel)}: {_plain(why)}" for rel, why in refused.items()]
            note = new_markdown_cell(
                "**The grader refused these files of your submission.** They were not copied, run or "
                "graded; everything else was:\n\n" + "\n".join(lines)
            )
            note.metadata["kvlib"] = {"refused": True}
            nb.cells.insert(0, note)
        return nb, resources


def _plain(text: str) -> str:
    """Text (a file name the learner chose) that markdown shows as it is: no HTML, no formatting."""
    text = html.escape("".join(ch if ch.isprintable() else "?" for ch in text), quote=False)
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", text)


class HideHiddenTests(ClearHiddenTests):
    """generate_feedback: a graded cell shows its visible asserts (the learner had them) and its
    verdict (the isolated check's "passed: ..." or message), never its hidden tests, which name the
    checks, the instructor's own ones included. Never fails on a learner's own cell that happens
    to contain the marker."""

    enforce_metadata = Bool(False).tag(config=True)


def _outputs(cell: str, verdicts: list[tuple[str, bool, str]], points: float, whole: bool = False) -> list:
    """A graded cell's outputs from its checks' verdicts [(check, passed, message)], as nbgrader's
    SaveAutoGrades reads them: all passed, full points (a "passed" line each); none, an error (0);
    some, a line each and the points earned as the cell's value (nbgrader's partial credit), unless the
    cell is whole (a find-and-fix exercise's: a shipped body that passes some checks earns nothing)."""
    passed = sum(ok for _, ok, _ in verdicts)
    lines = [f"passed: {msg}" if ok else f"failed: {name}: {msg}" for name, ok, msg in verdicts]
    if passed == len(verdicts):
        return [new_output("stream", name="stdout", text="\n".join(lines) + "\n")]
    if passed == 0 or whole:
        message = "; ".join(msg for _, ok, msg in verdicts if not ok)
        return [
            new_output(
                "error",
                ename="AssertionError",
                evalue=message,
                traceback=[f"AssertionError: {msg}" for _, ok, msg in verdicts if not ok]
                + [f"(isolated checks of {cell}: your kvlib code, run apart from this notebook)"],
            )
        ]
    earned = round(points * passed / len(verdicts), 4)
    text = "\n".join(lines) + f"\n{passed} of {len(verdicts)} checks passed (isolated checks of {cell})\n"
    return [
        new_output("stream", name="stdout", text=text),
        new_output("execute_result", data={"text/plain": repr(earned)}, execution_count=None),
    ]
