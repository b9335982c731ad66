"""pytest setup: the package is imported from the build tree (PYTHONPATH=<build>/python)."""
import os
import sys

import pytest

build = os.environ.get("SHMIPC_BUILD_DIR")
if build:
    sys.path.insert(0, os.path.join(build, "python"))


@pytest.fixture
def shmipc():
    import shmipc as module

    return module
