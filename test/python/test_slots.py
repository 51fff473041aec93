"""Shared-memory files kept from job to job (``slots.py``): Erlang's slots, mapped once and
registered from their second use, read as operands and written as results. Registrations
go through a double (``cudadouble.Pinner``) and are undone on every way a slot goes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import cudadouble
from erlcuda import shm, slots
from erlcuda.hostmem import Budget, Pinning
from erlcuda.shm import PART_UNIT, FileArg, ResultSlot, SharedFolder, ShmError
from erlcuda.slots import IDLE_S, OperandSlots

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


def make_slot(folder: SharedFolder, name: str, part_bytes: int = PART_UNIT) -> ResultSlot:
    """A result slot as erlcuda_shm_slots makes one: its part file, a part long."""
    with open(Path(folder.path) / f"{name}.0", "wb") as f:
        f.truncate(part_bytes)
    return ResultSlot(name, part_bytes)


def test_a_result_is_written_from_its_slot_s_start(folder: SharedFolder) -> None:
    kept = OperandSlots(folder)
    target = kept.result(make_slot(folder, "s7"), 4000)
    values = np.arange(1000, dtype=np.float32)
    target.view(F32)[:] = values
    assert target.commit() == shm.FileResult(4000, PART_UNIT)
    data = (Path(folder.path) / "s7.0").read_bytes()
    assert len(data) == PART_UNIT  # Erlang's file, as long as it made it
    np.testing.assert_array_equal(np.frombuffer(data[:4000], F32), values)
    # the next job that takes the slot writes over it: the same mapping
    again = kept.result(ResultSlot("s7", PART_UNIT), 8)
    again.view(F32)[:] = [5.0, 6.0]
    assert (Path(folder.path) / "s7.0").read_bytes()[:8] == np.float32([5, 6]).tobytes()
    assert len(kept) == 1


@pytest.mark.parametrize(("name", "nbytes", "why"), [
    ("s1", PART_UNIT + 4, "over its slot's"),
    ("i1-1", 8, "is not a slot"),
    ("s404", 8, "No such file"),
])
def test_a_result_slot_that_cannot_take_the_result_is_refused(folder: SharedFolder, name: str,
                                                              nbytes: int, why: str) -> None:
    make_slot(folder, "s1")
    with pytest.raises(ShmError, match=why):
        OperandSlots(folder).result(ResultSlot(name, PART_UNIT), nbytes)


def test_nothing_is_written_through_what_stands_at_a_result_slot_s_path(
        folder: SharedFolder, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, Path(folder.path) / "s9.0")
    with pytest.raises(ShmError):
        OperandSlots(folder).result(ResultSlot("s9", PART_UNIT), 4)
    assert victim.read_bytes() == b"keep"


def test_a_result_slot_is_registered_from_its_second_use_and_unregistered_with_it(
        folder: SharedFolder) -> None:
    pinner = cudadouble.Pinner()
    clock = Clock()
    kept = OperandSlots(folder, Pinning(pinner, Budget(1 << 30)), clock=clock)
    slot = make_slot(folder, "s2", 2 * PART_UNIT)
    assert not kept.result(slot, PART_UNIT + 1).pinned
    assert kept.result(slot, PART_UNIT + 1).pinned
    assert list(pinner.live.values()) == [2 * PART_UNIT]
    clock.now += IDLE_S + 1
    kept.sweep()
    assert pinner.live == {} and len(kept) == 0
    assert sorted(os.listdir(folder.path)) == [".lock", "s2.0"]  # Erlang's: left be


def test_the_sweep_interval_is_short_of_the_idle_time() -> None:
    assert slots.SWEEP_S < IDLE_S


def test_a_slot_whose_first_part_never_mapped_is_still_refused(folder: SharedFolder) -> None:
    """A slot whose first part could not be mapped is refused again by the next launch
    that names it, however few bytes that launch says it holds."""
    kept = OperandSlots(folder)
    arg = FileArg("s8", F32, 0, PART_UNIT)
    for _ in range(2):  # s8.0 is missing both times
        with pytest.raises(ShmError):
            kept.open(arg)


def test_a_slot_whose_growth_failed_is_registered_in_full_later(folder: SharedFolder) -> None:
    """A slot registered with one part, then grown by a launch that failed on a later part,
    has its mapped parts registered whole by the next launch within them."""
    pinner = cudadouble.Pinner()
    pinning = Pinning(pinner, Budget(1 << 30))
    kept = OperandSlots(folder, pinning)
    one = write_slot(folder, "s7", np.ones(10, np.float32), PART_UNIT)
    kept.open(one)
    kept.open(one)  # registered from its second use: one part
    assert list(pinner.live.values()) == [PART_UNIT]
    two = write_slot(folder, "s7", np.ones(PART_UNIT // 4 + 10, np.float32), PART_UNIT)
    with pytest.raises(ShmError):  # three parts named, the third not there
        kept.open(FileArg("s7", F32, 2 * PART_UNIT + 40, PART_UNIT))
    assert pinning.covers(kept.open(two))


def test_what_slots_say_is_registered_is_what_the_pinning_covers(folder: SharedFolder) -> None:
    """``registered`` (what a lane tells its device) agrees with a lookup by address in
    every state a slot passes through: first use, registered, grown past its registration,
    refused by the budget, not a slot, and gone."""
    pinner = cudadouble.Pinner()
    pinning = Pinning(pinner, Budget(2 * PART_UNIT))
    kept = OperandSlots(folder, pinning)
    small = write_slot(folder, "s9", np.ones(100, np.float32), PART_UNIT)
    other = write_slot(folder, "s10", np.ones(100, np.float32), PART_UNIT)

    def agree(args: list[FileArg], want: bool) -> None:
        views = [kept.open(arg) for arg in args]
        assert kept.registered(args) is want
        assert all(pinning.covers(v) for v in views) is want

    agree([small, other], False)  # first use: mapped, not yet registered
    agree([small, other], True)
    grown = write_slot(folder, "s9", np.ones(PART_UNIT // 4 + 10, np.float32), PART_UNIT)
    assert kept.registered([grown, other]) is False  # more parts than its registration
    agree([grown, other], False)  # the budget has no room for its two parts: refused
    agree([small, other], False)  # and not tried again
    agree([other], True)
    assert kept.registered([FileArg("s404", F32, 400, PART_UNIT)]) is False
    assert kept.registered([FileArg("i7-1", F32, 400, PART_UNIT)]) is False


def test_a_view_of_a_slot_replaced_under_its_name_is_not_called_registered(
        folder: SharedFolder) -> None:
    """One launch naming a slot at two part sizes (a frame Erlang never writes): the first
    view's slot is dropped, unregistered, when the second maps; ``registered`` does not
    vouch for it, as the lookup by address does not."""
    pinner = cudadouble.Pinner()
    pinning = Pinning(pinner, Budget(1 << 30))
    kept = OperandSlots(folder, pinning)
    small = write_slot(folder, "s11", np.ones(100, np.float32), PART_UNIT)
    kept.open(small)
    first = kept.open(small)  # registered from its second use
    assert pinning.covers(first)
    for k in range(2):  # the same name, made again at twice the part size
        (Path(folder.path) / f"s11.{k}").unlink(missing_ok=True)
    large = write_slot(folder, "s11", np.ones(100, np.float32), 2 * PART_UNIT)
    kept.open(large)
    kept.open(large)
    assert not pinning.covers(first)
    assert kept.registered([large]) and not kept.registered([small, large])
