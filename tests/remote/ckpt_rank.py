"""One rank of a job with automatic loader checkpoints, as its own process (for the remote
checkpoint tests): ``python ckpt_rank.py CONFIG_JSON RANK WORLD STEPS OUT``.

Builds the rank's loader (resuming from ``checkpoint_dir`` if it holds a complete save),
takes ``STEPS`` batches, closes the loader (which finishes the save in flight) and writes
the batches' ``input_ids`` rows to ``OUT`` (JSON).
"""

import json
import sys

from fmsdata import build_dataloader


def main() -> None:
    config, rank, world, steps, out = sys.argv[1:6]
    loader = build_dataloader(json.loads(config), rank=int(rank), world_size=int(world))
    start = loader.steps
    batches = []
    for batch in loader:
        batches.append(batch["input_ids"].tolist())
        if len(batches) == int(steps):
            break
    loader.close()
    with open(out, "w") as handle:
        json.dump({"start": start, "batches": batches}, handle)


if __name__ == "__main__":
    main()
