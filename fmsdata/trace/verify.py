"""``fmsdata trace --verify LOG.jsonl``: a training log of per-step batch digests checked
against what the config, checkpoint and data say those steps held.

Each line of the log is a JSON object with ``"step"`` (``loader.steps`` after the batch)
and one of:

- ``"rank"`` and ``"digest"``: one rank's digest (each rank may log its own lines; logs
  of several ranks may be concatenated);
- ``"digests"``: every rank's, in rank order (one ``all_gather`` of ``step_digest``);
- ``"digest"`` without ``"rank"``: the global step's (``combine_digests`` of the ranks').

A digest is ``step_digest`` (``return_step_digest: true``) as ``digest_hex`` writes it,
or the integer itself. The check derives each logged step's tokens (reading the data: this
is the one use of the trace that reads every token of the steps it checks) and names the
first step, and rank, whose digest differs: a certificate that two runs, or two versions
of the data, gave the same batches.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from fmsdata.errors import ConfigError
from fmsdata.trace.tracer import Tracer
from fmsdata.util.digest import combine_digests, digest_hex

__all__ = ["VerifyReport", "read_digest_log", "verify_digests"]


@dataclasses.dataclass
class VerifyReport:
    """The outcome of checking a digest log.

    Attributes:
        checked: Steps compared (all of them when none differs).
        step: The first step that differs, or None.
        rank: The rank whose digest differs first (None: the log holds combined digests).
        logged, derived: The two digests of that step (and rank).
        reason: What differs, in words.
    """

    checked: int
    step: int | None = None
    rank: int | None = None
    logged: str | None = None
    derived: str | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.step is None

    def to_plain(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def read_digest_log(path: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """``{step: {"ranks": {rank: hex}} | {"global": hex}}`` from a JSON-lines log.

    Raises:
        ConfigError: A line that is not such an object, naming the file, line and field.
    """
    steps: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            where = f"{os.fspath(path)}, line {number}"
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}: not JSON ({err})") from None
            if not isinstance(record, Mapping) or not isinstance(record.get("step"), int):
                raise ConfigError(f"{where}: expected an object with an integer 'step'")
            entry = steps.setdefault(int(record["step"]), {})
            _add(entry, record, where)
    return steps


def _add(entry: dict[str, Any], record: Mapping[str, Any], where: str) -> None:
    try:
        if "digests" in record:
            entry.setdefault("ranks", {}).update(
                {r: digest_hex(d) for r, d in enumerate(record["digests"])}
            )
        elif "rank" in record:
            entry.setdefault("ranks", {})[int(record["rank"])] = digest_hex(record["digest"])
        elif "digest" in record:
            entry["global"] = digest_hex(record["digest"])
        else:
            raise ConfigError(f"{where}: no 'digest' or 'digests'")
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: unreadable digest ({err})") from None


def verify_digests(tracer: Tracer, log: Mapping[int, Mapping[str, Any]]) -> VerifyReport:
    """Compare each logged step's digests with the ones the trace derives, in step order.

    Raises:
        ConfigError: The log names a rank the run does not have.
    """
    checked = 0
    for step, derived in tracer.digests(log):
        logged = log[step]
        if derived is None:
            return VerifyReport(
                checked, step, reason=f"step {step} is logged, but a skip passed over it"
            )
        ranks = logged.get("ranks") or {}
        for rank in sorted(ranks):
            if rank >= len(derived):
                raise ConfigError(
                    f"the log names rank {rank} at step {step}; the run has {len(derived)} "
                    "rank(s) there (pass --world-size)"
                )
            if ranks[rank] != derived[rank]:
                why = f"rank {rank}'s batch at step {step} differs"
                return VerifyReport(checked, step, rank, ranks[rank], derived[rank], why)
        combined = combine_digests(derived)
        if "global" in logged and logged["global"] != combined:
            why = f"the global batch of step {step} differs"
            return VerifyReport(checked, step, None, logged["global"], combined, why)
        checked += 1
    return VerifyReport(checked)
