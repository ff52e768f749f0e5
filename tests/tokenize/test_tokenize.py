"""fmsdata tokenize: the output, its determinism over workers / tasks / backends, resume,
bad records, and the loader reading it back to the input text."""

import hashlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from textinputs import output_files, write_jsonl

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.data.indexing import index_root
from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers import ArrowDocHandler
from fmsdata.handlers.megatron import MegatronHandler
from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize import TokenizeSpec, run_tokenize

SHARD = 16_000  # bytes of input per output shard: many shards from a small corpus


def spec(root, tokenizer, **kw):
    return TokenizeSpec(str(root), "docs", tokenizer, shard_bytes=SHARD, **kw)


def shard_documents(root, handler=None):
    """Every document of a tokenize output in shard order, as token lists."""
    handler = handler or ArrowDocHandler()
    folder = os.path.join(root, "docs")
    docs = []
    for name in handler.select(sorted(os.path.join(folder, f) for f in os.listdir(folder))):
        reader = handler.open(name)
        docs.extend(
            np.asarray(handler.get(reader, i)).tolist() for i in range(handler.num_docs(reader))
        )
    return docs


def test_output_holds_every_document_in_order_with_counts_and_metadata(inputs, tokenizer, tmp_path):
    folder, documents = inputs
    root = tmp_path / "out"
    result = run_tokenize(spec(root, tokenizer), [folder])
    assert result.complete and result.units > 5
    decoder = TextTokenizer(tokenizer)
    assert [decoder.decode(d) for d in shard_documents(str(root))] == documents
    assert result.documents == len(documents)

    meta = json.loads((root / "metadata.json").read_text())
    with open(tokenizer, "rb") as handle:
        assert meta["tokenizer"]["sha256"] == hashlib.sha256(handle.read()).hexdigest()
    assert meta["tokenizer"]["vocab_size"] == 4096
    assert meta["tokenizer"]["dtype"] == "uint16"
    assert meta["tokenizer"]["special_tokens"] == {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2}
    assert meta["tokenizers_version"] and meta["fmsdata_version"]
    entry = meta["datasets"]["docs"]
    assert entry["documents"] == len(documents) and entry["tokens"] == result.tokens
    for record in entry["inputs"]:
        with open(record["path"], "rb") as handle:
            data = handle.read()
        assert record["bytes"] == len(data)
        assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(entry["inputs"]) == 4 + 10
    # The bad lines of a.jsonl (every 40th record) are counted by kind.
    bad = entry["bad_records"][os.path.join(folder, "a.jsonl")]
    assert sum(bad.values()) == len(documents[:120]) // 40
    assert set(bad) == {
        "invalid JSON (Expecting value)",
        "no field 'text' (the record holds 'other')",
        "field 'text' is int, not text",
    }

    # meta/counts.csv is what `fmsdata index` writes for the same shards.
    counts = (root / "meta" / "counts.csv").read_bytes()
    index_root(str(root), ArrowDocHandler())
    assert (root / "meta" / "counts.csv").read_bytes() == counts


@pytest.mark.slow
def test_the_same_bytes_for_one_and_two_workers(inputs, tokenizer, tmp_path):
    folder, _ = inputs
    for workers in (1, 2):
        heard = []
        result = run_tokenize(
            spec(tmp_path / str(workers), tokenizer),
            [folder],
            workers=workers,
            on_progress=lambda docs, tokens, heard=heard: heard.append((docs, tokens)),
        )
        # Progress arrives per encoded batch, from the worker processes too, and adds up.
        assert len(heard) >= result.units
        assert [sum(x) for x in zip(*heard)] == [result.documents, result.tokens]
    one, two = output_files(tmp_path / "1"), output_files(tmp_path / "2")
    assert len(one) > 8 and one == two


def test_slurm_style_tasks_together_equal_the_single_run(inputs, tokenizer, tmp_path):
    folder, _ = inputs
    run_tokenize(spec(tmp_path / "single", tokenizer), [folder])
    tasks, array = 3, tmp_path / "array"
    results = []
    for task in (2, 0, 1):
        results.append(
            run_tokenize(spec(array, tokenizer), [folder], num_shards=tasks, shard_id=task)
        )
        # Only the task that finds every shard done writes the metadata.
        assert (array / "metadata.json").exists() == (len(results) == tasks)
    assert [r.complete for r in results] == [False, False, True]
    assert sum(r.mine for r in results) == results[0].units
    assert output_files(tmp_path / "array") == output_files(tmp_path / "single")


@pytest.mark.slow  # starts a local Ray instance
def test_ray_backend_gives_the_same_output(inputs, tokenizer, tmp_path, monkeypatch):
    import ray  # a shipped backend: its test fails, never skips, when ray is missing

    folder, _ = inputs
    run_tokenize(spec(tmp_path / "local", tokenizer), [folder])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    monkeypatch.chdir(tmp_path)  # relative paths, though Ray workers run elsewhere
    try:
        run_tokenize(spec("ray", tokenizer), [os.path.relpath(folder)], backend="ray")
    finally:
        ray.shutdown()
    assert output_files(tmp_path / "ray") == output_files(tmp_path / "local")


def test_a_killed_run_resumes_to_the_same_result(inputs, tokenizer, tmp_path):
    folder, _ = inputs
    run_tokenize(spec(tmp_path / "reference", tokenizer), [folder])
    target = tmp_path / "killed"
    # The run stops itself (SIGSTOP) right after its third shard record, however fast it
    # is, and is killed there: never a race with a run that finishes first.
    script = (
        "import os, signal, sys\n"
        "import fmsdata.tokenize.work as work\n"
        "from fmsdata.cli.main import main\n"
        "write, seen = work.write_json_atomic, []\n"
        "def stop_after_three(path, data):\n"
        "    write(path, data)\n"
        "    seen.append(path)\n"
        "    if len(seen) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGSTOP)\n"
        "work.write_json_atomic = stop_after_three\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [
        sys.executable, "-c", script, "tokenize", folder, "--tokenizer", tokenizer,
        "--output-dir", str(target), "--dataset", "docs", "--shard-size", str(SHARD),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), "the run ended before its third shard"
    process.send_signal(signal.SIGKILL)
    process.wait()
    records = target / "meta" / "tokenize" / "docs"
    done = len(list(records.glob("shard-*.json")))
    assert done == 3
    assert not (target / "metadata.json").exists(), "killed before the end, no metadata"
    # Whatever is under a shard's final name is a whole, readable shard.
    handler = ArrowDocHandler()
    for shard in (target / "docs").glob("*.arrow"):
        handler.num_docs(handler.open(str(shard)))

    result = run_tokenize(spec(target, tokenizer), [folder])
    assert result.complete and result.skipped >= done - 1 and result.skipped > 0
    assert output_files(target) == output_files(tmp_path / "reference")


def test_a_rerun_skips_finished_shards_and_refuses_other_settings(inputs, tokenizer, tmp_path):
    folder, _ = inputs
    root = tmp_path / "out"
    first = run_tokenize(spec(root, tokenizer), [folder])
    again = run_tokenize(spec(root, tokenizer), [folder])
    assert again.skipped == first.units and again.written == [] and again.complete
    with pytest.raises(ConfigError, match="another tokenize run.*settings"):
        run_tokenize(spec(root, tokenizer, text_field="body"), [folder])


def test_strict_names_the_file_and_line(tmp_path, texts, tokenizer):
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:300], bad_every=250)  # the bad line is line 251, in a late piece
    with pytest.raises(ShardFormatError, match=rf"{raw}:251: invalid JSON"):
        run_tokenize(spec(tmp_path / "out", tokenizer, strict=True), [str(raw)])
    gz = tmp_path / "raw.jsonl.gz"
    import gzip

    write_jsonl(gz, texts[:10], bad_every=4, opener=gzip.open)
    with pytest.raises(ShardFormatError, match=rf"{gz}:5: invalid JSON"):
        run_tokenize(spec(tmp_path / "gz", tokenizer, strict=True), [str(gz)])


def test_cli_reports_bad_records_and_writes_megatron(inputs, tokenizer, tmp_path, capsys):
    folder, documents = inputs
    root = tmp_path / "mega"
    argv = ["tokenize", folder, "--tokenizer", tokenizer, "--output-dir", str(root)]
    argv += ["--dataset", "docs", "--format", "megatron", "--shard-size", "16KB"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert f"{len(documents):,} documents" in out
    assert "skipped bad records in" in err and "a.jsonl" in err
    decoder = TextTokenizer(tokenizer)
    docs = shard_documents(str(root), MegatronHandler())
    assert [decoder.decode(d) for d in docs] == documents


def test_the_loader_streams_the_output_back_to_the_input_text(inputs, tokenizer, tmp_path):
    folder, documents = inputs
    root = tmp_path / "out"
    result = run_tokenize(spec(root, tokenizer), [folder])
    seq = 128
    loader = build_dataloader(
        dict(
            data_path=str(root),
            seq_length=seq,
            batch_size=1,
            logical_shards=1,
            shuffle_window=1,
            bos_token=0,
            eos_token=1,
            num_workers=0,
        )
    )
    framed = result.tokens + 2 * result.documents
    stream: list[int] = []
    for batch in loader:
        stream += batch["input_ids"][0].tolist() + batch["labels"][0, -1:].tolist()
        if len(stream) >= framed:
            break
    stream = stream[:framed]
    decoder = TextTokenizer(tokenizer)
    ends = [i for i, t in enumerate(stream) if t == 1]
    starts = [0] + [e + 1 for e in ends[:-1]]
    decoded = [decoder.decode(stream[s + 1 : e]) for s, e in zip(starts, ends)]
    assert all(stream[s] == 0 for s in starts)
    assert sorted(decoded) == sorted(documents)


def test_vocabularies_beyond_uint16_get_uint32_shards(tmp_path, texts):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{k}": k for k in range(70_000)}
    words = sorted({w for t in texts[:50] for w in t.split()})
    for word in words:
        vocab.setdefault(word, len(vocab))
    big = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = str(tmp_path / "big.json")
    big.save(path)
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:50])
    run_tokenize(spec(tmp_path / "out", path), [str(raw)])
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["tokenizer"]["dtype"] == "uint32"
    docs = shard_documents(str(tmp_path / "out"))
    assert docs[0] == [vocab[w] for w in texts[0].split()]
    assert max(max(d) for d in docs) >= 70_000


def test_bad_utf8_is_counted_and_a_broken_archive_is_an_error(tmp_path, texts, tokenizer):
    import gzip

    good = tmp_path / "raw" / "good.jsonl.gz"
    good.parent.mkdir()
    with gzip.open(good, "wb") as out:
        out.write(b'{"text": "fine"}\n{"text": "\xff\xfe broken"}\n{"text": "also fine"}\n')
    result = run_tokenize(spec(tmp_path / "out", tokenizer), [str(good)])
    assert result.documents == 2
    assert list(result.bad_records[str(good)]) == ["not UTF-8 (invalid start byte at byte 10)"]

    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(good.read_bytes()[:20])
    with pytest.raises(ShardFormatError, match=rf"{broken}: corrupt or truncated gzip stream"):
        run_tokenize(spec(tmp_path / "out2", tokenizer), [str(broken)])


def test_progress_is_reported_while_a_shard_is_written(tmp_path, texts, tokenizer):
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts)
    heard = []
    big = TokenizeSpec(str(tmp_path / "out"), "docs", tokenizer, shard_bytes=1 << 30)
    result = run_tokenize(big, [str(raw)], on_progress=lambda *x: heard.append(x))
    assert result.units == 1 and len(heard) == -(-len(texts) // 256)
    assert [sum(x) for x in zip(*heard)] == [result.documents, result.tokens]


def test_datasets_tokenized_into_one_root_share_its_metadata(tmp_path, texts, tokenizer):
    import threading

    for name in ("web", "code"):
        write_jsonl(tmp_path / f"{name}.jsonl", texts[: 200 if name == "web" else 100])
    root = tmp_path / "out"
    runs = [
        threading.Thread(
            target=run_tokenize,
            args=(TokenizeSpec(str(root), name, tokenizer), [str(tmp_path / f"{name}.jsonl")]),
        )
        for name in ("web", "code")
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    meta = json.loads((root / "metadata.json").read_text())
    assert {k: v["documents"] for k, v in meta["datasets"].items()} == {"web": 200, "code": 100}
    counts = (root / "meta" / "counts.csv").read_text().splitlines()
    assert sorted(line.split("/")[1] for line in counts[1:]) == ["code", "web"]
    loader = build_dataloader(dict(data_path=str(root), seq_length=64, batch_size=2))
    assert sorted(d.name for d in loader.dataset.catalog().datasets) == ["code", "web"]

    other = tmp_path / "other.json"
    other.write_bytes(open(tokenizer, "rb").read().replace(b'"<|pad|>"', b'"<|pad2|>"'))
    with pytest.raises(ConfigError, match="another tokenizer"):
        run_tokenize(TokenizeSpec(str(root), "math", str(other)), [str(tmp_path / "web.jsonl")])
    assert not (root / "math").exists()


@pytest.mark.parametrize("compressed", [False, True])
def test_no_record_with_the_text_field_is_an_error_naming_what_they_hold(
    tokenizer, tmp_path, capsys, compressed
):
    raw = tmp_path / "raw"
    raw.mkdir()
    name = "a.jsonl.gz" if compressed else "a.jsonl"
    lines = "".join(json.dumps({"id": i, "body": f"text {i}"}) + "\n" for i in range(30))
    data = lines.encode()
    if compressed:
        import gzip

        data = gzip.compress(data)
    (raw / name).write_bytes(data)
    with pytest.raises(
        ConfigError,
        match=r"dataset 'docs': 0 documents with text field 'text' .*30 record\(s\): no field "
        r"'text' \(the record holds 'body', 'id'\).*--text-field",
    ):
        run_tokenize(spec(tmp_path / "out", tokenizer), [str(raw)])
    assert not (tmp_path / "out" / "metadata.json").exists()
    code = main(
        [
            "tokenize",
            str(raw),
            "--output-dir",
            str(tmp_path / "cli"),
            "--tokenizer",
            tokenizer,
            "--dataset",
            "docs",
        ]
    )
    assert code != 0
    assert "no field 'text' (the record holds 'body', 'id')" in capsys.readouterr().err
    # The right field works on the same inputs.
    result = run_tokenize(spec(tmp_path / "ok", tokenizer, text_field="body"), [str(raw)])
    assert result.complete and result.documents == 30


def test_a_run_that_found_no_document_keeps_nothing_and_the_corrected_rerun_runs(
    tmp_path, texts, tokenizer
):
    """The wrong --text-field fails the run; what it wrote (shards of nothing, its plan) is
    gone, so the same command with the right field just runs."""
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:50])
    root = tmp_path / "out"
    with pytest.raises(ConfigError, match="0 documents with text field 'body'"):
        run_tokenize(spec(root, tokenizer, text_field="body"), [str(raw)])
    assert not (root / "docs").exists()
    assert not (root / "meta" / "tokenize" / "docs").exists()
    result = run_tokenize(spec(root, tokenizer), [str(raw)])
    assert result.complete and result.documents == 50


def test_other_settings_are_refused_naming_restart_and_what_it_deletes(
    tmp_path, texts, tokenizer, capsys
):
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:100])
    root = tmp_path / "out"
    run_tokenize(spec(root, tokenizer), [str(raw)])
    other = TokenizeSpec(str(root), "other", tokenizer)  # a dataset beside it is kept
    run_tokenize(other, [str(raw)])
    with pytest.raises(ConfigError, match="another tokenize run") as refused:
        run_tokenize(TokenizeSpec(str(root), "docs", tokenizer, shard_bytes=SHARD * 2), [str(raw)])
    message = str(refused.value)
    assert "--restart" in message
    named = [root / "docs", root / "meta" / "tokenize" / "docs"]
    for folder in named:  # the folders the message names exist
        assert f"in {folder}" in message and folder.is_dir()
    shards_before = len(list((root / "docs").iterdir()))
    assert f"{shards_before} shard file(s)" in message

    argv = ["tokenize", str(raw), "--tokenizer", tokenizer, "--output-dir", str(root)]
    argv += ["--dataset", "docs", "--shard-size", str(SHARD * 2), "--restart"]
    assert main(argv) == 0
    meta = json.loads((root / "metadata.json").read_text())
    assert meta["datasets"]["docs"]["shards"] == len(list((root / "docs").iterdir()))
    assert meta["datasets"]["docs"]["shards"] < shards_before
    assert meta["datasets"]["other"]["documents"] == 100
    counts = (root / "meta" / "counts.csv").read_text().splitlines()[1:]
    assert (
        len([row for row in counts if row.startswith("/docs/")])
        == meta["datasets"]["docs"]["shards"]
    )
    assert len([row for row in counts if row.startswith("/other/")]) == 1
    loader = build_dataloader(
        dict(data_path=str(root), datasets=["docs"], seq_length=64, batch_size=2)
    )
    assert next(iter(loader))["input_ids"].shape == (2, 64)


def test_restart_with_several_tasks_is_refused(tmp_path, texts, tokenizer):
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:20])
    with pytest.raises(ConfigError, match="several tasks"):
        run_tokenize(spec(tmp_path / "out", tokenizer), [str(raw)], num_shards=2, restart=True)


def test_a_plan_with_no_finished_shard_is_replaced(tmp_path, texts, tokenizer):
    """A run stopped before its first shard left only its plan: other settings just run."""
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, texts[:40])
    root = tmp_path / "out"
    stale = spec(root, tokenizer, text_field="body")
    os.makedirs(stale.work_dir)
    with open(os.path.join(stale.work_dir, "plan.json"), "w") as handle:
        json.dump({"fingerprint": "of another run"}, handle)
    assert run_tokenize(spec(root, tokenizer), [str(raw)]).documents == 40


def test_without_a_shard_size_small_inputs_make_enough_shards_for_the_workers(
    tmp_path, texts, tokenizer, capsys
):
    """The default shard size is the inputs' total over 64 (at least 1 MiB): 3 MiB of input
    make 3 shards, for any number of workers, and the output is the same bytes."""
    from fmsdata.tokenize.inputs import find_inputs
    from fmsdata.tokenize.plan import AUTO_SHARD_BYTES, AUTO_SHARDS, auto_shard_bytes

    raw = tmp_path / "raw.jsonl"
    lines = texts * (1 + (3 << 20) // sum(len(t) for t in texts))
    write_jsonl(raw, lines)
    inputs = find_inputs([str(raw)])
    assert auto_shard_bytes(inputs) == AUTO_SHARD_BYTES[0]  # small: the 1 MiB floor
    total = os.path.getsize(raw)
    outputs = []
    for workers in (1, 2):
        root = tmp_path / f"out{workers}"
        argv = ["tokenize", str(raw), "--tokenizer", tokenizer, "--output-dir", str(root)]
        assert main([*argv, "--dataset", "docs", "--workers", str(workers)]) == 0
        outputs.append(output_files(root))
        meta = json.loads((root / "metadata.json").read_text())
        assert meta["datasets"]["docs"]["shards"] == -(-total // (1 << 20))
    assert outputs[0] == outputs[1]
    assert "shard(s) to write" not in capsys.readouterr().err  # 3 shards for 2 workers

    class Sized:
        def __init__(self, size):
            self.size = size

    assert auto_shard_bytes([Sized(100 << 30)]) == AUTO_SHARD_BYTES[1]  # large: 256 MiB
    assert auto_shard_bytes([Sized(AUTO_SHARDS * (5 << 20))]) == 5 << 20
