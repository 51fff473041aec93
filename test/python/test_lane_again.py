"""A lane's reading of a lone job in slots, kept for the next (``Lane._again``): a job
that names the slots the last one did, through the same template, while the slots stay as
they were, runs on the plan, result target and registration read for the last one, and
reads its own data from the slots' pages; anything that changes the slots, or the job,
reads them again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudadouble
from erlcuda.framing import FrameReader
from erlcuda.hostmem import Budget, Pinning
from erlcuda.lanes import Lane
from erlcuda.shm import PART_UNIT, FileArg
from erlcuda.slots import IDLE_S
from erlcuda.worker import Worker
from workerpipe import (
    FileVector,
    launch_frame,
    parse_results,
    pinned_slot_worker,
    read_slot,
    result_slot,
    write_part,
)


@dataclass
class Rig:
    """A worker on the cpu backend whose slots register through a double, as the cuda
    backend's do, and a count of the lane's readings of slots."""

    worker: Worker
    lane: Lane
    folder: Path
    reader: FrameReader
    readings: list[int]


@contextmanager
def rig_with(tmp_path: Path, budget: int) -> Iterator[Rig]:
    """A ``Rig`` whose slots may register ``budget`` bytes."""
    folder = tmp_path / "erlcuda-again"
    folder.mkdir()
    worker, replies_r, replies_w = pinned_slot_worker(
        folder, Pinning(cudadouble.Pinner(), Budget(budget)))
    lane = worker.lanes[0]
    device = worker._device
    readings: list[int] = []
    read = lane._read_slots

    def counted(*args: Any, **kwargs: Any) -> Any:
        readings.append(1)
        return read(*args, **kwargs)

    lane._read_slots = counted  # type: ignore[method-assign]
    try:
        yield Rig(worker, lane, folder, FrameReader(replies_r), readings)
    finally:
        lane.close_here(device)
        for fd in (replies_r, replies_w):
            os.close(fd)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with rig_with(tmp_path, 1 << 30) as made:
        yield made


def add(rig: Rig, job_id: int, x: str, y: str, out: str, seed: int) -> None:
    """A lone vector_add of new data in slots ``x`` and ``y`` into slot ``out``, answered
    with the right sum there."""
    a, b = np.random.default_rng(seed).standard_normal((2, 3000), dtype=np.float32)
    args = [FileVector(name, write_part(rig.folder, name, v), part_bytes=PART_UNIT)
            for name, v in ((x, a), (y, b))]
    frame = launch_frame(job_id, "vector_add", args, result_file=(out, PART_UNIT))
    rig.worker._take(bytearray(frame))
    (reply,) = parse_results(rig.reader.read() or b"")
    assert (reply.job_id, reply.result) == (job_id, ("file", (a.nbytes, PART_UNIT)))
    np.testing.assert_array_equal(read_slot(rig.folder, out, a.nbytes), a + b)


def test_a_repeated_job_runs_on_its_reading_with_its_own_data(rig: Rig) -> None:
    """Once its slots are registered, the same job again reads nothing: each job's sum is
    of its own operands, and each use of a slot is counted (its idle time starts again)."""
    result_slot(rig.folder, "s3")
    for job_id in range(1, 7):
        add(rig, job_id, "s1", "s2", "s3", seed=job_id)
    # the first teaches the template (a batch of one); the second registers the slots
    assert len(rig.readings) == 1
    slots = rig.lane.slots
    assert slots is not None
    assert [slots._slots[n].uses for n in ("s1", "s2", "s3")] == [6, 6, 6]


def test_a_slot_used_for_the_first_time_is_read_until_it_is_registered(rig: Rig) -> None:
    """A new slot in the job (another result slot) is read again until it is registered:
    its second use registers it."""
    result_slot(rig.folder, "s3")
    result_slot(rig.folder, "s4")
    for job_id, out in enumerate(["s3", "s3", "s3", "s4", "s4", "s4"], 1):
        add(rig, job_id, "s1", "s2", out, seed=job_id)
    assert len(rig.readings) == 3  # s3's second use, then s4's first and second


def test_slots_swept_are_read_again(rig: Rig) -> None:
    """Slots dropped by the lane's sweep (idle) take the kept reading with them: the next
    job maps them afresh and gets its right sum."""
    result_slot(rig.folder, "s3")
    for job_id in range(1, 4):
        add(rig, job_id, "s1", "s2", "s3", seed=job_id)
    assert rig.lane._again is not None
    rig.lane.housekeep(now=rig.lane._sweep_at + 10 * IDLE_S + 1e6)
    assert rig.lane._again is None
    before = len(rig.readings)
    add(rig, 4, "s1", "s2", "s3", seed=4)
    assert len(rig.readings) == before + 1


def test_other_slots_or_another_result_are_read(rig: Rig) -> None:
    """A job naming other operand slots, or another result slot, is read."""
    for name in ("s3", "s6"):
        result_slot(rig.folder, name)
    for job_id in range(1, 4):
        add(rig, job_id, "s1", "s2", "s3", seed=job_id)
    before = len(rig.readings)
    add(rig, 4, "s2", "s1", "s3", seed=4)  # the operands' slots swapped
    add(rig, 5, "s1", "s2", "s6", seed=5)
    assert len(rig.readings) == before + 2


def test_a_result_slot_that_could_not_be_had_is_tried_again(rig: Rig) -> None:
    """A job whose result slot cannot be mapped (its file is not there) is answered
    through the pipe, and its reading is not kept: once the slot is there, the next job's
    result goes into it."""
    result_slot(rig.folder, "s3")
    for job_id in range(1, 3):
        add(rig, job_id, "s1", "s2", "s3", seed=job_id)
    a, b = np.random.default_rng(3).standard_normal((2, 3000), dtype=np.float32)
    args = [FileVector(name, write_part(rig.folder, name, v), part_bytes=PART_UNIT)
            for name, v in (("s1", a), ("s2", b))]
    rig.worker._take(bytearray(launch_frame(3, "vector_add", args,
                                            result_file=("s7", PART_UNIT))))
    (reply,) = parse_results(rig.reader.read() or b"")
    assert reply.job_id == 3 and reply.result[0] == "ok"
    np.testing.assert_allclose(np.array(reply.result[1], np.float32), a + b)
    result_slot(rig.folder, "s7")
    add(rig, 4, "s1", "s2", "s7", seed=4)


def test_a_slot_whose_registration_changed_is_read_again(tmp_path: Path) -> None:
    """A slot of the kept reading that another use grew past what the budget may register
    (its registration redone, and refused) is read again: the next job is not told that
    memory no longer registered is."""
    with rig_with(tmp_path, 3 * PART_UNIT) as rig:
        result_slot(rig.folder, "s3")
        for job_id in range(1, 4):
            add(rig, job_id, "s1", "s2", "s3", seed=job_id)
        assert rig.lane._again is not None and rig.lane._again.registered
        slots = rig.lane.slots
        assert slots is not None
        with open(rig.folder / "s1.1", "wb") as f:  # a second part, as Erlang grows a slot
            f.truncate(PART_UNIT)
        slots.open(FileArg("s1", np.dtype("<f4"), PART_UNIT + 4, PART_UNIT))
        assert slots._slots["s1"].pinned == 0 and slots._slots["s1"].refused
        before = len(rig.readings)
        add(rig, 4, "s1", "s2", "s3", seed=4)
        assert len(rig.readings) == before + 1
        assert rig.lane._again is not None and not rig.lane._again.registered
