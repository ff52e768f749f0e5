"""A stalled DataLoader worker is an error naming it, not a hang; a killed one is named
with its signal (issue 46)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.errors import WorkerDiedError, WorkerStalledError
from fmsdata.loader import workerwait
from fmsdata.stages import SpanStage
from fmsdata.stages.shard import Shard, default_stages

STALLED_SHARD = 3
TIMEOUT = 3.0


class SleepsForever(SpanStage):
    """Hands lines on, except in one logical shard, whose first line never comes."""

    def __init__(self, source, stalls: bool):
        super().__init__(source)
        self.stalls = stalls

    def __next__(self):
        while self.stalls:
            time.sleep(3600)
        return next(self.source)


def stalls_in_shard_3(shard: Shard):
    return SleepsForever(default_stages(shard), shard.id == STALLED_SHARD)


def stalls_everywhere(shard: Shard):
    return SleepsForever(default_stages(shard), True)


@pytest.mark.parametrize("pin_memory", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_worker_sleeping_in_a_user_stage_is_named_within_the_timeout(tmp_path, pin_memory):
    """Two workers, 4 logical shards dealt [0, 2] and [1, 3]: shard 3's stage sleeps, so
    worker 1 never sends an item. The wait ends with ``WorkerStalledError`` naming worker
    1, its shards, the stage (module and class), the file it read last, and its stack
    (the line of the stage that sleeps); a second iteration starts afresh."""
    info = corpus(tmp_path)
    config = base_config(info, num_workers=2, worker_timeout=TIMEOUT, pin_memory=pin_memory)
    loader = build_dataloader(config, stages=stalls_in_shard_3)
    started = time.monotonic()
    with pytest.raises(WorkerStalledError) as caught:
        take(loader, 1)
    took = time.monotonic() - started
    message = str(caught.value)
    assert took < TIMEOUT + 8, took  # the workers' start, a poll, the stack asked for
    assert "DataLoader worker 1 (pid " in message
    assert "logical shards [1, 3]" in message
    assert f"worker_timeout={TIMEOUT:g}" in message
    assert "stage test_stalled_workers.SleepsForever" in message
    assert os.path.join(info.root, "") in message  # the file it read last (a shard file)
    assert 'test_stalled_workers.py", line' in message and "in __next__" in message
    loader.close()


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_a_stall_in_the_first_worker_is_named_too(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=2, worker_timeout=2)
    loader = build_dataloader(config, stages=stalls_everywhere)
    with pytest.raises(WorkerStalledError, match=r"DataLoader worker 0 .*logical shards \[0, 2\]"):
        take(loader, 1)
    loader.close()


def test_the_stalled_worker_is_stopped(tmp_path):
    """The error does not leave the stalled process behind for torch's 5 s join."""
    info = corpus(tmp_path)
    loader = build_dataloader(
        base_config(info, num_workers=2, worker_timeout=2), stages=stalls_in_shard_3
    )
    iterator = iter(loader)
    with pytest.raises(WorkerStalledError) as caught:
        next(iterator)
    pid = int(str(caught.value).split("(pid ", 1)[1].split(",", 1)[0])
    deadline = time.monotonic() + 2  # SIGKILLed: gone once the kernel has torn it down
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid), f"the stalled worker {pid} still runs"


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie not yet reaped by its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_worker_killed_mid_run_is_named_with_its_signal(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, num_workers=2, prefetch_factor=1))
    iterator = iter(loader)
    next(iterator)
    pid = loader.worker_pids()[1]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as caught:
        for _ in range(10_000):  # until the main process notices (within its next wait)
            next(iterator)
    message = str(caught.value)
    assert f"DataLoader worker 1 (pid {pid}, logical shards [1, 3])" in message
    assert "was killed by signal 9 (SIGKILL)" in message
    assert isinstance(caught.value, RuntimeError)  # what code catching torch's error expects
    # The error's traceback keeps torch's iterator alive here: the next child process that
    # ends (a SIGCHLD) must not make torch raise about the dead worker again, wherever the
    # main thread is.
    for _ in range(3):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        time.sleep(0.1)


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_a_slow_worker_within_the_timeout_is_waited_for(tmp_path, monkeypatch):
    """Polls shorter than the timeout are waited through (torch gives the wait back every
    poll): a worker slower than a poll but within worker_timeout is not an error."""
    monkeypatch.setattr(workerwait, "POLL_S", 0.2)
    info = corpus(tmp_path)
    reference = take(build_dataloader(base_config(info)), 3)
    loader = build_dataloader(
        base_config(info, num_workers=2, worker_timeout=30), stages=slow_first_line
    )
    batches = take(loader, 3)
    assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(reference, batches))


class SlowFirstLine(SpanStage):
    """Waits a second before its first line (longer than a poll), then hands lines on."""

    def __init__(self, source):
        super().__init__(source)
        self.waited = False

    def __next__(self):
        if not self.waited:
            time.sleep(1.0)
            self.waited = True
        return next(self.source)

    def own_state(self):
        return {}

    def load_own_state(self, state):
        pass


def slow_first_line(shard: Shard):
    return SlowFirstLine(default_stages(shard))


def test_no_timeout_waits_without_polling(tmp_path):
    """worker_timeout None (or 0): torch's own wait, no timeout given to it."""
    info = corpus(tmp_path)
    for off in (None, 0):
        loader = build_dataloader(base_config(info, num_workers=1, worker_timeout=off))
        assert loader.config.worker_timeout is None and loader.timeout == 0
    loader = build_dataloader(base_config(info, num_workers=1))
    assert loader.config.worker_timeout == 600 and loader.timeout == workerwait.POLL_S
