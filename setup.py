"""Packages are found, not listed: every package under worker/ and operator/, installed as
inturn.worker.* and inturn.operator.* (pyproject.toml's package-dir maps the two folders).
The rest of the build is declared in pyproject.toml."""

from setuptools import find_namespace_packages, setup

FOLDERS = ["worker", "worker.*", "operator", "operator.*"]

setup(
    packages=[
        f"inturn.{name}"
        for name in find_namespace_packages(include=FOLDERS)
        if "__pycache__" not in name
    ]
)
