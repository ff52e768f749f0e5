import subprocess
import sys

import yaml
from support import base_config, corpus

from fmsdata.cli.main import main


def test_every_command_has_help():
    for command in ("demo", "index", "bench"):
        out = subprocess.run(
            [sys.executable, "-m", "fmsdata.cli.main", command, "--help"],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0 and "usage:" in out.stdout


def test_demo_runs_and_resumes_exactly(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path), "--batches", "40", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "matches the uninterrupted one" in out


def test_bench_reports_figures(tmp_path, capsys):
    info = corpus(tmp_path / "data")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(info)))
    assert main(["bench", str(path), "--batches", "5", "--warmup", "1", "--json"]) == 0
    assert "tokens_per_s" in capsys.readouterr().out


def test_errors_exit_with_a_message(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing")]) == 2
    assert "ConfigError" in capsys.readouterr().err
