"""`nbgrader autograde` that never copies or reads a submission through a link.

nbgrader 0.9's Autograde copies every file of submitted/<student>/<assignment>/ into autograded/
with shutil.copy, which follows symbolic links, and reads each notebook the same way; run as root,
a link to the source notebook, a clone's solutions or another student's file becomes a real copy
that the learner's code can print into its feedback. ScreenedAutograde screens each submission
first (kvlib.grading.submission.screen) and then:
  - copies only the regular files screening accepted (opened without following links);
  - reads a notebook that is a link as an empty one, which RestoreCells fills with the source's
    graded cells, so the submission's kvlib code is still graded;
  - logs every refused file, and hands the list to the NoteRefusedFiles preprocessor (resources
    ["nbgrader"]["refused"]), which tells the learner at the top of the graded notebook;
  - stops, before anything is read, a submission whose timestamp.txt is not a plain file (nbgrader
    reads it before any hook runs), saying so in the log;
  - writes each autograded notebook whole or not at all (a temporary file, then a rename), and makes
    its temporary folders in one of its own (kvlib.grading.scratch), removing those a killed grader left.
LinkKeepingCollect does the same for `nbgrader collect`: a link a student adds in the exchange
arrives in submitted/ as a link, to be refused here. Nothing in submitted/ is changed.
`install()` (called by the nbgrader_config.py that `kvlib course
init` writes) makes `nbgrader autograde` and the formgrader's autograde use it: nbgrader builds its
Autograde converter by name, with no setting to choose the class. NoteRefusedFiles refuses to
grade a notebook that did not come through here, so a setup where install() did not take grades
nothing rather than grading through links.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path

import nbformat
import nbgrader.apps.api
import nbgrader.apps.autogradeapp
from nbconvert.exporters.exporter import ResourcesDict
from nbgrader.converters import Autograde
from nbgrader.converters.base import BaseConverter
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import find_all_files, ignore_patterns

from kvlib.grading import scratch
from kvlib.grading.execute import GradingJail
from kvlib.grading.submission import Screened, open_screened, read, screen

_MAX_NOTEBOOK = 64 << 20  # a submitted notebook larger than this is not read


class _ScreenedSteps(BaseConverter):
    """BaseConverter's two steps that read submitted/, redone through the screening. It sits
    between Autograde and BaseConverter in ScreenedAutograde's method order, so Autograde's own
    `super().init_assignment` and `super().convert_single_notebook` land here."""

    _screened: Screened | None = None

    def _submission(self) -> Screened:
        if self._screened is None:
            raise RuntimeError("the submission was not screened")
        return self._screened

    def init_assignment(self, assignment_id: str, student_id: str) -> None:
        """BaseConverter.init_assignment: every non-notebook file of the submission to autograded/,
        except the refused ones (links are never followed)."""
        screened = self._submission()
        source = self._format_source(assignment_id, student_id)
        dest = self._format_dest(assignment_id, student_id)
        for filename in find_all_files(source, self.coursedir.ignore + ["*.ipynb"]):
            rel = Path(os.path.relpath(filename, source)).as_posix()
            if rel not in screened.files:  # refused (logged by ScreenedAutograde.init_assignment)
                continue
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                os.remove(path)
            self.log.info("Copying %s -> %s", filename, path)
            with open_screened(screened, rel) as src, open(path, "wb") as out:
                shutil.copyfileobj(src, out)
                os.chmod(path, os.fstat(src.fileno()).st_mode & 0o777)

    def convert_single_notebook(self, notebook_filename: str) -> None:
        """The sanitizing pass reads the submitted notebook: through the screening, and a refused
        one as an empty notebook. The autograding pass reads autograded/ (our own copy)."""
        screened = self._screened
        rel = None
        if screened is not None:  # both paths as nbgrader wrote them: never resolved through a link
            rel = Path(os.path.relpath(os.path.abspath(notebook_filename), os.path.abspath(screened.folder))).as_posix()
        if rel is None or rel.startswith("../"):
            if getattr(self, "_sanitizing", False):
                raise RuntimeError(
                    f"{notebook_filename} is not in the screened submission {screened and screened.folder}"
                )
            return super().convert_single_notebook(notebook_filename)
        self.log.info("Converting notebook %s", notebook_filename)
        resources = self.init_single_notebook_resources(notebook_filename)
        data = None
        if screened.why(rel) is None:
            try:
                data = read(screened, rel, _MAX_NOTEBOOK)
            except PermissionError as err:  # too large, or changed since it was screened
                screened.refused[rel] = str(err)
                resources["nbgrader"]["refused"] = dict(screened.refused)
                self.log.warning("Refused %s: %s", notebook_filename, err)
        if data is not None:
            nb = nbformat.reads(data.decode("utf-8"), as_version=4)
            st = os.lstat(notebook_filename)
        else:
            nb = nbformat.v4.new_notebook()
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            st = None
        meta = resources.setdefault("metadata", ResourcesDict())
        meta["name"] = os.path.splitext(os.path.basename(notebook_filename))[0]
        meta["path"] = os.path.dirname(notebook_filename)
        stamp = datetime.datetime.fromtimestamp(st.st_mtime if st else 0)
        meta["modified_date"] = stamp.strftime("%B %d, %Y")
        output, resources = self.exporter.from_notebook_node(nb, resources=resources)
        self.write_single_notebook(output, resources)

    def write_single_notebook(self, output: str, resources: ResourcesDict) -> None:
        """BaseConverter.write_single_notebook, whole or not at all: a temporary file beside the notebook, then a
        rename over it, so a grader killed while writing leaves the notebook as it was, never half of it."""
        folder = self._format_dest(resources["nbgrader"]["assignment"], resources["nbgrader"]["student"])
        self.writer.build_directory = folder  # where Autograde's second pass reads the notebook back
        os.makedirs(folder, exist_ok=True)
        final = os.path.join(folder, resources["unique_key"] + resources.get("output_extension", ".ipynb"))
        fd, tmp = tempfile.mkstemp(prefix=".kvlib-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(output)
                f.flush()
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # the mode nbgrader's own writer gives it
            os.replace(tmp, final)
        except BaseException:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise


class ScreenedAutograde(Autograde, _ScreenedSteps):
    """nbgrader's Autograde, reading each submission only through kvlib.grading.submission, and
    saying first which isolation grading gets (refusing plain mode where the config does)."""

    def start(self) -> None:
        GradingJail(config=self.config).announce(self.log)
        scratch.use_own_tempdir()
        swept = scratch.sweep()
        if swept:
            self.log.info("Removed %d temporary folder(s) of killed grading runs: %s", len(swept), swept)
        super().start()

    def init_destination(self, assignment_id: str, student_id: str) -> bool:
        # nbgrader reads timestamp.txt here and in init_assignment: screen first
        self._screened = None
        folder = self._format_source(assignment_id, student_id)
        top = self.coursedir.format_path(self.coursedir.submitted_directory, ".", ".")
        screened = screen(folder, top=os.path.normpath(top))
        if "timestamp.txt" in screened.refused or "." in screened.refused:
            reason = screened.refused.get("timestamp.txt") or screened.refused["."]
            raise PermissionError(
                f"{student_id}/{assignment_id}: timestamp.txt in the submission is {reason}"
                if "timestamp.txt" in screened.refused
                else f"{student_id}/{assignment_id}: {reason}"
            )
        for rel, why in screened.refused.items():
            self.log.warning(
                "Refused %s/%s/%s: %s (not copied, not read, not graded)", student_id, assignment_id, rel, why
            )
        self._screened = screened
        return super().init_destination(assignment_id, student_id)

    def init_single_notebook_resources(self, notebook_filename: str):
        resources = super().init_single_notebook_resources(notebook_filename)
        resources["nbgrader"]["refused"] = dict(self._submission().refused)
        return resources


class LinkKeepingCollect(ExchangeCollect):
    """`nbgrader collect` (the exchange) copying a link in a student's inbound folder as a link, not as
    the file it points to (nbgrader's copytree follows links, as the instructor): a link a student
    adds to their submission in the exchange then reaches submitted/ as a link, which
    ScreenedAutograde refuses. Set by `c.ExchangeFactory.collect` in the course's nbgrader_config.py."""

    def do_copy(self, src, dest, log=None):
        size = self.get_size(src)
        if size > 1000 * self.coursedir.max_dir_size:
            self.log.error("Directory size is too big")
            raise RuntimeError(
                f"Directory size is too big. Size is {size}, maximum size is {1000 * self.coursedir.max_dir_size}"
            )
        skip = ignore_patterns(
            exclude=self.coursedir.ignore,
            include=self.coursedir.include,
            max_file_size=self.coursedir.max_file_size,
            log=self.log,
        )

        def ignore(folder, names):  # nbgrader's own rules, on what is not a link (a link is kept, never followed)
            links = {n for n in names if os.path.islink(os.path.join(folder, n))}
            return set(skip(folder, [n for n in names if n not in links]))

        shutil.copytree(src, dest, symlinks=True, ignore=ignore)
        if self.coursedir.groupshared:
            for dirname, _, _ in os.walk(dest):
                mode = os.stat(dirname).st_mode
                if mode & 0o2770 != 0o2770:
                    try:
                        os.chmod(dirname, (mode | 0o2770) & 0o2777)
                    except PermissionError:
                        self.log.warning("Could not update permissions of %s to make it groupshared", dirname)


def install() -> None:
    """Make `nbgrader autograde` (and the formgrader's Autograde button) use ScreenedAutograde."""
    nbgrader.apps.autogradeapp.Autograde = ScreenedAutograde
    nbgrader.apps.api.Autograde = ScreenedAutograde


__all__ = ["LinkKeepingCollect", "ScreenedAutograde", "install"]
