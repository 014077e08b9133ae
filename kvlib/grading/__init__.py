"""Classroom grading with nbgrader that a submission's code cannot fool (docs/instructors.md).

preprocessor.py     IsolatedGrading, the autograde preprocessor: each graded cell's score comes from
                    its check, run here on numbers from an isolated child; RestoreCells (sanitizing:
                    the source's graded and locked cells back), NoteRefusedFiles, HideHiddenTests
execute.py          SandboxExecute: nbgrader's Execute with the kernel jailed, a time budget per notebook
checks_registry.py  which checks grade a notebook, and which of them run in the isolated child
sandbox.py          the grader's side of isolated checking: the child runs the learner's functions
_child.py           the isolated child, the only process that runs a submission's kvlib code
memory.py           the child's memory as the grading process reads it in /proc, around a measured call
_kernel_boot.py     starts an IPython kernel inside the jail
_kernel_checks.py   kvlib.checks as that kernel sees it while graded: grade() and no checks
jail.py             a throwaway root for one untrusted process (the kernel, or the child)
autograde.py        `nbgrader autograde` that screens each submission for links before it copies it
scratch.py          a grading process's temporary folders in one of its own, removed after a kill too
submission.py       what of a submission the grader reads: real files only, never through a link
__main__.py         `python -m kvlib.grading`: the isolation autograde gets in this course folder, and why
The course folder these run in is `kvlib course init DIR` (kvlib.app.course_folder).
Not here: the checks themselves (kvlib.checks).
"""

from __future__ import annotations

__all__ = ["HideHiddenTests", "IsolatedGrading", "NoteRefusedFiles", "RestoreCells", "SandboxExecute"]


def __getattr__(name: str):
    if name == "IsolatedGrading":
        from kvlib.grading.preprocessor import IsolatedGrading  # noqa: PLC0415 (start-up time: kvlib.grading's own modules import without nbgrader)

        return IsolatedGrading
    if name in ("RestoreCells", "NoteRefusedFiles", "HideHiddenTests"):
        from kvlib.grading import preprocessor  # noqa: PLC0415 (start-up time: kvlib.grading's own modules import without nbgrader)

        return getattr(preprocessor, name)
    if name == "SandboxExecute":
        from kvlib.grading.execute import SandboxExecute  # noqa: PLC0415 (start-up time: kvlib.grading's own modules import without nbgrader)

        return SandboxExecute
    raise AttributeError(f"module 'kvlib.grading' has no attribute {name!r}")
