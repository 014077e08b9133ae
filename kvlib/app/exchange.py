"""nbgrader's exchange between Unix accounts, with what nbgrader 0.9 leaves open closed.

  PrivateSubmit        `nbgrader submit` (and the Assignments panel's Submit) as a student: the
                       submission readable by the student and the instructor's group only, where
                       nbgrader makes it 0777 for everyone to write (set in the students' config);
                       without the course's own files that autograde puts back from the source
                       anyway (assets/, kvlib's subpackages: 2.3 of 2.4 MB of notebook 04's)
  OwnerCheckedCollect  `nbgrader collect` as the instructor: a submission is taken only from the
                       account whose name it carries, and only if every file in it is that
                       account's (nbgrader only warns); links are kept as links (LinkKeepingCollect)
The folders and modes of the exchange itself: course_folder.setup_exchange.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import stat
from collections import defaultdict

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.submit import ExchangeSubmit
from nbgrader.utils import check_mode

from kvlib.grading.autograde import LinkKeepingCollect

# The submission's folders are the student's and the instructor's group's (inbound is setgid, so they
# get its group): others cannot even pass through them. The files stay 0644: nbgrader writes
# timestamp.txt after the copy, with the student's own group, and a student cannot give a file a
# group they are not in; the folders keep everyone else out.
SUBMISSION_DIR_MODE = 0o770
SUBMISSION_FILE_MODE = 0o644


# Released folders a submission leaves out: never the learner's (the grader ignores a learner's file in a
# subfolder of kvlib/, and autograde copies these from the source over whatever a submission holds), so a
# copy in inbound/, the student's cache and submitted/ would only cost space: 1.5 MB of assets/ (the tiny
# model, from notebook 02 on) and 0.8 MB of kvlib's subpackages, in every submission.
NOT_SUBMITTED = ("assets", "kvlib/*/")


def _not_submitted(dest: str) -> list[str]:
    """The folders under dest that NOT_SUBMITTED names (kvlib's subfolders, not its top-level files)."""
    out = []
    for pattern in NOT_SUBMITTED:
        out += [p.rstrip("/") for p in glob.glob(os.path.join(glob.escape(dest), pattern))]
    return out


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit without NOT_SUBMITTED, then the submission's modes narrowed to SUBMISSION_DIR_MODE
    and _FILE_MODE."""

    def do_copy(self, src, dest, log=None):
        super().do_copy(src, dest, log)
        for path in _not_submitted(dest):
            if os.path.islink(path):  # copytree followed no link here, but never follow one to delete
                os.remove(path)
            elif os.path.isdir(path):
                shutil.rmtree(path)

    def copy_files(self):
        super().copy_files()
        dest = os.path.join(self.inbound_path, self.assignment_filename)
        folders = []
        for folder, _, files in os.walk(dest):
            for name in files:
                path = os.path.join(folder, name)
                if not os.path.islink(path):  # chmod would follow it
                    os.chmod(path, SUBMISSION_FILE_MODE)
            folders.append(folder)
        for folder in reversed(folders):
            os.chmod(folder, SUBMISSION_DIR_MODE)


def foreign_entries(path: str, uid: int) -> list[str]:
    """Entries under path (itself included) that are not owned by uid, relative to path."""
    out = []
    if os.lstat(path).st_uid != uid:
        out.append(".")
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(folder, name)
            if os.lstat(full).st_uid != uid:
                out.append(os.path.relpath(full, path))
    return out


class OwnerCheckedCollect(LinkKeepingCollect):
    """Collect that refuses a submission whose folder, or any file in it, is not owned by the
    account it names: one student cannot submit in another's name, nor plant a file in another's
    submission. The refused ones are logged as errors and never reach submitted/."""

    def _owned_by_its_student(self, path: str, username: str) -> bool:
        try:
            uid = pwd.getpwnam(username).pw_uid
        except KeyError:
            self.log.error("Not collected: %s names %s, who has no account here", path, username)
            return False
        foreign = foreign_entries(path, uid)
        if foreign:
            owners = sorted({pwd.getpwuid(os.lstat(os.path.join(path, f)).st_uid).pw_name for f in foreign})
            self.log.error(
                "Not collected: %s claims to be %s's, but %s in it belong to %s (submitted in another's name, or files "
                "planted in it)",
                path,
                username,
                ", ".join(foreign[:5]),
                ", ".join(owners),
            )
            return False
        mode = os.lstat(path).st_mode
        if mode & stat.S_IWOTH:
            self.log.warning(
                "%s is writable by every account (mode %s): that student's nbgrader is not set up with "
                "kvlib.app.exchange.PrivateSubmit (docs/instructors.md)",
                path,
                stat.filemode(mode),
            )
        return True

    def init_src(self):
        """nbgrader's ExchangeCollect.init_src, with the submissions that fail the owner check left out
        before the latest one of each student is picked."""
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail("Course not found: {}".format(self.inbound_path))
        if not check_mode(self.inbound_path, read=True, execute=True):
            self.fail("You don't have read permissions for the directory: {}".format(self.inbound_path))
        student_id = self.coursedir.student_id if self.coursedir.student_id else "*"
        pattern = os.path.join(self.inbound_path, "{}+{}+*".format(student_id, self.coursedir.assignment_id))
        records = [self._path_to_record(f) for f in glob.glob(pattern)]
        records = [
            r
            for r in records
            if self._owned_by_its_student(os.path.join(self.inbound_path, r["filename"]), r["username"])
        ]
        usergroups = defaultdict(list)
        for r in records:
            usergroups[r["username"]].append(r)
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for v in usergroups.values():
            records = self._sort_by_timestamp(v)
            if self.duedate is not None and self.before_duedate:
                before = [r for r in records if r["timestamp"] <= self.duedate]
                records = before or records
            self.src_records.append(records[0])


__all__ = ["OwnerCheckedCollect", "PrivateSubmit"]
