"""What `kvlib course autograde` graded, and which run grades what now, kept in the gradebook's own database.

  GradingRecord(db_url, course_id, assignment)  one run's view: the table kvlib_autograde beside nbgrader's
                                                tables (a row per course, assignment and student: the
                                                submission graded or being graded, its status, the run holding
                                                it, the result), changed in short transactions; the run's lease
  read_records(...)                             the rows, for a test or a report
  move_gradebook(src_url, dest_url)             every row of nbgrader's tables and of kvlib_autograde into an
                                                empty gradebook (SQLite -> PostgreSQL)

The record moves with the gradebook, so a course moved onto a new database starts with nothing graded, and a
row is trusted only where the gradebook holds that student's submission at the same time. A run is alive while
it holds its lease:
  PostgreSQL  a session advisory lock on the run's own key, held on a connection of its own for the run's life:
              the server drops it when that connection drops, however the run ends (SIGKILL too); a row in flight
              whose run's key is free was left by a run that died.
  SQLite      (and any other database) not safe for two writers (nbgrader's FAQ): an exclusive flock on a file
              beside the gradebook, which the kernel drops when the process ends; a second run is refused while
              the first lives, so every row in flight it finds was left by a run that died.
Not here: grading (class_grading.py), nbgrader's own tables (nbgrader.api).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from nbgrader.api import Base
from nbgrader.utils import parse_utc
from sqlalchemy import BigInteger, Column, Float, MetaData, String, Table, Text, create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

IN_FLIGHT, GRADED, REFUSED, FAILED = "in-flight", "graded", "refused", "failed"
_meta = MetaData()
TABLE = Table(
    "kvlib_autograde",
    _meta,
    Column("course_id", String(128), primary_key=True),
    Column("assignment", String(128), primary_key=True),
    Column("student", String(128), primary_key=True),
    Column("timestamp", String(64), nullable=False),  # of the submission (submitted/<s>/<a>/timestamp.txt)
    Column("status", String(16), nullable=False),  # IN_FLIGHT, GRADED, REFUSED or FAILED
    Column("holder", String(256), nullable=False),  # the run that set the status: "host pid N"
    Column("holder_key", BigInteger, nullable=False),  # its lease (PostgreSQL's advisory lock key)
    Column("updated", Float, nullable=False),  # seconds since the epoch
    Column("result", Text, nullable=False),  # class_grading.Result as JSON ("{}" while in flight)
)


class GradebookBusy(Exception):
    """The lease of a gradebook that takes one run at a time (SQLite) is another run's, or cannot be taken."""


@dataclass
class Row:
    student: str
    timestamp: str
    status: str
    holder: str
    holder_key: int
    result: dict


def _engine(db_url: str):
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":  # wait out a worker's write rather than fail at once
        return create_engine(db_url, connect_args={"timeout": 60})
    return create_engine(db_url, pool_size=2, max_overflow=2)


def _ensure_table(engine) -> None:
    if inspect(engine).has_table(TABLE.name):
        return
    try:
        _meta.create_all(engine)
    except (OperationalError, ProgrammingError, IntegrityError):  # another run made it at the same moment
        if not inspect(engine).has_table(TABLE.name):
            raise


def _rows(conn, course_id: str, assignment: str, students=None) -> dict[str, Row]:
    q = select(TABLE).where(TABLE.c.course_id == course_id, TABLE.c.assignment == assignment)
    if students is not None:
        q = q.where(TABLE.c.student.in_(list(students)))
    out = {}
    for r in conn.execute(q).mappings():
        out[r["student"]] = Row(
            r["student"], r["timestamp"], r["status"], r["holder"], r["holder_key"], json.loads(r["result"])
        )
    return out


def read_records(db_url: str, course_id: str, assignment: str) -> dict[str, Row]:
    """Every row of the assignment ({} where kvlib never graded it), without taking a lease."""
    engine = _engine(db_url)
    try:
        if not inspect(engine).has_table(TABLE.name):
            return {}
        with engine.connect() as conn:
            return _rows(conn, course_id, assignment)
    finally:
        engine.dispose()


class GradingRecord:
    """One run's record of an assignment's grading (a context manager: the lease is held inside it).

    Raises GradebookBusy on entry where the gradebook takes one run at a time and another holds it."""

    def __init__(self, db_url: str, course_id: str, assignment: str):
        self.db_url, self.course_id, self.assignment = db_url, course_id, assignment
        self.postgres = make_url(db_url).get_backend_name() == "postgresql"
        self.key = secrets.randbits(62) + 1  # this run's lease; never 0
        self.holder = f"{socket.gethostname()} pid {os.getpid()}"
        self._stack = contextlib.ExitStack()

    # -- the lease ---------------------------------------------------------------------------

    def __enter__(self) -> GradingRecord:
        self.engine = _engine(self.db_url)
        self._stack.callback(self.engine.dispose)
        try:
            _ensure_table(self.engine)
            if self.postgres:
                lease = self._stack.enter_context(self.engine.connect())
                lease.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
                lease.commit()  # the lock is the session's, not the transaction's: it stays
                self._probe = self._stack.enter_context(self.engine.connect())
            else:
                self._lock_file()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _lock_file(self) -> None:
        url = make_url(self.db_url)
        db = url.database if url.get_backend_name() == "sqlite" else None
        if not db or db == ":memory:":
            return  # nothing on disk for two runs to share
        path = Path(db).resolve().with_name(Path(db).name + ".kvlib-lock")
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except PermissionError:  # made by root's run: taking the lock needs no write
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as err:
            raise GradebookBusy(
                f"cannot open {path}, the lock beside the SQLite gradebook that keeps a second run out ({err.strerror}): "
                f"let this account write in {path.parent}"
            ) from None
        self._stack.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(path, errors="replace") as f:
                who = f.read(300).strip() or "another run"
            raise GradebookBusy(
                f"another `kvlib course autograde` ({who}) is grading with the SQLite gradebook {db}: SQLite is "
                "not safe for two graders at once (nbgrader's FAQ), so this run stops here. Wait for that one to "
                "end, or move the gradebook to PostgreSQL (`kvlib course move-gradebook`, docs/instructors.md) to "
                "grade from several runs or machines"
            ) from None
        with contextlib.suppress(OSError):  # who holds it, for the next one's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.holder}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}".encode(), 0)

    def alive(self, row: Row) -> bool:
        """Whether the run that holds row is still running (this run included)."""
        if row.holder_key == self.key:
            return True
        if not self.postgres:  # this run holds the only lease there is: the row's run has ended
            return False
        free = self._probe.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": row.holder_key}).scalar()
        if free:
            self._probe.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": row.holder_key})
        self._probe.commit()
        return not free

    # -- the rows ----------------------------------------------------------------------------

    def rows(self) -> dict[str, Row]:
        with self.engine.connect() as conn:
            return _rows(conn, self.course_id, self.assignment)

    def _set(self, conn, student: str, timestamp: str, status: str, result: dict) -> None:
        values = {
            "timestamp": timestamp,
            "status": status,
            "holder": self.holder,
            "holder_key": self.key,
            "updated": time.time(),
            "result": json.dumps(result),
        }
        key = {"course_id": self.course_id, "assignment": self.assignment, "student": student}
        done = conn.execute(TABLE.update().where(*(TABLE.c[k] == v for k, v in key.items())).values(**values)).rowcount
        if not done:
            conn.execute(TABLE.insert().values(**key, **values))

    def claim(self, students: dict[str, str], *, current, _tries: int = 5) -> tuple[list[str], dict[str, Row]]:
        """Mark students ({student: timestamp}) in flight for this run, each unless another live run holds it or
        current(row, timestamp) says it is already graded at that submission. One transaction; on PostgreSQL the
        rows are locked (FOR UPDATE, in the students' order, so two runs never wait on each other in a circle) while
        it decides, and a row two runs insert at once is taken by one. Returns (taken, {student: the row of one not
        taken})."""
        taken, left = [], {}
        try:
            with self.engine.begin() as conn:
                q = select(TABLE).where(
                    TABLE.c.course_id == self.course_id,
                    TABLE.c.assignment == self.assignment,
                    TABLE.c.student.in_(list(students)),
                )
                locked = conn.execute(q.order_by(TABLE.c.student).with_for_update()).mappings()
                rows = {r.student: r for r in self._as_rows(locked)}
                for student in sorted(students):
                    stamp, row = students[student], rows.get(student)
                    if row is not None and (
                        (row.status == IN_FLIGHT and row.holder_key != self.key and self.alive(row))
                        or (current is not None and current(row, stamp))
                    ):
                        left[student] = row
                        continue
                    self._set(conn, student, stamp, IN_FLIGHT, {})
                    taken.append(student)
        except (IntegrityError, OperationalError) as err:
            # another run inserted one of these rows first, or PostgreSQL broke a wait between two runs (40P01):
            # decide again, with their rows
            retry = isinstance(err, IntegrityError) or getattr(err.orig, "pgcode", None) in ("40P01", "40001")
            if not retry or _tries <= 1:
                raise
            time.sleep(0.05)
            return self.claim(students, current=current, _tries=_tries - 1)
        return taken, left

    @staticmethod
    def _as_rows(mappings):
        for r in mappings:
            yield Row(r["student"], r["timestamp"], r["status"], r["holder"], r["holder_key"], json.loads(r["result"]))

    def finish(self, student: str, timestamp: str, status: str, result: dict) -> None:
        """Record a student's result (status GRADED, REFUSED or FAILED) for this run."""
        with self.engine.begin() as conn:
            self._set(conn, student, timestamp, status, result)


# ---------------------------------------------------------------------------------------------
# Moving a gradebook


def move_gradebook(src_url: str, dest_url: str) -> dict[str, int]:
    """Copy every row of nbgrader's tables, its alembic version and kvlib_autograde from src to dest, whose nbgrader
    tables must be empty or missing (a new database). Returns {table: rows copied}."""
    if src_url == dest_url:
        raise ValueError("the gradebook to move to is the one the course uses already")
    src, dest = _engine(src_url), _engine(dest_url)
    try:
        Base.metadata.create_all(dest)  # nbgrader's tables, as its Gradebook makes them in a new database
        with dest.connect() as conn:
            full = [t.name for t in Base.metadata.sorted_tables if conn.execute(select(t).limit(1)).first()]
        if full:
            raise ValueError(
                f"the gradebook {make_url(dest_url).render_as_string(hide_password=True)} already holds rows "
                f"({', '.join(full)}): move into an empty database only"
            )
        tables = list(Base.metadata.sorted_tables)
        if inspect(src).has_table(TABLE.name):
            _ensure_table(dest)
            tables.append(TABLE)
        copied = {}
        with src.connect() as s, dest.begin() as d:
            for table in tables:
                rows = [dict(r) for r in s.execute(select(table)).mappings()]
                if rows:
                    d.execute(table.insert(), rows)
                copied[table.name] = len(rows)
            if inspect(src).has_table("alembic_version"):  # the schema's version, for `nbgrader db upgrade` later
                versions = s.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
                if not inspect(dest).has_table("alembic_version"):
                    d.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
                d.execute(text("DELETE FROM alembic_version"))
                for v in versions:
                    d.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": v})
        return copied
    finally:
        src.dispose()
        dest.dispose()


def parse_time(stamp: str) -> datetime.datetime | None:
    """A timestamp.txt's time as nbgrader keeps it (naive UTC), or None."""
    try:
        return parse_utc(stamp) if stamp else None
    except (ValueError, OverflowError):
        return None
