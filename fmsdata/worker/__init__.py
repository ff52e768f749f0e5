"""What runs in each DataLoader worker (or in process without workers).

The rank's ``IterableDataset`` (``dataset``) runs the logical shards a worker owns
(``topology``), each as a chain of stages (``chain``) whose lines are materialized from the
shard files (``materialize``); a loaded state's spans are checked against the data
(``spancheck``).
"""
