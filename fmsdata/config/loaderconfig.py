"""``LoaderConfig``: the sections together, the checks that span sections, and the flat
names every config file, CLI override and trainer integration writes.

Every way in (the constructor, ``from_dict``, ``from_yaml``, ``replace``,
``with_overrides``) goes through one path: the values are flattened (``flatten``), grouped
by section, each section validates its own fields, then ``LoaderConfig`` checks what spans
sections.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import os
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from fmsdata.config.checkpoint import CheckpointConfig
from fmsdata.config.data import DataConfig
from fmsdata.config.documents import DocumentsConfig
from fmsdata.config.files import parse_overrides, read_yaml
from fmsdata.config.fim import FimConfig
from fmsdata.config.lines import LinesConfig
from fmsdata.config.mix import MixConfig
from fmsdata.config.output import OutputConfig
from fmsdata.config.remote import RemoteConfig
from fmsdata.config.shards import ShardsConfig
from fmsdata.config.steering import SteeringConfig
from fmsdata.config.values import as_plain
from fmsdata.config.workers import WorkersConfig
from fmsdata.errors import ConfigError

__all__ = ["LoaderConfig", "SECTIONS", "field_names_of", "flatten", "as_config"]


def field_names_of(section: type) -> tuple[str, ...]:
    """The flat names of a section's fields, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(section))


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class LoaderConfig:
    """Everything that decides which tokens the loader emits and how it runs, in sections.

    Each section is a frozen dataclass its layer takes whole (see each one for its fields):

    - ``data`` (``DataConfig``): the root and how its files are read.
    - ``mix`` (``MixConfig``): which datasets, in what token shares over the run.
    - ``documents`` (``DocumentsConfig``): document delimiters, stripping, order.
    - ``lines`` (``LinesConfig``): packing into lines of ``seq_length + 1``, shuffling.
    - ``fim`` (``FimConfig``): fill-in-the-middle.
    - ``output`` (``OutputConfig``): the batches: size, tensors, dtype, vocabulary check.
    - ``shards`` (``ShardsConfig``): logical shards and seed, the key of every order.
    - ``workers`` (``WorkersConfig``): worker processes and what they hold.
    - ``remote`` (``RemoteConfig``): reaching, retrying and caching a remote root.
    - ``checkpoint`` (``CheckpointConfig``): the loader's automatic checkpoints.
    - ``steering`` (``SteeringConfig``): mix changes on resume, skipped steps.

    Every field has one flat name, unique across sections (``seq_length``, ``bos_token``,
    ``endpoint_url`` ...), the name fms-fsdp's configs use where it has one. Build it with
    flat names, sections (a mapping of a section's fields, or the section object), or
    both, each field at most once::

        LoaderConfig(data_path="/data", seq_length=2048)
        LoaderConfig.from_dict({"data": {"data_path": "/data"}, "lines": {"seq_length": 2048}})

    Read a field as ``config.lines.seq_length`` or by its flat name, ``config.seq_length``
    (also ``line_length`` and ``content_capacity`` of ``LinesConfig``). ``to_dict()`` gives
    the flat names (what configs are saved and compared as), ``field_names()`` lists them.

    Raises:
        ConfigError: On construction: an unknown field (naming the closest known one), a
            field given twice, or an invalid value (naming the field and quoting it).
    """

    data: DataConfig
    mix: MixConfig
    documents: DocumentsConfig
    lines: LinesConfig
    fim: FimConfig
    output: OutputConfig
    shards: ShardsConfig
    workers: WorkersConfig
    remote: RemoteConfig
    checkpoint: CheckpointConfig
    steering: SteeringConfig

    def __init__(self, **values: Any) -> None:
        """Build from flat names and/or sections (a section object or a mapping of its
        fields); ``data_path`` is required, every other field has a default."""
        flat = flatten(values)
        if "data_path" not in flat:
            raise ConfigError("config field data_path is required")
        grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for field, value in flat.items():
            grouped[_SECTION_OF[field]][field] = value
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, cls(**grouped[name]))
        self.__post_init__()

    def __post_init__(self) -> None:
        """The checks that span sections (each section checked its own fields)."""
        vocab = self.output.vocab_size
        for name in _TOKEN_FIELDS if vocab is not None else ():
            token = getattr(self, name)
            if token is not None and token >= vocab:
                raise ConfigError(f"{name}={token} is outside vocab_size={vocab}")
        first, seq_length = self.output.ignore_first_labels, self.lines.seq_length
        if first > seq_length:
            raise ConfigError(
                f"ignore_first_labels must be an integer from 0 to seq_length "
                f"({seq_length}), got {first!r}"
            )

    if typing.TYPE_CHECKING:
        # Flat names are properties set below, from the sections; this types them.
        def __getattr__(self, name: str) -> Any: ...

    # -- the edge: flat names in and out ------------------------------------------------

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Every field's flat name, section by section."""
        return tuple(_SECTION_OF)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoaderConfig:
        """Build from a mapping of flat names and/or sections; unknown keys are an error
        naming them (and the closest known name)."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a loader config must be a mapping, got {type(values).__name__}")
        return cls(**flatten(values))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> LoaderConfig:
        """Read a YAML file (flat, sectioned, or under fms-fsdp's top-level ``data:`` key)
        and apply ``key=value`` overrides (flat names) on top of it."""
        values = flatten(read_yaml(path))
        return cls(**{**values, **_known_overrides(overrides, "")})

    def replace(self, **changes: Any) -> LoaderConfig:
        """A copy with some fields changed (flat names or whole sections), validated again."""
        return type(self)(**{**self._flat_values(), **flatten(changes)})

    def with_overrides(self, overrides: Iterable[str]) -> LoaderConfig:
        """A copy with ``key=value`` overrides applied (values parsed as YAML scalars)."""
        return self.replace(**_known_overrides(overrides, " in overrides"))

    def to_dict(self, sectioned: bool = False) -> dict[str, Any]:
        """Plain data (lists, not tuples) suitable for YAML or JSON: flat names (how saved
        configs and state fingerprints hold it), or ``{section: {field: value}}``; either
        loads back with ``from_dict``."""
        flat = {name: as_plain(value) for name, value in self._flat_values().items()}
        if not sectioned:
            return flat
        return {name: {f: flat[f] for f in field_names_of(cls)} for name, cls in SECTIONS.items()}

    def _sections(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SECTIONS}

    def _flat_values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SECTION_OF}


# Section name -> section class, in LoaderConfig's order.
SECTIONS: dict[str, type] = {
    f.name: typing.get_type_hints(LoaderConfig)[f.name] for f in dataclasses.fields(LoaderConfig)
}
# Flat field name -> the section holding it.
_SECTION_OF: dict[str, str] = {
    field: name for name, cls in SECTIONS.items() for field in field_names_of(cls)
}
assert len(_SECTION_OF) == sum(len(field_names_of(c)) for c in SECTIONS.values()), (
    "a flat field name is used by two sections"
)
assert not set(_SECTION_OF) & set(SECTIONS), "a section is named like a field"
# Each flat name is a read-only property reading its section's field: the loader reads its
# config on every batch, and a property costs a fraction of a ``__getattr__`` lookup
# (seven flat reads a batch took 7 us of the main process's 19 us with one worker on the
# 2-core box).
for _name, _section in {**_SECTION_OF, "line_length": "lines", "content_capacity": "lines"}.items():
    setattr(LoaderConfig, _name, property(operator.attrgetter(f"{_section}.{_name}")))
del _name, _section
# Fields holding a token id that vocab_size bounds (in the order checked).
_TOKEN_FIELDS = "bos_token eos_token bol_token eol_token pad_token fim_pre fim_mid fim_suf".split()


def flatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat name -> value of a mapping of flat names and/or sections.

    A section's value is a mapping of its fields' flat names, the section object, or None
    (an empty section in YAML: all defaults).

    Raises:
        ConfigError: An unknown key (top level or in a section: naming the closest known
            name, or the section a field belongs to), a section that is not a mapping,
            or a field given twice (by flat name and in its section).
    """
    _refuse_unknown(values, (*_SECTION_OF, *SECTIONS), "")
    flat: dict[str, Any] = {}
    nested: dict[str, tuple[str, Any]] = {}
    for key, value in values.items():
        if key in SECTIONS:
            for name, item in _section_items(key, value).items():
                nested[name] = (key, item)
        else:
            flat[key] = value
    twice = sorted(set(flat) & set(nested))
    if twice:
        given = ", ".join(f"{name!r} (also in section {nested[name][0]!r})" for name in twice)
        raise ConfigError(
            f"config field(s) given twice: {given}; give each once, by its name or in its "
            "section (to change a field of a built config: config.replace(name=value))"
        )
    return {**{name: item for name, (_, item) in nested.items()}, **flat}


def _section_items(name: str, value: Any) -> dict[str, Any]:
    """The fields of section ``name`` given as ``value``, by flat name."""
    cls = SECTIONS[name]
    if isinstance(value, cls):
        return {f: getattr(value, f) for f in field_names_of(cls)}
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        # The remote section's values may be credentials: name the type only.
        shown = type(value).__name__ if cls is RemoteConfig else repr(value)
        raise ConfigError(
            f"config section {name!r} must be a mapping of its fields "
            f"({', '.join(field_names_of(cls))}) or a {cls.__name__}, got {shown}"
        )
    misplaced = sorted(k for k in value if k in _SECTION_OF and _SECTION_OF[k] != name)
    if misplaced:
        placed = ", ".join(f"{k!r} belongs in section {_SECTION_OF[k]!r}" for k in misplaced)
        raise ConfigError(f"config section {name!r} holds fields of other sections: {placed}")
    _refuse_unknown(value, field_names_of(cls), f" in section {name!r}")
    return dict(value)


def _known_overrides(overrides: Iterable[str], where: str) -> dict[str, Any]:
    """Parsed ``key=value`` overrides, each key a flat field name."""
    parsed = parse_overrides(overrides)
    _refuse_unknown(parsed, tuple(_SECTION_OF), where)
    return parsed


def _refuse_unknown(values: Mapping[Any, Any], known: tuple[str, ...], where: str) -> None:
    """A ``ConfigError`` naming each unknown key of ``values`` and the name it is closest to."""
    unknown = sorted(set(values) - set(known), key=str)
    if not unknown:
        return
    described = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        described.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    fields = [name for name in known if name not in SECTIONS]
    sections = [name for name in known if name in SECTIONS]
    raise ConfigError(
        f"unknown config field(s){where}: {', '.join(described)}; known fields: "
        + ", ".join(fields)
        + (f"; sections: {', '.join(sections)}" if sections else "")
    )


def as_config(config: LoaderConfig | Mapping[str, Any] | str | os.PathLike[str]) -> LoaderConfig:
    """Accept a config object, a dict or a YAML path."""
    if isinstance(config, LoaderConfig):
        return config
    if isinstance(config, Mapping):
        return LoaderConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return LoaderConfig.from_yaml(config)
    raise ConfigError(f"cannot build a loader config from {type(config).__name__}")
