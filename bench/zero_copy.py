"""A small vector_add copied to the GPU and back, against the kernel run on host memory.

    python bench/zero_copy.py [--n N] [--rounds R] [SIZES...]

No Erlang, the cuda backend only (needs a GPU and PyCUDA). One process opens erlcuda's
device 0 and, at each size (elements; default 1e3, 1e4, 3e4, 1e5, 2.5e5, 5e5), times in
blocks that take turns (``--rounds`` of them, ``--n`` calls each):

- staging, copies: the operands packed into the pinned input staging, copied to the device,
  the kernel, the sum copied back into the output staging (one wait; replayed as a graph
  where the size allows, as ``CudaDevice._add`` does above its measured ``in_place_max``);
- staging, in place: the same packing, then the kernel alone, reading the staging and
  writing the output staging over the bus (replayed as a graph alike);
- staging, packing only: what both of the above spend before the GPU;
- registered, copies: operands and result in a file of /dev/shm registered with the
  driver (a job in slots): both copies in, the kernel, the copy out;
- registered, in place: the kernel alone on the file's pages;
- reduce, copies and reduce, in place: a lone reduce of the first operand from the staging,
  its copy in, the two passes and the sum's copy out, or the passes alone on the staging.

Every mode's answer is checked against numpy before it is timed, its output overwritten
with NaN first. The in-place modes run only where the device takes host pointers. Prints
p10, p50 and p90 in µs per mode and size, and the device's own choice as it opened
(``backends/in_place.py``: ``in_place_max`` and the figures it came from).
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from erlcuda.backends.cuda import CudaBackend  # noqa: E402
from erlcuda.backends.cuda.device import CudaDevice  # noqa: E402
from erlcuda.backends.cuda.kernels import PACK_ALIGN  # noqa: E402
from erlcuda.backends.cuda.transfers import pack  # noqa: E402

SIZES = [1_000, 10_000, 30_000, 100_000, 250_000, 500_000]
Mode = Callable[[], np.ndarray | None]
#: A mode by name, with the output it writes (overwritten with NaN before its check).
Modes = dict[str, tuple[Mode, np.ndarray | None]]


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def staging_modes(dev: CudaDevice, a: np.ndarray, b: np.ndarray) -> Modes:
    """The modes on the device's pinned staging, each replayed as a graph alike."""
    import pycuda.driver as cuda  # the cuda backend is running: PyCUDA is there

    n = int(a.size)
    b_at = round_up(n, PACK_ALIGN)
    dev._ensure_capacity(b_at + n, n)
    host_in, host_out = dev._host_in.array, dev._host_out.array
    d_in, d_out = dev._dev_in.ptr, dev._dev_out.ptr
    h_in, h_out = dev._host_in.ptr, dev._host_out.ptr

    def packed() -> None:
        pack(host_in[:n], a)
        pack(host_in[b_at : b_at + n], b)

    def copies() -> None:
        cuda.memcpy_htod_async(d_in, host_in[: b_at + n], dev.stream)
        dev.launch_vector_add(d_in, d_in + 4 * b_at, d_out, n)
        cuda.memcpy_dtoh_async(host_out[:n], d_out, dev.stream)

    def in_place() -> None:
        dev.launch_vector_add(h_in, h_in + 4 * b_at, h_out, n)

    def sum_copies() -> None:
        cuda.memcpy_htod_async(d_in, host_in[:n], dev.stream)
        dev.launch_reduce(d_in, d_in, n, d_out, dot=False)
        cuda.memcpy_dtoh_async(host_out[:1], d_out, dev.stream)

    def sum_in_place() -> None:
        dev.launch_reduce(h_in, h_in, n, h_out, dot=False)

    def run(key: str, queue: Callable[[], None], out: int) -> Mode:
        def one() -> np.ndarray:
            packed()
            dev._replayed((key, n), n, queue)
            return host_out[:out]
        return one

    def pack_only() -> None:
        packed()

    modes: Modes = {"staging, copies": (run("bench-copies", copies, n), host_out[:n]),
                    "staging, packing only": (pack_only, None),
                    "reduce, copies": (run("bench-sum-copies", sum_copies, 1), host_out[:1])}
    if dev._host_pointers:
        modes["staging, in place"] = (run("bench-in-place", in_place, n), host_out[:n])
        modes["reduce, in place"] = (run("bench-sum-in-place", sum_in_place, 1),
                                     host_out[:1])
    return modes


def registered_modes(dev: CudaDevice, a: np.ndarray, b: np.ndarray,
                     folder: Path) -> tuple[Modes, Callable[[], None]]:
    """The modes on a registered file's pages, and what releases the file."""
    import pycuda.driver as cuda

    n = int(a.size)
    span = round_up(4 * n, 4096)
    path = folder / f"zero-copy-{n}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 3 * span)
        mapping = mmap.mmap(fd, 3 * span)
    finally:
        os.close(fd)
        path.unlink()  # the mapping keeps the pages
    pages = np.frombuffer(mapping, np.uint8)
    sa, sb, sc = (pages[i * span : i * span + 4 * n].view(np.float32) for i in range(3))
    sa[:], sb[:] = a, b
    if not dev.pinning.pin(pages):
        raise SystemExit(f"could not register {3 * span} bytes of {path}")
    d_in, d_out = dev._dev_in.ensure(2 * n), dev._dev_out.ensure(n)
    address = [int(x.__array_interface__["data"][0]) for x in (sa, sb, sc)]

    def copies() -> np.ndarray:
        cuda.memcpy_htod_async(d_in, sa, dev.stream)
        cuda.memcpy_htod_async(d_in + 4 * n, sb, dev.stream)
        dev.launch_vector_add(d_in, d_in + 4 * n, d_out, n)
        cuda.memcpy_dtoh_async(sc, d_out, dev.stream)
        dev.stream.synchronize()
        return sc

    def in_place() -> np.ndarray:
        dev.launch_vector_add(*address, n)
        dev.stream.synchronize()
        return sc

    def release() -> None:
        dev.pinning.unpin(pages)

    modes: Modes = {"registered, copies": (copies, sc)}
    if dev._host_pointers:
        modes["registered, in place"] = (in_place, sc)
    return modes, release


def check(modes: Modes, sums: np.ndarray, total: float) -> None:
    """Each mode's answer, its output overwritten with NaN before it ran: the sums exact,
    the reduce's total within f32's rounding over a sum of small integers."""
    for name, (mode, out) in modes.items():
        for _ in range(20):  # graphs captured, caches warm
            mode()
        if out is None:
            continue
        out[:] = np.nan
        got = mode()
        assert got is not None
        right = (abs(float(got[0]) - total) <= 1e-5 * total if got.size == 1
                 else np.array_equal(got, sums))
        if not right:
            raise SystemExit(f"{name}: wrong answer at {sums.size} elements")


def timed(modes: Modes, calls: int, rounds: int) -> dict[str, list[float]]:
    """Blocks of ``calls`` of each mode in turn, ``rounds`` times; µs per call."""
    clock = time.perf_counter_ns
    samples: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, (mode, _) in modes.items():
            mode()  # a block's first call follows another mode's work: not timed
            for _ in range(calls):
                t0 = clock()
                mode()
                samples[name].append((clock() - t0) / 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="calls per block")
    parser.add_argument("--rounds", type=int, default=10, help="blocks of each mode")
    parser.add_argument("sizes", type=int, nargs="*", default=SIZES)
    args = parser.parse_args()
    backend = CudaBackend(ROOT / "kernels")
    dev = backend.open(0)
    folder = Path(tempfile.mkdtemp(prefix="erlcuda-zero-copy-",
                                   dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    print(f"{dev.info()['name']}: in place where the device takes host pointers: "
          f"{dev._host_pointers}; chosen as it opened: up to {dev.in_place_max} elements"
          + (f" ({dev.in_place_error})" if dev.in_place_error else ""))
    for t in dev.in_place_timings:
        print(f"  at open {t.elements:>9}: copies {t.copies_s * 1e6:8.1f}  "
              f"in place {t.in_place_s * 1e6:8.1f} µs (medians)")
    try:
        for n in args.sizes:
            i = np.arange(n)
            a, b = (i % 97).astype(np.float32), (i * 2 % 97).astype(np.float32)
            modes = staging_modes(dev, a, b)
            shared, release = registered_modes(dev, a, b, folder)
            try:
                modes |= shared
                check(modes, a + b, float(a.astype(np.float64).sum()))
                for name, values in timed(modes, args.n, args.rounds).items():
                    p10, p50, p90 = np.percentile(values, [10, 50, 90])
                    print(f"{n:>9} {name:<24} p10 {p10:8.1f}  p50 {p50:8.1f}  "
                          f"p90 {p90:8.1f} µs")
            finally:
                release()
    finally:
        folder.rmdir()
        dev.close()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
