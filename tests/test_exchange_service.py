"""kvlib/app/exchange_service.py without a hub: the store's rules (who may do what, whose time a submission
carries, whose feedback a student gets), the archives it takes, and nbgrader's own steps through the service's
HTTP API with a stand-in for the hub's token check. tests/test_hub.py runs it behind a real JupyterHub, from a
student's server and from a grading machine of its own."""

from __future__ import annotations

import datetime
import io
import json
import os
import tarfile

import pytest

NB = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _tar(files: dict[str, str], links: dict[str, str] = {}, hard: dict[str, str] = {}) -> bytes:  # noqa: B006
    """A .tar.gz as a hostile client could send it: files {name: text}, symbolic and hard links {name: target}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
        for kind, entries in ((tarfile.SYMTYPE, links), (tarfile.LNKTYPE, hard)):
            for name, target in entries.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tar.addfile(info)
    return buf.getvalue()


def _store(tmp_path):
    from kvlib.app.exchange_service import Store, pack

    store = Store(tmp_path / "store", {"c1": {"teacher"}})
    (tmp_path / "release" / "kvlib").mkdir(parents=True)
    (tmp_path / "release" / "nb.ipynb").write_text(json.dumps(NB))
    (tmp_path / "release" / "kvlib" / "attention.py").write_text("# stub\n")
    store.release("c1", "a1", pack(tmp_path / "release"), user="teacher", force=False)
    return store


def _submission(secret: str = "s" * 64, **extra: str) -> bytes:
    return _tar({"nb.ipynb": json.dumps(NB), "submission_secret.txt": secret, **extra})


def test_an_upload_with_a_link_a_name_outside_or_too_much_is_refused_whole(tmp_path):
    """Check unpack: an archive holding a symbolic link, a hard link, a name outside its folder (.. or absolute),
    more bytes than allowed, or that is no archive at all is refused with a sentence naming why, and nothing of it
    is written; a plain one is written whole, its modes without set-id bits."""
    from kvlib.app.exchange_service import pack, unpack

    ok = {"a.py": "x", "kvlib/b.py": "y"}
    bad = {
        "a link": (_tar(ok, links={"kvlib/attention.py": "/etc/shadow"}), "is a link or a special file"),
        "a hard link": (_tar(ok, hard={"c.py": "/etc/shadow"}), "is a link or a special file"),
        "outside": (_tar({**ok, "../planted.py": "x"}), "a name outside the folder"),
        "absolute": (_tar({**ok, "/tmp/planted.py": "x"}), "a name outside the folder"),
        "too much": (_tar({"big.bin": "0" * 2000}), "MB unpacked: more than"),
        "not an archive": (b"PK\x03\x04 a zip", "not a .tar.gz archive"),
    }
    for what, (data, why) in bad.items():
        with pytest.raises(ValueError, match=why):
            unpack(data, tmp_path / what, max_bytes=1000)
        assert not (tmp_path / what).exists(), what
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary folder left either
    unpack(_tar(ok), tmp_path / "ok")
    assert (tmp_path / "ok" / "kvlib" / "b.py").read_text() == "y"
    (tmp_path / "ok" / "kvlib" / "b.py").chmod(0o6755)
    unpack(pack(tmp_path / "ok"), tmp_path / "again")
    assert (tmp_path / "again" / "kvlib" / "b.py").stat().st_mode & 0o7000 == 0
    os.symlink("/etc/passwd", tmp_path / "ok" / "link")
    with pytest.raises(ValueError, match="only files and folders are sent"):
        pack(tmp_path / "ok")


def test_a_submission_carries_the_services_time_and_its_hub_users_name(tmp_path):
    """Check Store.submit: the submission is kept under the name of the hub user who sent it, at the service's own
    time (its timestamp.txt, claiming 2020, replaced by it); one without nbgrader's submission_secret.txt, one for an
    assignment never released, or from a name nbgrader cannot take, is refused with its status."""
    from nbgrader.utils import parse_utc

    from kvlib.app.exchange_service import Refused

    store = _store(tmp_path)
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    receipt = store.submit("c1", "a1", _submission(**{"timestamp.txt": "2020-01-01 00:00:00 UTC"}), user="alice")
    after = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    kept = tmp_path / "store" / "c1" / "inbound" / receipt["id"]
    assert receipt["student"] == "alice" and receipt["id"].startswith("alice+a1+")
    assert (kept / "timestamp.txt").read_text() == receipt["timestamp"]
    assert before <= parse_utc(receipt["timestamp"]) <= after
    refusals = [
        (lambda: store.submit("c1", "a1", _tar({"nb.ipynb": "{}"}), user="alice"), 400, "submission_secret.txt"),
        (lambda: store.submit("c1", "a9", _submission(), user="alice"), 404, "released no assignment"),
        (lambda: store.submit("c1", "a1", _submission(), user="al+ice"), 400, r"no '\+'"),
        (lambda: store.submit("c2", "a1", _submission(), user="alice"), 404, "no course 'c2'"),
    ]
    for call, status, why in refusals:
        with pytest.raises(Refused, match=why) as err:
            call()
        assert err.value.status == status
    assert [p.name for p in (tmp_path / "store" / "c1" / "inbound").iterdir()] == [receipt["id"]]


def test_only_instructors_release_and_collect_and_each_student_gets_their_own_feedback(tmp_path):
    """Check the store's roles: a student may not release, list or download submissions, nor release feedback; the
    instructor may, and a feedback name that no submission's secret gives is refused; each student's feedback list
    holds their own feedback only."""
    from nbgrader.utils import notebook_hash

    from kvlib.app.exchange_service import Refused, pack

    store = _store(tmp_path)
    subs = {who: store.submit("c1", "a1", _submission(secret=who * 20), user=who) for who in ("alice", "bob")}
    for call in (
        lambda: store.release("c1", "a1", pack(tmp_path / "release"), user="alice", force=True),
        lambda: store.submissions("c1", "a1", user="alice"),
        lambda: store.submission_archive("c1", subs["bob"]["id"], user="alice"),
        lambda: store.put_feedback("c1", "0" * 32, b"<p>", user="alice"),
    ):
        with pytest.raises(Refused, match="alice is not an instructor of c1") as err:
            call()
        assert err.value.status == 403
    assert [s["student"] for s in store.submissions("c1", "a1", user="teacher")] == ["alice", "bob"]
    with pytest.raises(Refused, match="already released: add --force"):
        store.release("c1", "a1", pack(tmp_path / "release"), user="teacher", force=False)
    with pytest.raises(Refused, match="is for no submission"):
        store.put_feedback("c1", "0" * 32, b"<p>", user="teacher")
    names = {who: notebook_hash(secret=who * 20, notebook_id="nb") for who in subs}
    for who, name in names.items():
        store.put_feedback("c1", name, f"<p>{who}</p>".encode(), user="teacher")
    assert store.feedback_of("c1", user="alice") == {names["alice"]: "<p>alice</p>"}
    assert store.feedback_of("c1", user="bob") == {names["bob"]: "<p>bob</p>"}
    assert store.feedback_of("c1", user="carol") == {}


@pytest.mark.slow  # nbgrader's steps in this process, a tornado server in a thread: ~2 CPU-s
def test_nbgrader_steps_through_the_service(tmp_path):
    """Check nbgrader's own steps with the course's Service* classes against the service's HTTP API (a stand-in hub
    answering for three tokens): the instructor releases; a student lists, fetches and submits (as herself: a
    submission in another's name refused); the instructor lists and collects (the service's time in submitted/),
    releases feedback; the student fetches it and her list shows it; a student's release and collect are refused,
    and so is a token without the service's scope."""
    import asyncio
    import socket
    import threading

    from jupyterhub.services.auth import HubAuth
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange import ExchangeError
    from tornado import web
    from traitlets.config import Config

    from kvlib.app import exchange_service as es

    scope = f"access:services!service={es.SERVICE_NAME}"
    tokens = {"t-alice": ("alice", [scope]), "t-teacher": ("teacher", [scope]), "t-carol": ("carol", [])}

    class HubUser(web.RequestHandler):  # the hub's GET /hub/api/user: who a token is, and its scopes
        def get(self):
            token = self.request.headers.get("Authorization", "").split()[-1]
            if token not in tokens:
                raise web.HTTPError(403)
            name, scopes = tokens[token]
            self.finish({"kind": "user", "name": name, "scopes": scopes})

    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    (hub_port, svc_port) = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    store = es.Store(tmp_path / "store", {"c1": {"teacher"}})
    auth = HubAuth(api_url=f"http://127.0.0.1:{hub_port}/hub/api", api_token="svc", access_scopes={scope})
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        web.Application([(r"/hub/api/user", HubUser)]).listen(hub_port, "127.0.0.1")
        web.Application(es._handlers(store, f"/services/{es.SERVICE_NAME}/", auth)).listen(svc_port, "127.0.0.1")
        loop.call_soon(started.set)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30)
    url = f"http://127.0.0.1:{svc_port}/services/{es.SERVICE_NAME}/"

    def step(cls, who, cwd, **settings):
        c = Config()
        c.CourseDirectory.course_id, c.CourseDirectory.root = "c1", str(tmp_path / "course")
        c.ServiceExchange.url, c.ServiceExchange.token = url, f"t-{who}"
        c.Exchange.cache = str(tmp_path / f"cache-{who}")
        for key, value in settings.items():
            section, name = key.split("__")
            setattr(getattr(c, section), name, value)
        old = os.getcwd()
        os.chdir(cwd)
        try:
            return cls(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()
        finally:
            os.chdir(old)

    try:
        course, home = tmp_path / "course", tmp_path / "alice"
        (course / "release" / "a1" / "kvlib").mkdir(parents=True)
        home.mkdir()
        (course / "release" / "a1" / "nb.ipynb").write_text(json.dumps(NB))
        (course / "release" / "a1" / "kvlib" / "attention.py").write_text("# stub\n")
        step(es.ServiceReleaseAssignment, "teacher", course, CourseDirectory__assignment_id="a1")
        released = step(es.ServiceList, "alice", home)
        assert [(a["assignment_id"], a["status"], [n["notebook_id"] for n in a["notebooks"]]) for a in released] == [
            ("a1", "released", ["nb"])
        ]
        step(es.ServiceFetchAssignment, "alice", home, CourseDirectory__assignment_id="a1")
        (home / "a1" / "kvlib" / "attention.py").write_text("# mine\n")
        step(es.ServiceSubmit, "alice", home, CourseDirectory__assignment_id="a1")
        with pytest.raises(ExchangeError, match="you are alice on the hub: no submission in bob's name"):
            step(
                es.ServiceSubmit, "alice", home, CourseDirectory__assignment_id="a1", CourseDirectory__student_id="bob"
            )
        (inbound,) = step(es.ServiceList, "teacher", course, ExchangeList__inbound=True)
        stamp = inbound["submissions"][0]["timestamp"]
        assert inbound["student_id"] == "alice"
        step(es.ServiceCollect, "teacher", course, CourseDirectory__assignment_id="a1")
        got = course / "submitted" / "alice" / "a1"
        assert (got / "kvlib" / "attention.py").read_text() == "# mine\n"
        assert (got / "timestamp.txt").read_text() == stamp
        feedback = course / "feedback" / "alice" / "a1"
        feedback.mkdir(parents=True)
        (feedback / "nb.html").write_text("<p>well done</p>")
        for name in ("timestamp.txt", "submission_secret.txt"):  # as nbgrader's generate_feedback leaves them
            (feedback / name).write_text((got / name).read_text())
        step(es.ServiceReleaseFeedback, "teacher", course, CourseDirectory__assignment_id="a1")
        step(es.ServiceFetchFeedback, "alice", home, CourseDirectory__assignment_id="a1")
        assert (home / "a1" / "feedback" / stamp / "nb.html").read_text() == "<p>well done</p>"
        (cached,) = step(es.ServiceList, "alice", home, ExchangeList__cached=True)
        assert [(s["timestamp"], s["has_exchange_feedback"]) for s in cached["submissions"]] == [(stamp, True)]
        for who, cls, why in (
            ("alice", es.ServiceReleaseAssignment, "403 alice is not an instructor of c1"),
            ("alice", es.ServiceCollect, "403 alice is not an instructor of c1"),
            ("carol", es.ServiceCollect, "403 the token does not hold"),
        ):
            with pytest.raises(ExchangeError, match=why):
                step(cls, who, course, CourseDirectory__assignment_id="a1", ExchangeReleaseAssignment__force=True)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
