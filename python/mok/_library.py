"""Finds and loads libmok_torch.so, which registers the torch.ops.mok ops.

Where it is looked for, first found wins:
  1. inside this package (an installed package: `pip install .`);
  2. $MOK_LIB_DIR;
  3. <repo>/build/python (an in-tree CMake build, python/ on sys.path);
  4. an installed mok distribution's (the in-tree package imported while a
     `pip install .` of it exists elsewhere).
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib

import torch

LIB_NAME = "libmok_torch.so"


def candidates() -> list[pathlib.Path]:
    here = pathlib.Path(__file__).resolve().parent
    found = [here / LIB_NAME]
    env = os.environ.get("MOK_LIB_DIR")
    if env:
        found.append(pathlib.Path(env) / LIB_NAME)
    found.append(here.parents[1] / "build" / "python" / LIB_NAME)
    try:
        found.append(pathlib.Path(str(importlib.metadata.distribution("mok").locate_file("mok/" + LIB_NAME))))
    except importlib.metadata.PackageNotFoundError:
        pass
    return found


def load() -> pathlib.Path:
    for path in candidates():
        if path.is_file():
            torch.ops.load_library(str(path))
            return path
    raise ImportError(
        "mok: cannot find " + LIB_NAME + " (looked in: " + ", ".join(str(p) for p in candidates())
        + "); install the package with `pip install --no-build-isolation .` from the repository root,"
        " or build it in-tree with `scripts/build.sh` (where torch imports) or set MOK_LIB_DIR")
