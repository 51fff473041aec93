"""Large operands and results through the worker's shared-memory folder (``--shm-dir``).

Each case runs on the CPU backend and, where there is a GPU, on the cuda backend: the
folder's files are mapped and written by the worker whatever runs the kernels.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudadouble
from erlcuda import protocol, shm
from erlcuda.framing import FrameReader, FrameWriter
from erlcuda.hostmem import Budget, Pinning
from erlcuda.kernels import Plan
from erlcuda.lanes import Job, Lane
from erlcuda.protocol import Launch
from erlcuda.shm import (
    LOCK,
    MAX_PARTS,
    PART_UNIT,
    FileArg,
    SharedFolder,
    ShmError,
)
from erlcuda.worker import Options, Worker
from programdefs import definition, inp, step
from workerpipe import (
    TEST_WORKER,
    FileVector,
    WorkerPipe,
    launch_frame,
    parse_results,
    pinned_slot_worker,
    read_slot,
    result_slot,
    write_part,
)

BACKENDS = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (str(Path(__file__).resolve().parents[2] / "python"),
                os.environ.get("PYTHONPATH")) if p))


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


def _stage(folder: Path, name: str, values: np.ndarray, part_bytes: int = 8 << 20
           ) -> FileVector:
    """Write ``values`` as Erlang does, in parts ``name.0``, ``name.1``, ..."""
    data = values.astype("<f4").tobytes()
    for k in range(max(1, -(-len(data) // part_bytes))):
        (folder / f"{name}.{k}").write_bytes(data[k * part_bytes : (k + 1) * part_bytes])
    return FileVector(name, len(data), part_bytes=part_bytes)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


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
    slot = result_slot(folder, "s7", 2 * PART_UNIT)
    worker.launch(7, "vector_add", [_stage(folder, "i7-1", a), _stage(folder, "i7-2", b)],
                  result_file=slot)
    reply = worker.reply()
    assert reply.result == ("file", (a.nbytes, 2 * PART_UNIT))
    np.testing.assert_array_equal(read_slot(folder, "s7", a.nbytes), a + b)
    # inputs are unlinked once mapped: only the result slot is left, Erlang's
    assert _names(folder) == [".lock", "s7.0"]


def test_operands_and_the_result_in_many_parts(worker: WorkerPipe, folder: Path) -> None:
    # Operands in as many parts of whole pages as Erlang cuts (the last one short), mapped
    # side by side as one vector; a result over PART_UNIT still written as one part.
    rng = np.random.default_rng(5)
    n = 2 * PART_UNIT // 4 + 1001
    a, b = rng.standard_normal((2, n), dtype=np.float32)
    page = os.sysconf("SC_PAGE_SIZE")
    part = page * -(-a.nbytes // (MAX_PARTS * page))  # MAX_PARTS parts, the last one short
    assert -(-a.nbytes // part) == MAX_PARTS
    worker.launch(3, "vector_add",
                  [_stage(folder, "i3-1", a, part), _stage(folder, "i3-2", b)],
                  result_file=result_slot(folder, "s3", 3 * PART_UNIT))
    assert worker.reply().result == ("file", (a.nbytes, 3 * PART_UNIT))
    np.testing.assert_array_equal(read_slot(folder, "s3", a.nbytes), a + b)
    assert _names(folder) == [".lock", "s3.0"]
    worker.launch(4, "dot_product", [_stage(folder, "i4-1", a, part),
                                     _stage(folder, "i4-2", b, 2 * part)])
    job_id, (status, value) = worker.result()
    assert (job_id, status) == (4, "ok")
    assert value == pytest.approx(float(np.dot(a.astype(np.float64), b)), rel=1e-4)


@pytest.mark.parametrize(("slot", "part", "why"), [
    ("s8", 4096, "over its slot's 4096"),  # too small for the result
    ("i8-1", PART_UNIT, "is not a slot"),
    ("s9", PART_UNIT, "No such file"),  # named, never made
])
def test_a_result_slot_that_cannot_take_the_result_sends_it_through_the_pipe(
        worker: WorkerPipe, folder: Path, slot: str, part: int, why: str) -> None:
    if slot == "s8":
        result_slot(folder, slot, part)
    a = np.arange(2000, dtype=np.float32)
    worker.launch(1, "vector_add", [a.tobytes(), a.tobytes()], result_file=(slot, part))
    job_id, (status, values) = worker.result()
    assert (job_id, status) == (1, "ok") and values == (a * 2).tolist()
    wait_logged(worker, why)
    worker.call("info")  # what else it logged about the job has come by now: tried once
    assert sum(why in text for _, text in worker.logs) == 1, worker.logs


def wait_logged(worker: WorkerPipe, text: str) -> None:
    """Until the worker has logged ``text`` (log lines come in their own frames, among the
    answers)."""
    deadline = time.monotonic() + 5
    while not any(text in logged for _, logged in worker.logs):
        assert time.monotonic() < deadline, worker.logs
        worker.call("info")


@pytest.mark.parametrize(("part_bytes", "damage", "why"), [
    (1000, None, "not whole pages"),
    (0, None, "malformed shared-memory argument"),
    (4096, "gap", "i1-1.1: No such file"),
    (4096, "short", "i1-1.2 holds 4000 bytes, the launch says 4096"),
    (4096, "long", "i1-1.3 holds 4096 bytes, the launch says 3616"),
    (4096, "huge", f"over {MAX_PARTS} parts"),
    (4096, "fifo", "i1-1.1 is not a regular file"),
])
def test_bad_parts_are_bad_args_and_their_files_go(worker: WorkerPipe, folder: Path,
                                                   part_bytes: int, damage: str | None,
                                                   why: str) -> None:
    a = np.arange(4000, dtype=np.float32)  # 16000 bytes: parts of 4096, 4096, 4096, 3712
    staged = _stage(folder, "i1-1", a, 4096)
    if damage == "gap":
        (folder / "i1-1.1").unlink()
    elif damage == "short":
        (folder / "i1-1.2").write_bytes(b"\0" * 4000)
    elif damage == "long":
        (folder / "i1-1.3").write_bytes(b"\0" * 4096)
        staged = FileVector("i1-1", 12288 + 3616, part_bytes=4096)
    elif damage == "huge":  # 2**50 parts: refused before a list of their sizes is made
        staged = FileVector("i1-1", 1 << 62, part_bytes=4096)
    elif damage == "fifo":  # opened for reading, a FIFO would block the reading thread
        (folder / "i1-1.1").unlink()
        os.mkfifo(folder / "i1-1.1")
    worker.launch(1, "reduce", [FileVector("i1-1", staged.nbytes, part_bytes=part_bytes)])
    job_id, (status, (reason, text)) = worker.result()
    assert (job_id, status, reason) == (1, "error", "bad_args")
    assert why in bytes(text).decode()
    if part_bytes == 4096 and damage != "huge":  # read: every part it names is unlinked
        assert [p.name for p in folder.iterdir()] == [".lock"]
    worker.launch(2, "reduce", [np.ones(3, np.float32).tobytes()])
    assert worker.result() == (2, ("ok", 3.0))


def test_a_file_operand_with_the_result_through_the_pipe(worker: WorkerPipe,
                                                         folder: Path) -> None:
    a = np.arange(1000, dtype=np.float32)
    worker.launch(1, "reduce", [_stage(folder, "i1-1", a)],
                  result_file=result_slot(folder, "s1"))  # a scalar: through the pipe
    assert worker.result() == (1, ("ok", float(a.sum())))
    worker.launch(2, "vector_add", [_stage(folder, "i2-1", a), a.tobytes()])
    job_id, (status, values) = worker.result()
    assert (job_id, status) == (2, "ok") and values == (a * 2).tolist()
    assert _names(folder) == [".lock", "s1.0"]


def test_a_program_naming_a_file_input_twice_reads_it_once(worker: WorkerPipe,
                                                          folder: Path) -> None:
    # one step, so it runs as its launch; a job's own file is unlinked once mapped
    square = definition(1, [("dot_product", [inp(0), inp(0)])], [step(0)])
    twice = definition(1, [("vector_add", [inp(0), inp(0)])], [step(0)])
    a = np.arange(1000, dtype=np.float32)
    worker.launch(1, "square", [_stage(folder, "sq", a)], program=square)
    job_id, (status, [total]) = worker.result()
    assert (job_id, status) == (1, "ok")
    assert total == pytest.approx(float(np.dot(a.astype(np.float64), a)), rel=1e-6)
    worker.launch(2, "twice", [_stage(folder, "tw", a)], program=twice)
    assert worker.result() == (2, ("ok", [(a + a).tolist()]))


@pytest.mark.parametrize(("name", "why"), [
    ("missing", "No such file"),
    ("../escape", "not a file name"),
    ("", "not a file name"),
    ("short", "holds 8 bytes, the launch says 4000"),
])
def test_a_bad_file_operand_is_bad_args_and_the_worker_goes_on(
        worker: WorkerPipe, folder: Path, name: str, why: str) -> None:
    (folder / "short.0").write_bytes(b"\0" * 8)
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
        assert pipe.result() == (1, ("error", ("worker_down", "shm_unavailable")))
        a = np.ones(4, np.float32)
        pipe.launch(2, "vector_add", [a.tobytes(), a.tobytes()], result_file=("s1", PART_UNIT))
        assert pipe.result() == (2, ("ok", [2.0] * 4))
    finally:
        assert pipe.close() == 0


def test_a_folder_not_made_by_erlang_is_not_used(tmp_path: Path) -> None:
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep").write_bytes(b"x")
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(other))
    try:
        tag, _, info = pipe.call("hello")
        assert tag == "r"
        assert "a shared-memory folder's name starts with" in bytes(
            info["shm_unavailable"]).decode()
        pipe.launch(1, "reduce", [np.ones(2, np.float32).tobytes()])
        assert pipe.result() == (1, ("ok", 2.0))
        # A launch Erlang wrote before it read the hello names the folder: the worker
        # went without it, and says so as a worker that is down for it (sent again, the
        # launch takes the pipe), not as the caller's bad arguments.
        pipe.launch(2, "reduce", [FileVector("i2-1", 8, part_bytes=4096)])
        assert pipe.result() == (2, ("error", ("worker_down", "shm_unavailable")))
    finally:
        assert pipe.close() == 0
    assert (other / "keep").exists()


def test_a_folder_without_room_for_its_lock_is_not_used_and_the_hello_says_why(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The test worker's full_shm_double: creating the lock fails as in a full tmpfs.
    monkeypatch.setenv("ERLCUDA_TEST_SHM_FULL", "1")
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(folder), module=TEST_WORKER)
    try:
        tag, _, info = pipe.call("hello")
        assert tag == "r" and info["status"] == "ok"
        why = bytes(info["shm_unavailable"]).decode()
        assert "cannot take the folder's lock" in why and "No space left" in why
        assert pipe.call("info")[2]["shm_unavailable"] == info["shm_unavailable"]
        assert pipe.logs == []  # Erlang logs it, from the hello
        a = np.ones(1000, np.float32).tobytes()
        pipe.launch(1, "vector_add", [a, a])
        assert pipe.result() == (1, ("ok", [2.0] * 1000))
    finally:
        assert pipe.close() == 0


def test_a_worker_with_its_folder_says_nothing_of_it(worker: WorkerPipe) -> None:
    tag, _, info = worker.call("hello")
    assert tag == "r" and "shm_unavailable" not in info


@pytest.mark.parametrize("how", ["eof", "sigkill"])
def test_the_folder_goes_when_the_worker_ends(folder: Path, how: str) -> None:
    pipe = WorkerPipe("--backend", "cpu", "--shm-dir", str(folder))
    a = np.ones(10, np.float32)
    pipe.launch(1, "vector_add", [_stage(folder, "i1-1", a), a.tobytes()],
                result_file=result_slot(folder, "s1"))
    assert pipe.result() == (1, ("file", (40, PART_UNIT)))
    (folder / "i9-1.0").write_bytes(b"\0" * 4)  # staged for a job that never ran
    if how == "eof":
        assert pipe.close() == 0
    else:
        os.kill(pipe.proc.pid, signal.SIGKILL)
        assert pipe.close() == -signal.SIGKILL
    assert wait_gone(folder), f"{folder} still holds {list(folder.iterdir())}"


def _aged(path: Path, seconds: float = 3600) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_a_starting_worker_removes_only_folders_nobody_holds(tmp_path: Path) -> None:
    def made(name: str, lock: bool = True, age: float = 3600) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "i1-1").write_bytes(b"x")
        if lock:
            (path / LOCK).write_bytes(b"")
        _aged(path, age)
        return path

    stale = made("erlcuda-1-1")
    unlocked = made("erlcuda-2-1", lock=False)
    young = made("erlcuda-3-1", age=0)
    held = made("erlcuda-4-1")
    holder = os.open(held / LOCK, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a live worker's
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_bytes(b"x")
    (tmp_path / "erlcuda-5-1").symlink_to(victim)
    other = made("other-6-1")
    mine = tmp_path / "erlcuda-7-1"
    mine.mkdir()
    try:
        removed = SharedFolder(str(mine)).sweep_stale()
    finally:
        os.close(holder)
    assert sorted(removed) == ["erlcuda-1-1", "erlcuda-2-1"]
    assert not stale.exists() and not unlocked.exists()
    assert young.exists() and held.exists() and other.exists() and mine.exists()
    assert (victim / "keep").exists() and (tmp_path / "erlcuda-5-1").is_symlink()
    assert oct(mine.stat().st_mode & 0o777) == "0o700"


def _dead_and_live(tmp_path: Path) -> tuple[Path, Path, int]:
    """A folder whose worker and reaper died just now (too young to judge), and one a live
    worker holds; with the fd that holds its lock."""
    dead, live = tmp_path / "erlcuda-1-1", tmp_path / "erlcuda-2-1"
    for path in (dead, live):
        path.mkdir()
        (path / "s1.0").write_bytes(b"x")
        (path / LOCK).write_bytes(b"")
    holder = os.open(live / LOCK, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    return dead, live, holder


def test_a_live_worker_sweeps_again_what_was_too_young_at_its_start(tmp_path: Path) -> None:
    # A node killed with its worker and reaper, and started again within STALE_AFTER_S.
    dead, live, holder = _dead_and_live(tmp_path)
    mine = tmp_path / "erlcuda-3-1"
    mine.mkdir()
    folder = SharedFolder(str(mine))
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        """A fake clock: the first wait ages the folders by ``seconds``, the second stops."""
        waits.append(seconds)
        if len(waits) > 1:
            return True
        for path in (dead, live):
            _aged(path, seconds)
        return False

    try:
        assert folder.sweep_stale() == []  # the sweep at start
        assert dead.exists()
        folder.sweep_every(shm.STALE_AFTER_S, wait)
        assert waits == [shm.STALE_AFTER_S] * 2
        assert not dead.exists()
        assert live.exists() and mine.exists()
    finally:
        os.close(holder)


def test_the_later_sweeps_run_on_their_own_until_stopped(tmp_path: Path) -> None:
    dead, live, holder = _dead_and_live(tmp_path)  # too young for the first sweep
    mine = tmp_path / "erlcuda-3-1"
    mine.mkdir()
    folder = SharedFolder(str(mine))
    sweeps = folder.start_sweeps(every=0.05)
    try:
        assert dead.exists()
        for path in (dead, live):
            _aged(path, 2 * shm.STALE_AFTER_S)
        assert wait_gone(dead)
        assert live.exists() and mine.exists()
    finally:
        folder.stop_sweeps()
        os.close(holder)
    sweeps.join(10)
    assert not sweeps.is_alive()


def test_a_folder_is_removed_with_its_lock_held(tmp_path: Path) -> None:
    # A worker starting on a stale folder while it is removed fails to take its lock,
    # rather than keep a folder that is going.
    dead, _, holder = _dead_and_live(tmp_path)
    os.close(holder)
    _aged(dead, 2 * shm.STALE_AFTER_S)
    mine = tmp_path / "erlcuda-3-1"
    mine.mkdir()
    folder = SharedFolder(str(mine))
    seen: list[bool] = []

    def rmtree(path: str, ignore_errors: bool = False) -> None:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)
        except OSError:
            seen.append(True)
        finally:
            os.close(fd)
        real_rmtree(path, ignore_errors=ignore_errors)

    real_rmtree = shutil.rmtree
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shm.shutil, "rmtree", rmtree)
        assert "erlcuda-1-1" in folder.sweep_stale()
    assert seen[:1] == [True] and not dead.exists()


def _plant(path: Path, kind: str, target: Path) -> None:
    """Put a ``kind`` where a file of the folder is expected."""
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


def _released(path: Path, call: Callable[[], object]) -> tuple[bool, list[object]]:
    """Run ``call`` in a thread: whether it returned by itself, and what it returned. A
    call still blocked on the FIFO ``path`` after 10 s is released (a writer opens it)."""
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(10)
    blocked = thread.is_alive()
    if blocked:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        thread.join(10)
        os.close(fd)
    return not blocked, got


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_stale_folder_whose_lock_is_no_regular_file_is_left_alone(tmp_path: Path,
                                                                     kind: str) -> None:
    # A FIFO as another folder's lock held the starting worker for as long as nobody wrote
    # to it: opened for reading, a FIFO waits for a writer.
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    planted = tmp_path / "erlcuda-1-1"
    planted.mkdir()
    _plant(planted / LOCK, kind, victim)
    _aged(planted)
    mine = tmp_path / "erlcuda-2-1"
    mine.mkdir()
    returned, got = _released(planted / LOCK, SharedFolder(str(mine)).sweep_stale)
    assert returned
    assert got == [[]]
    assert planted.exists() and victim.read_bytes() == b"keep"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_folder_whose_lock_is_no_regular_file_is_not_used(tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    mine = tmp_path / "erlcuda-3-1"
    mine.mkdir()
    _plant(mine / LOCK, kind, victim)
    with pytest.raises(ShmError, match="cannot take the folder's lock"):
        SharedFolder(str(mine))
    assert victim.read_bytes() == b"keep"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_what_stands_at_an_operand_s_path_is_never_followed(worker: WorkerPipe, folder: Path,
                                                            tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(np.ones(1000, np.float32).tobytes())
    _plant(folder / "i1-1.0", kind, victim)
    worker.launch(1, "reduce", [FileVector("i1-1", 4000)])
    job_id, (status, (reason, _)) = worker.result()
    assert (job_id, status, reason) == (1, "error", "bad_args")
    assert victim.read_bytes() == np.ones(1000, np.float32).tobytes()
    worker.launch(2, "reduce", [np.ones(3, np.float32).tobytes()])
    assert worker.result() == (2, ("ok", 3.0))


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_what_stands_at_a_result_s_path_is_never_written(worker: WorkerPipe, folder: Path,
                                                         tmp_path: Path, kind: str) -> None:
    # A result slot is a regular file of its own name: in any other case the result comes
    # through the pipe.
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    _plant(folder / "s1.0", kind, victim)
    a = np.arange(6, dtype=np.float32)
    worker.launch(1, "vector_add", [a.tobytes(), a.tobytes()], result_file=("s1", PART_UNIT))
    assert worker.result() == (1, ("ok", (a * 2).tolist()))
    assert victim.read_bytes() == b"keep"


def test_a_folder_of_another_user_is_never_removed(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder of another user")

    theirs = tmp_path / "erlcuda-8-1"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    _aged(theirs)
    mine = tmp_path / "erlcuda-9-1"
    mine.mkdir()
    assert SharedFolder(str(mine)).sweep_stale() == []
    assert theirs.exists()


def test_a_result_slot_that_cannot_be_mapped_sends_it_through_the_pipe(worker: WorkerPipe,
                                                                 folder: Path) -> None:
    a = np.arange(6, dtype=np.float32)
    worker.launch(9, "reduce", [a.tobytes()])  # the worker is up, with its folder
    assert worker.result() == (9, ("ok", 15.0))
    shutil.rmtree(folder)  # as if shared memory were gone: the slot's file cannot be mapped
    worker.launch(1, "vector_add", [a.tobytes(), a.tobytes()], result_file=("s1", PART_UNIT))
    assert worker.result() == (1, ("ok", (a * 2).tolist()))
    wait_logged(worker, "goes through the pipe")


def test_an_operand_of_many_parts_holds_one_descriptor_at_a_time(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each part is opened, mapped and closed in turn: every part gets the same descriptor
    # (the lowest free one), which it could not while an earlier part was still open.
    page = os.sysconf("SC_PAGE_SIZE")
    a = np.arange(MAX_PARTS * page // 4, dtype=np.float32) % 7
    staged = _stage(folder, "i1-1", a, page)
    fds: list[int] = []
    open_part = shm._open_part

    def recorded(path: str, size: int) -> int:
        fds.append(open_part(path, size))
        return fds[-1]

    monkeypatch.setattr(shm, "_open_part", recorded)
    shared = SharedFolder(str(folder))
    got = shared.open_input(FileArg(staged.name, np.dtype("<f4"), a.nbytes, page))
    np.testing.assert_array_equal(got, a)
    assert len(fds) == MAX_PARTS and len(set(fds)) == 1, fds
    assert [p.name for p in folder.iterdir()] == [".lock"]


@pytest.mark.parametrize("parts", [MAX_PARTS, MAX_PARTS + 1])
def test_an_operand_takes_as_many_parts_as_erlang_cuts_and_no_more(folder: Path,
                                                                  parts: int) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    a = np.ones(parts * page // 4, dtype=np.float32)
    staged = _stage(folder, "i1-1", a, page)
    shared = SharedFolder(str(folder))
    arg = FileArg(staged.name, np.dtype("<f4"), a.nbytes, page)
    if parts <= MAX_PARTS:
        assert shared.open_input(arg).sum() == a.size
    else:
        with pytest.raises(ShmError, match=f"over {MAX_PARTS} parts"):
            shared.open_input(arg)


def test_a_span_outlives_the_interpreter_s_exit(tmp_path: Path) -> None:
    # A lane thread may still read an operand while the worker exits: its span is not
    # unmapped at exit (which faulted), the process's end unmaps it.
    folder = tmp_path / "erlcuda-exit"
    folder.mkdir()
    code = textwrap.dedent(f"""
        import os, sys, threading, time
        import numpy as np
        from erlcuda.shm import FileArg, SharedFolder
        f = SharedFolder({str(folder)!r})
        part = 1 << 20
        for k in range(2):
            with open(os.path.join(f.path, f"x.{{k}}"), "wb") as out:
                out.truncate(part)
        a = f.open_input(FileArg("x", np.dtype("<f4"), 2 * part, part))
        started = threading.Event()
        def read():
            started.set()
            while True:
                a.sum()
        threading.Thread(target=read, daemon=True).start()
        started.wait()
        time.sleep(0.1)
        sys.exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_ENV, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_an_operand_in_parts_cannot_be_made_writable(folder: Path) -> None:
    # Its pages are mapped read-only: a write would kill the worker, so numpy must refuse
    # to make the array writable, as it does for one part.
    page = os.sysconf("SC_PAGE_SIZE")
    shared = SharedFolder(str(folder))
    a = np.arange(3 * page // 4, dtype=np.float32)
    staged = _stage(folder, "i1-1", a, page)
    got = shared.open_input(FileArg("i1-1", np.dtype("<f4"), staged.nbytes, page))
    np.testing.assert_array_equal(got, a)
    with pytest.raises(ValueError):
        got.flags.writeable = True


def test_operands_are_mapped_on_their_devices_thread_not_the_readers(folder: Path) -> None:
    # The reading thread only notes a launch's shared-memory operands: mapping a large
    # launch's parts there held up the frames of other devices behind it (0.5 ms on the
    # H200 machine for 2 x 120 MB). Its device's lane maps and checks them.
    shm = SharedFolder(str(folder))
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        worker = Worker(FrameReader(r), FrameWriter(devnull),
                        Options(backend="cpu", cpu_devices=2), shm)
        arg = FileArg("i1-0", np.dtype("<f4"), 4000, PART_UNIT)
        job = worker.launch(Launch(1, 0, "reduce", [arg]))
        # No part file exists, and yet nothing was opened or refused here.
        assert isinstance(job, Job) and job.plan is None and job.error is None
        assert job.unmapped is not None and job.unmapped.args == [arg] and job.elements == 1000
        worker.lanes[0].prepare(job)
        assert job.error is not None and job.error.reason == "bad_args"
        assert "i1-0" in job.error.detail[0] and job.unmapped is None
        # With the part there, the lane maps it and the request is checked as ever.
        (folder / "i2-0.0").write_bytes(np.arange(1000, dtype="<f4").tobytes())
        job = worker.launch(Launch(2, 1, "reduce", [FileArg("i2-0", np.dtype("<f4"), 4000,
                                                             PART_UNIT)]))
        assert isinstance(job, Job) and job.unmapped is not None
        worker.lanes[1].prepare(job)
        assert job.error is None and job.plan is not None
        assert job.plan.a is not None and job.plan.a.tolist() == list(range(1000))
        assert not (folder / "i2-0.0").exists()  # unlinked once mapped
    finally:
        for fd in (r, w, devnull):
            os.close(fd)


def _operand_slot(folder: Path, name: str, values: np.ndarray) -> FileVector:
    """An operand slot of one part as Erlang writes one (``erlcuda_shm_slots``)."""
    path = folder / f"{name}.0"
    with open(path, "wb") as f:
        f.truncate(PART_UNIT)
    with open(path, "r+b") as f:
        f.write(values.tobytes())
    return FileVector(name, values.nbytes, part_bytes=PART_UNIT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slot_launches_that_repeat_are_read_by_their_template(folder: Path,
                                                              backend: str) -> None:
    """A lone launch naming slots (operands and result) is decoded and checked once; the
    next ones, which name other slots of the same sizes, are read by its template, each
    with its own slots' data, and one naming a slot that is gone is bad_args."""
    replies_r, replies_w = os.pipe()
    dead_r, _dead_w = os.pipe()
    worker = Worker(FrameReader(dead_r), FrameWriter(replies_w),
                    Options(backend=backend, spin_us=0), shm=SharedFolder(str(folder)))
    worker._device = worker.lanes[0].open_here()
    reader = FrameReader(replies_r)
    rng = np.random.default_rng(5)
    try:
        names = ["s1", "s2", "s3"]
        for job_id in range(1, 8):
            a, b = rng.standard_normal((2, 3000), dtype=np.float32)
            x, y, out = names[job_id % 3], names[(job_id + 1) % 3], names[(job_id + 2) % 3]
            result_slot(folder, out)
            frame = launch_frame(job_id, "vector_add", [_operand_slot(folder, x, a),
                                                        _operand_slot(folder, y, b)],
                                 result_file=(out, PART_UNIT))
            worker._take(bytearray(frame))
            (reply,) = parse_results(reader.read() or b"")
            assert (reply.job_id, reply.result) == (job_id, ("file", (a.nbytes, PART_UNIT)))
            np.testing.assert_array_equal(read_slot(folder, out, a.nbytes), a + b)
            assert worker._templates.find_slots(frame) is not None
        frame = launch_frame(9, "vector_add", [_operand_slot(folder, "s1", a),
                                               FileVector("s4", a.nbytes,
                                                          part_bytes=PART_UNIT)],
                             result_file=("s2", PART_UNIT))
        assert worker._templates.find_slots(frame) is not None
        worker._take(bytearray(frame))
        (reply,) = parse_results(reader.read() or b"")
        assert reply.job_id == 9 and reply.result[0] == "error"
        assert reply.result[1][0] == "bad_args" and b"s4.0" in bytes(reply.result[1][1])
    finally:
        worker.lanes[0].close_here(worker._device)
        os.close(replies_r)
        os.close(replies_w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["file", "floats", "over_its_slot"])
def test_a_lone_slot_launch_is_answered_as_a_batch_of_one_would_be(folder: Path,
                                                                     backend: str,
                                                                     case: str) -> None:
    """A lone launch read by its slot template runs by the lane's short path
    (``Lane.run_lone_slots``) and is answered exactly as the same launch in a batch of one
    (``Lane.run_jobs``): its result in its slot, with flag_floats, or through the pipe where
    it is larger than its result slot."""
    replies_r, replies_w = os.pipe()
    dead_r, _dead_w = os.pipe()
    worker = Worker(FrameReader(dead_r), FrameWriter(replies_w),
                    Options(backend=backend, spin_us=0), shm=SharedFolder(str(folder)))
    lane = worker.lanes[0]
    worker._device = lane.open_here()
    reader = FrameReader(replies_r)
    n = PART_UNIT // 4 + 1000 if case == "over_its_slot" else 3000
    a, b = np.random.default_rng(9).standard_normal((2, n), dtype=np.float32)
    part = 2 * PART_UNIT if case == "over_its_slot" else PART_UNIT
    try:
        def operand(name: str, values: np.ndarray) -> FileVector:
            return FileVector(name, write_part(folder, name, values, part), part_bytes=part)

        def answer(job_id: int, out: str, batch: bool) -> tuple[object, np.ndarray]:
            (folder / f"{out}.0").unlink(missing_ok=True)
            result_slot(folder, out)
            frame = launch_frame(job_id, "vector_add", [operand("s1", a), operand("s2", b)],
                                 result_file=(out, PART_UNIT), floats=case == "floats")
            def run() -> None:
                if batch:  # as the worker runs a slot launch it decodes
                    message = protocol.decode(frame)
                    assert isinstance(message, Launch)
                    job = worker.launch(message)
                    assert job is not None
                    lane.prepare(job)
                    lane.run_jobs([job], worker._device)
                else:
                    worker._take(bytearray(frame))

            # a reply larger than the pipe holds is read while it is written; the device
            # stays on this thread, whose context is current
            frames: list[bytes] = []
            reading = threading.Thread(target=lambda: frames.append(bytes(reader.read() or b"")))
            reading.start()
            run()
            reading.join()
            (reply,) = parse_results(frames[0])
            assert reply.job_id == job_id
            return reply.result, read_slot(folder, out, min(a.nbytes, PART_UNIT))

        answer(1, "s3", batch=False)  # its template learned
        assert worker._templates.find_slots(launch_frame(
            2, "vector_add", [operand("s1", a), operand("s2", b)],
            result_file=("s4", PART_UNIT), floats=case == "floats")) is not None
        short, short_slot = answer(2, "s4", batch=False)
        batched, batched_slot = answer(3, "s5", batch=True)
        assert type(short) is type(batched)
        if case == "over_its_slot":
            assert short[0] == "ok" and short[1] == (a + b).astype(float).tolist()
        else:
            assert short == ("file", (a.nbytes, PART_UNIT))
            np.testing.assert_array_equal(short_slot, a + b)
        assert repr(short) == repr(batched)
        np.testing.assert_array_equal(short_slot, batched_slot)
    finally:
        lane.close_here(worker._device)
        os.close(replies_r)
        os.close(replies_w)


def test_a_lone_slot_launch_tells_its_device_what_is_registered(folder: Path) -> None:
    """The short path tells the device its operands and result are registered (so that it
    looks nothing up by address) exactly when a lookup by address would say so: not on
    a slot's first use, and on every use once they are registered. The slots register
    through a double; the right sums land in the result slot each time."""
    pinning = Pinning(cudadouble.Pinner(), Budget(1 << 30))
    worker, replies_r, replies_w = pinned_slot_worker(folder, pinning)
    lane = worker.lanes[0]
    device = worker._device
    told: list[tuple[bool, bool]] = []
    execute = device.execute

    def recording(plans: list[Plan], *args: object, **kwargs: Any) -> list[object]:
        into = kwargs.get("into") or [None]
        hosts = [plans[0].a, plans[0].b, into[0]]
        told.append((bool(kwargs.get("registered")),
                     all(h is not None and pinning.covers(h) for h in hosts)))
        return execute(plans, *args, **kwargs)

    device.execute = recording  # type: ignore[method-assign]
    reader = FrameReader(replies_r)
    outs = {name: result_slot(folder, name, PART_UNIT) for name in ("s3", "s4")}
    try:
        for job_id, out in enumerate([outs[n] for n in ("s3", "s3", "s4", "s4", "s4")], 1):
            a, b = np.random.default_rng(job_id).standard_normal((2, 3000), dtype=np.float32)
            args = [FileVector(name, write_part(folder, name, v), part_bytes=PART_UNIT)
                    for name, v in (("s1", a), ("s2", b))]
            worker._take(bytearray(launch_frame(job_id, "vector_add", args, result_file=out)))
            (reply,) = parse_results(reader.read() or b"")
            assert (reply.job_id, reply.result) == (job_id, ("file", (a.nbytes, PART_UNIT)))
            np.testing.assert_array_equal(read_slot(folder, out[0], a.nbytes), a + b)
        # the first launch teaches the template (a batch of one); s4's first use is not
        # registered yet
        assert told[1:] == [(True, True), (False, False), (True, True), (True, True)]
    finally:
        lane.close_here(device)
        os.close(replies_r)
        os.close(replies_w)


def test_a_slot_template_hit_whose_name_is_not_utf8_is_bad_args(folder: Path) -> None:
    """A frame that matches a learned slot template but names an operand with bytes that
    are not UTF-8 is decoded, and answered bad_args (once), as any other would be; the
    worker goes on."""
    replies_r, replies_w = os.pipe()
    dead_r, _dead_w = os.pipe()
    worker = Worker(FrameReader(dead_r), FrameWriter(replies_w),
                    Options(backend="cpu", spin_us=0), shm=SharedFolder(str(folder)))
    worker._device = worker.lanes[0].open_here()
    reader = FrameReader(replies_r)
    a = np.arange(1000, dtype=np.float32)
    try:
        result_slot(folder, "s3")
        args = [_operand_slot(folder, "s1", a), _operand_slot(folder, "s2", a)]
        worker._take(bytearray(launch_frame(1, "vector_add", args, result_file=("s3", PART_UNIT))))
        assert parse_results(reader.read() or b"")[0].result[0] == "file"
        bad = launch_frame(2, "vector_add", [FileVector(b"s\xff", a.nbytes, part_bytes=PART_UNIT),
                                             args[1]], result_file=("s3", PART_UNIT))
        assert worker._templates.find_slots(bad) is not None
        worker._take(bytearray(bad))
        (reply,) = parse_results(reader.read() or b"")
        assert reply.job_id == 2 and reply.result[1][0] == "bad_args"
        assert b"not UTF-8" in bytes(reply.result[1][1])
        worker._take(bytearray(launch_frame(3, "vector_add", args,
                                            result_file=("s3", PART_UNIT))))
        assert parse_results(reader.read() or b"")[0].job_id == 3
    finally:
        worker.lanes[0].close_here(worker._device)
        os.close(replies_r)
        os.close(replies_w)


def test_without_a_device_a_slot_is_refused_and_left_to_erlang(folder: Path) -> None:
    """A lane with no device has no slots: a launch naming a slot is bad_args, and the
    slot's file (Erlang's) stays; only a job's own files are mapped and unlinked."""
    lane = Lane(0, None, FrameWriter(os.open(os.devnull, os.O_WRONLY)),  # type: ignore[arg-type]
                max_batch=8, max_elements=1 << 20, on_fatal=print, shm=SharedFolder(str(folder)))
    _operand_slot(folder, "s1", np.arange(10, dtype=np.float32))
    job = Job(1)
    lane.prepare_slots(job, [FileArg("s1", np.dtype("<f4"), 40, PART_UNIT)],
                       lambda _: pytest.fail("a plan made without the slot"))
    assert job.plan is None and job.error is not None and job.error.reason == "bad_args"
    assert "no slots without a device" in job.error.detail[0]
    assert (folder / "s1.0").exists()
