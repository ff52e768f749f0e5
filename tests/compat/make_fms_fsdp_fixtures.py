"""Run fms-fsdp's own loader (the oracle) on generated shards and record its batches.

    python tests/compat/make_fms_fsdp_fixtures.py [--peers ../shared/peers/fms-fsdp]
    python tests/compat/make_fms_fsdp_fixtures.py --branch mamba-fim
    python tests/compat/make_fms_fsdp_fixtures.py --out /tmp/live --cases w2_nw2,fim_w1_psm

Each branch runs in a subprocess of its own (both are package ``fms_fsdp``; ``--branch``
picks one, default both): it imports ``fms_fsdp`` from the unmodified copy of that branch
by ``sys.path``, there only, builds the corpus with ``fms_corpus.make_corpus`` and writes
into ``--out`` (default this folder's ``fixtures/``; ``--cases`` runs only the named
stream and checkpoint cases, and needs ``--out``: the committed fixtures are whole). For
``mamba-new``:

- ``fixtures/fms_fsdp_mamba_new.json``: per case, its config, world size, workers and the
  SHA-256 digest (16 hex digits) of every batch of every rank; for checkpoint cases the
  plain contents of fms-fsdp's ``loader_state_<rank>.pth`` (small values as they are,
  the rest as digests); the torch version and a probe of torch's generator, so tests can
  tell a torch whose ``multinomial`` / ``randint`` draws differ (and skip, saying so);
- ``fixtures/fms_ckpt/<case>/checkpoints/step_<N>_ckp/loader_state_<rank>.pth``: the
  checkpoints fms-fsdp wrote, which the tests resume from (they are a few KB).

For ``mamba-fim`` the same layout: ``fms_fsdp_mamba_fim.json`` with its FIM cases and
``fms_ckpt_fim/``. ``--peers`` defaults to ``$FMSDATA_FMS_FSDP_PEERS``, else
``../shared/peers/fms-fsdp`` beside the repository (``peers_folder``).

fms-fsdp's ``dataset_utils`` imports ``transformers.AutoTokenizer`` at the top and builds
one in its ``auto`` handler even for Arrow files; where ``transformers`` is not installed a
stand-in module is put in ``sys.modules`` (the tokenizer is never called on Arrow data).
Most tests compare against what it wrote (so they run anywhere); ``test_fms_fsdp_live.py``
also runs it on a few cases, where fms-fsdp's trees are at hand.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fms_corpus import batch_digest, make_corpus  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures")
BRANCHES = ("mamba-new", "mamba-fim")
COMMITS = {
    "mamba-new": "385c98d17d08ec01b82082901d61d28f4b23fa05",
    "mamba-fim": "05030cc9e14d755aa34ea1d47b2ddb23bdd91017",
}
OUTPUTS = {  # branch -> (digests file, checkpoint folder) under the output folder
    "mamba-new": ("fms_fsdp_mamba_new.json", "fms_ckpt"),
    "mamba-fim": ("fms_fsdp_mamba_fim.json", "fms_ckpt_fim"),
}
BASE = {
    "datasets": "lang=en/dataset=web,lang=de/dataset=wiki,code",
    "weights": "3,2,1",
    "seq_length": 64,
    "batch_size": 2,
    "logical_shards": 4,
    "seed": 2023,
    "eos_token": 0,
    "bos_token": None,
    "file_type": "auto",
    "col_name": "tokens",
    "checkpoint_interval": 100000,
    "num_workers": 0,
}

# name -> (config overrides, world size, steps)
STREAM_CASES: dict[str, tuple[dict, int, int]] = {
    "w1_nw0": ({}, 1, 40),
    "w1_nw1": ({"num_workers": 1}, 1, 40),
    "w1_nw2": ({"num_workers": 2}, 1, 40),
    "w2_nw0": ({}, 2, 30),
    "w2_nw1": ({"num_workers": 1}, 2, 30),
    "w2_nw2": ({"num_workers": 2}, 2, 30),
    "w1_nw0_seed7": ({"seed": 7}, 1, 30),
    "w2_nw0_seed99": ({"seed": 99}, 2, 30),
    "w2_bos_eol": (
        {"bos_token": 1, "bol_token": 5, "eol_token": 6, "strip_tokens": "7", "seq_length": 100},
        2,
        25,
    ),
    "w1_long_lines": ({"seq_length": 1500, "batch_size": 1}, 1, 12),
    "w1_short_lines": ({"seq_length": 16, "batch_size": 3}, 1, 30),
    "w1_epochs": ({"seq_length": 512, "batch_size": 4, "weights": "1,1,1"}, 1, 40),
    "w2_l8_one_dataset": ({"datasets": "code", "weights": "1", "logical_shards": 8}, 2, 30),
}

# name -> (overrides of the run that writes checkpoints, its world size, its steps,
#          the step folder to keep, [(resume name, world size, workers, steps), ...])
CKPT_CASES: dict[str, tuple[dict, int, int, int, list[tuple[str, int, int, int]]]] = {
    "ck_w2_nw0": (
        {"checkpoint_interval": 3},
        2,
        8,
        6,
        [("same", 2, 0, 10), ("to_w1", 1, 0, 10), ("to_w4", 4, 0, 8), ("to_w2_nw2", 2, 2, 8)],
    ),
    "ck_w1_nw2": (
        {"checkpoint_interval": 3, "num_workers": 2},
        1,
        14,
        6,
        [("same", 1, 2, 10), ("to_w1_nw0", 1, 0, 10), ("to_w2_nw0", 2, 0, 8)],
    ),
}


# mamba-fim: name -> (config overrides, world size, steps); fim_training on, no BOS
FIM_CASES: dict[str, tuple[dict, int, int]] = {
    "fim_w1_psm": ({"psm_rate": 0.5}, 1, 30),
    "fim_w2_mix": ({"psm_rate": 0.3, "spm_rate": 0.4}, 2, 25),
    "fim_w1_spm_nw2": ({"spm_rate": 0.9, "num_workers": 2}, 1, 30),
    "fim_w1_short_lines": ({"psm_rate": 0.5, "spm_rate": 0.5, "seq_length": 16}, 1, 30),
    "fim_w1_falsy_tokens": (
        {"psm_rate": 0.6, "spm_rate": 0.4, "fim_pre": 0, "fim_suf": None},
        1,
        20,
    ),
    "fim_w1_long_lines": (
        {"psm_rate": 0.5, "spm_rate": 0.5, "seq_length": 1500, "batch_size": 1},
        1,
        10,
    ),
}
FIM_CKPT_CASES: dict[str, tuple[dict, int, int, int, list[tuple[str, int, int, int]]]] = {
    "fim_ck_w2_nw0": (
        {"checkpoint_interval": 3, "psm_rate": 0.3, "spm_rate": 0.4},
        2,
        8,
        6,
        [("same", 2, 0, 10), ("to_w1", 1, 0, 10)],
    ),
}


def _import_fms(tree: str):
    try:
        import transformers  # noqa: F401
    except ImportError:
        stub = types.ModuleType("transformers")

        class AutoTokenizer:  # never called on Arrow data
            @staticmethod
            def from_pretrained(path, *args, **kwargs):
                return None

        stub.AutoTokenizer = AutoTokenizer
        sys.modules["transformers"] = stub
    sys.path.insert(0, tree)
    from fms_fsdp.config import train_config
    from fms_fsdp.utils.dataloader_utils import get_data_loader

    return train_config, get_data_loader


def generator_probe() -> str:
    """Digest of the torch generator calls fms-fsdp's order rests on (``multinomial`` over
    float counts, ``randint`` of one value, ``get_state`` after them): equal digests mean
    equal draws."""
    g = torch.Generator().manual_seed(3)
    draws = []
    for n in range(1, 200):
        weights = torch.tensor([float((n * k) % 7) for k in range(1, 9)]) + 0.5
        draws.append(torch.multinomial(weights, 1, generator=g).item())
        draws.append(torch.randint(n, (1,), generator=g).item())
    h = hashlib.sha256(json.dumps(draws).encode())
    h.update(g.get_state().numpy().tobytes())
    return h.hexdigest()[:16]


def fim_generator_probe() -> str:
    """Digest of the extra generator calls mamba-fim's FIM step makes (``rand`` of one
    value, ``randint`` of two cut points, ``get_state`` after them)."""
    g = torch.Generator().manual_seed(5)
    draws = []
    for n in range(10, 200):
        draws.append(torch.rand([1], generator=g).item())
        draws.append(torch.randint(0, n, [2], generator=g).tolist())
    h = hashlib.sha256(json.dumps(draws).encode())
    h.update(g.get_state().numpy().tobytes())
    return h.hexdigest()[:16]


def plain(value):
    """A checkpoint value as JSON-able data: tensors as ``{"uint8_sha256": ...}``."""
    if isinstance(value, torch.Tensor):
        return {"tensor_sha256": hashlib.sha256(value.numpy().tobytes()).hexdigest()[:16]}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def summarize_state(state: dict) -> dict:
    """Each key of a ``loader_state_<rank>.pth``: small values as they are, others as the
    digest of their canonical JSON."""
    out = {}
    for key, value in state.items():
        text = json.dumps(plain(value), sort_keys=True)
        out[key] = plain(value) if len(text) <= 160 else {"json_sha256": _sha(text)}
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_rank(train_config, get_data_loader, values: dict, rank: int, world: int, steps: int):
    cfg = train_config()
    for key, value in values.items():
        setattr(cfg, key, value)
    loader = get_data_loader(cfg, rank, world)
    digests = []
    it = iter(loader)
    for _ in range(steps):
        digests.append(batch_digest(next(it)))
    del it
    return digests


def run_job(train_config, get_data_loader, values: dict, world: int, steps: int):
    """Every rank's digests. Ranks run one after another, each saving into its own folder:
    a later rank would otherwise find an earlier one's checkpoints and resume from them."""
    return {
        str(r): run_rank(
            train_config,
            get_data_loader,
            {**values, "ckpt_save_path": f"{values['ckpt_save_path']}_rank{r}"},
            r,
            world,
            steps,
        )
        for r in range(world)
    }


def peers_folder() -> str:
    """fms-fsdp's reference trees: ``$FMSDATA_FMS_FSDP_PEERS`` if set, else
    ``shared/peers/fms-fsdp`` beside the repository (CI puts ``shared/`` beside its clone)."""
    env = os.environ.get("FMSDATA_FMS_FSDP_PEERS")
    if env:
        return env
    return os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "peers", "fms-fsdp"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=None, help="fms-fsdp trees (default: peers_folder())")
    parser.add_argument("--branch", choices=[*BRANCHES, "both"], default="both")
    parser.add_argument("--out", default=None, help="output folder (default: fixtures/)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (with --out)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    peers = args.peers or peers_folder()
    out = args.out or FIXTURES
    cases = None if args.cases is None else {c for c in args.cases.split(",") if c}
    if cases is not None and os.path.abspath(out) == os.path.abspath(FIXTURES):
        parser.error("--cases writes a part of the fixtures: give --out another folder")
    if cases is not None:
        known = {*STREAM_CASES, *CKPT_CASES, *FIM_CASES, *FIM_CKPT_CASES}
        if cases - known:
            parser.error(f"unknown cases {sorted(cases - known)}; known: {sorted(known)}")
    if args.child:
        run_branch(os.path.join(peers, args.branch), args.branch, out, cases)
        return
    os.makedirs(out, exist_ok=True)
    for branch in BRANCHES if args.branch == "both" else (args.branch,):
        # One process per branch: both trees are the package ``fms_fsdp``.
        command = [sys.executable, os.path.abspath(__file__), "--child", "--branch", branch]
        command += ["--peers", peers, "--out", out]
        if args.cases is not None:
            command += ["--cases", args.cases]
        subprocess.run(command, check=True)


def run_branch(tree: str, branch: str, out_dir: str, only: set[str] | None) -> None:
    """Run one branch's cases (``only``: those named) in this process; write its outputs."""
    train_config, get_data_loader = _import_fms(tree)
    fim = branch == "mamba-fim"
    base = {**BASE, "fim_training": True, "spm_rate": 0.0} if fim else BASE
    stream_cases, ckpt_cases = (FIM_CASES, FIM_CKPT_CASES) if fim else (STREAM_CASES, CKPT_CASES)
    if only is not None:
        stream_cases = {k: v for k, v in stream_cases.items() if k in only}
        ckpt_cases = {k: v for k, v in ckpt_cases.items() if k in only}
    json_name, ckpt_name = OUTPUTS[branch]
    out = {
        "oracle": f"fms-fsdp {branch} {COMMITS[branch]}",
        "torch": torch.__version__,
        "generator_probe": generator_probe(),
        "corpus_seed": 0,
        "base": base,
        "cases": {},
        "checkpoints": {},
    }
    if fim:
        out["fim_generator_probe"] = fim_generator_probe()
    ckpt_root = os.path.join(out_dir, ckpt_name)
    shutil.rmtree(ckpt_root, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_corpus(os.path.join(tmp, "data"), seed=0)
        for name, (over, world, steps) in stream_cases.items():
            values = {**base, **over, "data_path": data}
            values["ckpt_save_path"] = values["ckpt_load_path"] = os.path.join(tmp, name)
            out["cases"][name] = {
                "config": {**base, **over},
                "world_size": world,
                "steps": steps,
                "digests": run_job(train_config, get_data_loader, values, world, steps),
            }
            print(name, flush=True)
        for name, (over, world, steps, keep, resumes) in ckpt_cases.items():
            # Ranks run one after another here: each writes into its own folder (a later
            # rank would otherwise find the earlier ranks' checkpoints and resume from
            # them), and the kept step folder gathers all of them, as in a real job.
            values = {**base, **over, "data_path": data}
            kept = os.path.join(ckpt_root, name, "checkpoints", f"step_{keep}_ckp")
            digests = {}
            for r in range(world):
                run_dir = os.path.join(tmp, f"{name}_rank{r}")
                values["ckpt_save_path"] = values["ckpt_load_path"] = run_dir
                digests[str(r)] = run_rank(train_config, get_data_loader, values, r, world, steps)
                step_dir = os.path.join(run_dir, "checkpoints", f"step_{keep}_ckp")
                shutil.copytree(step_dir, kept, dirs_exist_ok=True)
            files = sorted(os.listdir(kept))
            record = {
                "config": {**base, **over},
                "world_size": world,
                "steps": steps,
                "digests": digests,
                "kept": f"step_{keep}_ckp",
                "files": {
                    f: summarize_state(torch.load(os.path.join(kept, f), weights_only=True))
                    for f in files
                },
                "resumes": {},
            }
            for rname, rworld, rworkers, rsteps in resumes:
                print("  resume", rname, flush=True)
                rvalues = {**values, "num_workers": rworkers}
                rvalues["ckpt_load_path"] = os.path.join(ckpt_root, name)
                rvalues["ckpt_save_path"] = os.path.join(tmp, f"{name}_{rname}")
                rvalues["resuming_dataset"] = True
                record["resumes"][rname] = {
                    "world_size": rworld,
                    "num_workers": rworkers,
                    "steps": rsteps,
                    "digests": run_job(train_config, get_data_loader, rvalues, rworld, rsteps),
                }
            out["checkpoints"][name] = record
            print(name, flush=True)
    with open(os.path.join(out_dir, json_name), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
