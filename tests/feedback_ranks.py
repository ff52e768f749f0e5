"""One rank of a run whose mix follows a synthetic loss (``tests/test_mix_feedback.py``
starts it under torchrun with gloo).

Each token's loss is its dataset's constant (``LOSSES``), found from the token's value
(the corpus's tokens encode their dataset). ``run`` takes ``steps`` batches, reporting
each one's loss, and saves the state after ``save_at`` batches (``rank<r>.state``);
``resume`` loads every rank's saved state and continues to ``steps``. Each rank writes
its batches' input ids and the mix history as JSON (``out<r>.json``).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from fmsdata import build_dataloader
from fmsdata.state.file import load_state, save_state


def synthetic_loss(input_ids, ranges, losses):
    """Per input token, its dataset's loss (0 on tokens of no dataset: padding)."""
    values = input_ids.numpy()
    out = np.zeros(values.shape, dtype=np.float32)
    for (first, end), loss in zip(ranges, losses):
        out[(values >= first) & (values < end)] = loss
    return torch.from_numpy(out)


def main():
    config_path, mode, folder, steps, save_at = sys.argv[1:6]
    steps, save_at = int(steps), int(save_at)
    with open(config_path) as handle:
        setup = json.load(handle)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = build_dataloader(setup["config"], rank=rank, world_size=world)
    if mode == "resume":
        saved = sorted(f for f in os.listdir(folder) if f.endswith(".state"))
        loader.load_state_dict([load_state(os.path.join(folder, f)) for f in saved])
    batches = []
    for batch in loader:
        if loader.steps > steps:
            break
        batches.append(batch["input_ids"].tolist())
        loader.record_loss(batch, synthetic_loss(batch["input_ids"], *setup["losses"]))
        if mode == "run" and loader.steps == save_at:
            save_state(os.path.join(folder, f"rank{rank}.state"), loader.snapshot())
        if loader.steps == steps:
            break
    with open(os.path.join(folder, f"out{rank}.json"), "w") as handle:
        json.dump({"batches": batches, "history": loader.mix_history}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
