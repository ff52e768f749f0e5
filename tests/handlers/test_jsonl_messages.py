"""Why a JSON line is not a document, said in a whole sentence: json's own messages that
end in "at" get the column they refer to."""

import pytest

from fmsdata.errors import ShardFormatError
from fmsdata.handlers import JsonlHandler
from fmsdata.handlers.jsonl import parse_record


@pytest.mark.parametrize(
    "raw, said",
    [
        (b'{"text": "a\tb"}', "invalid JSON (Invalid control character at column 12)"),
        (b'{"text": "abc', "invalid JSON (Unterminated string starting at column 10)"),
        (b"nope", "invalid JSON (Expecting value)"),
        (b'{"text" 1}', "invalid JSON (Expecting ':' delimiter)"),
    ],
)
def test_problems_are_complete_sentences(raw, said):
    assert parse_record(raw, "text") == (None, said)


def test_strict_error_carries_the_whole_message(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "tab\there"}\n')
    handler = JsonlHandler(tokenizer="stdlib-bpe-4k", strict=True, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ShardFormatError) as caught:
        handler.open(str(path))
    assert str(caught.value).endswith(
        "a.jsonl:2: invalid JSON (Invalid control character at column 14)"
    )
