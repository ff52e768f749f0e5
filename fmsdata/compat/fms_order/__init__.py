"""fms-fsdp ``mamba-new``'s data order, reimplemented in fmsdata (one stage per module).

Bit-identical batches to fms-fsdp's ``get_data_loader`` for the same config, ranks,
workers and torch build (``mamba-fim``'s with ``fim_training``); resumes from its
``loader_state_<p>.pth`` checkpoints without unpickling objects. Buffered lines are spans
of the memory-mapped documents (``spans``), so states stay small. See ``pipeline`` for how
the stages chain.
"""

from .pipeline import OWN_CHECKPOINTS, WINDOW, FmsOrderDataset, fms_resume_source

__all__ = ["OWN_CHECKPOINTS", "WINDOW", "FmsOrderDataset", "fms_resume_source"]
