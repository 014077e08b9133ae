"""A class between real Unix accounts, as on a JupyterHub: an instructor and four students, nbgrader's
exchange, notebook 01, a deadline with nbgrader's "zero" late penalty. The course folder comes from `kvlib
course init --exchange`; root hands out the students' config and checks the environment with the guide's own
commands (docs/instructors.md's marked blocks, run as written); students fetch, validate and submit as their
own accounts with nbgrader's commands (one twice, one late, one never, and one also in another's name), and four
more each backdate a submission in their own folder in inbound/ (ATTACKS); the instructor collects (--update for
the resubmission), grades with `kvlib course autograde` (once as root, once as the instructor), releases
feedback and exports the grades; each student fetches their own feedback. Then every cross-student read or
write the file system must refuse is tried, as each student. Last, a JupyterHub on 127.0.0.1 whose course moves
its gradebook onto a PostgreSQL server the instructor starts as the guide says, asking for a password: a student
logs in through its login page in headless Chromium, fetches, works, validates and submits from JupyterLab's
Assignments panel; the instructor grades that class into PostgreSQL, and the student fetches the feedback.

Needs root (it creates the accounts; all are removed at the end, with their processes and homes, and the
test fails if anything of them is left).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accounts import Accounts, unavailable
from conftest import ROOT

NB = "01-attention"
# the whole term runs in the first test's setup: on a loaded 2-core machine it takes minutes
pytestmark = pytest.mark.timeout(1800)
# CI (.ci/run) sets KVLIB_CLASS_TEST=required: what these tests need (root, the proxy, PostgreSQL, Chromium) missing
# fails them instead of skipping them
REQUIRED = os.environ.get("KVLIB_CLASS_TEST") == "required"
# A student's environment has no PYTHONPATH (the instructor's, in these tests, points at the checkout): IPython puts the
# notebook's folder after PYTHONPATH, so there the checkout's kvlib stubs would shadow the student's own kvlib/
STUDENT = {"PYTHONPATH": None}


def _need(ok: bool, reason: str) -> None:
    if not ok:
        (pytest.fail if REQUIRED else pytest.skip)(reason)


def _sources():
    """Notebook 01's module correct and with Exercise 1.1 only, their scores (kvlib bench class's submissions)."""
    from kvlib.app import class_bench

    want = class_bench.expected(NB)
    return class_bench.module_source(NB), class_bench.module_source(NB, ("1.1",)), want["partial"], want["correct"]


def _as_root(acc, title: str, names: dict[str, str]) -> str:
    """Run the guide's block `title` as root (docs/instructors.md, as written but for the names); its output."""
    from accounts import guide_block  # noqa: PLC0415

    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", guide_block(title, names)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **acc.base_env},
    )  # fmt: skip
    assert proc.returncode == 0, f"the guide's {title!r} failed: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


def _hand_out_config(acc, role: str) -> None:
    """The students' config from the instructor's course folder into the student's ~/.jupyter, as the guide does."""
    _as_root(acc, "hand out the students' config to one student (as root)", {
        "/home/teacher": str(acc.home("inst")), "/home/alice": str(acc.home(role)), "alice": acc.names[role],
    })  # fmt: skip


def _write_as(path: Path, text: str, owner: str) -> None:
    import pwd  # noqa: PLC0415

    path.write_text(text, encoding="utf-8")
    u = pwd.getpwnam(owner)
    os.chown(path, u.pw_uid, u.pw_gid)


_PROBE = r"""
import json, os, sys
out = {}
for op, path, *rest in json.loads(sys.argv[1]):
    try:
        if op == "read":
            open(path, "rb").read(1)
        elif op == "list":
            os.listdir(path)
        elif op == "write":
            open(path, "wb").write(b"planted")
        elif op == "rename":
            os.rename(path, rest[0])
        elif op == "delete":
            os.remove(path)
        elif op == "mkdir":
            os.mkdir(path)
        out[op + " " + path] = "allowed"
    except PermissionError:
        out[op + " " + path] = "refused"
    except OSError as err:
        out[op + " " + path] = "error: " + str(err)
print(json.dumps(out))
"""

# connecting to the PostgreSQL gradebook as a student: refused unless the server took the login
_PG_PROBE = r"""
import json, sys
import psycopg2
out = {}
for label, kw in json.loads(sys.argv[1]):
    try:
        psycopg2.connect(dbname="gradebook", connect_timeout=10, **kw).close()
        out[label] = "allowed"
    except psycopg2.OperationalError as err:
        text = str(err)
        refused = ("password" in text, "authentication" in text, "Permission denied" in text)
        out[label] = "refused" if any(refused) else "error: " + text
print(json.dumps(out))
"""

LOG: dict = {}


def inbound_of(exchange: Path, course_id: str) -> str:
    return str(exchange / course_id / "inbound")


def _stamp(seconds: float) -> str:
    """A time as nbgrader writes it in timestamp.txt and in a submission folder's name."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1e6) % 1000000:06d} UTC"


# Backdating, after the deadline, each as one student would do it to their own folder in inbound/ (nbgrader's submit
# prints its path): {student: plan(folder, deadline, correct code) -> what _ATTACK does}
ATTACKS = {
    # an honest late submission, then its timestamp.txt forged and every file touched to a minute before the deadline
    "eve": lambda folder, due, code: {"folder": folder, "stamp": _stamp(due - 60), "touch": due - 60},
    # a partial submission on time, its code made correct after the deadline, the file touched back
    "frank": lambda folder, due, code: {"folder": folder, "write": {"kvlib/attention.py": code}, "touch": due - 30},
    # no submit at all: a folder made by hand, named and stamped a second before the deadline, with correct code (and
    # a submission_secret.txt of her own: collect takes no folder without one, as `nbgrader submit` always writes it)
    "grace": lambda folder, due, code: {
        "folder": f"{folder}+{_stamp(due - 1)}+handmade",
        "make_from": "~/" + NB,
        "write": {"kvlib/attention.py": code, "submission_secret.txt": "0" * 128},
        "stamp": _stamp(due - 1),
        "touch": due - 1,
    },
    # an honest late submission renamed to a second before the deadline, stamped and touched to match
    "heidi": lambda folder, due, code: {
        "folder": folder,
        "rename": folder.rsplit("+", 2)[0] + f"+{_stamp(due - 1)}+renamed",
        "stamp": _stamp(due - 1),
        "touch": due - 1,
    },
}
_ATTACK = r"""
import json, os, shutil, sys
plan = json.loads(sys.argv[1])
folder = plan["folder"]
if "make_from" in plan:
    shutil.copytree(os.path.expanduser(plan["make_from"]), folder)
    os.chmod(folder, 0o770)
for rel, text in plan.get("write", {}).items():
    with open(os.path.join(folder, rel), "w") as f:
        f.write(text)
if "stamp" in plan:
    with open(os.path.join(folder, "timestamp.txt"), "w") as f:
        f.write(plan["stamp"])
if "rename" in plan:
    os.rename(folder, plan["rename"])
    folder = plan["rename"]
for top, dirs, files in os.walk(folder, topdown=False):  # touch -d: every file and folder, the folder last
    for name in files + dirs:
        os.utime(os.path.join(top, name), (plan["touch"], plan["touch"]), follow_symlinks=False)
os.utime(folder, (plan["touch"], plan["touch"]))
print(folder)
"""


@pytest.fixture(scope="module")
def term():
    """The whole term, run once: returns what the tests look at."""
    from nbgrader.api import Gradebook  # noqa: PLC0415

    from kvlib.app.class_grading import final_score  # noqa: PLC0415

    _need(unavailable() is None, str(unavailable()))
    correct, partial, partial_score, total = _sources()
    acc = Accounts()
    try:
        acc.add("inst")
        students = {r: acc.add(r) for r in ("alice", "bob", "carol", "dave")}
        attackers = {r: acc.add(r) for r in ATTACKS}  # each backdates a submission one way
        exchange = acc.tmp / "exchange"
        exchange.mkdir(mode=0o1777)
        exchange.chmod(0o1777)  # as an admin makes /srv/nbgrader/exchange
        course_id = f"kvt-{acc.tag}-llm"
        course = acc.home("inst") / "course"
        LOG["init"] = acc.run(
            "inst", str(acc.bin / "python"), "-m", "kvlib", "course", "init", str(course),
            "--exchange", str(exchange), "--course-id", course_id,
        ).stdout  # fmt: skip
        with open(course / "nbgrader_config.py", "a") as f:  # tight limits: the scores never wait on the kernel
            f.write("\nc.Execute.timeout = 10\nc.SandboxExecute.notebook_timeout = 30\n")
            f.write('c.LateSubmissionPlugin.penalty_method = "zero"\n')  # a late submission scores 0
        nbg = str(acc.bin / "nbgrader")
        acc.run("inst", nbg, "generate_assignment", NB, "--log-level=WARN", cwd=course)
        acc.run("inst", nbg, "release_assignment", NB, cwd=course)
        LOG["env check"] = _as_root(acc, "check the environment (as root)", {"/opt/kvlib": str(acc.bin.parent)})
        everyone = {**students, **attackers}
        outbound = exchange / course_id / "outbound" / NB
        for role in everyone:  # root hands each student the config `kvlib course init` wrote, as the guide says
            home = acc.home(role)
            _hand_out_config(acc, role)
            if role in students:
                acc.run(role, nbg, "fetch_assignment", NB, **STUDENT)
            else:  # what fetch gives, copied by hand (quicker; the attacks come after it)
                acc.run(role, "cp", "-r", str(outbound), str(home / NB))

        def submit(role, text, *extra):
            _write_as(acc.home(role) / NB / "kvlib" / "attention.py", text, everyone[role])
            out = acc.run(role, nbg, "submit", NB, *extra, **STUDENT)
            found = re.search(r"Destination: (.+)$", out.stdout + out.stderr, re.M)  # nbgrader tells the student
            return found.group(1) if found else None

        submit("alice", partial)
        _write_as(acc.home("dave") / NB / "kvlib" / "attention.py", correct, students["dave"])
        LOG["validate"] = acc.run("dave", nbg, "validate", f"{NB}/attention.ipynb", check=False, **STUDENT)
        acc.run("dave", nbg, "submit", NB, **STUDENT)
        LOG["collect1"] = acc.run("inst", nbg, "collect", NB, cwd=course).stderr
        env = {**os.environ, "KVLIB_SOLUTIONS": "0", "PYTHONPATH": str(ROOT)}
        root_run = subprocess.run(  # as root, as the guide's `sudo` does: the namespaces jail
            [sys.executable, "-m", "kvlib", "course", "autograde", NB, "--jobs", "2", "--course", str(course), "--quiet"],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
        LOG["autograde root"] = root_run.stdout + root_run.stderr
        assert root_run.returncode == 0, LOG["autograde root"][-5000:]
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
            first = {s.student.id: s.score for s in gb.assignment_submissions(NB)}
        time.sleep(1.1)  # nbgrader's timestamps: the resubmission is later
        submit("alice", correct)
        on_time = {"frank": submit("frank", partial)}
        time.sleep(1.1)
        due_s = time.time()
        due = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due_s))
        acc.run("inst", nbg, "db", "assignment", "add", NB, f"--duedate={due}", cwd=course)
        time.sleep(1.1)
        submit("bob", correct)  # after the deadline
        late = {role: submit(role, correct) for role in ("eve", "heidi")}
        for role, attack in ATTACKS.items():  # after the deadline, as the attacker, in their own folder in inbound/
            folder = on_time.get(role) or late.get(role) or f"{inbound_of(exchange, course_id)}/{everyone[role]}+{NB}"
            plan = attack(folder, due_s, correct)
            LOG[f"attack {role}"] = acc.run(role, str(acc.bin / "python"), "-c", _ATTACK, json.dumps(plan)).stdout
        _write_as(acc.home("bob") / NB / "kvlib" / "attention.py", partial, students["bob"])
        LOG["impostor"] = acc.run("bob", nbg, "submit", NB, f"--student={students['alice']}", check=False, **STUDENT)
        LOG["collect2"] = acc.run("inst", nbg, "collect", NB, cwd=course).stderr
        LOG["collect3"] = acc.run("inst", nbg, "collect", NB, "--update", cwd=course).stderr
        inbound = exchange / course_id / "inbound"
        LOG["inbound"] = {
            p.name: p.stat() for p in inbound.iterdir() if not p.name.startswith(tuple(attackers.values()))
        }
        LOG["inbound files"] = {
            p.name: sorted(f.relative_to(p).as_posix() for f in p.rglob("*") if f.is_file())
            for p in inbound.iterdir()
            if p.name in LOG["inbound"]
        }
        kvlib = [str(acc.bin / "python"), "-m", "kvlib", "course"]
        inst_run = acc.run("inst", *kvlib, "autograde", NB, "--jobs", "2", "--quiet", cwd=course)
        LOG["autograde inst"] = inst_run.stdout + inst_run.stderr
        acc.run("inst", nbg, "db", "student", "add", students["carol"], cwd=course)  # on the roster, never submitted
        acc.run("inst", nbg, "generate_feedback", NB, cwd=course)
        acc.run("inst", nbg, "release_feedback", NB, cwd=course)
        fetched = {}
        for role in students:
            acc.run(role, nbg, "fetch_feedback", NB, **STUDENT)
            fetched[role] = sorted(p.name for p in (acc.home(role) / NB / "feedback").glob("*/*.html"))
        LOG["canvas"] = acc.run("inst", *kvlib, "export-canvas", "--to", "-", cwd=course).stdout
        acc.run("inst", nbg, "export", "--to", "grades.csv", cwd=course)
        LOG["export"] = (course / "grades.csv").read_text()
        LOG["check"] = acc.run("inst", *kvlib, "init", str(course), "--check", check=False)
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
            final = {
                s.student.id: (final_score(s), s.max_score, s.total_seconds_late, s.timestamp, s.score)
                for s in gb.assignment_submissions(NB)
            }
        yield {
            "acc": acc, "students": students, "attackers": attackers, "course": course, "exchange": exchange / course_id,
            "first": first, "final": final, "fetched": fetched, "partial": partial_score, "total": total, "due": due,
        }  # fmt: skip
    finally:
        acc.close()


@pytest.mark.slow
def test_course_folder_and_gradebook_are_the_instructors_alone(term):
    """Check that init leaves the course folder, source/, the gradebook and the grading folders
    mode 0700/0600 and the instructor's, and that `kvlib course init --check` finds nothing after a term."""
    course = term["course"]
    for rel in ("", "source", "grading_secret", "nbgrader_config.py"):
        assert (course / rel).stat().st_mode & 0o077 == 0, f"{rel or 'the course folder'} is open"
    for rel in ("release", "submitted", "autograded", "feedback", "gradebook.db"):  # inside the closed folder
        assert (course / rel).stat().st_uid == course.stat().st_uid, f"{rel} is not the instructor's"
    assert LOG["check"].returncode == 0, LOG["check"].stdout + LOG["check"].stderr


def test_permission_check_names_what_is_open(tmp_path):
    """Check that `kvlib course init --check` warns of a gradebook others can read and exits 1."""
    from kvlib.app.course_folder import init_course, permission_problems  # noqa: PLC0415

    init_course(tmp_path / "c")
    assert permission_problems(tmp_path / "c") == []
    db = tmp_path / "c" / "gradebook.db"
    db.write_text("")
    db.chmod(0o644)
    (tmp_path / "c").chmod(0o755)
    problems = permission_problems(tmp_path / "c")
    assert any("gradebook.db is open to other accounts" in p for p in problems), problems
    assert any(str(tmp_path / "c") + " is open" in p for p in problems), problems


@pytest.mark.slow
def test_exchange_has_the_modes_nbgrader_documents_and_sticky_inbound(term):
    """Check the course's exchange folders (inbound sticky and setgid, write-only) and that each
    submission there is its student's, readable by the instructor's group only."""
    import grp  # noqa: PLC0415

    ex = term["exchange"]
    assert {rel: (ex / rel).stat().st_mode & 0o7777 for rel in ("", "outbound", "inbound", "feedback")} == {
        "": 0o755, "outbound": 0o755, "inbound": 0o3733, "feedback": 0o711,
    }  # fmt: skip
    assert ex.parent.stat().st_mode & 0o7777 == 0o1777
    inst_group = grp.getgrgid(term["course"].stat().st_gid).gr_name
    for name, st in LOG["inbound"].items():
        assert st.st_mode & 0o7777 == 0o770, f"{name}: {oct(st.st_mode)}"
        assert grp.getgrgid(st.st_gid).gr_name == inst_group
        files = LOG["inbound files"][name]  # the learner's files, not the course's (autograde copies those back)
        assert "attention.ipynb" in files and "kvlib/attention.py" in files, files
        assert not [f for f in files if f.startswith(("assets/", "kvlib/core/", "kvlib/course/"))], files


@pytest.mark.slow
def test_a_student_validates_before_submitting(term):
    """Check that `nbgrader validate`, as a student with the config `kvlib course init` wrote, runs the notebook
    against the student's own kvlib/attention.py and passes."""
    out = LOG["validate"].stdout + LOG["validate"].stderr
    assert LOG["validate"].returncode == 0 and "Success! Your notebook passes all the tests." in out, out[-3000:]


@pytest.mark.slow
def test_latest_submission_counts_and_late_is_recorded(term):
    """Check the scores: alice's resubmission replaced her partial one (collect --update, regraded
    without --force), dave graded once, bob late (nbgrader's penalty "zero": 14 before it, 0 after), carol nothing;
    the autograde summary gives bob's score after the penalty, and says why."""
    s, total = term["students"], term["total"]
    assert term["first"] == {s["alice"]: term["partial"], s["dave"]: total}
    final = {k: v for k, v in term["final"].items() if k in s.values()}
    assert set(final) == {s["alice"], s["bob"], s["dave"]}
    assert {k: (v[0], v[1], v[4]) for k, v in final.items()} == {
        s["alice"]: (total, total, total), s["dave"]: (total, total, total), s["bob"]: (0.0, total, total)
    }  # fmt: skip
    assert final[s["bob"]][2] > 0 and final[s["alice"]][2] == 0 and final[s["dave"]][2] == 0
    assert "use --update" in LOG["collect2"]
    assert "Updating submission" in LOG["collect3"]
    assert f"1 of {3 + len(ATTACKS)} already graded" in LOG["autograde inst"]
    late = re.search(rf"late: {s['bob']}: graded 0 of {total:g} \((\d+(\.\d+)?) s late: {total:g} before a penalty of "
                     rf"{total:g}\)", LOG["autograde inst"])  # fmt: skip
    assert late and abs(float(late.group(1)) - final[s["bob"]][2]) < 0.1, LOG["autograde inst"][-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("attacker", list(ATTACKS))
def test_a_backdated_submission_gains_nothing(term, attacker):
    """Check each backdating attack, done as the student to their own folder in inbound/ after the deadline (a forged
    timestamp.txt and touched files; code edited after submitting; a folder made by hand, named and stamped before the
    deadline; a late one renamed to before it): collected as submitted when its files last changed, late, so 0 under
    the penalty (as an honest late submission: bob), however correct its code (14 before the penalty), and the
    collect's log names it."""
    s, total = term["attackers"], term["total"]
    name = s[attacker]
    score, top, seconds_late, when, raw = term["final"][name]
    assert (score, top, raw) == (0.0, total, total), term["final"][name]
    due = datetime.datetime.strptime(term["due"], "%Y-%m-%d %H:%M:%S UTC")
    assert seconds_late > 0 and when > due, (when, due)
    assert LOG[f"attack {attacker}"].strip(), "the attack did not run"
    warned = [ln for ln in LOG["collect2"].splitlines() if name in ln and "no student can set" in ln]
    assert warned, LOG["collect2"][-3000:]


@pytest.mark.slow
def test_a_submission_in_another_students_name_is_not_collected(term):
    """Check that bob's `nbgrader submit --student=alice` is refused at collect (alice keeps her own score)."""
    s = term["students"]
    assert LOG["impostor"].returncode == 0  # nbgrader lets anyone submit under any name...
    assert (
        f"claims to be {s['alice']}'s" in LOG["collect3"] and s["bob"] in LOG["collect3"]
    )  # ...kvlib's collect does not


@pytest.mark.slow
def test_each_student_fetches_their_own_feedback(term):
    """Check that every student who submitted fetched feedback, and carol (never submitted) none."""
    fetched = term["fetched"]
    assert fetched["alice"] and fetched["bob"] and fetched["dave"] and not fetched["carol"]


@pytest.mark.slow
def test_isolation_mode_is_printed_root_and_instructor(term):
    """Check that each run printed its jail: namespaces as root, user namespaces (or plain) as the instructor."""
    print("\nroot:", LOG["autograde root"].splitlines()[0], "\ninstructor:", LOG["autograde inst"].splitlines()[0])
    assert LOG["autograde root"].startswith("isolation: namespaces")
    assert LOG["autograde inst"].startswith(("isolation: userns", "isolation: plain"))


@pytest.mark.slow
def test_canvas_csv_has_one_row_per_student_and_blanks(term):
    """Check the Canvas CSV: Canvas's columns, Points Possible, a row per student, carol blank."""
    s, total = term["students"], term["total"]
    rows = list(csv.reader(io.StringIO(LOG["canvas"])))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", NB]
    assert rows[1][0] == "Points Possible" and float(rows[1][5]) == total
    by_login = {r[3]: r[5] for r in rows[2:]}
    want = {s["alice"]: f"{total:g}", s["bob"]: "0", s["dave"]: f"{total:g}", s["carol"]: ""}  # bob: late, penalty
    assert by_login == {**want, **{name: "0" for name in term["attackers"].values()}}


@pytest.mark.slow
def test_canvas_csv_gives_the_scores_nbgrader_exports(term):
    """Check that every score in the Canvas CSV is the one in nbgrader's own export (after late penalties), and a
    student without a submission is blank there (0 in nbgrader's)."""
    canvas = {r[3]: r[5] for r in list(csv.reader(io.StringIO(LOG["canvas"])))[2:]}
    nbg = {r["student_id"]: r for r in csv.DictReader(io.StringIO(LOG["export"])) if r["assignment"] == NB}
    assert set(canvas) == set(nbg)
    for student, row in nbg.items():
        assert canvas[student] == ("" if row["timestamp"] == "" else f"{float(row['score']):g}"), (student, row)


@pytest.mark.slow
def test_nbgrader_export_has_every_student(term):
    """Check `nbgrader export` on the course folder: a row per student, the scores, bob (late) 0 with the penalty,
    carol (no submission) 0."""
    s, total = term["students"], term["total"]
    rows = {r["student_id"]: r for r in csv.DictReader(io.StringIO(LOG["export"])) if r["assignment"] == NB}
    assert set(rows) == set(s.values()) | set(term["attackers"].values())
    assert {k: float(rows[s[k]]["score"]) for k in s} == {"alice": total, "bob": 0.0, "carol": 0.0, "dave": total}
    assert float(rows[s["bob"]]["late_submission_penalty"]) == total and float(rows[s["bob"]]["raw_score"]) == total
    assert rows[s["carol"]]["timestamp"] == ""


def _cross_ops(term, victim: str, prober: str) -> list[list[str]]:
    """Every read or write of the victim's work, submission and feedback, of the course folder, the gradebook and
    the exchange, that the prober (another student) must be refused."""
    import pwd  # noqa: PLC0415

    acc, course, ex, s = term["acc"], term["course"], term["exchange"], term["students"]
    home = acc.home(victim)
    uid = pwd.getpwnam(s[victim]).pw_uid
    inbound = next(n for n, st in LOG["inbound"].items() if st.st_uid == uid)  # not bob's impostor in alice's name
    sub = course / "submitted" / s[victim] / NB
    return [
        ["read", f"{home}/{NB}/kvlib/attention.py"],
        ["list", str(home)],
        ["read", f"{home}/{NB}/feedback"],
        ["list", str(course)],
        ["read", f"{course}/source/{NB}/attention.ipynb"],
        ["read", f"{course}/gradebook.db"],
        ["read", f"{course}/grading_secret"],
        ["read", f"{sub}/kvlib/attention.py"],
        ["write", f"{sub}/kvlib/planted.py"],
        ["rename", f"{sub}/kvlib", f"{sub}/kvlib-moved"],
        ["mkdir", f"{course}/submitted/{s[prober]}-2"],
        ["read", f"{course}/autograded/{s[victim]}/{NB}/kvlib/attention.py"],
        ["write", f"{course}/autograded/{s[victim]}/{NB}/planted.py"],
        ["read", f"{course}/feedback/{s[victim]}/{NB}/attention.html"],
        ["write", f"{course}/feedback/{s[victim]}/{NB}/planted.html"],
        ["list", f"{ex}/inbound"],
        ["read", f"{ex}/inbound/{inbound}/attention.ipynb"],
        ["write", f"{ex}/inbound/{inbound}/planted.py"],
        ["delete", f"{ex}/inbound/{inbound}/attention.ipynb"],
        ["rename", f"{ex}/inbound/{inbound}", f"{ex}/inbound/moved"],
        ["list", f"{ex}/feedback"],
        ["write", f"{ex}/outbound/{NB}/planted.py"],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("prober", ["alice", "bob", "carol", "dave"])
def test_every_cross_student_access_is_refused(term, prober):
    """Check, as each student, every read or write of another's work, submission, feedback, the course
    folder, the gradebook and the exchange that a student must not do: all refused by the file system."""
    acc = term["acc"]
    victim = "dave" if prober == "alice" else "alice"  # both submitted, were graded and got feedback
    mine = f"{acc.home(prober)}/{NB}/kvlib/attention.py"
    ops = _cross_ops(term, victim, prober) + [["read", mine]]
    proc = acc.run(prober, str(acc.bin / "python"), "-c", _PROBE, json.dumps(ops))
    out = json.loads(proc.stdout)
    assert out.pop(f"read {mine}") == "allowed"  # the probe can read what is the prober's
    assert {k: v for k, v in out.items() if v != "refused"} == {}


# ---------------------------------------------------------------------------------------------
# JupyterHub: a student logs in through the hub's login page and submits from the Assignments panel


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120, ok: tuple[int, ...] = ()) -> None:
    """Wait until url answers (200, or a status in ok) while the hub runs."""
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the hub exited: {log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except urllib.error.HTTPError as err:  # the proxy answers 404 until the hub has added its route
            if err.code in ok:
                return
            time.sleep(1)
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the hub did not answer at {url}: {log.read_text()[-3000:]}")


def _grader_machine(tag: str) -> dict:
    """A second machine for the graders: a network namespace joined to this one by a veth link (its own
    addresses, routes and loopback: the hub's 127.0.0.1 is not its own). Returns {"ns", "hub_ip", "grader_ip"}."""
    import random  # noqa: PLC0415

    net = f"10.213.{random.randrange(256)}"
    ns, here, there = f"kvt-{tag}-grader", f"kvt{tag}h", f"kvt{tag}g"
    for cmd in (
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{net}.1/30", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/30", "dev", there],
        ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ):
        made = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if made.returncode != 0:  # e.g. a container without CAP_SYS_ADMIN
            _remove_grader_machine({"ns": ns, "link": here})
            _need(False, f"cannot make the grading machine's network namespace: {' '.join(cmd)}: {made.stderr.strip()}")
    return {"ns": ns, "link": here, "hub_ip": f"{net}.1", "grader_ip": f"{net}.2"}


def _remove_grader_machine(grader: dict) -> None:
    subprocess.run(["ip", "netns", "del", grader["ns"]], capture_output=True, timeout=60)
    subprocess.run(["ip", "link", "del", grader["link"]], capture_output=True, timeout=60)  # gone with it, or now


def _on_grader(grader: dict, hidden: list[Path]) -> list[str]:
    """The `via` of Accounts.run that runs a command on the grader's machine: in its network namespace, with the hub
    machine's own files (the exchange's store, the students' homes) hidden under an empty tmpfs each."""
    mounts = "".join(f"mount -t tmpfs -o size=64k,mode=000 kvt-hidden '{p}' && " for p in hidden)
    return ["ip", "netns", "exec", grader["ns"], "sh", "-c", f'{mounts}exec "$@"', "sh"]


@pytest.fixture(scope="module")
def hub():
    """A JupyterHub on one machine (this one's own network) and a grading machine beside it (_grader_machine), with
    the exchange as the hub's service (kvlib.app.exchange_service, under its own account; docs/instructors.md's
    blocks, run as written): the instructor makes the course, asks the hub for a token and releases notebook 01
    from the grading machine, then starts a PostgreSQL server for the class there that asks for a password and
    moves the gradebook onto it; one student (erin) and one more hub user (fred); the hub on the link's address
    (free ports, PAMAuthenticator against Unix passwords, LocalProcessSpawner: the student's server runs as the
    student)."""
    import importlib.util  # noqa: PLC0415
    import secrets  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from accounts import guide_block  # noqa: PLC0415

    _need(unavailable() is None, str(unavailable()))
    _need(shutil.which("configurable-http-proxy") is not None, "needs configurable-http-proxy (npm install -g ...)")
    _need(importlib.util.find_spec("jupyterhub") is not None, "needs jupyterhub (pip install -e '.[dev]')")
    _need(importlib.util.find_spec("psycopg2") is not None, "needs psycopg2 (pip install -e '.[dev]')")
    _need(
        Path("/usr/lib/postgresql/15/bin/initdb").exists(),
        "needs Debian 12's PostgreSQL 15 (apt-get install postgresql)",
    )
    _need(shutil.which("ip") is not None, "needs iproute2's ip (apt-get install iproute2): the grader's machine")
    acc = Accounts()
    proc = None
    proxy_pid = None
    pg_data = None
    grader = None
    try:
        inst = acc.add("inst")
        student = acc.add("erin")
        other = acc.add("fred")  # a hub user with no server: the service's refusals are tried with his token
        grader = _grader_machine(acc.tag)
        course_id = f"kvt-{acc.tag}-hub"
        course = acc.home("inst") / "course"
        store = acc.tmp / "exchange-store"
        port, hub_port, api_port, svc_port = _free_port(), _free_port(), _free_port(), _free_port()
        hub_url = f"http://{grader['hub_ip']}:{port}"
        names = {  # the guide's names, the test's values
            "/opt/kvlib": str(acc.bin.parent), "teacher": inst, "kvlib-2027-spring": course_id, "kvlib-svc": f"kvt-{acc.tag}-svc",
            "/srv/kvlib-exchange": str(store), "https://hub.example.edu": hub_url, "http://127.0.0.1:10101": f"http://127.0.0.1:{svc_port}",
        }  # fmt: skip
        _as_root(acc, "the exchange service's account and folder (as root, on the hub's machine)", names)
        acc.names["svc"] = names["kvlib-svc"]  # removed with the others
        passwords = {role: secrets.token_hex(8) for role in ("inst", "erin", "fred")}  # PAM logs each in
        subprocess.run(
            ["chpasswd"], input="".join(f"{acc.names[r]}:{pw}\n" for r, pw in passwords.items()), text=True, check=True
        )
        run = acc.tmp / "hub"
        run.mkdir()
        env = {k: v for k, v in acc.env("erin", **STUDENT).items() if k not in ("HOME", "USER", "LOGNAME")}
        (run / "jupyterhub_config.py").write_text(
            f"""c = get_config()
c.JupyterHub.ip = {grader["hub_ip"]!r}
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.pid_file = {str(run / "proxy.pid")!r}
c.JupyterHub.db_url = {"sqlite:///" + str(run / "hub.sqlite")!r}
c.JupyterHub.cookie_secret_file = {str(run / "cookie_secret")!r}
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = {{{student!r}, {other!r}, {inst!r}}}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{str(acc.bin / "jupyterhub-singleuser")!r}]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {env!r}
c.Spawner.start_timeout = 240
c.Spawner.http_timeout = 240
{guide_block("the hub's exchange service (jupyterhub_config.py)", names, lang="python")}
c.JupyterHub.services[0]["environment"] = {acc.env("inst", HOME=None, USER=None, LOGNAME=None)!r}  # the test's env
"""
        )
        log = run / "hub.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(run / "jupyterhub_config.py")],
                cwd=run, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PATH": f"{acc.bin}:{os.environ['PATH']}"},
            )  # fmt: skip
        _wait_http(f"{hub_url}/hub/login", proc, log)
        _wait_http(
            f"{hub_url}/services/kvlib-exchange/api/whoami", proc, log, ok=(403,)
        )  # the service asks for a token
        if (run / "proxy.pid").exists():
            proxy_pid = int((run / "proxy.pid").read_text().strip())
        # the instructor, on the grading machine: the course, a hub token, the release, the class's PostgreSQL
        on_grader = _on_grader(grader, [store, acc.home("erin"), acc.home("fred")])

        def grade(*argv, **kw):
            return acc.run("inst", *argv, via=on_grader, **kw)

        def guide(title, **kw):
            return grade("bash", "-euo", "pipefail", "-c", guide_block(title, {**names, **kw.pop("names", {})}), **kw)

        guide("a course that exchanges through the hub's service (as the instructor, on the grading machine)")
        guide("a grader's hub token (as the instructor, on the grading machine)", input=passwords["inst"] + "\n")
        with open(course / "nbgrader_config.py", "a") as f:  # the test's kernel limits
            f.write("\nc.Execute.timeout = 10\nc.SandboxExecute.notebook_timeout = 30\n")
        nbg = str(acc.bin / "nbgrader")
        kvlib = [str(acc.bin / "python"), "-m", "kvlib", "course"]
        grade(nbg, "generate_assignment", NB, "--log-level=WARN", cwd=course)
        released = grade(nbg, "release_assignment", NB, cwd=course)
        # the guide's PostgreSQL server for the class, started as the instructor, and the course moved onto it
        pg_password = secrets.token_hex(12)
        pg_data = acc.home("inst") / "gradebook-pg"
        guide("start PostgreSQL for the class (as the instructor)", names={"CHANGE-ME": pg_password})
        moved = guide("move the course onto PostgreSQL (as the instructor)", names={"CHANGE-ME": pg_password})
        db_url = f"postgresql+psycopg2://kvlib:{pg_password}@/gradebook?host={pg_data}"
        assert "moved " in moved.stderr and repr(db_url) in (course / "nbgrader_config.py").read_text(), moved.stderr
        _hand_out_config(acc, "erin")
        yield {"acc": acc, "url": hub_url, "student": student, "password": passwords["erin"], "passwords": passwords,
               "store": store / course_id, "log": log, "course": course, "course_id": course_id, "db_url": db_url,
               "kvlib": kvlib, "nbg": nbg, "grade": grade, "grader": grader, "released": released,
               "hub_api": ("127.0.0.1", hub_port)}  # fmt: skip
    finally:
        left = []
        if proc is not None:
            proc.send_signal(signal.SIGTERM)  # the hub stops the student's server, the service and its proxy
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                left.append(f"the hub (pid {proc.pid}) did not stop on SIGTERM within 60 s")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proxy_pid is not None and _alive(proxy_pid):
            left.append(f"the hub's proxy (pid {proxy_pid}) outlived it")
            os.kill(proxy_pid, signal.SIGKILL)
        if pg_data is not None and (pg_data / "postmaster.pid").exists():  # the class's server, stopped
            acc.run(
                "inst", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", str(pg_data), "-m", "immediate", "stop", check=False
            )
        if grader is not None:
            _remove_grader_machine(grader)
        acc.close()
        assert not left, left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_student_fetches_and_submits_through_the_hub_in_a_browser(hub):
    """Check, in headless Chromium: the hub's login page (PAM: a wrong password refused, the right one let in), the
    student's JupyterLab (spawned as the student), nbgrader's Assignments panel, all through the hub's exchange
    service with the token of the student's server: Fetch; the student's work (their kvlib/attention.py); Validate,
    which passes; Submit; the submission reaches the service's store under the student's hub name, with their work in
    it and the service's time of receipt in its timestamp.txt, between the press and the panel's answer."""
    import pwd  # noqa: PLC0415

    from test_browser import ARTIFACTS, _chromium  # noqa: PLC0415

    chromium = _chromium()
    _need(chromium is not None, "no Chromium found (apt-get install chromium)")
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    correct = _sources()[0]
    work = hub["acc"].home("erin") / NB / "kvlib" / "attention.py"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(hub["url"] + "/hub/login")
            page.fill("#username_input", hub["student"])
            page.fill("#password_input", hub["password"] + "x")  # PAM refuses a wrong password
            page.click("#login_submit")
            page.get_by_text("Invalid username or password").wait_for(timeout=60_000)
            page.fill("#username_input", hub["student"])
            page.fill("#password_input", hub["password"])
            page.click("#login_submit")
            page.wait_for_url(f"**/user/{hub['student']}/lab**", timeout=240_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            page.get_by_text("Nbgrader", exact=True).first.click()
            page.get_by_text("Assignment List", exact=True).first.click()
            panel = page.locator("#nbgrader-assignment-list")
            panel.get_by_role("button", name="Fetch").first.click(timeout=120_000)
            panel.locator("#fetched_assignments_list .assignment-notebooks-link").first.click(timeout=120_000)
            _write_as(work, correct, hub["student"])  # the student's work, done in their own folder
            panel.get_by_role("button", name="Validate").first.click(timeout=120_000)
            page.locator("#validation-message").wait_for(timeout=240_000)  # the notebook runs in the student's server
            validation = page.locator("#validation-message").inner_text()
            page.screenshot(path=str(ARTIFACTS / "hub-validate.png"))
            page.locator(".jp-Dialog .jp-mod-accept").click()
            pressed = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            panel.get_by_role("button", name="Submit").first.click(timeout=120_000)
            panel.get_by_role("button", name="Fetch Feedback").first.wait_for(timeout=120_000)  # in the submitted list
            answered = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            page.screenshot(path=str(ARTIFACTS / "hub-assignments.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "hub-failed.png"))
            raise AssertionError(f"see {ARTIFACTS / 'hub-failed.png'}; hub log: {hub['log'].read_text()[-3000:]}")
        finally:
            browser.close()
    assert "Success! Your notebook passes all the tests." in validation, validation[-2000:]
    from nbgrader.utils import parse_utc  # noqa: PLC0415

    svc = pwd.getpwnam(hub["acc"].names["svc"]).pw_uid
    assert hub["store"].parent.stat().st_uid == svc and hub["store"].parent.stat().st_mode & 0o777 == 0o700
    (mine,) = [p for p in (hub["store"] / "inbound").iterdir() if p.name.startswith(hub["student"] + "+" + NB + "+")]
    assert (mine / "kvlib" / "attention.py").read_text(encoding="utf-8") == correct
    assert all(p.stat().st_uid == svc for p in [mine, *mine.rglob("*")])  # the service's, not the student's
    stamp = (mine / "timestamp.txt").read_text()
    assert mine.name.split("+")[2] == stamp and pressed <= parse_utc(stamp) <= answered, (stamp, pressed, answered)


@pytest.mark.slow
def test_the_hubs_class_is_graded_into_postgresql(hub):
    """Check the rest of the hub's term from the grading machine, with the gradebook on PostgreSQL (after the browser
    test's submission): the instructor collects through the exchange service, autogrades, generates and releases
    feedback and exports; the student fetches the feedback through the service with a hub token of hers; the grade is
    in PostgreSQL; on the grading machine the service's store is out of reach and so is the hub's own loopback
    (all of it crossed as HTTP); and the student, who can reach the server's socket here, is refused without the
    password that only the instructor's config holds, and cannot read that config."""
    from nbgrader.api import Gradebook  # noqa: PLC0415

    from kvlib.app.exchange_service import hub_token  # noqa: PLC0415

    acc, course, nbg, kvlib, grade = hub["acc"], hub["course"], hub["nbg"], hub["kvlib"], hub["grade"]
    assert any(p.name.startswith(hub["student"] + "+" + NB) for p in (hub["store"] / "inbound").iterdir()), (
        "no submission from the browser test to grade"
    )
    grade(nbg, "collect", NB, cwd=course)
    assert (course / "submitted" / hub["student"] / NB / "kvlib" / "attention.py").read_text() == _sources()[0]
    graded = grade(*kvlib, "autograde", NB, "--quiet", cwd=course)
    assert "1 graded, 0 refused, 0 failed" in graded.stderr, graded.stderr[-3000:]
    grade(nbg, "generate_feedback", NB, cwd=course)
    grade(nbg, "release_feedback", NB, cwd=course)
    token = hub_token(hub["url"] + "/services/kvlib-exchange/", hub["student"], hub["password"])
    acc.run("erin", nbg, "fetch_feedback", NB, JUPYTERHUB_API_TOKEN=token, **STUDENT)  # as in a terminal of her server
    assert list((acc.home("erin") / NB / "feedback").glob("*/attention.html"))
    grade(nbg, "export", "--to", "grades.csv", cwd=course)
    rows = list(csv.DictReader(io.StringIO((course / "grades.csv").read_text())))
    total = _sources()[3]
    assert [(r["student_id"], float(r["score"])) for r in rows] == [(hub["student"], total)]
    reach = [["list", str(hub["store"])], ["list", str(acc.home("erin"))]]
    assert set(json.loads(grade(str(acc.bin / "python"), "-c", _PROBE, json.dumps(reach)).stdout).values()) == {
        "refused"
    }  # hidden on the grading machine
    loopback = grade(str(acc.bin / "python"), "-c", f"import socket; socket.create_connection({hub['hub_api']!r}, 5)",
                     check=False)  # fmt: skip
    assert "ConnectionRefusedError" in loopback.stderr, loopback.stderr[-2000:]  # its own 127.0.0.1, not the hub's
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", hub["course_id"]) as gb:  # the one before the move
        assert gb.assignment_submissions(NB) == []  # nothing went there
    with Gradebook(hub["db_url"], hub["course_id"]) as gb:
        assert [(s.student.id, s.score) for s in gb.assignment_submissions(NB)] == [(hub["student"], total)]
    host = hub["db_url"].split("host=", 1)[1]
    tries = [["no password", {"host": host, "user": "kvlib"}], ["a wrong one", {"host": host, "user": "kvlib",
             "password": "guess"}]]  # fmt: skip
    out = json.loads(acc.run("erin", str(acc.bin / "python"), "-c", _PG_PROBE, json.dumps(tries)).stdout)
    assert out == {"no password": "refused", "a wrong one": "refused"}, out  # the socket is in a closed home
    as_root = subprocess.run([sys.executable, "-c", _PG_PROBE, json.dumps(tries)], capture_output=True, text=True)
    assert json.loads(as_root.stdout) == out, as_root.stdout + as_root.stderr  # and the server asks for the password
    probe = [["read", f"{course}/nbgrader_config.py"]]
    assert json.loads(acc.run("erin", str(acc.bin / "python"), "-c", _PROBE, json.dumps(probe)).stdout) == {
        f"read {course}/nbgrader_config.py": "refused"
    }


@pytest.mark.slow
def test_the_exchange_service_takes_each_submission_as_its_hub_user_at_its_own_time(hub):
    """Check the exchange service against a hub user who talks to it directly (fred, with a token the hub gives for
    his password): a submission in another's name, a list or download of others' submissions, a release, an upload
    holding a link or a name outside its folder, a request without a token or with a token lacking the service's
    scope: each refused; a submission whose timestamp.txt claims 2020 is kept at the service's time of receipt;
    the feedback he gets is his own only (none), not erin's."""
    import urllib.error  # noqa: PLC0415
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    from nbgrader.utils import parse_utc  # noqa: PLC0415
    from test_exchange_service import _tar  # noqa: PLC0415

    from kvlib.app.exchange_service import hub_token  # noqa: PLC0415

    api = hub["url"] + "/services/kvlib-exchange/api/"
    course = f"courses/{hub['course_id']}"
    fred = hub["acc"].names["fred"]
    token = hub_token(api.removesuffix("api/"), fred, hub["passwords"]["fred"])

    def call(method, path, body=None, tok=token):
        req = urllib.request.Request(api + path, data=body, method=method, headers={"Content-Type": "application/gzip"})
        if tok:
            req.add_header("Authorization", f"token {tok}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    sub = {
        "attention.ipynb": "{}",
        "submission_secret.txt": "f" * 64,
        "timestamp.txt": "2020-01-01 00:00:00.000000 UTC",
    }
    assert call("GET", "whoami")[1]["name"] == fred
    erins = [p.name for p in (hub["store"] / "inbound").iterdir()]
    refused = {
        "in erin's name": call("POST", f"{course}/submissions/{NB}?student={hub['student']}", _tar(sub)),
        "list": call("GET", f"{course}/submissions/{NB}"),
        "download": call("GET", f"{course}/submissions/{NB}/{urllib.parse.quote(erins[0])}"),
        "release": call("PUT", f"{course}/released/{NB}?force=1", _tar({"x.ipynb": "{}"})),
        "a link": call("POST", f"{course}/submissions/{NB}", _tar(sub, {"kvlib/attention.py": "/etc/shadow"})),
        "outside": call("POST", f"{course}/submissions/{NB}", _tar({**sub, "../../planted.py": "x"})),
        "no token": call("GET", "whoami", tok=None),
    }
    scopeless = json.loads(
        urllib.request.urlopen(urllib.request.Request(
            hub["url"] + f"/hub/api/users/{fred}/tokens", method="POST",
            data=json.dumps({"auth": {"username": fred, "password": hub["passwords"]["fred"]}, "scopes": ["read:users:activity!user"]}).encode(),
        ), timeout=60).read()
    )["token"]  # fmt: skip
    refused["no scope"] = call("GET", "whoami", tok=scopeless)
    codes = {k: code for k, (code, _) in refused.items()}
    assert codes == {"in erin's name": 403, "list": 403, "download": 403, "release": 403, "a link": 400, "outside": 400,
                     "no token": 403, "no scope": 403}, refused  # fmt: skip
    assert not (hub["store"] / "planted.py").exists() and not (hub["store"].parent / "planted.py").exists()
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    code, receipt = call("POST", f"{course}/submissions/{NB}", _tar(sub))
    after = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert code == 200 and receipt["student"] == fred, receipt
    kept = hub["store"] / "inbound" / receipt["id"]
    assert (kept / "timestamp.txt").read_text() == receipt["timestamp"]
    assert before <= parse_utc(receipt["timestamp"]) <= after  # the service's clock, not the 2020 it claimed
    assert call("GET", f"{course}/feedback") == (200, {"feedback": {}})  # erin's feedback is released, not his
