"""The loader configuration: frozen sections, one per layer, each validating its own
fields, and ``LoaderConfig`` over them, which checks what spans them and loads from a dict,
YAML or CLI overrides by flat field names.

Field names follow the fms-fsdp / Bamba training config (``data_path``, ``datasets``,
``weights``, ``col_name``, ``bos_token`` ...), so an existing config file loads unchanged;
``datasets``, ``weights`` and ``strip_tokens`` also accept that config's comma strings.
"""

from __future__ import annotations

from fmsdata.config.checkpoint import CheckpointConfig
from fmsdata.config.data import DEFAULT_FILE_TYPE, DataConfig
from fmsdata.config.documents import DOCUMENT_ORDERS, Decoration, DocumentOrder, DocumentsConfig
from fmsdata.config.files import parse_overrides
from fmsdata.config.fim import FimConfig
from fmsdata.config.lines import PACKING_MODES, LinesConfig, PackingMode
from fmsdata.config.loaderconfig import SECTIONS, LoaderConfig, as_config, field_names_of
from fmsdata.config.mix import MixConfig, ScheduleInterpolation, ScheduleUnit
from fmsdata.config.output import (
    BATCH_FORMATS,
    OUTPUT_DTYPES,
    BatchFormat,
    OutputConfig,
    OutputDtype,
)
from fmsdata.config.remote import RemoteConfig
from fmsdata.config.shards import ShardsConfig
from fmsdata.config.steering import SteeringConfig
from fmsdata.config.values import PATH_FIELDS, as_plain
from fmsdata.config.workers import StartMethod, WorkersConfig

__all__ = [
    "LoaderConfig",
    "SECTIONS",
    "PATH_FIELDS",
    "DataConfig",
    "MixConfig",
    "DocumentsConfig",
    "LinesConfig",
    "FimConfig",
    "OutputConfig",
    "ShardsConfig",
    "WorkersConfig",
    "RemoteConfig",
    "CheckpointConfig",
    "SteeringConfig",
    "Decoration",
    "BATCH_FORMATS",
    "DEFAULT_FILE_TYPE",
    "DOCUMENT_ORDERS",
    "OUTPUT_DTYPES",
    "PACKING_MODES",
    "BatchFormat",
    "DocumentOrder",
    "OutputDtype",
    "PackingMode",
    "ScheduleInterpolation",
    "ScheduleUnit",
    "StartMethod",
    "as_config",
    "as_plain",
    "field_names_of",
    "parse_overrides",
]
