"""The DCP load planner for a loader's state (``fmsdata.checkpoint.LoadPlanner``).

In a module of its own so that importing fmsdata does not import
``torch.distributed.checkpoint`` (about 0.6 s): ``fmsdata.checkpoint`` hands it out when
asked for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from fmsdata.state.format import META_KEY, SHARD_PREFIX

__all__ = ["LoadPlanner"]


class LoadPlanner(DefaultLoadPlanner):
    """A DCP load planner that sizes the loader's entries from the checkpoint.

    The loader's state entries are byte tensors whose length depends on the state saved;
    the default planner requires the destination to already have the saved shape. Pass
    ``planner=LoadPlanner()`` to ``torch.distributed.checkpoint.load``; everything else
    loads as with the default planner.
    """

    def set_up_planner(
        self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is None:
            return
        for fqn, value in list(self.state_dict.items()):
            leaf = fqn.rsplit(".", 1)[-1]
            if not (leaf == META_KEY or leaf.startswith(SHARD_PREFIX)):
                continue
            saved = metadata.state_dict_metadata.get(fqn)
            if not isinstance(saved, TensorStorageMetadata) or not isinstance(value, torch.Tensor):
                continue
            resized = torch.empty(saved.size, dtype=torch.uint8)
            self.state_dict[fqn] = resized
            if getattr(self, "flatten_state_dict", False) and fqn in getattr(self, "mappings", {}):
                *parents, last = self.mappings[fqn]  # its place in the nested state dict
                node: Any = self.original_state_dict
                for key in parents:
                    node = node[key]
                node[last] = resized
