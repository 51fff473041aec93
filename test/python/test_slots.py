"""Shared-memory files kept from job to job (``slots.py``): Erlang's operand slots, mapped
once and registered from their second use, and the worker's result buffers, linked under
each result's name and used again once Erlang deleted that name. Registrations go through
a double (``cudadouble.Pinner``) and are undone on every way a slot or buffer goes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

import cudadouble
from erlcuda import shm, slots
from erlcuda.hostmem import Budget, Pinning
from erlcuda.shm import PART_UNIT, FileArg, SharedFolder, ShmError
from erlcuda.slots import IDLE_S, OperandSlots, ResultBuffers

F32 = np.dtype("<f4")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def folder(tmp_path: Path) -> SharedFolder:
    path = tmp_path / f"erlcuda-slots-{os.getpid()}"
    path.mkdir()
    return SharedFolder(str(path))


def write_slot(folder: SharedFolder, name: str, values: np.ndarray, part_bytes: int) -> FileArg:
    """Write ``values`` into slot ``name`` as erlcuda_shm_slots does: part files of
    ``part_bytes`` each (made that long once), rewritten from their start."""
    data = values.astype(F32).tobytes()
    for k in range(max(1, -(-len(data) // part_bytes))):
        path = Path(folder.path) / f"{name}.{k}"
        with open(path, "r+b" if path.exists() else "w+b") as f:
            f.truncate(part_bytes)
            f.write(data[k * part_bytes : (k + 1) * part_bytes])
    return FileArg(name, F32, len(data), part_bytes)


def test_only_erlang_s_slot_names_are_slots() -> None:
    assert OperandSlots.owns("s0") and OperandSlots.owns("s12345")
    for name in ("s", "short", "s1-2", "i7-1", "s\u00b2", "r3"):
        assert not OperandSlots.owns(name)


def test_a_slot_is_mapped_once_and_its_files_stay(folder: SharedFolder) -> None:
    kept = OperandSlots(folder)
    page = os.sysconf("SC_PAGE_SIZE")
    a = np.arange(3 * page // 4 + 10, dtype=np.float32)  # three parts of one page, one short
    arg = write_slot(folder, "s1", a, page)
    np.testing.assert_array_equal(kept.open(arg), a)
    b = -a
    write_slot(folder, "s1", b, page)  # the same files written again
    view = kept.open(arg)
    np.testing.assert_array_equal(view, b)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view.setflags(write=True)
    assert sorted(os.listdir(folder.path)) == [".lock", "s1.0", "s1.1", "s1.2", "s1.3"]
    assert len(kept) == 1


def test_a_slot_grows_by_the_parts_a_larger_operand_takes(folder: SharedFolder) -> None:
    kept = OperandSlots(folder)
    page = os.sysconf("SC_PAGE_SIZE")
    small = np.ones(page // 4, np.float32)
    np.testing.assert_array_equal(kept.open(write_slot(folder, "s2", small, page)), small)
    large = np.arange(5 * page // 4, dtype=np.float32)
    np.testing.assert_array_equal(kept.open(write_slot(folder, "s2", large, page)), large)


def test_a_slot_is_registered_from_its_second_use(folder: SharedFolder) -> None:
    pinner = cudadouble.Pinner()
    pinning = Pinning(pinner, Budget(1 << 30))
    kept = OperandSlots(folder, pinning)
    arg = write_slot(folder, "s3", np.ones(1000, np.float32), PART_UNIT)
    first = kept.open(arg)
    assert pinner.pinned == 0 and not pinning.covers(first)
    second = kept.open(arg)
    assert pinner.pinned == 1 and pinning.covers(second)
    kept.open(arg)
    assert pinner.pinned == 1  # once


@pytest.mark.parametrize("how", ["deleted", "idle", "closed"])
def test_a_slot_s_registration_goes_with_the_slot(folder: SharedFolder, how: str) -> None:
    pinner = cudadouble.Pinner()
    clock = Clock()
    kept = OperandSlots(folder, Pinning(pinner, Budget(1 << 30)), clock)
    arg = write_slot(folder, "s4", np.ones(10, np.float32), PART_UNIT)
    kept.open(arg)
    kept.open(arg)
    assert len(pinner.live) == 1
    kept.sweep()
    assert len(pinner.live) == 1  # in use and its files there: kept
    if how == "deleted":  # Erlang deleted the slot (its job's caller died, say)
        os.unlink(os.path.join(folder.path, "s4.0"))
        kept.sweep()
    elif how == "idle":
        clock.now += IDLE_S + 1
        kept.sweep()
    else:
        kept.close()
    assert pinner.live == {} and len(kept) == 0


def test_a_slot_part_of_the_wrong_size_is_refused(folder: SharedFolder) -> None:
    kept = OperandSlots(folder)
    (Path(folder.path) / "s5.0").write_bytes(b"\0" * 100)
    with pytest.raises(ShmError, match="holds 100 bytes"):
        kept.open(FileArg("s5", F32, 100, PART_UNIT))


def test_a_slot_part_that_is_a_symlink_is_refused(folder: SharedFolder, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"\0" * PART_UNIT)
    os.symlink(target, Path(folder.path) / "s6.0")
    with pytest.raises(ShmError):
        OperandSlots(folder).open(FileArg("s6", F32, 16, PART_UNIT))


def test_a_result_buffer_is_linked_under_the_result_s_name(folder: SharedFolder) -> None:
    pool = ResultBuffers(folder, 0)
    target = pool.take(4000)
    assert target is not None
    values = np.arange(1000, dtype=np.float32)
    target.view(F32)[:] = values
    record = target.commit(7)
    assert record == shm.FileResult(4000, PART_UNIT)
    data = (Path(folder.path) / "r7.0").read_bytes()
    assert len(data) == PART_UNIT  # a whole buffer: Erlang reads the record's length
    np.testing.assert_array_equal(np.frombuffer(data[:4000], F32), values)


def test_a_buffer_is_used_again_once_erlang_deleted_its_result(folder: SharedFolder) -> None:
    pool = ResultBuffers(folder, 0)
    first = pool.take(4000)
    assert first is not None
    first.commit(1)
    second = pool.take(4000)  # the first is still being read: another buffer
    assert second is not None
    second.commit(2)
    assert len(pool) == 2
    os.unlink(os.path.join(folder.path, "r1.0"))  # Erlang has read it
    third = pool.take(100)
    assert third is not None
    third.commit(3)
    assert len(pool) == 2
    assert os.path.samefile(os.path.join(folder.path, "r3.0"),
                            os.path.join(folder.path, "p0-0"))


def test_a_released_buffer_is_free_at_once(folder: SharedFolder) -> None:
    pool = ResultBuffers(folder, 0)
    target = pool.take(10)
    assert target is not None and pool.take(10) is not target
    target.release()
    assert len(pool) == 2
    pool.take(10)
    assert len(pool) == 2


def test_nothing_is_written_through_what_stands_at_a_result_s_name(folder: SharedFolder,
                                                                  tmp_path: Path) -> None:
    pool = ResultBuffers(folder, 0)
    target = pool.take(8)
    assert target is not None
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, Path(folder.path) / "r9.0")
    with pytest.raises(ShmError):
        target.commit(9)
    assert victim.read_bytes() == b"keep"
    assert pool.take(8) is not None and len(pool) == 1  # released


def test_result_buffers_are_registered_and_unregistered_with_them(
        folder: SharedFolder) -> None:
    pinner = cudadouble.Pinner()
    clock = Clock()
    pool = ResultBuffers(folder, 0, Pinning(pinner, Budget(1 << 30)), clock=clock)
    target = pool.take(PART_UNIT + 1)
    assert target is not None and target.pinned
    assert list(pinner.live.values()) == [2 * PART_UNIT]
    target.commit(1)
    clock.now += IDLE_S + 1
    pool.sweep()
    assert len(pinner.live) == 1  # Erlang has not read it yet: kept
    os.unlink(os.path.join(folder.path, "r1.0"))
    pool.sweep()
    assert pinner.live == {} and len(pool) == 0
    assert sorted(os.listdir(folder.path)) == [".lock"]


def test_buffers_stay_within_their_bytes(folder: SharedFolder) -> None:
    pool = ResultBuffers(folder, 0, limit=3 * PART_UNIT)
    big = pool.take(2 * PART_UNIT)
    assert big is not None
    assert pool.take(2 * PART_UNIT) is None  # no room, the first is in use
    big.release()
    assert pool.take(PART_UNIT) is not None  # made room: the free one went
    assert pool.bytes <= 3 * PART_UNIT


def test_a_full_dev_shm_gives_no_buffer(folder: SharedFolder,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    pool = ResultBuffers(folder, 0)
    assert pool.take(100) is None
    assert sorted(os.listdir(folder.path)) == [".lock"]


def test_closing_drops_every_buffer_but_results_not_yet_read(folder: SharedFolder) -> None:
    pinner = cudadouble.Pinner()
    pool = ResultBuffers(folder, 0, Pinning(pinner, Budget(1 << 30)))
    taken = pool.take(10)
    assert taken is not None
    taken.commit(5)
    assert pool.take(10) is not None
    pool.close()
    assert pinner.live == {}
    assert sorted(os.listdir(folder.path)) == [".lock", "r5.0"]


def test_the_sweep_interval_is_short_of_the_idle_time() -> None:
    assert slots.SWEEP_S < IDLE_S
