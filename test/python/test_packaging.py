"""One version everywhere, and a wheel that carries what the worker reads at run time."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import erlcuda

ROOT = Path(__file__).resolve().parents[2]


def _field(path: Path, pattern: str) -> str:
    found = re.search(pattern, path.read_text(encoding="utf-8"), re.M)
    assert found, f"no version in {path}"
    return found[1]


def test_the_versions_agree() -> None:
    # The Erlang side sends its vsn in hello; a worker of another version refuses jobs.
    pyproject = _field(ROOT / "pyproject.toml", r'^version\s*=\s*"([^"]+)"')
    app = _field(ROOT / "erlang" / "erlcuda.app.src", r'\{vsn,\s*"([^"]+)"\}')
    assert {"erlcuda.__version__": erlcuda.__version__, "pyproject.toml": pyproject,
            "erlcuda.app.src": app} == dict.fromkeys(
                ("erlcuda.__version__", "pyproject.toml", "erlcuda.app.src"), erlcuda.__version__)


def _can_build_offline() -> str | None:
    """Why a wheel cannot be built here without the network, or None."""
    if importlib.util.find_spec("pip") is None:
        return "pip is missing"
    try:  # not imported: setuptools' distutils shim must not load inside pytest
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is missing"
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    if (major, minor) < (64, 0):
        return f"setuptools {version} is older than 64"
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {version} needs the wheel package to build wheels"
    return None


def test_the_wheel_carries_the_kernels_the_contract_and_the_host_headers(tmp_path: Path) -> None:
    why = _can_build_offline()
    if why is not None:
        pytest.skip(f"cannot build a wheel offline: {why}")
    # A copy of the sources: the build writes build/ and *.egg-info next to them.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "python", source / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "kernels", source / "kernels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("erlcuda-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = {f"erlcuda/kernels_cu/{p.name}" for p in (ROOT / "kernels").iterdir()
               if p.suffix in (".cu", ".cuh")}
    assert "erlcuda/kernels_cu/vector_add.cu" in kernels
    assert kernels <= names
    assert {"erlcuda/contract.json", "erlcuda/py.typed", "erlcuda/backends/sources.py"} <= names
    headers = {f"erlcuda/hostinclude/{p.name}"
               for p in (ROOT / "python" / "erlcuda" / "hostinclude").glob("*.h")}
    assert "erlcuda/hostinclude/erlcuda_host.h" in headers
    assert headers <= names
    assert wheel.name.startswith(f"erlcuda-{erlcuda.__version__}-")
