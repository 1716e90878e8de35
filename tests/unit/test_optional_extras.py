"""matplotlib and tqdm are the `experiment` extra, not the core install: nothing imports them at import time,
and what needs them stops with a message naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from experiment import report, runner

ROOT = Path(__file__).resolve().parents[2]


def test_the_core_imports_without_matplotlib_or_tqdm():
    code = ("import sys; sys.modules['matplotlib'] = None; sys.modules['tqdm'] = None\n"
            "import cli.main, deployment.service, operations.dashboard, experiment.runner, experiment.report")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_missing_extra_names_what_needs_it_and_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=r"plots needs the Python package 'matplotlib'.*slicex\[experiment\]"):
        report.plots(tmp_path, [])
    exp = runner.Experiment.__new__(runner.Experiment)  # never reached: the check comes before any repetition
    with pytest.raises(SystemExit, match="matplotlib"):
        runner.run(exp, tmp_path, progress=False)
