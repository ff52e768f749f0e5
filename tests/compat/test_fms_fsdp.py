"""S8: fms-fsdp's get_data_loader over its own train_config, with fms-fsdp's meanings."""

import dataclasses
import os
from typing import Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support import corpus

from fmsdata import build_dataloader
from fmsdata.compat.fms_fsdp import (
    LOADER_CHECKPOINTS,
    causal_lm,
    get_data_loader,
    get_dummy_loader,
    loader_config,
)
from fmsdata.data.indexing import index_root
from fmsdata.errors import ConfigError, ShardFormatError, StateMismatchError
from fmsdata.handlers import ArrowDocHandler
from fmsdata.handlers.arrow import write_arrow_docs
from fmsdata.handlers.text import TextTokenizer
from fmsdata.util.textcorpus import bundled_tokenizer_path

BAMBA = {"lang=en/dataset=commoncrawl": 3, "lang=de/dataset=wikipedia": 2}


@dataclasses.dataclass
class train_config:  # noqa: N801 -- fms-fsdp's name (mamba-new + FIM branches), field for field
    # model
    model_variant: str = "7b"
    ckpt_load_path: str = "/fsx/output/ckpt"
    ckpt_save_path: str = "/fsx/output/ckpt"

    # dataset and dataloader
    use_dummy_dataset: bool = False
    data_path: str = "/fsx/data"
    file_type: str = "arrow"
    col_name: str = "tokens"
    tokenizer_path: str = "/fsx/tokenizer"
    datasets: str = "lang=en/dataset=commoncrawl,lang=en/dataset=webhose,lang=en/dataset=github_clean,lang=de/dataset=wikipedia,lang=es/dataset=wikipedia,lang=fr/dataset=wikipedia,lang=ja/dataset=wikipedia,lang=pt/dataset=wikipedia,lang=en/dataset=wikimedia,lang=en/dataset=uspto,lang=en/dataset=pubmedcentral,lang=en/dataset=arxiv,lang=en/dataset=stackexchange"  # noqa: E501
    weights: str = "7725,500,550,28,17,22,25,8,100,500,175,250,100"
    seq_length: int = 4096
    vocab_size: int = 32000
    bos_token: Optional[int] = None  # noqa: UP045 -- as written in fms-fsdp
    eos_token: int = 0
    bol_token: Optional[int] = None  # noqa: UP045
    eol_token: Optional[int] = None  # noqa: UP045
    strip_tokens: str = ""
    logical_shards: int = 1024
    num_workers: int = 1

    # fsdp policies
    sharding_strategy: str = "hsdp"
    fsdp_activation_checkpointing: bool = False
    selective_checkpointing: Union[float, str] = 1  # noqa: UP007
    mixed_precision: bool = True
    low_cpu_fsdp: bool = False

    # training spec
    batch_size: int = 2
    num_steps: int = 1000000
    training_stage: str = "initial"
    learning_rate: float = 3e-4
    grad_clip_thresh: float = 1.0
    seed: int = 2023

    # continued training spec
    resuming_dataset: bool = False

    # profiling
    use_profiler: bool = False
    profiler_rank0_only: bool = True

    # logging
    report_interval: int = 100
    checkpoint_interval: int = 10000
    tracker: Optional[str] = None  # noqa: UP045
    tracker_dir: str = "/fsx/aim_logs/llama"
    tracker_project_name: str = "llama"
    tracker_run_id: Optional[str] = None  # noqa: UP045

    # compile
    use_torch_compile: bool = True

    # speculator training
    tp_size: int = 8
    model_arch: str = "embedllama"
    model_path: str = "/path/to/model/"
    n_speculator_heads: int = 3
    speculator_width: int = 4096
    speculator_tie_weights: bool = True
    speculator_scale_input: bool = True
    stage2_start_step: int = 15000
    stage2_prompt_length: int = 64
    stage2_batch_size: int = 96
    stage2_seq_length: int = 256

    # FIM training
    fim_training: bool = False
    psm_rate: float = 0.0
    spm_rate: float = 0.0
    fim_pre: int = 1
    fim_mid: int = 2
    fim_suf: int = 3


def bamba_root(tmp_path):
    """A Bamba-layout root: nested dataset folders and meta/counts.csv."""
    info = corpus(tmp_path / "data", BAMBA, docs_per_file=20, mean_length=30)
    index_root(info.root, ArrowDocHandler())
    return info


def bamba_config(info, tmp_path, **changes):
    cfg = train_config()
    cfg.data_path = info.root
    cfg.datasets = ",".join(BAMBA)
    cfg.weights = "3,1"
    cfg.seq_length = 24
    cfg.logical_shards = 4
    cfg.num_workers = 0
    cfg.ckpt_save_path = str(tmp_path / "run1")
    cfg.ckpt_load_path = str(tmp_path / "run1")
    cfg.checkpoint_interval = 4
    for name, value in changes.items():
        setattr(cfg, name, value)
    return cfg


def run(loaders, n_steps):
    """fms-fsdp's training loop over every rank's loader: per step, the sorted rows of
    (input, label) across ranks."""
    per_rank = []
    for loader in loaders:
        seen = []
        for batch_idx, (input, label) in enumerate(loader, start=1):
            assert input.dtype == label.dtype == torch.int32
            seen.append([(tuple(i), tuple(lab)) for i, lab in zip(input.tolist(), label.tolist())])
            if batch_idx == n_steps:
                break
        per_rank.append(seen)
    return [sorted(row for rank in per_rank for row in rank[s]) for s in range(n_steps)]


def wait_for_saves(loaders):
    for loader in loaders:
        loader.checkpointer.wait()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_bamba_config_trains_saves_and_resumes_exactly_on_any_world_size(tmp_path, num_workers):
    info = bamba_root(tmp_path)
    cfg = bamba_config(info, tmp_path, num_workers=num_workers)
    two = [get_data_loader(cfg, r, 2) for r in range(2)]
    reference = run(two, 10)  # saves at steps 4 and 8
    wait_for_saves(two)
    saved = tmp_path / "run1" / LOADER_CHECKPOINTS
    assert sorted(os.listdir(saved)) == ["step_000000004", "step_000000008"]
    assert not (tmp_path / "run1" / "checkpoints").exists()  # the model Checkpointer's folder

    for world in (2, 1, 4):
        resumed = bamba_config(
            info,
            tmp_path,
            resuming_dataset=True,
            ckpt_save_path=str(tmp_path / f"run2_{world}"),
            batch_size=4 // world,
            num_workers=num_workers,
        )
        loaders = [get_data_loader(resumed, r, world) for r in range(world)]
        assert run(loaders, 2) == reference[8:10]
        # Its own step count restarts at 0, as the model's does when loading another run.
        assert all(loader.steps == 2 for loader in loaders)


def test_a_restarted_job_resumes_from_its_save_path_whatever_resuming_dataset(tmp_path):
    info = bamba_root(tmp_path)
    cfg = bamba_config(info, tmp_path)
    first = get_data_loader(cfg, 0, 1)
    reference = run([first], 7)
    wait_for_saves([first])
    restarted = get_data_loader(cfg, 0, 1)  # resuming_dataset stays False
    assert restarted.steps == 4  # the job's own count goes on
    assert run([restarted], 3) == reference[4:7]


def test_resuming_dataset_without_a_loader_checkpoint_is_an_error(tmp_path):
    info = bamba_root(tmp_path)
    old = tmp_path / "fms_run" / "checkpoints" / "step_100_ckp"
    old.mkdir(parents=True)
    (old / "loader_state_0.pth").write_bytes(b"")
    cfg = bamba_config(info, tmp_path, resuming_dataset=True, ckpt_load_path=str(old.parents[1]))
    with pytest.raises(StateMismatchError, match="fms-fsdp's own loader states.*order="):
        get_data_loader(cfg, 0, 1, order="fmsdata")
    # order unset: those states are continued in fms-fsdp's order (this one is no torch file)
    with pytest.raises(StateMismatchError, match="loader_state_0.pth: not an fms-fsdp"):
        next(iter(get_data_loader(cfg, 0, 1)))


def test_model_checkpointer_still_finds_its_own_newest_folder(tmp_path):
    info = bamba_root(tmp_path)
    cfg = bamba_config(info, tmp_path, checkpoint_interval=2)
    model_dir = tmp_path / "run1" / "checkpoints"
    (model_dir / "step_2_ckp").mkdir(parents=True)
    loader = get_data_loader(cfg, 0, 1)
    run([loader], 6)
    loader.checkpointer.wait()
    # fms-fsdp's get_latest: every entry of checkpoints/ is step_<int>_..., newest by number.
    newest = max(os.listdir(model_dir), key=lambda name: int(name.split("_")[1]))
    assert newest == "step_2_ckp"


def test_unknown_fields_are_errors_and_foreign_ones_are_ignored(tmp_path):
    info = bamba_root(tmp_path)
    cfg = bamba_config(info, tmp_path, learning_rate=1.0, model_variant="9b", tp_size=3)
    loader_config(cfg)
    cfg.seq_lenght = 12  # a typo of a loader field
    with pytest.raises(ConfigError, match="seq_lenght.*did you mean 'seq_length'"):
        get_data_loader(cfg, 0, 1)


def test_fim_fields_map_to_the_fim_stage(tmp_path):
    info = bamba_root(tmp_path)
    config = loader_config(bamba_config(info, tmp_path, psm_rate=0.5, spm_rate=0.5, fim_pre=7))
    assert not config.fim_training  # fms-fsdp's default: the rates alone change nothing
    cfg = bamba_config(info, tmp_path, fim_training=True, psm_rate=0.5, spm_rate=0.5, fim_pre=7)
    config = loader_config(cfg)
    assert (config.fim_training, config.psm_rate, config.spm_rate) == (True, 0.5, 0.5)
    assert (config.fim_pre, config.fim_mid, config.fim_suf) == (7, 2, 3)
    plain = [b for _, b in zip(range(3), get_data_loader(bamba_config(info, tmp_path), 0, 1))]
    cfg.fim_mid, cfg.fim_suf = 11, 12  # ids the corpus and its delimiters do not use
    fim = [b for _, b in zip(range(3), get_data_loader(cfg, 0, 1))]
    assert all(torch.isin(x, torch.tensor([7, 11, 12])).any() for x, _ in fim)
    for (x, _), (y, _) in zip(plain, fim):
        assert x.shape == y.shape
    with pytest.raises(ConfigError, match="psm_rate \\+ spm_rate must be at most 1"):
        loader_config(bamba_config(info, tmp_path, fim_training=True, psm_rate=0.8, spm_rate=0.8))


def test_postprocess_steps_apply_in_order_and_decide_the_line_length(tmp_path):
    info = bamba_root(tmp_path)
    cfg = bamba_config(info, tmp_path, seq_length=16)
    (input, label), *_ = [b for _, b in zip(range(1), get_data_loader(cfg, 0, 1))]
    assert input.shape == label.shape == (2, 16)
    assert (label[:, 0] == -100).all() and (label[:, 1:-1] == input[:, 2:]).all()

    def double(pair):
        return pair[0] * 2, pair[1]

    batch = next(iter(get_data_loader(cfg, 0, 1, postprocess=[causal_lm, double])))
    assert torch.equal(batch[0], input * 2) and torch.equal(batch[1], label)

    lines = next(iter(get_data_loader(cfg, 0, 1, postprocess=[])))  # e.g. speculator training
    assert isinstance(lines, torch.Tensor) and lines.dtype == torch.int32
    assert lines.shape == (2, 16)  # seq_length tokens: causal_lm does not shift them

    def plus_one(x):
        return x + 1

    def twice(x):
        return x * 2

    one_way = next(iter(get_data_loader(cfg, 0, 1, postprocess=[plus_one, twice])))
    other_way = next(iter(get_data_loader(cfg, 0, 1, postprocess=[twice, plus_one])))
    assert torch.equal(one_way, (lines + 1) * 2) and torch.equal(other_way, lines * 2 + 1)


def test_causal_lm_masks_the_first_prompt_len_labels():
    line = torch.arange(10, 20)
    input, label = causal_lm(line, prompt_len=3)
    assert input.dtype == label.dtype == torch.int32
    assert input.tolist() == list(range(10, 19))
    assert label.tolist() == [-100, -100, -100, *range(14, 20)]


def test_dummy_loader_counts_modulo_vocab_size():
    cfg = train_config(seq_length=5, vocab_size=7, batch_size=2)
    input, label = next(iter(get_dummy_loader(cfg, 0, 1)))
    assert input.dtype == torch.int32 and torch.equal(input, label)
    assert input.tolist() == [[0, 1, 2, 3, 4], [5, 6, 0, 1, 2]]


# -- fms-fsdp meanings, each checked against the data it was built from --------------------


def write_dataset(root, name, docs, col_name="tokens"):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    write_arrow_docs(os.path.join(root, name, "part.arrow"), docs, col_name)


def emitted_lines(cfg, n_batches):
    """The packed lines (input plus the last label) of the first ``n_batches`` batches."""
    lines = []
    for batch_idx, (input, label) in enumerate(get_data_loader(cfg, 0, 1), start=1):
        lines.extend(torch.cat([input, label[:, -1:]], dim=1).numpy())
        if batch_idx == n_batches:
            return lines


def small_config(tmp_path, root, datasets, **changes):
    cfg = train_config(
        data_path=str(root),
        datasets=",".join(datasets),
        weights=",".join("1" for _ in datasets),
        seq_length=48,
        logical_shards=1,
        num_workers=0,
        batch_size=4,
        ckpt_save_path=str(tmp_path / "ckpt"),
        ckpt_load_path=str(tmp_path / "ckpt"),
    )
    for name, value in changes.items():
        setattr(cfg, name, value)
    return cfg


def test_special_ids_already_at_document_edges_are_stripped_not_doubled(tmp_path):
    eos, bos = 0, 1
    docs = [np.array([bos, *range(100 + 10 * i, 105 + 10 * i), eos]) for i in range(12)]
    docs.append(np.array([bos, 900, eos, 901, 902, eos]))  # an inner EOS is content
    write_dataset(tmp_path / "data", "d", docs)
    cfg = small_config(tmp_path, tmp_path / "data", ["d"], bos_token=bos, eos_token=eos)
    lines = emitted_lines(cfg, 60)
    text = " | ".join(" " + " ".join(str(t) for t in line) + " " for line in lines)
    assert " 0 0 " not in text and " 1 1 " not in text
    assert " 0 1 100 101 102 103 104 0 1 " in text
    assert " 1 900 0 901 902 0 " in text


def test_documents_shorter_than_three_tokens_with_their_delimiters_are_dropped(tmp_path):
    lengths = [1, 2, 5] * 8
    starts = np.cumsum([0, *lengths])[:-1] + 100
    docs = [np.arange(s, s + n) for s, n in zip(starts, lengths)]
    write_dataset(tmp_path / "data", "d", docs)
    for bos, shortest_kept in ((None, 2), (7, 1)):
        cfg = small_config(tmp_path, tmp_path / "data", ["d"], bos_token=bos)
        seen = set(np.concatenate(emitted_lines(cfg, 60)).tolist())
        for doc in docs:
            assert (int(doc[0]) in seen) == (len(doc) >= shortest_kept), (bos, doc)


def test_col_name_is_a_list_of_candidates_resolved_per_file(tmp_path):
    root = tmp_path / "data"
    write_dataset(root, "a", [np.arange(100, 130)] * 4, col_name="input_ids")
    write_dataset(root, "b", [np.arange(300, 330)] * 4, col_name="tokens")
    cfg = small_config(tmp_path, root, ["a", "b"], col_name="text,input_ids,tokens")
    seen = set(np.concatenate(emitted_lines(cfg, 10)).tolist())
    assert {100, 129, 300, 329} <= seen

    write_dataset(root, "c", [np.arange(500, 530)] * 4, col_name="ids")
    cfg = small_config(tmp_path, root, ["a", "c"], col_name="text,input_ids,tokens")
    loader = get_data_loader(cfg, 0, 1)  # the config is fine: only reading c fails
    with pytest.raises(ShardFormatError, match=r"c/part.arrow: no token column among"):
        for _ in zip(range(10), loader):
            pass


def test_hf_parquet_tokenizes_a_text_column_with_tokenizer_path(tmp_path):
    texts = [f"def function_{i}(x):\n    return x + {i}\n" for i in range(30)]
    os.makedirs(tmp_path / "data" / "code")
    table = pa.table({"id": list(range(30)), "contents": texts})
    pq.write_table(table, tmp_path / "data" / "code" / "part.parquet")
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(open(bundled_tokenizer_path(), "rb").read())
    cfg = small_config(
        tmp_path,
        tmp_path / "data",
        ["code"],
        file_type="hf_parquet",
        col_name="text,contents",
        tokenizer_path=str(folder),
        eos_token=1,
    )
    expected = TextTokenizer(str(folder / "tokenizer.json")).encode(texts)
    lines = emitted_lines(cfg, 20)
    assert set(np.concatenate(lines).tolist()) <= {1, *(t for ids in expected for t in ids)}
    stream = " | ".join(" ".join(str(t) for t in line) for line in lines)
    assert sum(" ".join(str(t) for t in ids) in stream for ids in expected) >= len(texts) // 2
    with pytest.raises(ConfigError, match="tokenizer_path"):
        loader_config(small_config(tmp_path, tmp_path / "data", ["code"], file_type="hf_parquet"))


def test_auto_reads_arrow_tokens_and_tokenizes_parquet_text_side_by_side(tmp_path):
    root = tmp_path / "data"
    write_dataset(root, "tokens", [np.arange(5000, 5040)] * 3)
    os.makedirs(root / "text")
    texts = [f"print({i} * {i})" for i in range(20)]
    pq.write_table(pa.table({"text": texts}), root / "text" / "part.parquet")
    cfg = small_config(
        tmp_path,
        root,
        ["tokens", "text"],
        file_type="auto",
        col_name="tokens,text",
        tokenizer_path=bundled_tokenizer_path(),
        eos_token=1,
    )
    seen = set(np.concatenate(emitted_lines(cfg, 10)).tolist())
    encoded = TextTokenizer(bundled_tokenizer_path()).encode(texts)
    assert 5000 in seen and 5039 in seen
    assert seen - set(range(5000, 5040)) - {1} <= {t for ids in encoded for t in ids}
    assert len(seen - set(range(5000, 5040)) - {1}) > 5


def test_vocab_size_is_a_model_field_not_a_check_of_the_data(tmp_path):
    llama3 = [np.arange(128_000 + 10 * i, 128_008 + 10 * i) for i in range(6)]
    write_dataset(tmp_path / "data", "d", llama3)
    cfg = small_config(tmp_path, tmp_path / "data", ["d"])  # vocab_size keeps 32000
    assert max(int(line.max()) for line in emitted_lines(cfg, 4)) >= 128_000
    plain = loader_config(cfg).replace(vocab_size=cfg.vocab_size, batch_format="dict")
    with pytest.raises(ShardFormatError, match="vocab_size"):
        next(iter(build_dataloader(plain, 0, 1)))


def test_fields_a_config_lacks_take_fms_fsdp_defaults(tmp_path):
    info = corpus(tmp_path / "data", {"a": 1})
    config = loader_config({"data_path": info.root, "datasets": "a", "weights": "1"})
    assert (config.seq_length, config.logical_shards, config.seed) == (4096, 1024, 2023)
    assert (config.eos_token, config.strip_tokens, config.min_length) == (0, (0,), 2)
    assert config.vocab_size is None


def _unchanged(pair):
    """A postprocess step after ``causal_lm`` that changes nothing: the chain then runs
    on each line in the workers, as any other postprocess does."""
    return pair


def _batches(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fim", [False, True])
def test_the_default_postprocess_is_written_by_the_workers_as_causal_lm_makes_it(
    tmp_path, num_workers, fim
):
    """With ``[causal_lm]`` the workers write fms-fsdp's int32 ``(input, label)`` into the
    shared ring (no Python per line): the batches ``causal_lm`` makes line by line, and
    states that resume either way."""
    info = bamba_root(tmp_path)
    fim_fields = dict(
        fim_training=True, psm_rate=0.5, spm_rate=0.5, fim_pre=7, fim_mid=11, fim_suf=12
    )
    cfg = bamba_config(
        info,
        tmp_path,
        num_workers=num_workers,
        checkpoint_interval=0,
        **(fim_fields if fim else {}),
    )
    written = get_data_loader(cfg, 0, 1)
    per_line = get_data_loader(cfg, 0, 1, postprocess=[causal_lm, _unchanged])
    assert written.dataset.preprocess is None and per_line.dataset.preprocess is not None
    expected = _batches(per_line, 16)
    got = _batches(written, 8)
    for (x, y), (a, b) in zip(got, expected):
        assert x.dtype == y.dtype == torch.int32
        assert torch.equal(x, a) and torch.equal(y, b)
    assert (torch.stack([y for _, y in got])[:, :, 0] == -100).all()
    resumed = get_data_loader(cfg, 0, 1, postprocess=[causal_lm, _unchanged])
    resumed.load_state_dict(written.state_dict())
    for (x, y), (a, b) in zip(_batches(resumed, 8), expected[8:]):
        assert torch.equal(x, a) and torch.equal(y, b)
