"""Open the course in JupyterLab: `kvlib lab` for learners, `kvlib present` for presenters.

Both start `jupyter lab` on the repository in the learner view: nbgrader's Validate button on
every notebook, and none of the instructor's tools (formgrader, create assignment, the course and
assignment lists), which need a course folder and an exchange that a self-paced learner does not
have. The view is a Jupyter config folder written at launch and put first on JUPYTER_CONFIG_PATH,
so the learner's own ~/.jupyter settings still apply. Presenter mode opens solutions/ in reference
mode (KVLIB_SOLUTIONS=1); `kvlib present --check` runs every solution notebook headless and
prints the seconds each took. `--lang zh-CN` opens the translated notebooks (notebooks/zh-CN/, solutions/zh-CN/),
sets KVLIB_LANG for every kernel (hints, checks' messages and figures in the language) and makes the language
JupyterLab's default interface language (its language pack, unless the learner chose another in Settings).
Not here: the instructor's flow (kvlib course init, nbgrader).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kvlib.app.release import ROOT, label
from kvlib.core import progress
from kvlib.course import i18n
from kvlib.course.exercises import notebook_files

# ---------------------------------------------------------------------------------------------
# The learner view

# nbgrader's JupyterLab plugins for instructors and for the exchange; Validate stays.
HIDDEN_LAB_PLUGINS = (
    "@jupyter/nbgrader:menu",
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
    "@jupyter/nbgrader:assignment-list",
)
# ... and the server extensions behind them; nbgrader.server_extensions.validate_assignment stays.
HIDDEN_SERVER_EXTENSIONS = (
    "nbgrader.server_extensions.formgrader",
    "nbgrader.server_extensions.course_list",
    "nbgrader.server_extensions.assignment_list",
)


# JupyterLab's own interface language for each of the course's: its locale and the language pack that has it
LAB_LOCALES = {"zh-CN": ("zh_CN", "jupyterlab-language-pack-zh-CN")}
TRANSLATION_PLUGIN = "@jupyterlab/translation-extension:plugin"


def write_learner_config(folder: Path, lang: str = i18n.DEFAULT) -> Path:
    """Write the learner view's Jupyter config into folder (for JUPYTER_CONFIG_PATH) and return it; for a language
    other than English, JupyterLab's default interface language too (labconfig/default_setting_overrides.json: a
    default, so a language the learner picked in Settings stays theirs)."""
    folder = Path(folder)
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    page = {"disabledExtensions": {name: True for name in HIDDEN_LAB_PLUGINS}}
    (folder / "labconfig" / "page_config.json").write_text(json.dumps(page, indent=1))
    if lang in LAB_LOCALES:
        overrides = {TRANSLATION_PLUGIN: {"locale": LAB_LOCALES[lang][0]}}
        (folder / "labconfig" / "default_setting_overrides.json").write_text(json.dumps(overrides, indent=1))
    server = {"ServerApp": {"jpserver_extensions": {name: False for name in HIDDEN_SERVER_EXTENSIONS}}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(server, indent=1))
    return folder


def lab_env(config_dir: Path, *, reference: bool, base: dict | None = None, lang: str | None = None) -> dict:
    """The environment for `jupyter lab`: the learner view first on the config path, the mode, and the language of
    every kernel's hints, messages and figures (KVLIB_LANG; None keeps the environment's)."""
    env = dict(os.environ if base is None else base)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(filter(None, [str(config_dir), env.get("JUPYTER_CONFIG_PATH")]))
    if reference:
        env["KVLIB_SOLUTIONS"] = "1"
    else:
        env.pop("KVLIB_SOLUTIONS", None)  # the learner's own code, whatever the shell had set
    if lang is not None:
        env[i18n.ENV] = lang
    return env


def language_pack_missing(lang: str) -> str | None:
    """The language pack JupyterLab needs for `lang`'s interface, where it is not installed; else None."""
    from importlib.metadata import PackageNotFoundError, distribution  # noqa: PLC0415 (start-up time: --lang only)

    if lang not in LAB_LOCALES:
        return None
    try:
        distribution(LAB_LOCALES[lang][1])
    except PackageNotFoundError:
        return LAB_LOCALES[lang][1]
    return None


def resolve_open(target: str | None, *, folder: str, root: Path = ROOT) -> str:
    """The path, relative to root, that JupyterLab opens: what a selector names (kvlib.course.exercises' grammar:
    1.2, 01, 02b, a path), or folder. A notebook of two parts opens its first; a folder path opens the folder.

    Example: resolve_open("01", folder="solutions") -> "solutions/01-attention/attention.ipynb"
    """
    if not target:
        return folder
    path = Path(target).resolve()
    if path.is_dir() and path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return notebook_files(target, folder=folder, root=root)[0].relative_to(root).as_posix()


def lab_command(
    *,
    root: Path = ROOT,
    open_path: str = "notebooks",
    port: int | None = None,
    browser: bool = True,
    token: str | None = None,
    expose_app: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The `jupyter lab` command line: the course folder as root, open_path opened first."""
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url=/lab/tree/{open_path}",
    ]
    if port is not None:
        cmd += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if not browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI run as root; jupyter refuses to start otherwise
    if token is not None:
        cmd.append(f"--IdentityProvider.token={token}")
    if expose_app:
        cmd.append("--LabApp.expose_app_in_browser=True")  # window.jupyterapp, for the browser test
    return cmd + list(extra)


def language_folder(folder: str, lang: str, target: str | None, root: Path = ROOT) -> str:
    """The folder whose notebooks `kvlib lab --lang` opens: folder/<lang> ("notebooks/zh-CN") where the notebook the
    target names is translated (all of them: where the folder is), else the English folder, saying so."""
    if lang == i18n.DEFAULT:
        return folder
    translated = f"{folder}/{lang}"
    try:
        if (root / translated).is_dir() and (not target or notebook_files(target, folder=translated, root=root)):
            return translated
    except ValueError:
        pass
    what = f"notebook {target}" if target else "the course"
    print(f"{what} is not translated into {lang} yet ({translated}/): opening the English one", flush=True)
    return folder


def launch(
    *, reference: bool, target: str | None = None, port: int | None = None, browser: bool = True, lang: str = "en"
) -> int:
    """Run JupyterLab on the course in the learner view until it is stopped; returns its exit code."""
    folder = language_folder("solutions" if reference else "notebooks", lang, target)
    open_path = resolve_open(target, folder=folder)
    if pack := language_pack_missing(lang):
        print(f"JupyterLab's interface stays in English: pip install {pack}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvlib-lab-") as tmp:
        env = lab_env(write_learner_config(Path(tmp), lang), reference=reference, lang=lang)
        cmd = lab_command(open_path=open_path, port=port, browser=browser)
        mode = "reference mode (KVLIB_SOLUTIONS=1): every exercise runs the solution" if reference else "your kvlib"
        print(f"JupyterLab on {ROOT}, opening {open_path}, {mode}, {i18n.ENV}={lang}. Stop it with Ctrl+C.", flush=True)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        if threading.current_thread() is threading.main_thread():  # a kill of kvlib stops the server too
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        try:
            while True:
                try:
                    return proc.wait()
                except KeyboardInterrupt:  # jupyter got the Ctrl+C too: it asks, or shuts down on a second one
                    continue
        finally:
            if proc.poll() is None:  # we were stopped some other way: do not leave the server behind
                proc.terminate()
                proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# Presenter check: the whole course, headless, timed


@dataclass
class NotebookRun:
    path: Path
    seconds: float
    error: str | None  # the first error of the run, or None
    notebook: object = None  # the executed nbformat notebook, outputs included

    def figures(self) -> list[tuple[int, bytes]]:
        """The PNG images the notebook displayed: (cell index, bytes), in order."""
        cells = self.notebook.cells if self.notebook is not None else []
        return [
            (i, base64.b64decode(out["data"]["image/png"]))
            for i, cell in enumerate(cells)
            for out in cell.get("outputs", [])
            if "image/png" in out.get("data", {})
        ]


def solution_notebooks(selector: str | None = None) -> list[Path]:
    """The solution notebooks a selector names (1.2, 01, 02b, a path; kvlib.course.exercises' grammar), or all."""
    return notebook_files(selector, folder="solutions")


def run_notebook(path: Path, *, timeout: int = 300, on_cell=None) -> NotebookRun:
    """Execute one notebook in reference mode with nbclient (nothing is written back) and time it.

    on_cell(): called as each code cell is done (a progress bar).
    """
    import nbformat  # noqa: PLC0415 (start-up time: only `kvlib present --check` runs notebooks)
    from nbclient.exceptions import CellExecutionError  # noqa: PLC0415 (start-up time: only `kvlib present --check` runs notebooks)

    from kvlib.grading.execute import SteppedNotebookClient  # noqa: PLC0415 (start-up time: only `kvlib present --check` runs notebooks)

    nb = nbformat.read(path, as_version=4)
    before = os.environ.get("KVLIB_SOLUTIONS")
    os.environ["KVLIB_SOLUTIONS"] = "1"  # the kernel inherits it
    start = time.perf_counter()
    error = None
    # the kernel's own stderr (ipykernel's start-up warnings) is shown only if the run fails
    with tempfile.TemporaryFile("w+") as kernel_log:
        try:
            # stepped waits: a lost zmq wake-up otherwise stalls a cell for the whole timeout
            client = SteppedNotebookClient(
                nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
            )
            if on_cell is not None:
                client.on_cell_executed = lambda **_: on_cell()
            client.execute(stderr=kernel_log)
        except CellExecutionError as err:
            error = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        except Exception as err:  # a timeout or a dead kernel: report it with the others
            kernel_log.seek(0)
            tail = kernel_log.read()[-2000:].strip()
            error = f"{type(err).__name__}: {err}" + (f"\nkernel stderr:\n{tail}" if tail else "")
        finally:
            if before is None:
                os.environ.pop("KVLIB_SOLUTIONS", None)
            else:
                os.environ["KVLIB_SOLUTIONS"] = before
    return NotebookRun(path, time.perf_counter() - start, error, nb)


def check_course(
    selector: str | None = None, *, timeout: int = 300, figures: Path | None = None, out=sys.stdout
) -> list[NotebookRun]:
    """Run every solution notebook as a presenter would, printing one line per notebook as it ends.

    figures: a folder to save every figure into, as <notebook>-cell<NN>.png (to look at them)
    """
    runs, paths = [], solution_notebooks(selector)
    cells = {path: _code_cells(path) for path in paths}
    bar = progress.bar(desc="kvlib present --check", total=sum(cells.values()), unit="cell")
    for path in paths:
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        bar.set_postfix_str(name)
        done = bar.n
        run = run_notebook(path, timeout=timeout, on_cell=bar.update)
        bar.update(done + cells[path] - bar.n)  # the cells a failure left unrun
        runs.append(run)
        status = "ok" if run.error is None else f"FAILED: {run.error}"
        saved = ""
        if figures is not None:
            Path(figures).mkdir(parents=True, exist_ok=True)
            for i, png in run.figures():
                (Path(figures) / f"{label(path, sep='-')}-cell{i:02d}.png").write_bytes(png)
            saved = f"  {len(run.figures())} figures -> {figures}"
        progress.write(f"{name:<45} {run.seconds:7.1f} s  {status}{saved}", file=out)
    bar.close()
    return runs


def _code_cells(path: Path) -> int:
    return sum(cell["cell_type"] == "code" for cell in json.loads(path.read_text(encoding="utf-8"))["cells"])
