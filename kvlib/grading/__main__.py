"""`python -m kvlib.grading` in a course folder: the isolation `nbgrader autograde` gets there, and why.

It reads the configuration as nbgrader autograde does (nbgrader_config.py here, and the user's and
system's Jupyter config) and finds the mode the same way (kvlib.grading.jail.find_mode): run it
exactly as you run autograde, e.g. `sudo -E env PATH="$PATH" python -m kvlib.grading`. Exit status 1
where autograde would refuse to grade (plain mode, with c.GradingJail.allow_plain = False).
"""

from __future__ import annotations

import logging
import sys

from nbgrader.apps.autogradeapp import AutogradeApp

from kvlib.grading.execute import GradingJail, PlainModeRefused


def main() -> int:
    app = AutogradeApp()
    app.initialize([])  # nbgrader's own config loading: nbgrader_config.py of this folder, then Jupyter's
    log = logging.getLogger("kvlib.grading")
    log.addHandler(logging.StreamHandler(sys.stdout))
    try:
        GradingJail(config=app.config).announce(log)
    except PlainModeRefused as err:
        print(f"autograde here would stop: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
