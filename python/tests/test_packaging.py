"""`pip install .` puts the library inside the package, so that `import mok`
works from any directory with no environment variable. Skipped where mok is
not installed (an in-tree build only)."""

import importlib.metadata
import os
import subprocess
import sys
import tempfile

import pytest

from mok import _library


def test_the_package_directory_is_searched_first():
    assert _library.candidates()[0].parent.name == "mok"


def test_an_installed_mok_imports_from_anywhere_without_environment():
    try:
        importlib.metadata.distribution("mok")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mok is not installed (pip install --no-build-isolation .)")
    env = {k: v for k, v in os.environ.items() if k not in ("MOK_LIB_DIR", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as elsewhere:
        result = subprocess.run(
            [sys.executable, "-c", "import mok, torch; print(mok.LIBRARY_PATH); print(torch.ops.mok.format_probe(7))"],
            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    library, probe = result.stdout.split()[-2:]
    assert library.endswith(os.path.join("site-packages", "mok", "libmok_torch.so")), library
    assert probe == "7"
