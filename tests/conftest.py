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

# A DataLoader iterator that shuts its workers down joins each for MP_STATUS_CHECK_INTERVAL
# (5 s), then terminates it. fmsdata's iterations stop their workers themselves
# (fmsdata.loader.feed.RUNNING; before that, loaders freed out of a reference cycle stalled
# whichever test the garbage collector ran in by 5 s); the join waits 0.5 s here so that
# any worker still missing its stop message costs a test seconds, not the run minutes.
# tests/remote/test_s3_shutdown.py checks with torch's own 5 s that none is terminated.
import torch.utils.data._utils as _torch_data_utils  # noqa: E402

_torch_data_utils.MP_STATUS_CHECK_INTERVAL = 0.5


@pytest.fixture(scope="session", autouse=True)
def _scratch_root(tmp_path_factory):
    """Where ``support.scratch_dir()`` makes its folders: inside pytest's base temp."""
    import support

    support.SCRATCH_ROOT = str(tmp_path_factory.mktemp("scratch"))


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Derived data (token caches, document indexes, downloads) goes to a folder inside
    pytest's base temp, for this process and the subprocesses it starts: a test run leaves
    nothing in the user's cache (``$FMSDATA_CACHE``, else ``~/.cache/fmsdata``).
    ``tests/test_setup.py`` checks that it is in force and that nothing else names the
    user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FMSDATA_CACHE", str(tmp_path_factory.mktemp("fmsdata-cache")))
        yield
