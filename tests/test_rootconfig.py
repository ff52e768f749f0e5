"""tokenize -> load: every ``tokenize --format`` output loads through ``build_dataloader``
with a config naming only data_path, datasets, seq_length and batch_size, every document
framed by exactly one EOS, checked against the documents encoded directly by the
tokenizer; settings that contradict ``metadata.json`` are refused naming both values;
``get_dataset`` and ``fmsdata inspect`` read the same roots with no options."""

import json
import os
import shutil

import numpy as np
import pytest

from fmsdata import build_dataloader, get_dataset
from fmsdata.cli.main import main
from fmsdata.cli.tokenize import OUTPUT_FORMATS
from fmsdata.config import LoaderConfig
from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, resolve_config, root_token_ids
from fmsdata.errors import ConfigError
from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize import TokenizeSpec, run_tokenize
from fmsdata.util.textcorpus import bundled_tokenizer_path, stdlib_docstrings

EOS, BOS, VOCAB = 1, 0, 4096  # the bundled tokenizer's <|eos|>, <|bos|> and size
SEQ, BATCH, BATCHES = 256, 4, 150  # 600 lines of 257 tokens: seven epochs of the 150 documents
EOS_FORMATS = ("flat", "pbin")  # the formats whose documents carry their EOS


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """``({format: root}, documents)``: the same 150 texts tokenized in every format (two
    shards each, so files split the same way), and their direct encodings."""
    base = tmp_path_factory.mktemp("roots")
    texts = list(stdlib_docstrings(limit=150))
    with open(base / "in.jsonl", "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}) + "\n")
    tokenizer = bundled_tokenizer_path()
    shard_bytes = os.path.getsize(base / "in.jsonl") // 2 + 1
    found = {}
    for fmt in OUTPUT_FORMATS:
        found[fmt] = str(base / fmt)
        spec = TokenizeSpec(
            found[fmt], "docs", tokenizer, shard_bytes=shard_bytes, output_format=fmt
        )
        assert run_tokenize(spec, [str(base / "in.jsonl")]).complete
    docs = [tuple(d) for d in TextTokenizer(tokenizer).encode(texts) if d]
    return found, docs


def lines_of(config):
    """The first ``BATCHES`` batches' packed lines (input_ids plus the last label)."""
    loader = build_dataloader(config, rank=0, world_size=1)
    lines = []
    for _, batch in zip(range(BATCHES), loader):
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        lines.extend(np.concatenate([ids, labels[:, -1:]], axis=1))
    loader.close()
    return loader.config, np.array(lines)


def minimal(root):
    return {"data_path": root, "datasets": ["docs"], "seq_length": SEQ, "batch_size": BATCH}


def check_against_documents(lines, docs):
    """Each line split after every EOS: a piece that follows an EOS starts a document, one
    that ends with EOS ends one, so a piece doing both is a whole document + one EOS. An
    EOS pair makes an empty document, which no text encodes to; a piece of neither kind
    lies inside one document. Returns the documents
    identified (by a whole piece, or a start or end of 8+ tokens matching only one)."""
    seen = set()
    for line in lines:
        cuts = np.flatnonzero(line == EOS) + 1
        pieces = np.split(line, cuts)
        for k, piece in enumerate(pieces):
            starts, ends = k > 0, k < len(pieces) - 1
            body = tuple(piece[:-1].tolist()) if ends else tuple(piece.tolist())
            if not body and not ends:
                continue  # the line ends right after an EOS
            if starts and ends:
                assert body in docs, f"an EOS-framed piece is no document: {body[:12]}"
                matches = [i for i, d in enumerate(docs) if d == body]
            elif starts:
                assert body, "an EOS right after an EOS: a doubled delimiter"
                matches = [i for i, d in enumerate(docs) if d[: len(body)] == body]
                assert matches, f"no document starts with {body[:12]}"
            elif ends:
                matches = [i for i, d in enumerate(docs) if body == d[len(d) - len(body) :]]
                assert matches, f"a line starts with {body[-12:]}: no document ends so"
            else:  # the whole line lies inside one document
                text = " ".join(map(str, body))
                assert any(text in " ".join(map(str, d)) for d in docs), "a line of no document"
                continue
            if len(matches) == 1 and (len(body) >= 8 or (starts and ends)):
                seen.add(matches[0])
    return seen


def test_every_format_loads_with_a_minimal_config_and_one_eos_per_document(roots):
    found, docs = roots
    streams = {}
    for fmt in OUTPUT_FORMATS:
        config, streams[fmt] = lines_of(minimal(found[fmt]))
        assert config.eos_token == EOS and config.vocab_size == VOCAB
        assert not np.any((streams[fmt][:, 1:] == EOS) & (streams[fmt][:, :-1] == EOS)), fmt
    # Same documents, files and seed: the five formats give the same lines, token for token.
    for fmt in OUTPUT_FORMATS[1:]:
        assert np.array_equal(streams[fmt], streams[OUTPUT_FORMATS[0]]), fmt
    seen = check_against_documents(streams["arrow"], set(docs))
    assert seen == set(range(len(docs))), f"documents never seen: {set(range(len(docs))) - seen}"


def test_recorded_settings_fill_the_config(roots):
    found, _ = roots
    file_types = {"arrow": "arrow", "megatron": "megatron", "flat": "npy", "pbin": "pbin"}
    for fmt in OUTPUT_FORMATS:
        config = resolve_config(LoaderConfig(**minimal(found[fmt])))
        assert config.file_type == file_types.get(fmt, fmt)
        assert (config.eos_token, config.vocab_size, config.bos_token) == (EOS, VOCAB, None)
        # The stored EOS is replaced by the added one, never followed by a second.
        assert config.strip_tokens == ((EOS,) if fmt in EOS_FORMATS else ())


@pytest.mark.parametrize("fmt", EOS_FORMATS)
def test_formats_that_keep_their_eos_get_no_second_one_without_metadata(roots, tmp_path, fmt):
    """The class, not just tokenize output: npy and pbin documents end with their EOS, so a
    configured eos_token replaces it, with or without metadata.json."""
    found, _ = roots
    bare = str(tmp_path / fmt)
    shutil.copytree(found[fmt], bare)
    os.remove(os.path.join(bare, "metadata.json"))
    file_type = {"flat": "npy"}.get(fmt, fmt)
    _, lines = lines_of({**minimal(bare), "file_type": file_type, "eos_token": EOS})
    _, expected = lines_of(minimal(found["arrow"]))
    assert np.array_equal(lines, expected)


def test_a_root_without_metadata_keeps_the_old_defaults(roots, tmp_path):
    found, _ = roots
    bare = str(tmp_path / "arrow")
    shutil.copytree(found["arrow"], bare)
    os.remove(os.path.join(bare, "metadata.json"))
    config = resolve_config(LoaderConfig(data_path=bare))
    assert (config.file_type, config.eos_token, config.vocab_size) == ("arrow", None, None)
    assert config.strip_tokens == ()


@pytest.mark.parametrize(
    "fmt, field, value, recorded",
    [
        ("flat", "file_type", "arrow", "'npy'"),
        ("arrow", "file_type", "megatron", "'arrow'"),
        ("arrow", "eos_token", 7, "1"),
        ("flat", "doc_separator", 7, "1"),
        ("mds", "bos_token", 7, "0"),
        ("pbin", "vocab_size", 1000, "4096"),
    ],
)
def test_a_contradiction_names_the_field_both_values_and_the_file(
    roots, fmt, field, value, recorded
):
    found, _ = roots
    with pytest.raises(ConfigError) as err:
        build_dataloader({**minimal(found[fmt]), field: value}, rank=0, world_size=1)
    message = str(err.value)
    assert f"{field}={value!r}" in message and f"records {recorded}" in message, message
    assert os.path.join(found[fmt], "metadata.json") in message


def test_agreeing_or_compatible_settings_are_accepted(roots):
    found, _ = roots
    config = resolve_config(
        LoaderConfig(
            **minimal(found["pbin"]),
            file_type="auto",
            eos_token=EOS,
            bos_token=BOS,
            vocab_size=4160,
        )
    )
    # auto reads any format; a larger vocabulary is a model's padded embedding.
    assert (config.file_type, config.vocab_size, config.strip_tokens) == ("auto", 4160, (EOS,))


@pytest.mark.parametrize("fmt", OUTPUT_FORMATS)
def test_get_dataset_reads_a_tokenize_root_with_no_options(roots, fmt):
    found, docs = roots
    dataset = get_dataset(found[fmt], 64)
    stream = np.concatenate([np.append(d, EOS) for d in docs])
    got = np.concatenate([dataset[i]["token_ids"].numpy() for i in range(len(dataset))])
    assert len(dataset) == len(stream) // 64
    assert np.array_equal(got, stream[: len(got)])
    with pytest.raises(ConfigError, match=r"eos_token=7 contradicts .*records 1"):
        get_dataset(found[fmt], 64, eos_token=7)


@pytest.mark.parametrize("fmt", OUTPUT_FORMATS)
def test_inspect_reads_a_tokenize_root_with_no_options(roots, fmt, capsys):
    found, docs = roots
    assert main(["inspect", found[fmt], "--json", "--samples", "0"]) == 0
    figures = json.loads(capsys.readouterr().out)
    stored = sum(map(len, docs)) + (len(docs) if fmt in EOS_FORMATS else 0)
    assert (figures["documents"], figures["tokens"]) == (len(docs), stored)
    assert main(["inspect", found[fmt], "--file-type", "jsonl"]) == 2
    err = capsys.readouterr().err
    assert "file_type='jsonl' contradicts" in err and "metadata.json" in err


def test_bench_runs_a_minimal_config_on_a_tokenize_root(roots, tmp_path, capsys):
    found, _ = roots
    path = tmp_path / "bench.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in minimal(found["pbin"]).items()))
    assert main(["bench", str(path), "--batches", "2", "--seconds", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens_per_s"] > 0


def write_metadata(root, metadata):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "metadata.json"), "w") as handle:
        json.dump(metadata, handle)
    return str(root)


TOKENIZER_METADATA = {
    "tokenizer": {"vocab_size": 4096, "special_tokens": {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2}}
}


def test_root_token_ids_fill_unset_ids_from_the_metadata_and_check_given_ones(tmp_path):
    root = write_metadata(tmp_path / "root", TOKENIZER_METADATA)
    assert root_token_ids(root) == {"bos_token": 0, "eos_token": 1, "vocab_size": 4096}
    # Agreeing ids, and a model's padded vocabulary (larger than the tokenizer's), are kept.
    assert root_token_ids(root, 0, 1, 8192) == {"bos_token": 0, "eos_token": 1, "vocab_size": 8192}
    names = CLI_TOKEN_OPTIONS
    for given, said in [
        ({"bos_token": 1}, "--bos-token=1 contradicts"),
        ({"eos_token": 2}, "--eos-token=2 contradicts"),
        ({"vocab_size": 1000}, "--vocab-size 1000 is smaller than the vocabulary"),
    ]:
        with pytest.raises(ConfigError, match=said) as caught:
            root_token_ids(root, **given, option_names=names)
        assert os.path.join(root, "metadata.json") in str(caught.value)
    with pytest.raises(ConfigError, match="eos_token=2 contradicts"):
        root_token_ids(root, eos_token=2)  # the field's own name without option names


def test_root_token_ids_take_a_datasets_own_end_token_and_a_tokenizer_without_bos(tmp_path):
    metadata = {
        "tokenizer": {"vocab_size": 50257, "special_tokens": {"<|endoftext|>": 50256}},
        "datasets": {"web": {"format": "flat", "eos_token": 7, "documents_end_with_eos": True}},
    }
    root = write_metadata(tmp_path / "root", metadata)
    assert root_token_ids(root) == {"bos_token": None, "eos_token": 7, "vocab_size": 50257}


def test_root_token_ids_without_metadata_need_what_is_required(tmp_path):
    bare = str(tmp_path)
    assert root_token_ids(bare, 1, 2, 100) == {"bos_token": 1, "eos_token": 2, "vocab_size": 100}
    with pytest.raises(ConfigError, match="no metadata.json; give --eos-token and --vocab-size"):
        root_token_ids(bare, option_names=CLI_TOKEN_OPTIONS)
    with pytest.raises(ConfigError, match="give vocab_size"):
        root_token_ids(bare, eos_token=2)
    assert root_token_ids(bare, required=()) == dict.fromkeys(
        ("bos_token", "eos_token", "vocab_size")
    )
    root = write_metadata(tmp_path / "root", {"tokenizer": {"special_tokens": {"<|bos|>": 0}}})
    with pytest.raises(ConfigError, match="its metadata.json records none; give eos_token"):
        root_token_ids(root)
