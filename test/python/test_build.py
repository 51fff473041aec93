"""The build (rebar3 compile) where a tool it needs is missing: it says what and how to get it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What rebar3 and the build's hooks run, but Python.
TOOLS = ("rebar3", "escript", "erl", "erlc", "sh", "env", "dirname", "basename", "sed", "cat",
         "rm", "mkdir", "cp", "find")


@pytest.mark.slow
def test_a_build_without_python3_says_what_is_missing(tmp_path: Path) -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not on the PATH: {missing}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(str(shutil.which(tool)))
    source = tmp_path / "erlcuda"
    source.mkdir()
    for part in ("erlang", "python", "kernels"):
        shutil.copytree(ROOT / part, source / part,
                        ignore=shutil.ignore_patterns("__pycache__", "erlcuda_contract.*rl"))
    shutil.copy(ROOT / "rebar.config", source)
    env = {"HOME": str(tmp_path), "PATH": str(bin_dir), "LANG": os.environ.get("LANG", "C")}
    done = subprocess.run(["rebar3", "compile"], cwd=source, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert "building needs Python 3, and python3 was not found" in said, said
    assert "apt-get install python3" in said and "ERLCUDA_PYTHON" in said
    assert not (source / "erlang" / "erlcuda_contract.erl").exists()
