"""Nothing left behind (issue 46): a 2-worker run killed with SIGKILL — the whole job, its
main process alone, or one worker — leaves nothing it made in ``/dev/shm``.

torch shares tensors through segments it unlinks as it makes them (the ``file_descriptor``
strategy, Linux's default), or, with ``file_system``, through named ``torch_<pid>_*``
segments its ``torch_shm_manager`` unlinks once their last user is gone. Both are run here.
"What the run made" is read from the live processes before the kill (every ``/dev/shm``
file they hold open or mapped) and from the names torch gives its segments (the creating
pid), so files other programs on the machine make meanwhile are not counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support import corpus

pytestmark = pytest.mark.slow  # six runs of a few seconds each, killed

SHM = "/dev/shm"

RUN = textwrap.dedent(
    """
    import json, os, sys, time
    import torch.multiprocessing
    strategy, root, pin = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    torch.multiprocessing.set_sharing_strategy(strategy)
    from fmsdata import build_dataloader
    loader = build_dataloader(dict(
        data_path=root, datasets=["a", "b"], weights=[1.0, 1.0], seq_length=32,
        batch_size=4, logical_shards=4, shuffle_window=8, eos_token=2, num_workers=2,
        pin_memory=pin,
    ))
    for i, batch in enumerate(loader):
        if i == 6:
            print(json.dumps([os.getpid(), *loader.worker_pids()]), flush=True)
        time.sleep(0.01)
    """
)


def held_in_shm(pid: int) -> set[str]:
    """The ``/dev/shm`` files process ``pid`` has open or mapped, by name (unlinked ones
    included: ``(deleted)``)."""
    held = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if f"{SHM}/" in line:
                    held.add(line.split(None, 5)[-1].strip())
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(f"{SHM}/"):
                held.add(target)
    except OSError:
        pass
    return held


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def left_in_shm(pids: list[int], held: set[str]) -> list[str]:
    named = [n for n in os.listdir(SHM) if any(n.startswith(f"torch_{p}_") for p in pids)]
    still = [h for h in held if not h.endswith("(deleted)") and os.path.exists(h)]
    return sorted({*(f"{SHM}/{n}" for n in named), *still})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("leftovers"))


@pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm on this system")
@pytest.mark.parametrize(
    ("strategy", "killed", "pin"),
    [
        *(("file_descriptor", killed, "0") for killed in ("job", "main", "worker")),
        ("file_descriptor", "job", "1"),  # (pinning changes nothing without CUDA)
        *(("file_system", killed, "0") for killed in ("job", "main", "worker")),
    ],
)
def test_a_killed_two_worker_run_leaves_nothing_in_dev_shm(data, strategy, killed, pin):
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, strategy, data.root, pin],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        pids = json.loads(run.stdout.readline())
        assert len(pids) == 3, pids
        held = set().union(*(held_in_shm(p) for p in pids))
        assert held, "the run shares no memory: nothing would be checked"
        main, worker = pids[0], pids[1]
        if killed == "job":
            os.killpg(run.pid, signal.SIGKILL)
        else:
            os.kill(main if killed == "main" else worker, signal.SIGKILL)
        # Workers of a killed main process notice within torch's 5 s watchdog; a main
        # process whose worker was killed raises and exits.
        deadline = time.monotonic() + 60
        while any(running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(p) for p in pids), "a process of the killed run lives on"
        run.wait(timeout=30)
        # torch_shm_manager unlinks named segments shortly after their users are gone.
        while left_in_shm(pids, held) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left_in_shm(pids, held) == []
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
