"""`kvlib course init DIR`: an instructor's nbgrader course folder, ready for the standard commands.

  DIR/nbgrader_config.py                  course id, timeouts, exclude_overwriting, isolated grading
  DIR/grading_secret                      the seed of every student's random inputs (mode 600; never released)
  DIR/source/<NN-topic>/<notebook>.ipynb  from solutions/ (nbgrader generate_assignment strips it); --lang zh-CN:
                                          from solutions/zh-CN/ where translated (the same cells, ids, grades)
  DIR/source/<NN-topic>/kvlib/            the learner package: stubs for this notebook's exercises;
                                          earlier notebooks' modules the reference (--earlier given)
                                          or stubs the learners fill in again (--earlier own)
Existing files are never overwritten without force=True, and then a changed one is first kept
as <name>.bak; the secret is never replaced. The folder and what grading writes in it are made the
instructor's alone (secure, permission_problems), and `--exchange ROOT` sets up nbgrader's exchange
for the course (setup_exchange). Not here: grading itself (kvlib.grading), parallel grading
(class_grading.py), the exchange's submit and collect steps (exchange.py).
"""

from __future__ import annotations

import ast
import grp
import os
import pwd
import secrets
import shutil
import stat
from pathlib import Path

from kvlib.app.release import BEGIN, END, ROOT, assignments, stub_source
from kvlib.course.exercises import EXERCISES
from kvlib.grading.submission import MAX_HELPER_BYTES, MAX_HELPERS

SECRET = "grading_secret"
# kvlib parts learners do not get: the grader, the release tool and this course-folder builder
_INSTRUCTOR_ONLY = {
    "grading",
    "app/release.py",
    "app/course_folder.py",
    "app/class_grading.py",
    "app/grading_record.py",
    "app/class_bench.py",
    "app/exchange.py",
    "app/exchange_service.py",
    "app/translate.py",
}


class CourseFolderExists(FileExistsError):
    def __init__(self, paths: list[Path]):
        self.paths = paths
        listed = "\n  ".join(str(p) for p in paths[:20]) + ("\n  ..." if len(paths) > 20 else "")
        super().__init__(
            f"these files exist and differ from what `kvlib course init` writes:\n  {listed}\n"
            "nothing was written; rerun with --force to replace them (each is kept as <name>.bak first)"
        )


def module_notebooks() -> dict[str, str]:
    """Exercise module -> the notebook that introduces it ("attention" -> "01-attention")."""
    out: dict[str, str] = {}
    for ex in EXERCISES:
        out.setdefault(ex.module, ex.notebook)
    return out


def _number(notebook: str) -> int:
    return int(notebook.split("-")[0])


def _without_markers(solution: str) -> str:
    return "".join(line for line in solution.splitlines(keepends=True) if line.strip() not in (BEGIN, END))


def learner_files(notebook: str, earlier: str) -> dict[str, bytes]:
    """kvlib/ (and the assets/ folders it reads, see _ASSETS) as the learners of `notebook` get it, {relative path: content}."""
    if earlier not in ("own", "given"):
        raise ValueError(f"earlier must be 'own' or 'given', not {earlier!r}")
    files: dict[str, bytes] = {}
    package = ROOT / "kvlib"
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package)
        if (
            not path.is_file()
            or rel.parts[0] in _INSTRUCTOR_ONLY
            or rel.as_posix() in _INSTRUCTOR_ONLY
            or "__pycache__" in rel.parts
            or path.suffix == ".pyc"
        ):
            continue
        files[f"kvlib/{rel.as_posix()}"] = path.read_bytes()
    owners = module_notebooks()
    for sol in sorted((ROOT / "solutions" / "kvlib").glob("*.py")):
        owner = owners.get(sol.stem)
        if owner is None:  # no exercise of the table is in it yet: not part of the course so far
            continue
        text = sol.read_text(encoding="utf-8")
        given = earlier == "given" and _number(owner) < _number(notebook)
        files[f"kvlib/{sol.name}"] = (_without_markers(text) if given else stub_source(text)).encode()
    files["YOUR_FILES.md"] = your_files(notebook, earlier).encode()
    for folder, first in _ASSETS.items():
        if _number(notebook) >= first:
            for path in sorted((ROOT / "assets" / folder).glob("*")):
                files[f"assets/{folder}/{path.name}"] = path.read_bytes()
    return files


# assets/<folder> -> the first notebook that reads it (a missing folder ships nothing)
_ASSETS = {
    "tiny": 2,  # the trained tiny model runs everything from notebook 02 on
    "recordings": 5,  # GPU runs of `kvlib bench memory`, shown as recordings in notebook 05
    "gqa": 6,  # the recorded uptraining study of notebook 06
    "draft": 10,  # notebook 10's drafter model
}


def your_files(notebook: str, earlier: str) -> str:
    """The note in every released assignment that says which files are the learner's."""
    mine = learner_edited(notebook, earlier)
    by_file = {}
    for ex in EXERCISES:
        if f"kvlib/{ex.module}.py" in mine:
            by_file.setdefault(f"kvlib/{ex.module}.py", []).append(ex.id)
    lines = [
        f"# Your files in {notebook}",
        "",
        "You fill in the exercises of these files (each stub raises NotImplementedError until you do):",
        "",
    ]
    lines += [f"- `{f}`: Exercises {', '.join(ids)}" for f, ids in by_file.items()]
    used = earlier_used(notebook) if earlier == "own" else []
    if used:
        importers = ", ".join(f"`kvlib/{m}.py`" for m in dict.fromkeys(u[0] for u in used))
        calls = ", ".join(f"`{name}` (Exercise {ids}, `kvlib/{other}.py`)" for _, other, name, ids in used)
        lines += [
            "",
            f"**Paste in your earlier files before you hand in.** {importers} imports your solutions of earlier",
            f"notebooks: {calls}. Here those files are stubs until you put your own finished ones in their",
            "place; while one is a stub, every graded check that reaches it fails, however right your exercises of",
            "this notebook are.",
        ]
    lines += [
        "",
        "Everything else in `kvlib/` (`core/`, `course/`, `measure/`, `study/`, `checks/`, `app/`) is the course's",
        "infrastructure: the model, figures, measuring, checks and commands. Read it, but do not edit it: the grader",
        "uses its own copy. Hand in the notebook and the files above.",
        "",
        "Your code may import numpy, torch, `kvlib.core`, `kvlib.course`, `kvlib.measure`, `kvlib.study`, the",
        "other exercise modules and modules of your own. `kvlib.checks` and `kvlib.app` run your `kvlib check`",
        "here, but they are not there when your code is graded: a module that imports them does not import, and scores 0.",
        "",
        "## Modules of your own",
        "",
        "You may move code you share between exercises into modules of your own, beside the files above,",
        "e.g. `kvlib/my_helpers.py`, imported with `from kvlib.my_helpers import ...` (or",
        "`from . import my_helpers`). Hand them in with the rest: they are graded with your exercises.",
        f"The grader takes at most {MAX_HELPERS} of them, each at most {MAX_HELPER_BYTES >> 10} KiB, directly in `kvlib/`",
        "(not in a subfolder), with a name that kvlib does not use already (not `core`, `checks`, `attention`, ...).",
        "",
        "Hand in files, never links: a symbolic link, or a hard link to a file outside your folder, is",
        "refused (not copied, not run, not graded), and your graded notebook says which.",
        "",
    ]
    return "\n".join(lines)


def earlier_used(notebook: str) -> list[tuple[str, str, str, str]]:
    """What this notebook's own modules import of earlier notebooks' exercises, as the reference imports it:
    [(importing module, earlier module, function or class, exercise ids), ...]."""
    owners = module_notebooks()
    by_name: dict[tuple[str, str], list[str]] = {}
    for ex in EXERCISES:  # a class stands for its exercise methods (KVCache: 4.1)
        by_name.setdefault((ex.module, ex.name.split(".")[0]), []).append(ex.id)
    used = []
    for module in sorted({ex.module for ex in EXERCISES if ex.notebook == notebook}):
        tree = ast.parse((ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            other = (node.module or "").removeprefix("kvlib.") if isinstance(node, ast.ImportFrom) else ""
            if other not in owners or _number(owners[other]) >= _number(notebook):
                continue
            for alias in node.names:
                ids = by_name.get((other, alias.name))
                entry = (module, other, alias.name, ", ".join(ids or []))
                if ids and entry not in used:
                    used.append(entry)
    return used


def learner_edited(notebook: str, earlier: str) -> list[str]:
    """The kvlib files learners of `notebook` edit: autograde must keep their copies."""
    owners = module_notebooks()
    return sorted(
        f"kvlib/{m}.py"
        for m, nb in owners.items()
        if nb == notebook or (earlier == "own" and _number(nb) < _number(notebook))
    )


def config_text(
    course_id: str, exclude: dict[str, list[str]], exchange: str | None = None, service: str | None = None
) -> str:
    exclude_lines = "".join(f"    {k!r}: {v!r},\n" for k, v in exclude.items())
    exchange_lines = (
        f"# nbgrader's exchange (set up by `kvlib course init --exchange`); students need the same root and course id\n"
        f"c.Exchange.root = {exchange!r}\n"
        if exchange
        else ""
    )
    collect = (
        "# `nbgrader collect` copies a link in the exchange as a link (which autograde then refuses), not as its "
        "target,\n# and takes a submission only from the account it names (kvlib.app.exchange)\n"
        'c.ExchangeFactory.collect = "kvlib.app.exchange.OwnerCheckedCollect"\n'
    )
    if service:
        from kvlib.app.exchange_service import config_lines  # noqa: PLC0415 (start-up time: nbgrader's exchange, service only)

        collect = (
            "# nbgrader's exchange through the hub's service (kvlib.app.exchange_service); students need the same URL\n"
            f"{config_lines(service)}# a hub token of yours, where $JUPYTERHUB_API_TOKEN is not set (docs/instructors.md)\n"
            '# c.ServiceExchange.token = "..."\n'
        )
    return f'''"""nbgrader configuration of a kvlib course, written by `kvlib course init` (instructor guide:
docs/instructors.md). Yours to edit: `kvlib course init --force` keeps a changed copy as .bak."""
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, GetGrades, OverwriteCells, SaveAutoGrades

from kvlib.grading import HideHiddenTests, IsolatedGrading, NoteRefusedFiles, RestoreCells, SandboxExecute
from kvlib.grading.autograde import install

# `nbgrader autograde` screens every submission before it copies anything: links (symbolic, or
# hard links to files outside the submission) are refused, named in the log and in the learner's
# graded notebook, and the rest is graded (docs/instructors.md, "What the grader defends against").
install()

c = get_config()  # noqa: F821 (provided by nbgrader)
c.CourseDirectory.course_id = {course_id!r}
{exchange_lines}{collect}c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}

# Learners edit these kvlib files, not the notebooks: autograde keeps their copies.
c.Autograde.exclude_overwriting = {{
{exclude_lines}}}
# nbgrader's own sanitizing steps, plus RestoreCells before OverwriteCells: deleted test cells
# come back, and cells with edited nbgrader metadata get the source's, instead of failing the
# whole submission (which nbgrader's own add_missing_cells does on this course's notebooks).
_sanitize = list(Autograde.class_traits()["sanitize_preprocessors"].default())
_sanitize.insert(_sanitize.index(OverwriteCells), RestoreCells)
# then the refused files, named at the top of the notebook (a submission not screened stops here)
_sanitize.insert(_sanitize.index(OverwriteCells), NoteRefusedFiles)
c.Autograde.sanitize_preprocessors = _sanitize

# nbgrader's own autograde steps, with the notebook's kernel jailed (SandboxExecute) and every
# graded cell scored by its check on the submission's isolated code (IsolatedGrading), just
# before SaveAutoGrades records the scores.
_steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
_steps[_steps.index(Execute)] = SandboxExecute
_steps.insert(_steps.index(SaveAutoGrades), IsolatedGrading)
c.Autograde.autograde_preprocessors = _steps

# The feedback shows each graded cell's visible asserts and verdict, never its hidden tests.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, HideHiddenTests]

# Time limits: one notebook cell; all cells of one notebook (then the rest are skipped); one call
# of a learner's function in the isolated checker; all isolated checks of one notebook.
c.Execute.timeout = 60
c.SandboxExecute.notebook_timeout = 300
c.IsolatedGrading.call_timeout = 10
c.IsolatedGrading.notebook_timeout = 120

# Late submissions (a due date: `nbgrader db assignment add A --duedate=...`): nbgrader's penalty, none by default;
# "zero" scores a late submission 0. `kvlib course autograde`'s summary and `export-canvas` apply it, as nbgrader's
# own export does. A submission's time is when its files last changed in the exchange (kvlib.app.exchange).
# c.LateSubmissionPlugin.penalty_method = "zero"

# Random inputs per student come from the secret in {SECRET} (never release it);
# c.IsolatedGrading.seed = 1234 would fix them instead.
# Your own hidden checks (docs/instructors.md, "Your own checks"):
# c.IsolatedGrading.extra_checks = ["course_checks.py"]
# auto: namespaces when root, else user namespaces, else plain (docs/instructors.md: what plain leaves open)
# c.GradingJail.isolation = "auto"
# Where no jail works, autograde stops rather than run the submissions' code as you; True grades without one.
# `sudo -E env PATH="$PATH" python -m kvlib.grading` here says which mode autograde gets, and why.
c.GradingJail.allow_plain = False
'''


def plan(
    dest: Path,
    *,
    earlier: str = "own",
    course_id: str = "kvlib",
    exchange: str | None = None,
    service: str | None = None,
    lang: str = "en",
) -> dict[Path, bytes]:
    """Every file init writes (the secret aside), {path: content}; lang: each notebook translated into it
    (solutions/<lang>/, kvlib.app.translate) in its place, the others in English."""
    files: dict[Path, bytes] = {}
    exclude = {}
    for nb in assignments():
        exclude[nb] = learner_edited(nb, earlier)
        for src in sorted((ROOT / "solutions" / nb).glob("*.ipynb")):
            translated = ROOT / "solutions" / lang / nb / src.name
            files[dest / "source" / nb / src.name] = (translated if translated.is_file() else src).read_bytes()
        for rel, data in learner_files(nb, earlier).items():
            files[dest / "source" / nb / rel] = data
    files[dest / "nbgrader_config.py"] = config_text(course_id, exclude, exchange, service).encode()
    if exchange or service:
        files[dest / STUDENT_CONFIG] = student_config_text(exchange, course_id, service).encode()
    return files


def init_course(
    dest: Path | str,
    *,
    earlier: str = "own",
    force: bool = False,
    course_id: str = "kvlib",
    exchange: Path | str | None = None,
    service: str | None = None,
    lang: str = "en",
) -> list[Path]:
    """Write the course folder, make it its owner's alone (secure) and, with `exchange`, set up the
    course in nbgrader's exchange there (setup_exchange); with `service` (the URL of the hub's exchange
    service, kvlib.app.exchange_service), configure nbgrader to exchange through it instead. Returns the
    files written. Raises CourseFolderExists, writing nothing, when a file there differs and force is False;
    ValueError for a course id that a shared exchange cannot take, or for both exchange and service."""
    dest = Path(dest).resolve()
    if exchange is not None and service is not None:
        raise ValueError("give --exchange (a folder on this machine) or --exchange-service (a hub's URL), not both")
    if service is not None and not service.startswith(("http://", "https://")):
        raise ValueError(
            f"--exchange-service {service!r}: give the service's URL, e.g. https://hub.example.edu/services/kvlib-exchange/"
        )
    if exchange is not None:
        exchange = str(Path(exchange).resolve())
    if exchange is not None or service is not None:
        check_course_id(course_id, shared=True)
    files = plan(dest, earlier=earlier, course_id=course_id, exchange=exchange, service=service, lang=lang)
    changed = [p for p, data in files.items() if p.exists() and (p.is_dir() or p.read_bytes() != data)]
    if changed and not force:
        raise CourseFolderExists(changed)
    written = []
    for path, data in files.items():
        if path.exists() and not path.is_dir() and path.read_bytes() == data:
            continue
        if path in changed:
            backup = path.with_name(path.name + ".bak")
            n = 1
            while backup.exists():
                backup, n = path.with_name(f"{path.name}.bak{n}"), n + 1
            shutil.move(str(path), backup)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    secret = dest / SECRET
    if not secret.exists():
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        written.append(secret)
    owner = dest.stat()
    if os.geteuid() == 0 and owner.st_uid != 0:  # root writing an instructor's folder: hand it all back
        for path in written:
            os.chown(path, owner.st_uid, owner.st_gid)
            for parent in path.parents:
                if parent == dest:
                    break
                os.chown(parent, owner.st_uid, owner.st_gid)
    secure(dest)
    if exchange is not None:
        setup_exchange(Path(exchange), course_id, uid=owner.st_uid, gid=owner.st_gid)
    return written


# ---------------------------------------------------------------------------------------------
# The course folder is the instructor's alone

# What grading keeps there (relative to the course folder; "" is the folder itself). On a hub every
# student has a shell: the hidden tests in source/, the gradebook and the submissions must not be theirs to read.
PRIVATE = ("", "source", "release", "submitted", "autograded", "feedback", "gradebook.db", SECRET, "nbgrader_config.py")


def secure(dest: Path | str) -> list[Path]:
    """Take every access of group and others away from the course folder and what PRIVATE names in
    it (0700 folders, 0600 files); returns the paths whose mode changed."""
    dest = Path(dest)
    changed = []
    for rel in PRIVATE:
        path = dest / rel if rel else dest
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) or st.st_mode & 0o077 == 0:
            continue
        path.chmod(st.st_mode & 0o700 | (0o700 if stat.S_ISDIR(st.st_mode) else 0o600))
        changed.append(path)
    return changed


def permission_problems(dest: Path | str) -> list[str]:
    """What lets anyone but the course folder's owner in, or keeps the owner out: one sentence each,
    with the command that fixes it. Empty when the folder is its owner's alone."""
    dest = Path(dest).resolve()
    owner = dest.stat().st_uid
    name = _user(owner)
    problems = []
    # Nobody else passes through a folder of mode 0700: what nbgrader makes in it later with its
    # umask (release/, submitted/, the gradebook at 0644) is out of reach while the folder is closed.
    closed = dest.stat().st_mode & 0o077 == 0
    for rel in PRIVATE:
        if closed and rel:
            break
        path = dest / rel if rel else dest
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            problems.append(f"{path} is a symbolic link: the course folder's parts must be its own (remove the link)")
            continue
        if st.st_mode & 0o077:
            who = "other accounts" if st.st_mode & 0o007 else "its group"
            problems.append(
                f"{path} is open to {who} (mode {stat.filemode(st.st_mode)}): students could read the hidden tests, "
                f"the gradebook or each other's work; `chmod go-rwx {path}` (or `kvlib course init {dest}` again)"
            )
    for rel in ("source", "release", "submitted", "autograded", "feedback", "gradebook.db"):
        path = dest / rel
        if not path.exists():
            continue
        others = sorted({_user(p.lstat().st_uid) for p in [path, *_walk(path)] if p.lstat().st_uid != owner})
        if others:
            problems.append(
                f"{path} holds files owned by {', '.join(others)}, not by the course's owner {name}: a later run as "
                f"{name} cannot write them; `chown -R {name}: {path}`"
            )
    return problems


def _walk(path: Path):
    if not path.is_dir() or path.is_symlink():
        return
    for folder, dirs, files in os.walk(path):
        for n in dirs + files:
            yield Path(folder) / n


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# ---------------------------------------------------------------------------------------------
# nbgrader's exchange: release, submit, collect and feedback between accounts

STUDENT_CONFIG = "student_nbgrader_config.py"  # what students' nbgrader needs: the exchange and the course id
DEFAULT_COURSE_ID = "kvlib"


def check_course_id(course_id: str, *, shared: bool) -> None:
    """A course id nbgrader can use; on a shared exchange not the default, which every kvlib course would share."""
    if not course_id or "+" in course_id or "/" in course_id or course_id.startswith("."):
        raise ValueError(f"course id {course_id!r}: give a name without '+' or '/', e.g. kvlib-2027-spring")
    if shared and course_id == DEFAULT_COURSE_ID:
        raise ValueError(
            f"the course id {course_id!r} is the default of every kvlib course: on a shared exchange two courses "
            "would read each other's submissions; give one of your own, e.g. --course-id kvlib-2027-spring"
        )


# modes nbgrader documents for the exchange, and what kvlib adds: the sticky bit on the root (no one
# renames another course's folder and puts their own in its place) and on inbound (no student
# renames or deletes another's submission); inbound setgid, so submissions get the instructor's group
EXCHANGE_ROOT_MODE = 0o1777
COURSE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o3733, "feedback": 0o711}


def setup_exchange(root: Path, course_id: str, *, uid: int, gid: int) -> None:
    """Make ROOT/<course_id>/{outbound,inbound,feedback} with COURSE_MODES, owned by uid:gid (the
    instructor), creating ROOT (mode 1777) where missing. Raises PermissionError when the course's
    folder is someone else's (another course took that id) or a mode cannot be set."""
    check_course_id(course_id, shared=True)
    if not root.exists():
        root.mkdir(parents=True)
        root.chmod(EXCHANGE_ROOT_MODE)
    elif root.stat().st_mode & 0o7777 != EXCHANGE_ROOT_MODE:
        try:
            root.chmod(EXCHANGE_ROOT_MODE)
        except PermissionError as err:
            raise PermissionError(
                f"the exchange {root} has mode {stat.filemode(root.stat().st_mode)}; it must be drwxrwxrwt "
                f"(everyone writes, the sticky bit keeps each course's folder its owner's): `sudo chmod 1777 {root}`"
            ) from err
    course = root / course_id
    for rel, mode in COURSE_MODES.items():
        path = course / rel if rel else course
        if not path.exists():
            path.mkdir()
        st = path.lstat()
        if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
            raise PermissionError(
                f"{path} belongs to {_user(st.st_uid)}, not to the course's instructor {_user(uid)}: another course "
                "uses this id (or someone took it first); choose another --course-id"
            )
        if os.geteuid() == 0:
            os.chown(path, uid, gid)
        path.chmod(mode)
    shared = [u.pw_name for u in pwd.getpwall() if u.pw_gid == gid and u.pw_uid != uid]
    shared += [m for m in grp.getgrgid(gid).gr_mem if m != _user(uid)] if _has_group(gid) else []
    if shared:
        raise PermissionError(
            f"the instructor's group {_group(gid)} also holds {', '.join(sorted(set(shared))[:5])}: submissions in "
            f"{course / 'inbound'} are readable by that group; give the instructor a group of their own"
        )


def exchange_problems(root: Path, course_id: str, uid: int) -> list[str]:
    """What is wrong with the course's folders in the exchange, one sentence each (empty: as setup_exchange leaves them)."""
    course = root / course_id
    problems = []
    for rel, mode in COURSE_MODES.items():
        path = course / rel if rel else course
        try:
            st = path.lstat()
        except FileNotFoundError:
            problems.append(f"{path} is missing: `kvlib course init DIR --exchange {root} --course-id {course_id}`")
            continue
        if st.st_uid != uid:
            problems.append(f"{path} belongs to {_user(st.st_uid)}, not to the course's owner {_user(uid)}")
        if st.st_mode & 0o7777 != mode:
            problems.append(
                f"{path} has mode {stat.filemode(st.st_mode)} ({oct(st.st_mode & 0o7777)}), not {oct(mode)}: "
                f"`chmod {oct(mode)[2:]} {path}`"
            )
    return problems


def _has_group(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def _group(gid: int) -> str:
    return grp.getgrgid(gid).gr_name if _has_group(gid) else f"gid {gid}"


def student_config_text(exchange: str | None, course_id: str, service: str | None = None) -> str:
    """Each student's nbgrader_config.py (the hub's /etc/jupyter/nbgrader_config.py, or ~/.jupyter/ of each): the
    exchange folder, or the hub's exchange service (kvlib.app.exchange_service)."""
    option = "--exchange-service" if service else "--exchange"
    if service:
        from kvlib.app.exchange_service import config_lines  # noqa: PLC0415 (start-up time: nbgrader's exchange, service only)

        how = f"# nbgrader's exchange through the hub's service, with each student's hub token\n{config_lines(service)}"
    else:
        how = f"""c.Exchange.root = {exchange!r}
# a submission readable by its student and the instructor's group only (nbgrader's own makes it 0777), without
# the course's own files that autograde puts back anyway (assets/, kvlib's subpackages)
c.ExchangeFactory.submit = "kvlib.app.exchange.PrivateSubmit"
"""
    return f'''"""nbgrader for the students of {course_id}, written by `kvlib course init {option}` (docs/instructors.md).
On the hub: /etc/jupyter/nbgrader_config.py, or each student's ~/.jupyter/nbgrader_config.py."""
c = get_config()  # noqa: F821 (provided by nbgrader)
c.CourseDirectory.course_id = {course_id!r}
{how}# Validate runs the notebook: as in the course's own repository, every graded cell finishes well inside this, and
# the kernel client waits in short steps, so a lost zmq wake-up does not hold a student for the whole timeout
c.Execute.timeout = 120
c.AsyncKernelManager.client_class = "kvlib.grading.execute.SteppedKernelClient"
'''
