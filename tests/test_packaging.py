"""Packaging: pyproject.toml and environment.yml name the same packages."""

import re

import tomllib
from conftest import ROOT

CONDA_NAMES = {"torch": "pytorch"}  # pip name -> conda-forge name, where they differ


def _name(spec: str) -> str:
    return re.split(r"[\s<>=!\[~;]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_the_same_packages_as_pyproject():
    """Check that environment.yml installs exactly the runtime and dev packages of pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip = {_name(s) for s in project["dependencies"] + project["optional-dependencies"]["dev"]}
    conda = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("\ndependencies:\n", 1)[1].splitlines():
        m = re.match(r"^  - ([A-Za-z][\w.-]*)", line)
        if m and m.group(1) not in {"python", "pip"}:
            conda.add(m.group(1).lower())
    assert conda == {CONDA_NAMES.get(n, n) for n in pip}


def test_declared_torch_range_admits_the_ci_build():
    """Check that the torch range in pyproject.toml admits torch 2.13.0, which CI installs first."""
    import torch

    spec = next(
        s
        for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if _name(s) == "torch"
    )
    low = re.search(r">=\s*([\d.]+)", spec).group(1)
    high = re.search(r"<\s*([\d.]+)", spec).group(1)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split("."))) + (0,)
