"""Large operands and results through the worker's shared-memory folder (``--shm-dir``).

Each case runs on the CPU backend and, where there is a GPU, on the cuda backend: the
folder's files are mapped and written by the worker whatever runs the kernels.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workerpipe import FileVector, WorkerPipe

BACKENDS = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / f"erlcuda-test-{os.getpid()}"
    path.mkdir()
    return path


@pytest.fixture(params=BACKENDS)
def worker(request: pytest.FixtureRequest, folder: Path) -> Iterator[WorkerPipe]:
    pipe = WorkerPipe("--backend", request.param, "--shm-dir", str(folder))
    yield pipe
    assert pipe.close() == 0


def _stage(folder: Path, name: str, values: np.ndarray) -> FileVector:
    data = values.astype("<f4").tobytes()
    (folder / name).write_bytes(data)
    return FileVector(name, len(data))


def wait_gone(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_operands_in_files_and_the_result_in_a_file(worker: WorkerPipe, folder: Path) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 300_000), dtype=np.float32)
    worker.launch(7, "vector_add", [_stage(folder, "i7-1", a), _stage(folder, "i7-2", b)],
                  result_file=True)
    reply = worker.reply()
    assert reply.result == ("file", a.nbytes)
    got = np.frombuffer((folder / "r7").read_bytes(), "<f4")
    np.testing.assert_array_equal(got, a + b)
    # inputs are unlinked once mapped: only the result is left for Erlang to take
    assert sorted(p.name for p in folder.iterdir()) == ["r7"]


def test_a_file_operand_with_the_result_through_the_pipe(worker: WorkerPipe,
                                                         folder: Path) -> None:
    a = np.arange(1000, dtype=np.float32)
    worker.launch(1, "reduce", [_stage(folder, "i1-1", a)], result_file=True)  # a scalar
    assert worker.result() == (1, ("ok", float(a.sum())))
    worker.launch(2, "vector_add", [_stage(folder, "i2-1", a), a.tobytes()])
    job_id, (status, values) = worker.result()
    assert (job_id, status) == (2, "ok") and values == (a * 2).tolist()
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("name", "why"), [
    ("missing", "No such file"),
    ("../escape", "not a file name"),
    ("", "not a file name"),
    ("short", "holds 8 bytes, the launch says 4000"),
])
def test_a_bad_file_operand_is_bad_args_and_the_worker_goes_on(
        worker: WorkerPipe, folder: Path, name: str, why: str) -> None:
    (folder / "short").write_bytes(b"\0" * 8)
    worker.launch(1, "reduce", [FileVector(name, 4000)])
    job_id, (status, (reason, text)) = worker.result()
    assert (job_id, status, reason) == (1, "error", "bad_args")
    assert why in bytes(text).decode()
    worker.launch(2, "reduce", [np.ones(3, np.float32).tobytes()])
    assert worker.result() == (2, ("ok", 3.0))


def test_without_a_folder_a_file_operand_is_refused_and_results_use_the_pipe() -> None:
    pipe = WorkerPipe("--backend", "cpu")
    try:
        pipe.launch(1, "reduce", [FileVector("i1-1", 4)])
        job_id, (status, (reason, text)) = pipe.result()
        assert (job_id, status, reason) == (1, "error", "bad_args")
        assert "without --shm-dir" in bytes(text).decode()
        a = np.ones(4, np.float32)
        pipe.launch(2, "vector_add", [a.tobytes(), a.tobytes()], result_file=True)
        assert pipe.result() == (2, ("ok", [2.0] * 4))
    finally:
        assert pipe.close() == 0


def test_a_folder_not_made_by_erlang_is_not_used(tmp_path: Path) -> None:
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep").write_bytes(b"x")
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(other))
    try:
        pipe.launch(1, "reduce", [np.ones(2, np.float32).tobytes()])
        assert pipe.result() == (1, ("ok", 2.0))
        assert any("no shared memory" in text for _, text in pipe.logs)
    finally:
        assert pipe.close() == 0
    assert (other / "keep").exists()


@pytest.mark.parametrize("how", ["eof", "sigkill"])
def test_the_folder_goes_when_the_worker_ends(folder: Path, how: str) -> None:
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(folder))
    a = np.ones(10, np.float32)
    pipe.launch(1, "vector_add", [_stage(folder, "i1-1", a), a.tobytes()], result_file=True)
    assert pipe.result() == (1, ("file", 40))
    (folder / "i9-1").write_bytes(b"\0" * 4)  # staged for a job that never ran
    if how == "eof":
        assert pipe.close() == 0
    else:
        os.kill(pipe.proc.pid, signal.SIGKILL)
        assert pipe.close() == -signal.SIGKILL
    assert wait_gone(folder), f"{folder} still holds {list(folder.iterdir())}"
