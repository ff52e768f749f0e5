"""``loader.close()`` and interpreter exit: pending saves finish, files close, no noise."""

import os
import subprocess
import sys
import textwrap

import pytest
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.checkpoint import latest_checkpoint
from fmsdata.state import checkpointsave

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_script(body: str, *args: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.path.insert(0, {TESTS!r})\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300
    )


SLOW_SAVES = """
import time
from fmsdata.state import checkpointsave
real_bytes = checkpointsave.state_to_bytes
def slow_bytes(state):  # a slow save: still running when the script ends
    time.sleep(1.0)
    return real_bytes(state)
checkpointsave.state_to_bytes = slow_bytes
"""


def test_close_finishes_the_pending_save_and_stops_iterations(tmp_path, monkeypatch):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    done = []
    real_bytes = checkpointsave.state_to_bytes

    def slow_bytes(state):
        import time

        time.sleep(0.5)
        done.append(state["steps"])
        return real_bytes(state)

    monkeypatch.setattr(checkpointsave, "state_to_bytes", slow_bytes)
    loader = build_dataloader(base_config(info, checkpoint_dir=str(root), checkpoint_every=3))
    reference = take(build_dataloader(base_config(info)), 6)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    loader.close()
    assert len(done) == 1 and latest_checkpoint(root) == str(root / "step_000000003")
    assert next(iterator, None) is None  # the iteration was closed
    loader.close()  # twice is fine
    again = take(loader, 3)  # a new iteration continues from the consumed state
    assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(reference[3:], again))


def test_close_stops_worker_processes(tmp_path):
    info = corpus(tmp_path / "data")
    loader = build_dataloader(base_config(info, num_workers=2))
    iterator = iter(loader)
    next(iterator)
    pids = loader.worker_pids()
    assert len(pids) == 2
    loader.close()
    for pid in pids:  # gone (reaped), not left running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


EXIT_DURING_A_RUN = """
import logging
from fmsdata import build_dataloader
loader = build_dataloader(eval(sys.argv[1]))
iterator = iter(loader)
for _ in range(4):  # the step-4 save starts with the 4th batch and is still running at exit
    next(iterator)
# Anything that keeps the iteration alive until module teardown (here a module imported
# before fmsdata holds it) would close its readers while modules are being cleared.
logging.kept = iterator
del loader
"""


@pytest.mark.slow  # a fresh interpreter, to its exit
def test_interpreter_exit_finishes_the_pending_save(tmp_path):
    info = corpus(tmp_path / "data")
    root = tmp_path / "auto"
    config = base_config(info, checkpoint_dir=str(root), checkpoint_every=4, num_workers=0)
    out = run_script(SLOW_SAVES + EXIT_DURING_A_RUN, repr(config))
    assert out.returncode == 0, out.stderr
    assert latest_checkpoint(root) == str(root / "step_000000004")
    assert not [name for _, _, names in os.walk(root) for name in names if name.endswith(".tmp")]


@pytest.mark.slow  # a fresh interpreter, to its exit
def test_interpreter_exit_after_a_run_is_silent(tmp_path):
    config = base_config(corpus(tmp_path / "data"), num_workers=0)
    out = run_script(EXIT_DURING_A_RUN, repr(config))
    assert out.returncode == 0, out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_readers_close_without_module_globals(tmp_path, monkeypatch):
    """What a reader's close meets at interpreter shutdown: module globals already None."""
    import numpy as np

    # (imported here: ruff's import sorting and the handlers/ package-dir mapping disagree)
    from fmsdata.handlers import ArrowDocHandler
    from fmsdata.handlers import arrow as arrow_module
    from fmsdata.handlers import mapping as mapping_module
    from fmsdata.handlers.arrow import write_arrow_docs

    path = str(tmp_path / "a.arrow")
    write_arrow_docs(path, [np.arange(5, dtype=np.uint16), np.arange(3, dtype=np.uint16)])
    handler = ArrowDocHandler()
    reader = handler.open(path)
    assert handler.get(reader, 1).tolist() == [0, 1, 2]
    monkeypatch.setattr(arrow_module, "np", None)
    monkeypatch.setattr(mapping_module, "np", None)
    handler.close(reader)
    assert len(reader.flat) == 0 and len(reader.mapped.bytes) == 0
