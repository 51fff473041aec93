"""Length-prefixed frames through real pipes."""

from __future__ import annotations

import os
import select
import struct
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from erlcuda import etf
from erlcuda.framing import FrameError, FrameReader, FrameWriter
from workerpipe import spawn_on_port_fds


class Pipe:
    """An ``os.pipe()`` whose ends are closed once, whichever test code closes them first."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self._open = {self.r, self.w}
        self._lock = threading.Lock()

    def close(self, fd: int) -> None:
        with self._lock:
            if fd in self._open:
                self._open.discard(fd)
                os.close(fd)

    def close_all(self) -> None:
        for fd in (self.r, self.w):
            self.close(fd)


@contextmanager
def pipe() -> Iterator[Pipe]:
    p = Pipe()
    try:
        yield p
    finally:
        p.close_all()


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    """Run ``fn`` in a thread (a pipe holds only 64 KiB, so writers and readers must overlap)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def finish(thread: threading.Thread) -> None:
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not thread.errors  # type: ignore[attr-defined]


def test_round_trips() -> None:
    big = os.urandom(1 << 20) * 64  # 64 MiB
    frames: list[list[bytes | memoryview]] = [
        [b"hello"],
        [],
        [b""],
        [b"a", memoryview(b"bc"), b"", b"def"],
        [memoryview(big)[: 1 << 20], memoryview(big)[1 << 20 :]],
    ]
    with pipe() as p:
        writer = FrameWriter(p.w)

        def write_all() -> None:
            for chunks in frames:
                writer.write(chunks)
            p.close(p.w)

        thread = in_thread(write_all)
        reader = FrameReader(p.r)
        got = []
        while (frame := reader.read()) is not None:
            got.append(frame)
        finish(thread)
    assert [bytes(f) for f in got[:4]] == [b"hello", b"", b"", b"abcdef"]
    # One preallocated buffer (from the pool, for a large frame), never grown by concatenation.
    assert type(got[4]) is memoryview and len(got[4]) == len(big)
    assert type(got[4].obj) is bytearray
    assert got[4] == big
    assert len(got) == len(frames)


def test_each_frame_is_a_fresh_buffer() -> None:
    with pipe() as p:
        FrameWriter(p.w).write_many([[b"one"], [b"two"]])
        reader = FrameReader(p.r)
        first, second = reader.read(), reader.read()
    assert first == b"one" and second == b"two" and first is not second


def test_non_byte_memoryviews_count_bytes() -> None:
    words = memoryview(struct.pack(">4I", 1, 2, 3, 4)).cast("I")
    with pipe() as p:
        FrameWriter(p.w).write([words])
        assert FrameReader(p.r).read() == struct.pack(">4I", 1, 2, 3, 4)


def test_concurrent_writers_never_interleave() -> None:
    threads, per_thread = 4, 40
    with pipe() as p:
        writer = FrameWriter(p.w)

        def write(tag: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(per_thread):
                    n = (i * 7919) % 200_000 + 1  # many frames larger than the pipe
                    body = bytes((tag,)) * n
                    writer.write([body[: n // 3], body[n // 3 :]])

            return run

        writers = [in_thread(write(t)) for t in range(threads)]
        reader = FrameReader(p.r)
        seen = {t: 0 for t in range(threads)}
        for _ in range(threads * per_thread):
            frame = reader.read()
            assert frame is not None and len(frame) > 0
            assert frame.count(frame[0]) == len(frame)
            seen[frame[0]] += 1
        for thread in writers:
            finish(thread)
    assert seen == {t: per_thread for t in range(threads)}


def test_write_many_beyond_iov_max() -> None:
    iov_max = os.sysconf("SC_IOV_MAX")
    frames = [[bytes((i % 251,))] * 7 for i in range((iov_max * 3) // 7)]
    frames.append([b"x"] * (iov_max + 10))
    with pipe() as p:
        thread = in_thread(lambda: FrameWriter(p.w).write_many(frames))
        reader = FrameReader(p.r)
        for chunks in frames:
            assert reader.read() == b"".join(chunks)
        finish(thread)


def test_clean_eof_is_none() -> None:
    with pipe() as p:
        FrameWriter(p.w).write([b"last"])
        p.close(p.w)
        reader = FrameReader(p.r)
        assert reader.read() == b"last"
        assert reader.read() is None


@pytest.mark.parametrize(
    "data",
    [b"\x00\x00", struct.pack(">I", 10) + b"12345", struct.pack(">I", 1)],
    ids=["header", "body", "empty-body"],
)
def test_truncated_frame(data: bytes) -> None:
    with pipe() as p:
        os.write(p.w, data)
        p.close(p.w)
        with pytest.raises(FrameError):
            FrameReader(p.r).read()


def test_frame_over_the_limit_fails_without_allocating() -> None:
    with pipe() as p:
        os.write(p.w, struct.pack(">I", 0xFFFFFFFF) + b"abc")
        reader = FrameReader(p.r, max_frame=1 << 20)
        tracemalloc.start()
        try:
            with pytest.raises(FrameError):
                reader.read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20


def test_write_to_closed_pipe() -> None:
    with pipe() as p:
        p.close(p.r)
        with pytest.raises(FrameError):
            FrameWriter(p.w).write([b"nobody listens"])


def test_frame_longer_than_32_bits() -> None:
    mib = bytes(1 << 20)
    with pipe() as p, pytest.raises(FrameError):
        FrameWriter(p.w).write([mib] * 4097)  # the same MiB, 4097 times: over 4 GiB


def test_a_large_frame_costs_about_its_size_and_its_buffer_is_reused() -> None:
    body = os.urandom(1 << 20) * 16
    with pipe() as p:
        thread = in_thread(lambda: FrameWriter(p.w).write_many([[body], [body]]))
        reader = FrameReader(p.r)
        tracemalloc.start()
        try:
            frame = reader.read()
            first_peak = tracemalloc.get_traced_memory()[1]
            assert frame == body
            del frame
            tracemalloc.reset_peak()
            again = reader.read()  # the first frame's buffer, already grown, is free again
            second_peak = tracemalloc.get_traced_memory()[1] - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        finish(thread)
    assert again == body
    # Grown as the bytes came: the buffer's spare capacity (an eighth) and one read chunk.
    assert first_peak < len(body) * 9 // 8 + 2 * FrameReader.CHUNK
    assert second_peak < 64 << 10


@pytest.mark.parametrize("announced", [0xFFFFFFFF, 0xFFFFFFF0, 0x7FFFFFFF, 1 << 30,
                                       FrameReader.POOL_MIN - 1])
def test_a_header_alone_commits_no_memory(announced: int) -> None:
    # A lone header made the reader allocate the announced size (4 GiB) before any byte came.
    with pipe() as p:
        os.write(p.w, struct.pack(">I", announced) + b"only this")
        p.close(p.w)
        reader = FrameReader(p.r)  # the default limit: what 4 bytes can say
        tracemalloc.start()
        try:
            with pytest.raises(FrameError, match="end of file inside a frame"):
                reader.read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 2 * FrameReader.CHUNK + (64 << 10)


def test_the_writer_checks_each_frame_on_its_own() -> None:
    with pipe() as p:
        writer = FrameWriter(p.w, max_frame=100)
        with pytest.raises(FrameError, match=r"frame 1 of 101 bytes"):
            writer.write_many([[b"first"], [b"x" * 60, b"y" * 41], [b"z" * 100]])
        p.close(p.w)
        reader = FrameReader(p.r)
        assert reader.read() == b"first"
        assert reader.read() == b"z" * 100
        assert reader.read() is None


def test_large_frame_buffers_are_reused_only_once_no_view_is_left() -> None:
    size = FrameReader.POOL_MIN
    with pipe() as p:
        writer = FrameWriter(p.w)
        thread = in_thread(lambda: [writer.write([bytes([i]) * size]) for i in range(3)])
        reader = FrameReader(p.r)
        first = reader.read()
        second = reader.read()  # the first is still held: another buffer
        assert first is not None and second is not None
        assert first.obj is not second.obj  # type: ignore[union-attr]
        assert bytes(first[:1]) == b"\x00" and bytes(second[:1]) == b"\x01"
        held = first.obj  # type: ignore[union-attr]
        del first
        third = reader.read()  # the first buffer is free again and is refilled
        assert third is not None and third.obj is held  # type: ignore[union-attr]
        assert bytes(third[-1:]) == b"\x02" and bytes(second[-1:]) == b"\x01"
        finish(thread)


def test_a_pooled_buffer_no_frame_used_for_a_while_is_dropped() -> None:
    # Under a mix of frame sizes the pool kept one buffer per size seen: the worker's memory
    # rose in steps for as long as a load ran. Now one idle for POOL_IDLE_S goes.
    size = FrameReader.POOL_MIN
    now = [0.0]
    with pipe() as p:
        writer = FrameWriter(p.w)
        sizes = [size, 3 * size, size, size, 3 * size, 2 * size]
        thread = in_thread(lambda: [writer.write([b"x" * n]) for n in sizes])
        reader = FrameReader(p.r, clock=lambda: now[0])
        small = reader.read()
        assert small is not None
        small_buf = small.obj  # type: ignore[union-attr]
        del small
        big = reader.read()
        assert big is not None
        big_buf = big.obj  # type: ignore[union-attr]
        del big
        assert reader._pool == [small_buf, big_buf]
        now[0] = FrameReader.POOL_IDLE_S  # a sweep: both were used in the period
        again = reader.read()
        assert again is not None and again.obj is small_buf  # type: ignore[union-attr]
        del again
        assert reader._pool == [small_buf, big_buf]
        now[0] = 2 * FrameReader.POOL_IDLE_S  # a sweep: the big one went unused
        held = reader.read()
        assert held is not None and held.obj is small_buf  # type: ignore[union-attr]
        assert reader._pool == [small_buf]
        last = reader.read()  # no free buffer for 3 MiB: a new one
        assert last is not None and last.obj is not big_buf  # type: ignore[union-attr]
        del last
        now[0] = 3 * FrameReader.POOL_IDLE_S  # both used in the period
        assert reader.read() is not None  # 2 MiB: into the new 3 MiB buffer
        assert len(reader._pool) == 2
        now[0] = 4 * FrameReader.POOL_IDLE_S
        reader._sweep()  # the small one went unused, but a view still holds it: kept
        assert reader._pool[0] is small_buf and len(reader._pool) == 2
        del held
        finish(thread)


@pytest.mark.parametrize(("periods", "kept"), [(1, 1), (2, 0)])
def test_an_idle_pooled_buffer_goes_under_small_frames_too(periods: int, kept: int) -> None:
    # Once every large operand travels through shared memory, only small frames come: the
    # pool's idle buffers must still go. Each frame sweeps once a period has passed; the
    # first sweep keeps the buffer (it was used in its period), the second drops it.
    now = [0.0]
    with pipe() as p:
        writer = FrameWriter(p.w)
        sizes = [FrameReader.POOL_MIN] + [100] * periods
        thread = in_thread(lambda: [writer.write([b"x" * n]) for n in sizes])
        reader = FrameReader(p.r, clock=lambda: now[0])
        assert reader.read() is not None  # large: read into a pooled buffer
        for _ in range(periods):
            now[0] += FrameReader.POOL_IDLE_S
            assert reader.read() == b"x" * 100
        assert len(reader._pool) == kept
        finish(thread)


def test_small_frames_that_came_together_are_read_apart() -> None:
    sizes = [0, 1, 3, 4, 5, 100, 4000, 20_000, 70_000, 5]
    bodies = [bytes((i,)) * n for i, n in enumerate(sizes)]
    with pipe() as p:
        thread = in_thread(lambda: FrameWriter(p.w).write_many([[b] for b in bodies]))
        reader = FrameReader(p.r)
        got = [reader.read() for _ in bodies]
        finish(thread)
    assert [bytes(g) for g in got if g is not None] == bodies
    # Each is a buffer of its own, not a view of the read-ahead buffer, which is reused.
    assert all(type(g) is bytearray for g in got[:-2])


def test_pending_after_a_small_frame_asks_only_what_was_read() -> None:
    with pipe() as p:
        writer = FrameWriter(p.w)
        reader = FrameReader(p.r)
        writer.write_many([[b"one"], [b"two"]])
        assert reader.read() == b"one"
        assert reader.pending()  # "two" came in the same read
        assert reader.read() == b"two"
        writer.write([b"three"])
        # What arrives after a small frame's read waits for the next read, without a poll.
        assert not reader.pending()
        assert reader.read() == b"three"


def test_pending_after_a_large_frame_asks_the_pipe() -> None:
    big = bytes(FrameReader.READ_AHEAD * 3)
    with pipe() as p:
        writer = FrameWriter(p.w)
        reader = FrameReader(p.r)
        thread = in_thread(lambda: writer.write([big]))
        assert reader.read() == big
        finish(thread)
        assert not reader.pending()
        writer.write([b"next"])
        assert reader.pending()
        assert reader.read() == b"next"


def test_a_frame_over_the_limit_inside_the_read_ahead_still_fails() -> None:
    with pipe() as p:
        os.write(p.w, struct.pack(">I", 10) + bytes(10))
        with pytest.raises(FrameError, match="over the 9 byte limit"):
            FrameReader(p.r, max_frame=9).read()


@pytest.mark.parametrize("cuts", [[3], [4], [5, 1], [1, 1, 1, 1, 1, 1]])
def test_a_sized_frame_written_in_part_is_finished_in_order(
        cuts: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # A blocking pipe takes a writev whole unless a signal cuts it short: write_sized must
    # then send the rest, once.
    real = os.writev
    left = list(cuts)

    def short(fd: int, bufs: list[bytes | memoryview]) -> int:
        if not left:
            return real(fd, bufs)
        data = b"".join(bytes(b) for b in bufs)[: left.pop(0)]
        return real(fd, [data])

    body = [b"head-", memoryview(b"payload" * 40)]
    size = 5 + 280
    with pipe() as p:
        monkeypatch.setattr(os, "writev", short)
        FrameWriter(p.w).write_sized(body, size)
        monkeypatch.setattr(os, "writev", real)
        assert FrameReader(p.r).read() == b"head-" + b"payload" * 40


def test_a_sized_frame_over_the_limit_is_refused_unwritten() -> None:
    with pipe() as p:
        writer = FrameWriter(p.w, max_frame=4)
        with pytest.raises(FrameError, match="over the 4 byte limit"):
            writer.write_sized([b"12345"], 5)
        writer.write([b"ok"])
        assert FrameReader(p.r).read() == b"ok"


def test_a_sized_frame_to_a_closed_pipe_is_a_frame_error() -> None:
    with pipe() as p:
        p.close(p.r)
        with pytest.raises(FrameError):
            FrameWriter(p.w).write_sized([b"nobody listens"], 14)


def test_pending_after_a_read_that_filled_the_read_ahead_asks_the_pipe() -> None:
    # Frames of 4096 bytes: a full read ahead ends on a frame boundary, while a blocked
    # writer refills the pipe. pending() must see those frames (it once said no, and the
    # worker cut every batch at 16 frames).
    body = bytes(4092)
    with pipe() as p:
        thread = in_thread(lambda: FrameWriter(p.w).write_many([[body]] * 48))
        reader = FrameReader(p.r)
        while True:
            assert reader.read() == body
            if reader._lo == reader._hi:  # the read ahead is used up
                break
        assert reader._hi == FrameReader.READ_AHEAD  # that read filled it
        assert select.select([p.r], [], [], 10)[0]  # more has come meanwhile
        assert reader.pending()
        for _ in range(48 - 16):
            assert reader.read() == body
        finish(thread)


@pytest.mark.parametrize("announced", [0xFFFFFFF0, 0x7FFFFFFF])
def test_a_worker_given_a_header_alone_says_why_and_exits(announced: int) -> None:
    # No JobId to answer: the worker logs the frame it could not read, once, and ends, so
    # that Erlang starts another.
    proc, to_worker, from_worker = spawn_on_port_fds(
        [sys.executable, "-m", "erlcuda", "serve", "--backend", "cpu"])
    os.write(to_worker, struct.pack(">I", announced) + b"J" * 100)
    os.close(to_worker)
    reader = FrameReader(from_worker)
    logs: list[str] = []
    while (frame := reader.read()) is not None:
        term = etf.decode(frame)
        if term[0] == "L":
            logs.append(bytes(term[2]).decode())
    os.close(from_worker)
    assert proc.wait(timeout=60) == 1
    assert [text for text in logs if "port closed" in text] == [
        f"erlcuda.worker: port closed: end of file inside a frame (100 of {announced} bytes)"]
