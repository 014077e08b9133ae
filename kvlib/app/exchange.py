"""nbgrader's exchange between Unix accounts, with what nbgrader 0.9 leaves open closed.

  PrivateSubmit        `nbgrader submit` (and the Assignments panel's Submit) as a student: the
                       submission readable by the student and the instructor's group only, where
                       nbgrader makes it 0777 for everyone to write (set in the students' config);
                       without the course's own files that autograde puts back from the source
                       anyway (assets/, kvlib's subpackages: 2.3 of 2.4 MB of notebook 04's)
  OwnerCheckedCollect  `nbgrader collect` as the instructor: a submission is taken only from the
                       account whose name it carries, and only if every file in it is that
                       account's (nbgrader only warns); links are kept as links (LinkKeepingCollect);
                       and it is timed by the kernel, not by the student (submission_time)
The folders and modes of the exchange itself: course_folder.setup_exchange.

A student owns their folder in inbound/, so they can rewrite its timestamp.txt, `touch` its files, edit
their code after the deadline, rename the folder or make one by hand. None of that can set a file's
change time (st_ctime: the kernel sets it to the clock on every write, chmod, rename or link, and
`touch` cannot set it), so the time a submission is collected as is the latest change time of every
file and folder in it: the moment it last took its present form. timestamp.txt, what the student's
nbgrader wrote, is only compared with it: a collect logs a submission whose timestamp.txt claims an
earlier time (backdated), and writes the kernel's time into submitted/<student>/<assignment>/timestamp.txt,
where autograde (and its late penalty) reads it.
"""

from __future__ import annotations

import datetime
import glob
import os
import pwd
import shutil
import stat
from collections import defaultdict

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.submit import ExchangeSubmit
from nbgrader.utils import check_mode, parse_utc

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


def _entries(path: str):
    """(relative path, lstat) of path itself and of everything under it, links not followed; raises
    PermissionError for a folder that cannot be listed (nothing in a submission may be out of sight)."""
    yield ".", os.lstat(path)

    def fail(err: OSError):
        raise PermissionError(f"{err.filename} cannot be listed: {err.strerror}") from err

    for folder, dirs, files in os.walk(path, onerror=fail):
        for name in dirs + files:
            full = os.path.join(folder, name)
            yield os.path.relpath(full, path), os.lstat(full)


def foreign_entries(path: str, uid: int) -> list[str]:
    """Entries under path (itself included) that are not owned by uid, relative to path."""
    return [rel for rel, st in _entries(path) if st.st_uid != uid]


def last_change(path: str) -> float:
    """The latest change time (st_ctime, seconds since the epoch) of path and everything under it: no
    file or folder in it has been written, renamed, linked or had its mode changed since."""
    return max(st.st_ctime_ns for _, st in _entries(path)) / 1e9


def utc(seconds: float) -> datetime.datetime:
    """Seconds since the epoch as nbgrader keeps times: naive UTC."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # nbgrader's own (Exchange.timestamp_format, in UTC)
# timestamp.txt is written before the files are copied: an honest one is earlier than their last change by the
# copy's duration, a fraction of a second; earlier than this, the submission changed after the time it claims
BACKDATED_S = 2.0


def claimed_time(path: str) -> datetime.datetime | None:
    """The time the submission's timestamp.txt claims (naive UTC), or None if it is missing, a link or unreadable."""
    try:
        fd = os.open(os.path.join(path, "timestamp.txt"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            return parse_utc(f.read(200).strip())
    except (OSError, ValueError, OverflowError):
        return None


def submission_time(path: str) -> tuple[datetime.datetime, str]:
    """The time a submission folder in inbound/ is taken as (naive UTC): the last change of anything in it
    (last_change), which its student cannot set; and a warning when its timestamp.txt says otherwise ("" if not)."""
    changed = utc(last_change(path))
    claimed = claimed_time(path)
    if claimed is None:
        return changed, f"its timestamp.txt is missing or unreadable; taken as changed last at {changed} UTC"
    if (changed - claimed).total_seconds() > BACKDATED_S:
        return changed, (
            f"its timestamp.txt claims {claimed} UTC, but its files were changed as late as {changed} UTC (the "
            "kernel's change times, which no student can set): backdated, or changed after it was submitted; "
            f"collected as submitted at {changed} UTC"
        )
    return changed, ""


def not_collectable(path: str, username: str, uid: int) -> str:
    """Why collect must not take the submission folder path, which names the student username (account uid), or "":
    a file in it someone else owns (submitted in another's name, or planted), a part its student closed to the
    instructor, or no submission_secret.txt (not made by `nbgrader submit`: release_feedback would fail on it)."""
    try:
        foreign = foreign_entries(path, uid)
    except PermissionError as err:
        return f"cannot be read whole: {err} (its student closed part of it to the instructor)"
    if foreign:
        owners = sorted({_owner(os.path.join(path, f)) for f in foreign})
        return (
            f"claims to be {username}'s, but {', '.join(foreign[:5])} in it belong to {', '.join(owners)} (submitted "
            "in another's name, or files planted in it)"
        )
    secret = os.path.join(path, "submission_secret.txt")
    if not os.path.isfile(secret) or os.path.islink(secret):
        return "has no submission_secret.txt: it was not made by `nbgrader submit` (nbgrader's feedback needs one)"
    return ""


def latest_of_each(records: list[dict], duedate: datetime.datetime | None = None) -> list[dict]:
    """Each student's latest of records ({"username", "timestamp", ...}), as nbgrader's collect picks; with duedate
    (--before-duedate), their latest on or before it where they have one."""
    by_student = defaultdict(list)
    for r in records:
        by_student[r["username"]].append(r)
    out = []
    for mine in by_student.values():
        mine = sorted(mine, key=lambda r: r["timestamp"], reverse=True)
        before = [r for r in mine if duedate is not None and r["timestamp"] <= duedate]
        out.append((before or mine)[0])
    return out


def take_latest(collect, records: list[dict]) -> None:
    """What nbgrader's collect does with the submissions it found: the assignment's due date from the gradebook into
    collect.duedate, and into collect.src_records each student's latest of records (latest_of_each; on or before the
    due date with --before-duedate)."""
    with Gradebook(collect.coursedir.db_url, collect.coursedir.course_id) as gb:
        try:
            collect.duedate = gb.find_assignment(collect.coursedir.assignment_id).duedate
        except MissingEntry:
            collect.duedate = None
    collect.src_records = latest_of_each(records, collect.duedate if collect.before_duedate else None)


def _owner(path: str) -> str:
    uid = os.lstat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class OwnerCheckedCollect(LinkKeepingCollect):
    """Collect that refuses a submission whose folder, or any file in it, is not owned by the
    account it names: one student cannot submit in another's name, nor plant a file in another's
    submission. The refused ones are logged as errors and never reach submitted/. Each submission is
    timed by submission_time, which picks the latest of a student's and decides lateness."""

    _times: dict[str, datetime.datetime]

    def _owned_by_its_student(self, path: str, username: str) -> bool:
        try:
            uid = pwd.getpwnam(username).pw_uid
        except KeyError:
            self.log.error("Not collected: %s names %s, who has no account here", path, username)
            return False
        why = not_collectable(path, username, uid)
        if why:
            self.log.error("Not collected: %s %s", path, why)
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

    def _timed(self, record: dict) -> dict:
        """The record with the submission's own time (submission_time) for the one its folder's name claims."""
        path = os.path.join(self.inbound_path, record["filename"])
        record["timestamp"], warning = submission_time(path)
        if warning:
            self.log.warning("Submission %s: %s", record["filename"], warning)
        self._times[path] = record["timestamp"]
        return record

    def init_src(self):
        """nbgrader's ExchangeCollect.init_src, with the submissions that fail the owner check left out
        and every one timed by submission_time before the latest one of each student is picked."""
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
        self._times = {}
        records = [
            self._timed(r)
            for r in records
            if self._owned_by_its_student(os.path.join(self.inbound_path, r["filename"]), r["username"])
        ]
        take_latest(self, records)

    def do_copy(self, src, dest, log=None):
        """The submission copied (links kept), with the time it is taken as in its timestamp.txt: the later of
        its time when it was picked and its last change by the end of the copy (a change while it was copied)."""
        super().do_copy(src, dest, log)
        when = self._times.get(src)
        after = utc(last_change(src))
        if when is None or after > when:
            if when is not None:
                self.log.warning("Submission %s changed while it was collected: taken as of %s UTC", src, after)
            when = after
        stamp = os.path.join(dest, "timestamp.txt")
        if os.path.lexists(stamp):
            os.remove(stamp)  # the student's (a link too: never written through)
        fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(when.strftime(TIMESTAMP_FORMAT))


__all__ = ["OwnerCheckedCollect", "PrivateSubmit"]
