"""fms-fsdp ``mamba-new``'s data order, reimplemented in fmsdata (one stage per module).

Bit-identical batches to fms-fsdp's ``get_data_loader`` for the same config, ranks,
workers and torch build; resumes from its ``loader_state_<p>.pth`` checkpoints without
unpickling objects. See ``pipeline`` for how the stages chain.
"""

from .pipeline import OWN_CHECKPOINTS, WINDOW, FmsOrderDataset, fms_resume_source

__all__ = ["OWN_CHECKPOINTS", "WINDOW", "FmsOrderDataset", "fms_resume_source"]
