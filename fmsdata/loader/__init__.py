"""The loader layer: ``build_dataloader`` and the stateful DataLoader it returns.

``build`` makes a rank's loader from a config; ``dataloader`` is the DataLoader, whose
state is exactly what was consumed (``consumed``); ``feed`` receives the workers' items
and assembles their batches.
"""

from fmsdata.loader.build import build_dataloader, config_advice
from fmsdata.loader.dataloader import FmsDataLoader, as_tuple

__all__ = ["FmsDataLoader", "as_tuple", "build_dataloader", "config_advice"]
