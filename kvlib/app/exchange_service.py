"""nbgrader's exchange as a JupyterHub service, for a class whose students' servers and graders are on other machines.

  the service  `python -m kvlib.app.exchange_service serve --store DIR --course ID=INSTRUCTOR[,...]`, run by the hub
               (c.JupyterHub.services): one folder in nbgrader's exchange layout, DIR/<course>/{outbound,inbound,
               feedback}, its own account's alone, reached over HTTP behind the hub's login (Store, main)
  the client   nbgrader's exchange steps (c.ExchangeFactory.*) talking to it with a hub API token: students fetch,
               submit, list and fetch feedback from their hub servers; the instructor releases, collects and
               releases feedback from any machine that reaches the hub (Service*)

Who is who comes from the hub: every request carries a hub API token (each hub server has one in
$JUPYTERHUB_API_TOKEN; a grader elsewhere asks the hub for one), the service asks the hub whose it is, and a
student submits under that name only. A submission's time is the service's clock once the upload has arrived
whole, written into its timestamp.txt and folder name over what the student's nbgrader wrote: the student can
neither set it nor change the submission afterwards (the store is not theirs; a resubmission is a new one).
Feedback goes only to the student whose submission it grades. Not here: the exchange as a folder every account
of one machine writes (exchange.py, course_folder.setup_exchange).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import getpass
import glob
import io
import json
import os
import re
import secrets
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from nbgrader.exchange import ExchangeError
from nbgrader.exchange.default import (
    Exchange,
    ExchangeCollect,
    ExchangeFetchAssignment,
    ExchangeFetchFeedback,
    ExchangeList,
    ExchangeReleaseAssignment,
    ExchangeReleaseFeedback,
)
from nbgrader.utils import find_all_notebooks, notebook_hash, parse_utc
from traitlets import Unicode

from kvlib.app.exchange import TIMESTAMP_FORMAT, PrivateSubmit, take_latest

SERVICE_NAME = "kvlib-exchange"  # the hub's name for the service: its URL is <hub>/services/kvlib-exchange/
# a course, assignment or student id, and a submission's or feedback's name: one path segment, no '+' (nbgrader
# splits a submission's folder name on it)
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@ :-]{0,199}")
MAX_UPLOAD_MB = 100  # one release or submission, unpacked (notebook 04's release: 2.4 MB; a submission 0.1 MB)
MAX_FILES = 2000


class Refused(Exception):
    """A request the service turns down: an HTTP status and one sentence."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_id(kind: str, value: str) -> str:
    if not ID.fullmatch(value or "") or value in (".", ".."):
        raise Refused(400, f"{kind} {value!r}: letters, digits and . _ @ - only, no '+' or '/'")
    return value


# ---------------------------------------------------------------------------------------------
# Folders in transit: a gzipped tar of regular files and folders only


def pack(folder: str | Path) -> bytes:
    """folder as a .tar.gz of its files and subfolders (relative names); raises ValueError on a link or anything
    else that is not a regular file or folder (nothing of the sender's machine travels but its files' bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for top, dirs, files in os.walk(folder):
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(top, name)
                if os.path.islink(path) or not (os.path.isfile(path) or os.path.isdir(path)):
                    raise ValueError(f"{path} is a link or a special file: only files and folders are sent")
                tar.add(path, arcname=os.path.relpath(path, folder), recursive=False)
    return buf.getvalue()


def unpack(data: bytes, dest: str | Path, *, max_bytes: int = MAX_UPLOAD_MB * 10**6) -> None:
    """Write the archive pack() made into the new folder dest: refused whole (ValueError, dest not made) if it holds
    a link, a device, a name outside dest, more than MAX_FILES entries or more than max_bytes unpacked."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ValueError(f"not a .tar.gz archive: {err}") from err
    if len(members) > MAX_FILES:
        raise ValueError(f"{len(members)} files and folders: more than {MAX_FILES}")
    total = 0
    for m in members:
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not parts or "\\" in m.name:
            raise ValueError(f"{m.name!r}: a name outside the folder")
        if not (m.isfile() or m.isdir()):
            raise ValueError(f"{m.name!r} is a link or a special file: only files and folders are taken")
        total += m.size
    if total > max_bytes:
        raise ValueError(f"{total / 1e6:.1f} MB unpacked: more than {max_bytes / 1e6:.0f} MB")
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=Path(dest).parent))
    try:
        tar.extractall(tmp, members=members, filter="data")  # the data filter: no modes beyond rwx, no owners
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def now_stamp() -> str:
    """This machine's clock as nbgrader writes a submission's time (UTC, microseconds)."""
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).strftime(TIMESTAMP_FORMAT)


# ---------------------------------------------------------------------------------------------
# The service's side: the store, and who may do what in it


class Store:
    """The exchange's folder, laid out as nbgrader's (ROOT/<course>/outbound/<assignment>/, inbound/<student>+
    <assignment>+<time>+<random>/, feedback/<hash>.html), and who may do what: an instructor of a course releases,
    collects and releases feedback; any hub user fetches, submits (as themselves) and fetches their own feedback."""

    def __init__(self, root: str | Path, courses: dict[str, set[str]], *, max_bytes: int = MAX_UPLOAD_MB * 10**6):
        self.root = Path(root)
        self.courses = {check_id("course id", c): set(who) for c, who in courses.items()}
        self.max_bytes = max_bytes
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)  # the service's account's alone: no student, no instructor reads it but through it
        for course in self.courses:
            for sub in ("outbound", "inbound", "feedback"):
                (self.root / course / sub).mkdir(parents=True, exist_ok=True)

    def _course(self, course: str) -> Path:
        if check_id("course id", course) not in self.courses:
            raise Refused(404, f"no course {course!r} on this exchange (it serves {', '.join(sorted(self.courses))})")
        return self.root / course

    def instructor(self, course: str, user: str) -> bool:
        self._course(course)
        return user in self.courses[course]

    def _instructor_only(self, course: str, user: str, what: str) -> None:
        if not self.instructor(course, user):
            raise Refused(403, f"{user} is not an instructor of {course}: only they may {what}")

    # released assignments
    def released(self, course: str) -> dict[str, list[str]]:
        """Every released assignment, with its notebooks (paths in it, as nbgrader's find_all_notebooks gives)."""
        out = self._course(course) / "outbound"
        return {p.name: sorted(find_all_notebooks(str(p))) for p in sorted(out.iterdir()) if p.is_dir()}

    def release(self, course: str, assignment: str, data: bytes, *, user: str, force: bool) -> None:
        self._instructor_only(course, user, "release an assignment")
        dest = self._course(course) / "outbound" / check_id("assignment id", assignment)
        if dest.exists() and not force:
            raise Refused(409, f"{course}/{assignment} is already released: add --force to replace it")
        new = dest.with_name(f".{assignment}.new")
        shutil.rmtree(new, ignore_errors=True)
        self._unpack(data, new)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(new, dest)

    def unrelease(self, course: str, assignment: str, *, user: str) -> None:
        self._instructor_only(course, user, "remove a released assignment")
        shutil.rmtree(self._released_path(course, assignment))

    def released_archive(self, course: str, assignment: str) -> bytes:
        return pack(self._released_path(course, assignment))

    def _released_path(self, course: str, assignment: str) -> Path:
        path = self._course(course) / "outbound" / check_id("assignment id", assignment)
        if not path.is_dir():
            raise Refused(404, f"{course} has released no assignment {assignment!r}")
        return path

    def _unpack(self, data: bytes, dest: Path) -> None:
        try:
            unpack(data, dest, max_bytes=self.max_bytes)
        except ValueError as err:
            raise Refused(413 if "MB unpacked" in str(err) else 400, f"upload refused: {err}") from err

    # submissions
    def submit(self, course: str, assignment: str, data: bytes, *, user: str) -> dict:
        """Take a submission from `user`, as of now on this machine's clock; returns its record (id, student,
        timestamp). Its timestamp.txt is replaced by that time: what the student's machine wrote is not kept."""
        check_id("student id", user)
        self._released_path(course, assignment)
        stamp = now_stamp()
        name = f"{user}+{assignment}+{stamp}+{secrets.token_urlsafe(6)}"
        inbound = self._course(course) / "inbound"
        tmp = inbound / f".{name}"
        self._unpack(data, tmp)
        try:
            secret = tmp / "submission_secret.txt"
            if not secret.is_file() or not secret.read_text(errors="replace").strip():
                raise Refused(400, "upload refused: no submission_secret.txt (`nbgrader submit` writes one)")
            (tmp / "timestamp.txt").write_text(stamp)
            os.replace(tmp, inbound / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {"id": name, "student": user, "timestamp": stamp}

    def submissions(self, course: str, assignment: str, *, user: str, student: str | None = None) -> list[dict]:
        """Every submission of the assignment ("*": of every one), or of one student, oldest first: instructors only."""
        self._instructor_only(course, user, "collect submissions")
        out = []
        for path in (self._course(course) / "inbound").glob(
            f"*+{'*' if assignment == '*' else glob.escape(assignment)}+*"
        ):
            who, a, stamp, _ = path.name.rsplit("+", 3)
            if assignment in ("*", a) and (student is None or who == student):
                out.append({"id": path.name, "student": who, "assignment": a, "timestamp": stamp})
        return sorted(out, key=lambda r: parse_utc(r["timestamp"]))

    def submission_archive(self, course: str, submission: str, *, user: str) -> bytes:
        self._instructor_only(course, user, "collect submissions")
        path = self._course(course) / "inbound" / submission
        if "/" in submission or submission.startswith(".") or not path.is_dir():
            raise Refused(404, f"no submission {submission!r} in {course}")
        return pack(path)

    # feedback
    def _hashes(self, course: str, student: str | None = None) -> set[str]:
        """The feedback names (nbgrader's notebook_hash of a submission's secret and notebook) of every submission
        in the course, or of one student's."""
        out = set()
        for path in (self._course(course) / "inbound").glob(f"{glob.escape(student) if student else '*'}+*"):
            if student is not None and path.name.rsplit("+", 3)[0] != student:
                continue
            secret = (path / "submission_secret.txt").read_text()
            for nb in path.glob("*.ipynb"):
                out.add(notebook_hash(secret=secret, notebook_id=nb.stem))
        return out

    def put_feedback(self, course: str, name: str, html: bytes, *, user: str) -> None:
        self._instructor_only(course, user, "release feedback")
        if check_id("feedback", name) not in self._hashes(course):
            raise Refused(404, f"feedback {name!r} is for no submission in {course}")
        dest = self._course(course) / "feedback" / f"{name}.html"
        tmp = dest.with_name(f".{name}.tmp")
        tmp.write_bytes(html)
        os.replace(tmp, dest)

    def feedback_of(self, course: str, *, user: str) -> dict[str, str]:
        """The released feedback of `user`'s own submissions, {name: html}."""
        folder = self._course(course) / "feedback"
        mine = self._hashes(course, check_id("student id", user))
        return {
            h: (folder / f"{h}.html").read_text(encoding="utf-8")
            for h in sorted(mine)
            if (folder / f"{h}.html").is_file()
        }


def _handlers(store: Store, prefix: str, hub_auth) -> list:
    """The service's routes (under prefix, the hub's /services/kvlib-exchange/): every request authenticated by its hub
    token (hub_auth: jupyterhub's HubAuth, whose access scope the token must hold)."""
    from tornado import web  # noqa: PLC0415 (optional dependency: jupyterhub's tornado, [instructor])

    class Handler(web.RequestHandler):
        user: str

        async def prepare(self):
            token = hub_auth.get_token(self, in_cookie=False)
            model = await hub_auth.user_for_token(token, sync=False) if token else None
            if not model or model.get("kind", "user") != "user":
                raise web.HTTPError(403, "%s", "a hub user's API token is needed (Authorization: token ...)")
            if hub_auth.access_scopes and not hub_auth.check_scopes(hub_auth.access_scopes, model):
                raise web.HTTPError(403, "%s", f"the token does not hold {sorted(hub_auth.access_scopes)}")
            self.user = model["name"]

        def write_error(self, status_code, **kw):
            err = kw.get("exc_info", (None, None))[1]
            reason = err.log_message % err.args if isinstance(err, web.HTTPError) and err.log_message else self._reason
            self.finish({"error": reason})

        def _call(self, f, *args, **kw):
            try:
                return f(*args, **kw)
            except Refused as err:
                raise web.HTTPError(err.status, "%s", str(err)) from err

        def send_archive(self, data: bytes):
            self.set_header("Content-Type", "application/gzip")
            self.finish(data)

    class Whoami(Handler):
        def get(self):
            self.finish(
                {"name": self.user, "instructor_of": sorted(c for c, who in store.courses.items() if self.user in who)}
            )

    class Released(Handler):
        def get(self, course):
            self.finish(self._call(store.released, course))

    class Assignment(Handler):
        def get(self, course, assignment):
            self.send_archive(self._call(store.released_archive, course, assignment))

        def put(self, course, assignment):
            force = self.get_argument("force", "0") == "1"
            self._call(store.release, course, assignment, self.request.body, user=self.user, force=force)
            self.finish({"released": assignment})

        def delete(self, course, assignment):
            self._call(store.unrelease, course, assignment, user=self.user)
            self.finish({"removed": assignment})

    class Submissions(Handler):
        def post(self, course, assignment):
            claimed = self.get_argument("student", "")
            if claimed and claimed != self.user:
                raise web.HTTPError(403, "%s", f"you are {self.user} on the hub: no submission in {claimed}'s name")
            self.finish(self._call(store.submit, course, assignment, self.request.body, user=self.user))

        def get(self, course, assignment):
            student = self.get_argument("student", None)
            self.finish(
                {"submissions": self._call(store.submissions, course, assignment, user=self.user, student=student)}
            )

    class Submission(Handler):
        def get(self, course, assignment, submission):
            self.send_archive(self._call(store.submission_archive, course, submission, user=self.user))

    class Feedback(Handler):
        def get(self, course):
            self.finish({"feedback": self._call(store.feedback_of, course, user=self.user)})

        def put(self, course, name):
            self._call(store.put_feedback, course, name, self.request.body, user=self.user)
            self.finish({"released": name})

    seg = r"([^/]+)"
    api = prefix.rstrip("/") + "/api"
    return [
        (f"{api}/whoami", Whoami),
        (f"{api}/courses/{seg}/released", Released),
        (f"{api}/courses/{seg}/released/{seg}", Assignment),
        (f"{api}/courses/{seg}/submissions/{seg}", Submissions),
        (f"{api}/courses/{seg}/submissions/{seg}/{seg}", Submission),
        (f"{api}/courses/{seg}/feedback", Feedback),
        (f"{api}/courses/{seg}/feedback/{seg}", Feedback),
    ]


def _courses(specs: list[str]) -> dict[str, set[str]]:
    out = {}
    for spec in specs:
        course, sep, who = spec.partition("=")
        names = {w.strip() for w in who.split(",") if w.strip()}
        if not sep or not names:
            raise SystemExit(f"--course {spec!r}: give COURSE_ID=INSTRUCTOR[,INSTRUCTOR...], e.g. kvlib-2027=teacher")
        out[course] = names
    return out


def hub_token(service_url: str, user: str, password: str) -> str:
    """A new hub API token of user's that reaches the service at service_url and nothing else (its one scope), asked of
    the hub (whose API is beside the service: <hub>/hub/api) with the user's hub password."""
    base = re.sub(rf"services/{re.escape(SERVICE_NAME)}/?$", "", service_url.rstrip("/") + "/")
    body = {
        "auth": {"username": user, "password": password},
        "scopes": [f"access:services!service={SERVICE_NAME}"],
        "note": "kvlib grading: the exchange service",
    }
    url = f"{base}hub/api/users/{urllib.parse.quote(user)}/tokens"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())["token"]
    except urllib.error.HTTPError as err:
        raise SystemExit(
            f"the hub at {base} gave no token to {user}: {err.code} {err.reason} (a wrong password?)"
        ) from err
    except OSError as err:
        raise SystemExit(f"the hub at {base} cannot be reached: {err}") from err


def main(argv: list[str] | None = None) -> None:
    """`serve`: run the service where the hub says ($JUPYTERHUB_SERVICE_URL, _PREFIX, _API_URL, _API_TOKEN: a managed
    service gets them from the hub; an external one from its own environment). `token`: print the config line of a
    grader's hub token."""
    p = argparse.ArgumentParser(prog="python -m kvlib.app.exchange_service", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the service (the hub starts it: c.JupyterHub.services)")
    s.add_argument("--store", required=True, help="the exchange's folder (made mode 0700: the service account's alone)")
    s.add_argument(
        "--course",
        action="append",
        default=[],
        metavar="ID=INSTRUCTOR[,...]",
        help="a course and its instructors' hub names",
    )
    s.add_argument("--max-upload-mb", type=int, default=MAX_UPLOAD_MB, help="one release or submission, unpacked")
    s.add_argument("--ip", help="the address to listen on (default: $JUPYTERHUB_SERVICE_URL's host; 0.0.0.0 in a pod)")
    t = sub.add_parser("token", help="ask the hub for a token (your hub password, read from the terminal or stdin)")
    t.add_argument("url", help=f"the service's URL, as in c.ServiceExchange.url (…/services/{SERVICE_NAME}/)")
    t.add_argument("user", help="your hub name")
    args = p.parse_args(argv)
    if args.command == "token":
        password = getpass.getpass(f"{args.user}'s hub password: ") if sys.stdin.isatty() else sys.stdin.readline()
        print(f"c.ServiceExchange.token = {hub_token(args.url, args.user, password.rstrip(chr(10)))!r}")
        return
    if not args.course:
        p.error("serve: give at least one --course ID=INSTRUCTOR")
    try:
        store = Store(args.store, _courses(args.course), max_bytes=args.max_upload_mb * 10**6)
    except Refused as err:
        p.error(str(err))
    serve(store, args.max_upload_mb, args.ip)


def serve(store: Store, max_upload_mb: int, ip: str | None = None) -> None:
    from jupyterhub.services.auth import HubAuth  # noqa: PLC0415 (optional dependency: jupyterhub, [instructor])
    from tornado import web  # noqa: PLC0415 (optional dependency: jupyterhub's tornado, [instructor])

    url = urllib.parse.urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")
    hub_auth = HubAuth()
    if not hub_auth.access_scopes:  # run outside the hub's environment: ask for this service's scope all the same
        hub_auth.access_scopes = {f"access:services!service={SERVICE_NAME}"}
    app = web.Application(_handlers(store, prefix, hub_auth))

    async def run():
        app.listen(url.port or 80, ip or url.hostname, max_body_size=(max_upload_mb + 1) * 10**6)
        print(f"{SERVICE_NAME}: {store.root}, courses {sorted(store.courses)}, at {url.geturl()}{prefix}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


# ---------------------------------------------------------------------------------------------
# The client's side: nbgrader's exchange steps, through the service

STEPS = {  # nbgrader's ExchangeFactory trait: the class below that does it
    "fetch_assignment": "ServiceFetchAssignment",
    "submit": "ServiceSubmit",
    "list": "ServiceList",
    "fetch_feedback": "ServiceFetchFeedback",
    "release_assignment": "ServiceReleaseAssignment",
    "release_feedback": "ServiceReleaseFeedback",
    "collect": "ServiceCollect",
}


def config_lines(url: str) -> str:
    """The lines of an nbgrader_config.py (a student's or the instructor's) that exchange through the service at url."""
    steps = "".join(f'c.ExchangeFactory.{step} = "{__name__}.{cls}"\n' for step, cls in STEPS.items())
    return f"c.ServiceExchange.url = {url!r}\n{steps}"


class ServiceExchange(Exchange):
    """What every step shares: the service's URL and the hub token, and a request to it. nbgrader's own filesystem
    steps run on a temporary folder laid out as the exchange (the part this user may see), then what they wrote
    there is sent."""

    url = Unicode("", help=f"The service's URL, e.g. https://hub.example.edu/services/{SERVICE_NAME}/").tag(config=True)
    token = Unicode(
        "",
        help="A hub API token; empty: $JUPYTERHUB_API_TOKEN, which every hub server has (a grader elsewhere sets it)",
    ).tag(config=True)

    def ensure_root(self):  # no folder of the exchange here
        if not self.url:
            self.fail("c.ServiceExchange.url is not set: the exchange service's URL (docs/instructors.md)")

    def call(self, method: str, path: str, *, body: bytes | None = None, **params) -> bytes:
        """One request to the service's api/<path>; its body, or ExchangeError with the service's reason."""
        token = self.token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not token:
            self.fail("no hub API token: set c.ServiceExchange.token, or $JUPYTERHUB_API_TOKEN (docs/instructors.md)")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = self.url.rstrip("/") + "/api/" + urllib.parse.quote(path) + (f"?{query}" if query else "")
        headers = {
            "Authorization": f"token {token}",
            "Content-Type": "application/gzip",
        }  # not a form: tornado parses those
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", "replace")
            try:
                reason = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                reason = text[:300] or err.reason
            self.fail(f"the exchange service refused {method} {path}: {err.code} {reason}")
        except OSError as err:
            self.fail(f"the exchange service at {self.url} cannot be reached: {err}")

    def call_json(self, method: str, path: str, **kw):
        return json.loads(self.call(method, path, **kw))

    def api_path(self, *parts: str) -> str:
        if not self.coursedir.course_id:
            self.fail("No course id specified. Re-run with --course flag.")
        return "/".join(["courses", self.coursedir.course_id, *parts])

    def student_filter(self) -> str | None:
        """--student, or None for every student."""
        return self.coursedir.student_id if self.coursedir.student_id not in ("", "*") else None

    def mirror(self) -> str:
        """A temporary exchange root for nbgrader's own steps; removed when the step ends (start)."""
        self._mirror = tempfile.mkdtemp(prefix="kvlib-exchange-")
        self.root = self._mirror
        return self._mirror

    def mirror_feedback(self) -> None:
        """This user's released feedback into the mirror's feedback/, where nbgrader's steps look for it."""
        folder = Path(self.mirror()) / self.coursedir.course_id / "feedback"
        folder.mkdir(parents=True)
        for name, html in self.call_json("GET", self.api_path("feedback"))["feedback"].items():
            (folder / f"{check_id('feedback', name)}.html").write_text(html, encoding="utf-8")

    def start(self):
        try:
            return super().start()
        finally:
            if getattr(self, "_mirror", None):
                shutil.rmtree(self._mirror, ignore_errors=True)


class ServiceFetchAssignment(ServiceExchange, ExchangeFetchAssignment):
    """`nbgrader fetch_assignment`: the released assignment downloaded, then nbgrader's own copy into ./<assignment>."""

    def init_src(self):
        if not self.authenticator.has_access(self.coursedir.student_id, self.coursedir.course_id):
            self.fail("You do not have access to this course.")
        data = self.call("GET", self.api_path("released", self.coursedir.assignment_id))
        self.src_path = os.path.join(self.mirror(), self.coursedir.assignment_id)
        unpack(data, self.src_path)


class ServiceSubmit(ServiceExchange, PrivateSubmit):
    """`nbgrader submit`: nbgrader's own (strict about missing notebooks, its ignore rules and sizes, the student's
    cache for the Assignments panel), without what autograde puts back (PrivateSubmit), sent to the service, which
    takes it as the hub's user at its own clock's time; the cache entry then carries that name and time."""

    def init_dest(self):
        if not self.authenticator.has_access(self.coursedir.student_id, self.coursedir.course_id):
            self.fail("You do not have access to this course.")
        self.inbound_path = os.path.join(self.mirror(), "inbound")
        os.mkdir(self.inbound_path)
        self.cache_path = os.path.join(self.cache, self.coursedir.course_id)
        me, claimed = self.call_json("GET", "whoami")["name"], self.coursedir.student_id
        if claimed not in ("*", me):
            self.fail(f"you are {me} on the hub: no submission in {claimed}'s name")
        self.coursedir.student_id = me
        self.cached_name = f"{me}+{self.coursedir.assignment_id}+{self.timestamp}"  # nbgrader's cache entry
        self.assignment_filename = self.cached_name + ("+local" if self.add_random_string else "")

    def init_release(self):
        """The released notebooks (to warn of a missing one, as nbgrader does), from the service's list."""
        released = self.call_json("GET", self.api_path("released"))
        if self.coursedir.assignment_id not in released:
            self.fail(f"Assignment not found: {self.coursedir.course_id}/{self.coursedir.assignment_id}")
        self.release_path = os.path.join(self._mirror, "outbound")
        for nb in released[self.coursedir.assignment_id]:
            Path(self.release_path, nb).parent.mkdir(parents=True, exist_ok=True)
            Path(self.release_path, nb).touch()

    def copy_files(self):
        super().copy_files()  # nbgrader's submit into the mirror's inbound/ and the cache; PrivateSubmit's modes
        local = os.path.join(self.inbound_path, self.assignment_filename)
        cached = os.path.join(self.cache_path, self.cached_name)
        try:
            receipt = self.call_json(
                "POST",
                self.api_path("submissions", self.coursedir.assignment_id),
                body=pack(local),
                student=self.coursedir.student_id,
            )
        except BaseException:
            shutil.rmtree(cached, ignore_errors=True)  # not submitted: the Assignments panel must not list it
            raise
        taken = os.path.join(
            self.cache_path, f"{receipt['student']}+{self.coursedir.assignment_id}+{receipt['timestamp']}"
        )
        os.replace(cached, taken)
        Path(taken, "timestamp.txt").write_text(receipt["timestamp"])
        self.log.info("Submitted to the exchange service as of its clock: %s", receipt["timestamp"])


class ServiceList(ServiceExchange, ExchangeList):
    """`nbgrader list` and the Assignments panel's lists: released assignments from the service; a student's
    submissions from their cache, as nbgrader does, with the service's feedback for them; `--inbound`, the
    instructor's list of what was submitted, from the service."""

    def init_dest(self):
        if self.inbound:
            return
        if self.cached:
            self.mirror_feedback()
        else:
            outbound = Path(self.mirror(), self.coursedir.course_id, "outbound")
            for assignment, notebooks in self.call_json("GET", self.api_path("released")).items():
                for nb in [f"{check_id('assignment id', assignment)}/.keep", *(f"{assignment}/{n}" for n in notebooks)]:
                    (outbound / nb).parent.mkdir(parents=True, exist_ok=True)
                    (outbound / nb).touch()
        super().init_dest()

    def parse_assignments(self):
        if not self.inbound:
            return super().parse_assignments()
        subs = self.call_json(
            "GET", self.api_path("submissions", self.coursedir.assignment_id or "*"), student=self.student_filter()
        )["submissions"]
        out: dict[tuple, dict] = {}
        for s in subs:
            key = {"course_id": self.coursedir.course_id, "student_id": s["student"], "assignment_id": s["assignment"]}
            group = out.setdefault(tuple(key.values()), {**key, "status": "submitted", "submissions": []})
            group["submissions"].append({**key, "timestamp": s["timestamp"], "status": "submitted", "notebooks": []})
        return list(out.values())

    def format_inbound_assignment(self, info):
        if self.inbound:
            return "{course_id} {student_id} {assignment_id} {timestamp}".format(**info)
        return super().format_inbound_assignment(info)

    def remove_files(self):
        if self.inbound:
            self.fail("the exchange service keeps every submission: `nbgrader list --inbound --remove` is not offered")
        if self.cached:
            return super().remove_files()  # the student's own cache, on their machine
        removed = super().list_files()
        for info in removed:
            self.call("DELETE", self.api_path("released", info["assignment_id"]))
        return removed


class ServiceFetchFeedback(ServiceExchange, ExchangeFetchFeedback):
    """`nbgrader fetch_feedback`: the student's own released feedback from the service, found by nbgrader's own
    lookup (each cached submission's secret and notebooks)."""

    def init_src(self):
        self.mirror_feedback()
        super().init_src()


class ServiceReleaseAssignment(ServiceExchange, ExchangeReleaseAssignment):
    """`nbgrader release_assignment`: release/<assignment> sent whole (--force replaces a released one)."""

    def init_dest(self):
        self.dest_path = os.path.join(self.mirror(), self.coursedir.assignment_id)

    def copy_files(self):
        self.do_copy(self.src_path, self.dest_path)  # nbgrader's ignore rules and sizes
        path = self.api_path("released", self.coursedir.assignment_id)
        self.call("PUT", path, body=pack(self.dest_path), force="1" if self.force else None)
        self.log.info("Released as: %s %s", self.coursedir.course_id, self.coursedir.assignment_id)


class ServiceReleaseFeedback(ServiceExchange, ExchangeReleaseFeedback):
    """`nbgrader release_feedback`: nbgrader's own naming of each feedback file (from its submission's secret), then
    each one sent; the service gives it only to the student whose submission has that secret."""

    def init_dest(self):
        if not self.coursedir.course_id:
            self.fail("No course id specified. Re-run with --course flag.")
        self.dest_path = self.mirror()

    def copy_files(self):
        super().copy_files()
        for html in sorted(Path(self.dest_path).glob("*.html")):
            self.call("PUT", self.api_path("feedback", html.stem), body=html.read_bytes())


class ServiceCollect(ServiceExchange, ExchangeCollect):
    """`nbgrader collect`: each student's latest submission (or latest before the due date, with --before-duedate)
    downloaded into submitted/<student>/<assignment>/, its time the service's receipt; --update as nbgrader's."""

    def init_src(self):
        self.check_owner = False  # no folder's owner to check: the service took each from the hub user it names
        self.inbound_path = "service"
        subs = self.call_json(
            "GET",
            self.api_path("submissions", self.coursedir.assignment_id),
            student=self.student_filter(),
        )["submissions"]
        records = [
            {"username": s["student"], "filename": s["id"], "timestamp": parse_utc(s["timestamp"])} for s in subs
        ]
        take_latest(self, records)

    def do_copy(self, src, dest, log=None):
        data = self.call("GET", self.api_path("submissions", self.coursedir.assignment_id, os.path.basename(src)))
        unpack(data, dest)


__all__ = [
    "ServiceCollect",
    "ServiceFetchAssignment",
    "ServiceFetchFeedback",
    "ServiceList",
    "ServiceReleaseAssignment",
    "ServiceReleaseFeedback",
    "ServiceSubmit",
    "Store",
]

if __name__ == "__main__":
    main()
