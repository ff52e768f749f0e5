"""The set-up a newcomer runs: the README's test command is what CI runs, its constraints
bind only the test set-up, and the extras the README names exist."""

import os
import re

import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


def readme_test_command():
    lines = read("README.md").splitlines()
    return lines[lines.index("# Run the tests:") + 1].strip()


def test_ci_runs_exactly_the_readme_test_command():
    command = readme_test_command()
    assert "-c constraints.txt" in command and command.endswith("python -m pytest -q")
    ci = [line.strip() for line in read(".ci/run").splitlines()]
    assert command in ci


def test_constraints_pin_no_core_requirement():
    """Users' installs (pip install fmsdata) never see constraints.txt; still, it must not
    hold back what the package itself needs (torch>=2.4 and the rest)."""
    project = tomllib.loads(read("pyproject.toml"))["project"]
    core = {re.split(r"[<>=!~\[; ]", r)[0].lower() for r in project["dependencies"]}
    pinned = {
        re.split(r"[<>=!~\[; ]", line)[0].lower()
        for line in read("constraints.txt").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert pinned and not (pinned & (core - {"fsspec"}))  # fsspec: s3fs pins its own release
    assert "torch>=2.4" in project["dependencies"]


def test_readme_names_every_extra_it_relies_on():
    extras = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]
    readme = read("README.md")
    for extra in ("s3", "gcs", "text", "ray", "plot"):
        assert extra in extras
        assert f'"fmsdata[{extra}]"' in readme, extra
    assert any(r.startswith("gcsfs") for r in extras["gcs"])
    assert any(r.startswith("matplotlib") for r in extras["plot"])


def test_readme_states_the_measured_set_up_time():
    text = " ".join(read("README.md").split())
    assert re.search(r"The test set-up took (\d+ min(utes)? )?\d+ s", text)


def test_tests_keep_derived_data_out_of_the_users_cache(tmp_path_factory):
    """conftest points FMSDATA_CACHE inside pytest's base temp for the whole session, in
    this process and in the processes it starts; and the one place that names the user's
    cache folder is ``default_cache_dir`` (which honours it), so nothing a test runs writes
    there. (A check of the folder itself before and after a run would fail whenever another
    run on the machine writes there at the same time.)"""
    import re
    import subprocess
    import sys

    from fmsdata.handlers.derived import default_cache_dir

    base = str(tmp_path_factory.getbasetemp())
    assert os.path.commonpath([default_cache_dir(), base]) == base
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fmsdata.handlers.derived import default_cache_dir as d; print(d())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert os.path.commonpath([child.stdout.strip(), base]) == base
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    naming = []
    for package in ("fmsdata", "handlers"):
        for parent, _, names in os.walk(os.path.join(here, package)):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(parent, name)
                with open(path, encoding="utf-8") as handle:
                    code = "\n".join(
                        line
                        for line in handle.read().splitlines()
                        if not line.lstrip().startswith(("#", "``", '"""'))
                    )
                if re.search(r"""["']\.cache["']|\.cache/fmsdata|expanduser\(["']~["']\)""", code):
                    naming.append(os.path.relpath(path, here))
    assert naming == ["handlers/derived.py"]
