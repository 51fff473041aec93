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


def _tables(toml: str) -> dict[str, str]:
    """Each [table]'s lines of a TOML file, by the table's name."""
    parts = re.split(r"^\[([^\]\n]+)\]\s*$", toml, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_version_is_written_once() -> None:
    # The Erlang side sends its vsn in hello; a worker of another version refuses jobs. So
    # the version is __version__ alone, which pyproject.toml reads and the app's build
    # derives: neither may carry a version of its own that could drift from it.
    tables = _tables((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert not re.search(r'^version\s*=', tables["project"], re.M)
    assert re.search(r'^dynamic\s*=\s*\["version"\]', tables["project"], re.M)
    assert re.search(r'^version\s*=\s*\{\s*attr\s*=\s*"erlcuda\.__version__"\s*\}',
                     tables["tool.setuptools.dynamic"], re.M)
    command = _field(ROOT / "erlang" / "erlcuda.app.src", r'\{vsn,\s*\{cmd,\s*"(.+)"\}\}')
    derived = subprocess.run(["sh", "-c", command.replace('\\"', '"').replace("\\\\", "\\")],
                             cwd=ROOT, capture_output=True, text=True, check=True, timeout=30)
    assert derived.stdout.strip() == erlcuda.__version__


def test_the_built_application_has_the_version() -> None:
    app = ROOT / "_build" / "default" / "lib" / "erlcuda" / "ebin" / "erlcuda.app"
    if not app.is_file():
        pytest.skip("erlcuda is not built (rebar3 compile)")
    assert _field(app, r'\{vsn,\s*"([^"]+)"\}') == erlcuda.__version__


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
