"""Raw text to token shards the loader reads: ``fmsdata tokenize`` and its library form."""

from fmsdata.tokenize.plan import TokenizeSpec
from fmsdata.tokenize.run import TokenizeResult, run_tokenize

__all__ = ["TokenizeSpec", "TokenizeResult", "run_tokenize"]
