"""Classroom grading with nbgrader that a submission's code cannot fool (docs/instructors.md).

  kvlib course init DIR        an nbgrader course folder (kvlib.app.course_folder)
  IsolatedGrading              the autograde preprocessor: each graded cell's score comes from its
                               check, run here on numbers from an isolated child (preprocessor.py)
  RestoreCells                 sanitizing: the source's graded and locked cells back, whatever
                               the submission did to them (preprocessor.py)
  SandboxExecute               nbgrader's Execute with the notebook's kernel in a jail and a time
                               budget per notebook (execute.py)
  autograde.install()          `nbgrader autograde` screens each submission for links before it
                               copies anything (autograde.py, submission.py)
  NoteRefusedFiles             sanitizing: the refused files, named at the top of the graded notebook
  HideHiddenTests              generate_feedback: graded cells without their hidden tests
Not here: the checks themselves (kvlib.checks).
"""

from __future__ import annotations

__all__ = ["HideHiddenTests", "IsolatedGrading", "NoteRefusedFiles", "RestoreCells", "SandboxExecute"]


def __getattr__(name: str):
    if name == "IsolatedGrading":
        from kvlib.grading.preprocessor import IsolatedGrading

        return IsolatedGrading
    if name in ("RestoreCells", "NoteRefusedFiles", "HideHiddenTests"):
        from kvlib.grading import preprocessor

        return getattr(preprocessor, name)
    if name == "SandboxExecute":
        from kvlib.grading.execute import SandboxExecute

        return SandboxExecute
    raise AttributeError(f"module 'kvlib.grading' has no attribute {name!r}")
