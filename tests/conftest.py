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

# A DataLoader iterator a test drops shuts its workers down when it is collected: torch
# joins each worker for MP_STATUS_CHECK_INTERVAL (5 s), then terminates it. Some workers
# (over an S3 root, or after an error raised in the worker) are still there when joined,
# so each such drop stalled whichever test the garbage collector ran in by 5 s, about a
# minute of the run in all. The join waits 0.5 s here; no test checks shutdown time.
import torch.utils.data._utils as _torch_data_utils  # noqa: E402

_torch_data_utils.MP_STATUS_CHECK_INTERVAL = 0.5


@pytest.fixture(scope="session", autouse=True)
def _scratch_root(tmp_path_factory):
    """Where ``support.scratch_dir()`` makes its folders: inside pytest's base temp."""
    import support

    support.SCRATCH_ROOT = str(tmp_path_factory.mktemp("scratch"))
