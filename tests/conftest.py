import os
import sys

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
