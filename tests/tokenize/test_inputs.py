"""Input pieces: however a file is cut, its pieces read back exactly its records, once."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.tokenize.inputs import InputFile, describe_position, read_piece, split_input
from fmsdata.tokenize.plan import plan_units, select_units

line_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
record = st.one_of(
    line_text.map(lambda t: json.dumps({"text": t})),
    st.just("{broken"),
    st.just(""),  # blank lines are not records
    st.just(json.dumps({"text": None})),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(record, max_size=60), piece_bytes=st.integers(1, 400), crlf=st.booleans())
def test_pieces_of_a_jsonl_file_read_every_record_once(tmp_path_factory, lines, piece_bytes, crlf):
    path = tmp_path_factory.mktemp("pieces") / "data.jsonl"
    ending = "\r\n" if crlf else "\n"
    path.write_bytes("".join(line + ending for line in lines).encode())
    file = InputFile(str(path), "jsonl", path.stat().st_size, False)
    whole = list(read_piece(file, split_input(0, file, 1 << 30)[0], "text"))
    pieces = split_input(0, file, piece_bytes)
    assert sum(p.weight for p in pieces) == file.size
    cut = [r for p in pieces for r in read_piece(file, p, "text")]
    assert cut == whole
    expected = [json.loads(x)["text"] if x.startswith('{"') else None for x in lines if x.strip()]
    assert [text for _, text, _ in cut] == expected
    # Positions name the right line of the file.
    numbers = [k + 1 for k, x in enumerate(lines) if x.strip()]
    assert [describe_position(file, where) for where, _, _ in cut] == [
        f"{path}:{n}" for n in numbers
    ]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=20),
    shard_bytes=st.integers(1, 6000),
    tasks=st.integers(1, 5),
)
def test_units_cover_the_inputs_in_order_and_tasks_partition_them(
    tmp_path_factory, sizes, shard_bytes, tasks
):
    folder = tmp_path_factory.mktemp("units")
    inputs = []
    for k, size in enumerate(sizes):
        path = folder / f"{k}.jsonl"
        path.write_bytes(b"x" * size)
        inputs.append(InputFile(str(path), "jsonl", size, False))
    units = plan_units(inputs, shard_bytes)
    pieces = [p for u in units for p in u.pieces]
    assert [(p.file, p.start) for p in pieces] == sorted((p.file, p.start) for p in pieces)
    for k, size in enumerate(sizes):
        mine = [p for p in pieces if p.file == k]
        assert mine[0].start == 0 and mine[-1].end == size
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
    assert all(u.weight <= shard_bytes or len(u.pieces) == 1 for u in units)
    split = [select_units(units, tasks, t) for t in range(tasks)]
    assert sorted(u.index for s in split for u in s) == list(range(len(units)))


def test_inputs_that_are_not_text_are_refused(tmp_path):
    import pytest

    from fmsdata.errors import ConfigError
    from fmsdata.tokenize.inputs import find_inputs

    (tmp_path / "data.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match="data.bin.*unknown kind"):
        find_inputs([str(tmp_path / "data.bin")])
    with pytest.raises(ConfigError, match="missing.jsonl.*does not exist"):
        find_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(ConfigError, match="holds no .jsonl"):
        find_inputs([str(tmp_path)])
