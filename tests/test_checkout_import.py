"""Python run from the folder holding a checkout named ``fmsdata/`` imports the package,
not the checkout as an empty namespace package (issue 22)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import os
import fmsdata
import fmsdata.handlers
from fmsdata.util.textcorpus import bundled_tokenizer_path
print(fmsdata.build_dataloader.__module__, fmsdata.handlers.ArrowDocHandler.__name__)
print(os.path.realpath(fmsdata.__file__))
print(os.path.realpath(fmsdata.handlers.__file__))
print(os.path.isfile(bundled_tokenizer_path()))
"""


@pytest.mark.slow  # a fresh interpreter
def test_a_script_beside_the_checkout_imports_the_package(tmp_path):
    checkout = tmp_path / "fmsdata"  # what `git clone` names it
    checkout.mkdir()
    for name in ("__init__.py", "fmsdata", "handlers", "pyproject.toml"):
        os.symlink(os.path.join(REPO, name), checkout / name)
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "fmsdata.loader.build ArrowDocHandler"
    assert lines[1] == os.path.join(REPO, "fmsdata", "__init__.py")
    assert lines[2] == os.path.join(REPO, "handlers", "__init__.py")
    assert lines[3] == "True"  # package data resolves inside the package folder


EACH_MODULE_FIRST = """
import importlib, os, pkgutil, sys
import fmsdata
root = os.path.dirname(fmsdata.__file__)
mods = sorted(m.name for m in pkgutil.walk_packages([root], "fmsdata."))
failed = []
for name in mods:
    for key in [k for k in sys.modules if k == "fmsdata" or k.startswith("fmsdata.")]:
        del sys.modules[key]
    try:
        importlib.import_module(name)
    except Exception as error:
        # The class of this import's fmsdata.errors: each import starts afresh.
        if isinstance(error, sys.modules["fmsdata.errors"].MissingDependencyError):
            continue  # a trainer's integration without that trainer installed: by design
        failed.append(f"{name}: {error!r}")
print(len(mods))
print("\\n".join(failed))
"""


@pytest.mark.slow  # ~100 fresh imports in a subprocess
def test_every_module_imports_first():
    """A user's first fmsdata import may be any module (``from fmsdata.stages import
    Shard``): no import cycle shows only in some orders."""
    done = subprocess.run(
        [sys.executable, "-c", EACH_MODULE_FIRST], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    count, *failed = done.stdout.strip().split("\n")
    assert int(count) > 50 and not [f for f in failed if f], failed
