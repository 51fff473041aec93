"""``erlcuda.probe``: what it says of an interpreter, run as the port owner runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from erlcuda import probe

ROOT = Path(__file__).resolve().parents[2]
SOURCE = (ROOT / "python" / "erlcuda" / "probe.py").read_text(encoding="utf-8")
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))


def run(*python_args: str, module: str = "erlcuda") -> dict[str, tuple[str, str]]:
    """``python PYTHON_ARGS -c SOURCE MODULE`` as the port owner runs it: each check's status
    and text."""
    done = subprocess.run([sys.executable, *python_args, "-c", SOURCE, module], env=ENV,
                          capture_output=True, text=True, timeout=60, check=True)
    found = {}
    for line in done.stdout.splitlines():
        prefix, check, status, text = line.split("\t")
        assert prefix == probe.PREFIX
        found[check] = (status, text)
    return found


@pytest.mark.process
def test_a_python_that_can_serve() -> None:
    found = run()
    assert found["executable"] == ("ok", sys.executable)
    assert found["python"] == ("ok", ".".join(map(str, sys.version_info[:3])))
    assert found["numpy"][0] == "ok" and found["erlcuda"][0] == "ok"
    assert "module" not in found


@pytest.mark.process
def test_numpy_missing() -> None:
    # -S: no site-packages, the erlcuda package still on PYTHONPATH
    found = run("-S")
    assert found["numpy"] == ("missing", "ModuleNotFoundError: No module named 'numpy'")
    assert found["erlcuda"][0] == "ok"


@pytest.mark.process
def test_the_package_missing() -> None:
    # -I: PYTHONPATH is ignored, so the package is not found
    found = run("-I")
    assert found["erlcuda"] == ("missing", "ModuleNotFoundError: No module named 'erlcuda'")


@pytest.mark.process
def test_a_worker_module_is_found_not_imported() -> None:
    assert run(module="erlcuda_no_such_worker")["module"] == (
        "missing", "no module named erlcuda_no_such_worker")
    assert run(module="json")["module"][0] == "ok"


def test_an_old_python_is_named() -> None:
    (python,) = [line for line in probe.checks("erlcuda", (3, 9, 18))
                 if line.split("\t")[1] == "python"]
    assert python == "erlcuda-probe\tpython\told\t3.9.18 (erlcuda needs 3.10 or later)"


def test_text_stays_on_one_line() -> None:
    assert probe.line("numpy", "missing", "a\tb\nc") == "erlcuda-probe\tnumpy\tmissing\ta b c"


def test_the_oldest_python_is_pyprojects() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^requires-python\s*=\s*">=(\d+)\.(\d+)"', pyproject, re.M)
    assert found and (int(found[1]), int(found[2])) == probe.MIN_PYTHON
