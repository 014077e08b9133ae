"""Starts an IPython kernel inside the grading jail: `python -I -S _kernel_boot.py CONFIG_JSON`.

-I -S: no site, no .pth, no PYTHON* variables, so the site-packages come only from the list in
CONFIG_JSON; the notebook's folder goes before them, where Jupyter itself puts it (IPython skips
that step under -I). Stdlib only.
"""

import json
import os
import runpy
import sys

cfg = json.loads(sys.argv[1])
for d in (os.environ.get("HOME"), os.environ.get("IPYTHONDIR"), os.environ.get("MPLCONFIGDIR")):
    if d:
        os.makedirs(d, exist_ok=True)
os.chdir(cfg["cwd"])
sys.path.extend(cfg["site"])
sys.path.insert(sys.path.index(cfg["site"][0]), cfg["cwd"])
sys.argv = ["ipykernel_launcher", "-f", cfg["connection_file"], *cfg["args"]]
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
