# Makes `import mok` find the package under test: the in-tree python/mok when
# an in-tree build of libmok_torch.so exists (build/python, or $MOK_LIB_DIR),
# else the installed package (pip install .).
import os
import sys

import pytest

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if os.environ.get("MOK_LIB_DIR") or os.path.isfile(
        os.path.join(_REPO_PYTHON, "..", "build", "python", "libmok_torch.so")):
    sys.path.insert(0, _REPO_PYTHON)


def has_hopper() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def skip_without_hopper() -> None:
    """Skips the calling test module where no Hopper (sm_90) GPU exists."""
    if not has_hopper():
        pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)
