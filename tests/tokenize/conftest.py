"""Raw text inputs for the tokenize tests: real English (stdlib docstrings) with a few
bad records, in every input kind."""

import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from textinputs import write_jsonl, zst_open

from fmsdata.util.textcorpus import bundled_tokenizer_path, stdlib_docstrings


@pytest.fixture(scope="session")
def texts():
    return list(stdlib_docstrings(limit=600))


@pytest.fixture(scope="session")
def tokenizer():
    return bundled_tokenizer_path()


@pytest.fixture
def inputs(tmp_path, texts):
    """A folder of JSONL (plain with bad lines, .gz, .zst), Parquet and .txt inputs; returns
    the folder and the documents in input order."""
    folder = tmp_path / "raw"
    folder.mkdir()
    parts = [texts[k::5] for k in range(5)]
    write_jsonl(folder / "a.jsonl", parts[0], bad_every=40)
    write_jsonl(folder / "b.jsonl.gz", parts[1], opener=gzip.open)
    write_jsonl(folder / "c.jsonl.zst", parts[2], opener=zst_open)
    table = pa.table({"text": parts[3], "id": list(range(len(parts[3])))})
    pq.write_table(table, folder / "d.parquet", row_group_size=20)
    (folder / "e").mkdir()
    for k, text in enumerate(parts[4][:10]):
        (folder / "e" / f"{k:02d}.txt").write_text(text, encoding="utf-8")
    documents = [*parts[0], *parts[1], *parts[2], *parts[3], *parts[4][:10]]
    return str(folder), documents
