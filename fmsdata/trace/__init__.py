"""Provenance: what global step N trained on, and when a document was delivered.

A run's data is a pure function of its config, seed and saved state, so the trace tells
any step exactly, from the run's start or a checkpoint, without a global index and
without reading tokens (``fmsdata trace``; README "What did step N train on?")::

    from fmsdata.trace import Tracer

    tracer = Tracer("run.yaml", checkpoint="ckpt/step_1000")
    step = tracer.step(1200)               # every rank's rows and their document pieces
    print(step.to_plain()["rows"][0]["pieces"])
    seen = tracer.document("web", "web/part-00017.arrow", 42, until=5000)
    batches = tracer.batch(1200)           # each rank's input_ids and labels, read

``Tracer`` (``fmsdata.trace.tracer``) walks the run (``walker``) from an origin
(``origin``), tells rows (``rows``) and their tokens (``tokens``); ``document`` follows one
document's shards; ``verify`` checks a log of per-step digests.
"""

from fmsdata.trace.document import DocumentTrace, trace_document
from fmsdata.trace.rows import RowTrace
from fmsdata.trace.tracer import StepTrace, Tracer
from fmsdata.trace.verify import VerifyReport, read_digest_log, verify_digests
from fmsdata.util.digest import batch_digest, combine_digests, digest_hex

__all__ = [
    "Tracer",
    "StepTrace",
    "RowTrace",
    "DocumentTrace",
    "trace_document",
    "VerifyReport",
    "read_digest_log",
    "verify_digests",
    "batch_digest",
    "combine_digests",
    "digest_hex",
]
