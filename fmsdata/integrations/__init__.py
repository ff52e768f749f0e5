"""fmsdata inside the trainers people run: torchtitan, OLMo-core and PyTorch Lightning.

Each submodule implements one trainer's own data-loader contract on
``fmsdata.build_dataloader``, takes the data-parallel rank and size from that trainer's mesh
or strategy, and resumes and rescales exactly through that trainer's own checkpointing:

- ``fmsdata.integrations.torchtitan``: ``FmsDataTorchtitanLoader``, a torchtitan
  ``BaseDataLoader`` (``pip install "fmsdata[torchtitan]"``).
- ``fmsdata.integrations.olmo_core``: ``FmsDataLoaderConfig`` building an OLMo-core
  ``DataLoaderBase`` (``pip install "fmsdata[olmo-core]"``).
- ``fmsdata.integrations.lightning``: ``FmsDataModule``, a ``LightningDataModule``
  (``pip install "fmsdata[lightning]"``).

fmsdata's loader state is per rank, and a trainer may keep only one rank's copy of it
(Lightning writes rank 0's checkpoint; OLMo-core falls back to ``rank0.pt`` on another
world size; DCP de-duplicates equal keys). So every integration carries every
data-parallel rank's state in each copy (``fmsdata.integrations.ranks``): whichever copy
the trainer keeps is enough to resume, on the same or another data-parallel size.

Nothing here is imported by ``import fmsdata``: each submodule imports its trainer only
when it is itself imported.
"""

__all__: list[str] = []
