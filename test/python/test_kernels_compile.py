"""Every CUDA kernel file compiles with nvcc, without warnings or register spills.

Needs nvcc only, no GPU and no PyCUDA, so a broken kernel is caught on any machine that has
the CUDA toolkit. The options match those ``backends/cuda.py`` gives the nvcc cache
(``compile.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = sorted(KERNELS.glob("*.cu"))
ARCH = "sm_90"  # the H200 the project targets

#: The extern "C" entry points backends/cuda.py loads, by file.
ENTRY_POINTS = {
    "vector_add.cu": {"vector_add", "vector_add_f64"},
    "reduce.cu": {
        "reduce_partial",
        "dot_partial",
        "reduce_final",
        "reduce_segments",
        "dot_segments",
        "reduce_partial_f64",
        "dot_partial_f64",
        "reduce_final_f64",
    },
    "matmul.cu": {"matmul_aligned", "matmul_checked", "matmul_f64"},
    "testing.cu": {"erlcuda_fault"},
}
#: The tests' faulting kernel (``test/worker``), checked as the shipped ones are.
TESTING = Path(__file__).resolve().parents[1] / "worker" / "erlcuda_testworker" / "testing.cu"


def test_every_kernel_file_is_known() -> None:
    assert {p.name for p in SOURCES} | {TESTING.name} == set(ENTRY_POINTS)


@pytest.mark.parametrize("source", [*SOURCES, TESTING], ids=lambda p: p.name)
def test_kernel_compiles_without_warnings_or_spills(source: Path, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    cubin = tmp_path / f"{source.stem}.cubin"
    cmd = [
        nvcc,
        "-cubin",
        f"-arch={ARCH}",
        "-O3",
        "-Xptxas",
        "-v",
        "-I",
        str(KERNELS),
        "-o",
        str(cubin),
        str(source),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert cubin.stat().st_size > 0
    assert "warning" not in log.lower(), log
    compiled = set(re.findall(r"Compiling entry function '(\w+)'", log))
    assert compiled == ENTRY_POINTS[source.name], log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log
