"""What a saved loader state must agree with to be loaded: the fingerprint.

A state records what its lines were built from (data hash per dataset, the mix, the shard
keys, the handler's options and each stage of the chain with its settings); a loader
refuses a state whose fingerprint differs from its own, naming the field and both values.
The state's format (``fmsdata.state.format``) carries the fingerprint; this module says what
is in it and how two are compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fmsdata.config import (
    DocumentsConfig,
    FimConfig,
    LinesConfig,
    LoaderConfig,
    MixConfig,
    ShardsConfig,
    as_plain,
    field_names_of,
)
from fmsdata.errors import StateMismatchError
from fmsdata.handlers.base import FileHandler

__all__ = [
    "MIX_FIELDS",
    "LINE_FIELDS",
    "SEQ_LENGTH",
    "stream_fingerprint",
    "check_fingerprint",
    "mix_changed",
    "saved_seq_length",
    "seq_length_change",
]

# Config fields of the mix: the mix section's (what ``allow_mix_change`` lets differ; a
# resume replays the lines drawn with the old ones). Every other setting that shapes the
# lines is a stage's (``Stage.settings``), recorded per stage under ``stages``; batch size,
# workers and world size shape no line and may change between save and load.
MIX_FIELDS = field_names_of(MixConfig)
# What every shard's walk is keyed by, outside any one stage: the shards section.
_SHARD_FIELDS = field_names_of(ShardsConfig)
# Config fields that shape a shard's lines: the documents, lines and fim sections. Stages
# record them under their own names and as derived values (the packer's capacity is
# seq_length + 1 less the line delimiters), and their settings decide what must match; the
# fingerprint keeps these as configured too (under CONFIG_KEY), only so that a refused
# state is explained in the config's terms.
LINE_FIELDS = (
    *field_names_of(DocumentsConfig),
    *field_names_of(LinesConfig),
    *field_names_of(FimConfig),
)
CONFIG_KEY = "config"
# The line writer's settings (``LineWriter.settings``): what rows depend on besides spans.
WRITER_KEY = "writer"
# The config field a resume may change with ``allow_changes=[SEQ_LENGTH]``: the settings
# it derives (the packer's capacity, the streams' line_tokens, the writer's line_length,
# a user stage's own) are accepted under this one name (``seq_length_change``).
SEQ_LENGTH = "seq_length"


def stream_fingerprint(
    config: LoaderConfig,
    handler: FileHandler,
    names: Sequence[str],
    data: Mapping[str, str],
    stages: Sequence[Mapping[str, Any]],
    writer: Mapping[str, Any],
) -> dict[str, Any]:
    """What a saved state must agree with to be loaded: data hash, mix, shard keys, the
    handler's options, the chain's stages (``fmsdata.stages.base.layout``) and the line
    writer's settings, as plain data (lists, dicts: as a state file gives it back), so
    fingerprints compare with ``==``."""
    values = config.to_dict()
    fingerprint = {"data": dict(data), **{f: values[f] for f in (*MIX_FIELDS, *_SHARD_FIELDS)}}
    fingerprint["datasets"] = list(names)
    fingerprint.update(handler.describe())
    fingerprint["stages"] = [dict(stage) for stage in stages]
    fingerprint[WRITER_KEY] = dict(writer)
    fingerprint[CONFIG_KEY] = {field: values[field] for field in LINE_FIELDS}
    return as_plain(fingerprint)


def check_fingerprint(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    allow: Iterable[str] = (),
    mix_change: bool = False,
) -> bool:
    """Raise StateMismatchError naming the first field that differs; return whether the
    mix (dataset list, weights, schedule) differs, which only ``mix_change`` allows.

    Both fingerprints are plain data (``stream_fingerprint``; a read state's). Fields in
    ``allow`` may differ. With ``mix_change`` the dataset list, weights and schedule may
    too, and the data must match only for the datasets both sides have.
    """
    allowed = set(allow) | (set(MIX_FIELDS) if mix_change else set())
    if "datasets" not in allowed:
        _check_dataset_list(saved.get("datasets"), current.get("datasets"))
    if mix_change:
        saved_data, current_data = saved.get("data") or {}, current.get("data") or {}
        for name in sorted(set(saved_data) & set(current_data)):
            if saved_data[name] != current_data[name]:
                raise StateMismatchError(
                    f"the files of dataset {name!r} changed since the state was saved "
                    f"(data hash {saved_data[name]} became {current_data[name]})"
                )
        allowed.add("data")
    _check_stages(saved, current, allowed, mix_change)
    _check_writer(saved, current, allowed)
    for field in sorted(set(saved) | set(current)):
        if field in allowed or field in ("stages", WRITER_KEY, CONFIG_KEY):
            continue
        if saved.get(field) != current.get(field):
            raise StateMismatchError(
                f"saved loader state has {field}={saved.get(field)!r} but this loader has "
                f"{field}={current.get(field)!r}" + (_ALLOW_MIX if field in MIX_FIELDS else "")
            )
    return mix_change and mix_changed(saved, current)


_ALLOW_MIX = (
    "; to resume with a changed mix, set allow_mix_change: true (each dataset continues "
    "from its own position, added ones start at their beginning, removed ones are dropped)"
)


def _check_dataset_list(saved: Any, current: Any) -> None:
    """Name the datasets added or removed (or the new order) when the list changed."""
    if saved == current or not isinstance(saved, list):
        return
    current = list(current or [])
    added = [name for name in current if name not in saved]
    removed = [name for name in saved if name not in current]
    change = ", ".join(
        f"{what} {names}" for what, names in (("added", added), ("removed", removed)) if names
    )
    raise StateMismatchError(
        f"the datasets field changed since the state was saved: "
        f"{change or 'same datasets in another order'} (saved {saved}, now {current})" + _ALLOW_MIX
    )


def _changed_config(saved: Any, current: Any) -> str:
    """The line-shaping config fields that differ, as "the state was saved with X=a but
    this loader has X=b" ("" when the saved state records none: an older fmsdata)."""
    if not isinstance(saved, Mapping) or not isinstance(current, Mapping):
        return ""
    fields = [f for f in current if f in saved and saved[f] != current[f]]
    if not fields:
        return ""
    before = ", ".join(f"{f}={saved[f]!r}" for f in fields)
    after = ", ".join(f"{f}={current[f]!r}" for f in fields)
    return f"the state was saved with {before} but this loader has {after}"


def _check_stages(
    fingerprint: Mapping[str, Any], now: Mapping[str, Any], allowed: set[str], mix_change: bool
) -> None:
    """The same chain (stage types at the same paths) with the same settings; a differing
    setting is named with its stage, after the config fields that differ when the state
    records them (``_changed_config``, worded only for the refusal). The mixer's dataset
    list may differ with a mix change."""
    saved: Any = fingerprint.get("stages")
    current: Any = now.get("stages")
    changed = _changed_config(fingerprint.get(CONFIG_KEY), now.get(CONFIG_KEY))
    if mix_change and isinstance(saved, list) and isinstance(current, list):
        # A dataset's stream (role "dataset", under its name) on one side only: the dataset
        # was added or removed, which the mix change allows.
        both = set(fingerprint.get("datasets") or []) & set(now.get("datasets") or [])
        saved, current = (
            [
                s
                for s in stages
                if not isinstance(s, Mapping)
                or s.get("role") != "dataset"
                or not isinstance(s.get("path"), list)
                or (s["path"] and s["path"][-1] in both)
            ]
            for stages in (saved, current)
        )
        # A reordered dataset list reorders the streams' entries: compare them by path.
        saved, current = (
            sorted(stages, key=lambda s: (s.get("role") == "dataset", str(s.get("path"))))
            if all(isinstance(s, Mapping) for s in stages)
            else stages
            for stages in (saved, current)
        )

    def shape(stages: list[Mapping[str, Any]]) -> list[tuple[Any, Any]]:
        return [(s["path"], s["stage"]) for s in stages]

    if shape(saved) != shape(current):
        raise StateMismatchError(
            (f"{changed}: " if changed else "")
            + "the saved loader state comes from another chain of stages: saved "
            f"{_chain_text(saved, current)}, this loader runs {_chain_text(current, saved)}"
            + " (the first stage that differs in brackets); resume with the chain the state "
            "was saved with (stage classes are recorded by module and name: a class defined "
            "in the script run is __main__.<name>)"
        )
    for old, new in zip(saved, current):
        before, after = old.get("settings") or {}, new.get("settings") or {}
        for key in sorted(set(before) | set(after)):
            if key in allowed or (mix_change and new.get("role") == "mixer" and key == "datasets"):
                continue
            if before.get(key) != after.get(key):
                path = _path_text(new.get("path"))
                what = f"stage {new.get('role') or _short(new)!r} ({_short(new)} at {path})"
                raise _setting_differs(changed, what, key, before, after)


def _setting_differs(
    changed: str, what: str, key: str, before: Mapping[str, Any], after: Mapping[str, Any]
) -> StateMismatchError:
    """The refusal of a setting ``key`` of ``what`` (a stage, the line writer) that differs,
    after the config fields that differ (``changed``) when the state records them."""
    setting = (
        f"{what} with {key}={before.get(key)!r} but this loader has {key}={after.get(key)!r}; "
        f"if the change is intended, load with allow_changes=[{key!r}]"
    )
    return StateMismatchError(
        f"{changed} (saved {setting})" if changed else f"saved loader state has {setting}"
    )


def _path_text(path: Any) -> str:
    """A stage's path in the shard state as messages write it (``source/sources/a``)."""
    return "/".join(map(str, path)) if path else "top"


def _short(stage: Mapping[str, Any]) -> str:
    return str(stage.get("stage", "?")).rsplit(".", 1)[-1]


def _chain_text(stages: list[Mapping[str, Any]], other: list[Mapping[str, Any]]) -> str:
    """The chain by class names; by module and name where the other chain has a class of
    the same name from elsewhere (``__main__.Order`` against ``orders.Order``); the first
    stage that differs from the other chain (type or path) in brackets."""
    clash = {_short(s) for s in stages} & {_short(o) for o in other}
    full = {
        name
        for name in clash
        if {str(s.get("stage")) for s in stages if _short(s) == name}
        != {str(o.get("stage")) for o in other if _short(o) == name}
    }
    differs = next(
        (
            k
            for k, (s, o) in enumerate(zip(stages, other))
            if (s.get("path"), s.get("stage")) != (o.get("path"), o.get("stage"))
        ),
        min(len(stages), len(other)),
    )
    names = [str(s.get("stage", "?")) if _short(s) in full else _short(s) for s in stages]
    return " <- ".join(f"[{name}]" if k == differs else name for k, name in enumerate(names))


def _check_writer(
    fingerprint: Mapping[str, Any], now: Mapping[str, Any], allowed: set[str]
) -> None:
    """The line writer's settings (line length, line delimiters, padding) as saved, but
    those in ``allowed``; a differing one is named, after the config fields that differ."""
    before, after = fingerprint[WRITER_KEY], now[WRITER_KEY]
    for key in sorted(set(before) | set(after)):
        if key in allowed or before.get(key) == after.get(key):
            continue
        changed = _changed_config(fingerprint.get(CONFIG_KEY), now.get(CONFIG_KEY))
        raise _setting_differs(changed, "the line writer", key, before, after)


def saved_seq_length(fingerprint: Mapping[str, Any]) -> int | None:
    """The ``seq_length`` a state was saved with: as the fingerprint records the config,
    else (an older fmsdata) the line writer's line length less one; None when neither."""
    config = fingerprint.get(CONFIG_KEY)
    if isinstance(config, Mapping) and isinstance(config.get(SEQ_LENGTH), int):
        return int(config[SEQ_LENGTH])
    writer = fingerprint.get(WRITER_KEY)
    length = writer.get("line_length") if isinstance(writer, Mapping) else None
    return length - 1 if isinstance(length, int) else None


def seq_length_change(
    saved: Mapping[str, Any], current: Mapping[str, Any], allow: Iterable[str]
) -> int | None:
    """The ``seq_length`` a state was saved with when it differs from this loader's and
    ``allow`` holds ``"seq_length"`` (the state is then checked against this loader's
    fingerprint at that length, and carried over: ``fmsdata.state.relength``); None when
    it is the same.

    Raises:
        StateMismatchError: It differs and the change is not allowed: the one thing to pass.
    """
    before, after = saved_seq_length(saved), saved_seq_length(current)
    if before is None or after is None or before == after:
        return None
    if SEQ_LENGTH in set(allow):
        return before
    raise StateMismatchError(
        f"the state was saved with seq_length={before} but this loader has "
        f"seq_length={after}; to continue this run at the new length (document positions "
        "kept, the lines the state holds re-packed to the new length), load with "
        "allow_changes=['seq_length'] (config allow_changes: [seq_length]); otherwise "
        f"resume with seq_length={before}"
    )


def mix_changed(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two fingerprints differ in the dataset list, weights or schedule."""
    return any(saved.get(f) != current.get(f) for f in MIX_FIELDS)
