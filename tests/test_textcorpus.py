"""The demo's and the tests' corpus: the standard library's own docstrings."""

import subprocess
import sys


def test_a_file_named_like_a_stdlib_module_is_not_run(tmp_path):
    """Under ``python -m`` the working folder comes first on ``sys.path``: a stray
    ``imp.py`` there must not be imported (run) in place of the standard library's."""
    (tmp_path / "imp.py").write_text("raise SystemExit('the stray imp.py ran')\n")
    script = (
        "from fmsdata.util.textcorpus import stdlib_docstrings\n"
        "texts = list(stdlib_docstrings(limit=None))\n"
        "print(len(texts))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 500
