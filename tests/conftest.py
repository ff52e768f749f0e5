import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

# Examples are derived from the test name, not a clock: a run cannot pass or fail by luck.
settings.register_profile(
    "fmsdata",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("fmsdata")


@pytest.fixture(scope="session", autouse=True)
def _scratch_root(tmp_path_factory):
    """Where ``support.scratch_dir()`` makes its folders: inside pytest's base temp."""
    import support

    support.SCRATCH_ROOT = str(tmp_path_factory.mktemp("scratch"))
