"""Map-style access: ``get_dataset(metadata, context_length)`` -> indexable token windows
(tatm's API; OLMo's ``custom_dataset``)."""

from fmsdata.mapstyle.dataset import TokenWindowDataset, document_mask, get_dataset
from fmsdata.mapstyle.source import DATA_DIR_ENV

__all__ = ["get_dataset", "TokenWindowDataset", "document_mask", "DATA_DIR_ENV"]
