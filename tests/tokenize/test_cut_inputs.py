"""A cut or unreadable compressed input never shortens a tokenize output without a word:
every compression tokenize reads (gzip, zstd), cut at many points, in both kinds that may
be compressed (JSON lines, plain text), is a CorruptStreamError naming the file, also
through worker processes; a folder's files under a compression it does not read (bz2, xz,
...) are refused, naming them, instead of being left out."""

import bz2
import gzip
import json
import lzma

import pytest
import zstandard

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.tokenize import TokenizeSpec, run_tokenize

COMPRESS = {
    ".gz": gzip.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
    ".zstd": lambda data: zstandard.ZstdCompressor(write_content_size=False).compress(data),
}


def payload(kind, texts):
    if kind == "jsonl":
        return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    return "\n\n".join(texts).encode()


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
@pytest.mark.parametrize("kind", ["jsonl", "txt"])
@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.97])
def test_a_cut_compressed_input_is_an_error_naming_it(
    tmp_path, texts, tokenizer, suffix, kind, fraction
):
    whole = COMPRESS[suffix](payload(kind, texts[:200]))
    cut = tmp_path / f"raw.{kind}{suffix}"
    cut.write_bytes(whole[: int(len(whole) * fraction)])
    spec = TokenizeSpec(str(tmp_path / "out"), "docs", tokenizer)
    with pytest.raises(ShardFormatError, match=rf"{cut}: (corrupt|truncated)"):
        run_tokenize(spec, [str(cut)], workers=1 + (fraction > 0.9))


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_an_empty_compressed_input_is_an_error_naming_it(tmp_path, tokenizer, suffix):
    empty = tmp_path / f"raw.jsonl{suffix}"
    empty.write_bytes(b"")
    spec = TokenizeSpec(str(tmp_path / "out"), "docs", tokenizer)
    with pytest.raises(ShardFormatError, match=rf"{empty}: empty file"):
        run_tokenize(spec, [str(empty)])


@pytest.mark.parametrize(
    "name, compress", [("b.jsonl.bz2", bz2.compress), ("c.txt.xz", lzma.compress)]
)
def test_a_folder_input_under_an_unread_compression_is_refused(
    tmp_path, texts, tokenizer, name, compress
):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(payload("jsonl", texts[:20])))
    (folder / name).write_bytes(compress(payload("jsonl", texts[20:40])))
    (folder / "notes.bak").write_bytes(b"not an input")  # not text by its name: left out
    spec = TokenizeSpec(str(tmp_path / "out"), "docs", tokenizer)
    with pytest.raises(ConfigError, match=rf"{folder / name}: .*compression.*\.gz.*\.zst"):
        run_tokenize(spec, [str(folder)])
