"""kvlib.checks as the notebook's kernel sees it while nbgrader autogrades in a jail (execute.py binds a folder
holding only this file, as __init__.py, over every kvlib/checks/ the kernel could read): the checks' reference
computations are not in the kernel's world, so a submission's code run there cannot import or read them.
The graded cells' scores come from the isolated child's checks (kvlib.grading.preprocessor), never from here.
Stdlib only; a learner's own `kvlib check` and `grade(...)` outside grading use the real kvlib.checks.
"""

CHECKS: dict = {}
WHY = "the checks are not in the notebook's kernel while it is graded: the isolated grader scores this cell"


def grade(name, **kwargs) -> None:
    """What a graded cell's hidden grade(...) does here, were it run: nothing to check against."""
    print(f"{name}: {WHY}")


def check(exercise_id):
    def register(fn):
        return fn

    return register


def __getattr__(name):
    raise AttributeError(f"kvlib.checks.{name}: {WHY}")
