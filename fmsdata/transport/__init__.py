"""How batches travel from DataLoader workers to the main process.

A worker's items (``items``) of several batches each, grouped into rounds (``rounds``);
the batches written by the workers into a ring of final-batch slots in shared memory
(``batchwrite``, ``batchring``) and put back together in canonical row order by the main
process (``assemble``).
"""
