"""The repository root, which Python imports as ``fmsdata`` only by mistake.

``git clone`` names the checkout ``fmsdata/``. Python run from the folder holding it puts
that folder first on ``sys.path``, finds the checkout under the package's name, and, before
this file existed, imported it as an empty namespace package (``AttributeError: module
'fmsdata' has no attribute 'build_dataloader'``): the editable install resolves the real
package through a finder that Python consults only after the path scan, because the format
handlers live in the top-level ``handlers/`` (installed as ``fmsdata.handlers``).

Here the checkout stands aside for the package it holds: the real ``fmsdata/__init__.py``
is loaded under the name ``fmsdata`` and replaces this module in ``sys.modules`` (which the
import statement returns). Its submodules are looked up in ``fmsdata/`` and, for
``fmsdata.handlers``, in this folder, as the installed package maps them. An installed or
editable ``fmsdata`` never sees this file (it is no package of the distribution).
"""

import importlib.util
import os
import sys


def _stand_aside() -> None:
    root = os.path.dirname(os.path.abspath(__file__))
    package = os.path.join(root, "fmsdata")
    spec = importlib.util.spec_from_file_location(
        "fmsdata", os.path.join(package, "__init__.py"), submodule_search_locations=[package, root]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"{package}: the fmsdata package is missing from this checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fmsdata"] = module
    spec.loader.exec_module(module)


# Under any other name (pytest imports a root ``__init__.py`` as the rootdir's package when
# it collects tests) this file stays an empty module.
if __name__ == "fmsdata":
    _stand_aside()
