"""The commands each example's docstring documents, run as written on a tokenize root.

A documented command is a line of the module docstring that starts with ``torchrun`` or
``python examples/`` (backslash continuations joined). Placeholders are filled in: the data
root (``DATA``, ``DATA_ROOT``, ``ROOT``) and ``DATASET``. Lines that abbreviate with ``...``
are not runnable and are left out; every example must document at least one that is.
``torchrun`` runs as ``python -m torch.distributed.run --standalone`` (a free rendezvous
port, so runs beside other torchrun jobs on the machine do not meet on the default one).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
DATA_PLACEHOLDERS = ("DATA_ROOT", "DATA", "ROOT")


def documented_commands(script: str) -> list[list[str]]:
    """The runnable commands of ``examples/<script>``'s docstring, as argument lists."""
    with open(os.path.join(EXAMPLES, script), encoding="utf-8") as handle:
        doc = ast.get_docstring(ast.parse(handle.read())) or ""
    joined = re.sub(r"\\\n\s*", " ", doc)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not (line.startswith("torchrun ") or line.startswith("python examples/")):
            continue
        if "..." in line:
            continue
        commands.append(shlex.split(line))
    return commands


def tokenize_root(folder: str) -> tuple[str, str]:
    """What ``fmsdata demo`` tokenizes (the standard library's docstrings, the bundled
    tokenizer), written by ``fmsdata tokenize``'s code to ``folder``: (root, dataset)."""
    from fmsdata.cli.demo import write_raw
    from fmsdata.tokenize import TokenizeSpec, run_tokenize
    from fmsdata.util.textcorpus import bundled_tokenizer_path

    raw, root = os.path.join(folder, "raw"), os.path.join(folder, "tokens")
    write_raw(raw)
    run_tokenize(TokenizeSpec(root, "stdlib", bundled_tokenizer_path()), [raw])
    return root, "stdlib"


def filled(command: list[str], root: str, dataset: str) -> list[str]:
    """``command`` with the placeholders filled and ``torchrun`` / ``examples/`` resolved."""
    out = []
    for word in command:
        if word in DATA_PLACEHOLDERS:
            word = root
        elif word == "DATASET":
            word = dataset
        elif word.startswith("examples/"):
            word = os.path.join(EXAMPLES, word[len("examples/") :])
        out.append(word)
    if out[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", *out[1:]]
    if out[0] == "python":
        return [sys.executable, *out[1:]]
    raise AssertionError(f"not a command: {command}")


def run_documented(command: list[str], cwd: str, extra: list[str], timeout: int = 600) -> str:
    """Run one filled command (plus ``extra`` options, e.g. a hash log) in ``cwd``; its
    output. Fails with the output when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # warnings shown: tests look for some
    done = subprocess.run(
        [*command, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"{shlex.join(command)}\n" + done.stdout[-3000:] + done.stderr[-5000:]
    )
    return done.stdout + done.stderr


def option(command: list[str], name: str) -> str:
    """The value of ``name`` in ``command``."""
    return command[command.index(name) + 1]


def step_hash(input_ids) -> str:
    """The examples' order-independent hash of one global step's sequences."""
    import hashlib

    rows = sorted(
        hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in input_ids
    )
    return hashlib.blake2b("".join(rows).encode(), digest_size=12).hexdigest()


def logged_hashes(path: str, key: str = "hash") -> dict[int, str]:
    """``{step: hash}`` of an example's hash log; fails on a step logged twice."""
    import json

    with open(path) as handle:
        rows = [json.loads(line) for line in handle]
    steps = [row["step"] for row in rows]
    assert len(steps) == len(set(steps)), f"{path}: a step logged twice: {steps}"
    return {row["step"]: row[key] for row in rows}


def unbroken_hashes(config: dict, steps: int) -> dict[int, str]:
    """Each global step's hash from fmsdata's own loader on one rank: by G2 what any number
    of ranks takes with the same global batch."""
    from fmsdata import build_dataloader

    loader = build_dataloader(config, rank=0, world_size=1)
    out = {}
    for step, batch in enumerate(loader, 1):
        out[step] = step_hash(batch["input_ids"])
        if step == steps:
            break
    assert len(set(out.values())) == steps  # distinct steps: a skip or a repeat shows
    return out
