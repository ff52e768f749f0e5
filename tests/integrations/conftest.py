"""The trainer tests (marker ``trainers``) are deselected unless asked for with
``-m trainers``: they need the ``test-trainers`` extra and several torchrun launches
(see docs/guide/trainers.md)."""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "trainers" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("trainers") is None]
    dropped = [item for item in items if item.get_closest_marker("trainers") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
