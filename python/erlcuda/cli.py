"""``python -m erlcuda``: serve the Erlang port, or run kernels standalone for debugging.

    python -m erlcuda devices [--backend auto|cpu|cuda]
    python -m erlcuda run vector_add --size 1000 [--backend cpu|cuda] [--device 0]
    python -m erlcuda serve [--backend ...] [--cpu-devices N] [--max-batch N]
                            [--buffer-limit BYTES]
    python -m erlcuda --version

``serve`` is what Erlang starts (a port with nouse_stdio: frames on fds 3 and 4); from a
shell it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from . import __version__, contract, hostmem, kernels, logs, portenv
from .backends import select
from .backends.base import BackendError, BackendUnavailable
from .framing import FrameReader, FrameWriter
from .shm import SharedFolder, ShmError
from .worker import Extension, Options, Worker

#: Exit status of ``serve`` outside an Erlang port (and of a command-line mistake).
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m erlcuda", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"erlcuda {__version__} (protocol {contract.PROTOCOL})")
    sub = parser.add_subparsers(dest="command", required=True)

    def backend_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
        p.add_argument("--cpu-devices", type=_int_in(1, contract.MAX_DEVICES), default=1,
                       metavar="N")

    backend_args(sub.add_parser("devices", help="list the devices a backend sees"))
    run = sub.add_parser("run", help="run one kernel on random data and time it")
    run.add_argument("kernel", choices=kernels.KERNELS)
    run.add_argument("--size", type=int, default=1000,
                     help="vector length (matmul: the side of square matrices)")
    run.add_argument("--device", type=int, default=0)
    run.add_argument("--repeat", type=int, default=10)
    backend_args(run)
    serve = sub.add_parser("serve", help="port mode: frames on fds 3 (in) and 4 (out)")
    backend_args(serve)
    serve.add_argument("--max-batch", type=_int_in(1, 1 << 31), default=256,
                       help="largest batch (1 turns batching off)")
    serve.add_argument("--spin-us", type=_int_in(-1, 1 << 31), default=-1, metavar="US",
                       help="device threads poll this long for more work before sleeping "
                            "(default: 300 on the cuda backend, 0 on cpu)")
    serve.add_argument("--device-thread", action="store_true",
                       help="run a lone device on a thread of its own, handed each job by "
                            "the reading thread (default: the reading thread runs it)")
    serve.add_argument("--shm-dir", metavar="DIR",
                       help="the worker's shared-memory folder (an erlcuda-* folder that "
                            "Erlang made): large operands and results travel through it")
    serve.add_argument("--shm-keep-ms", type=_int_in(1, 86_400_000), default=10_000,
                       metavar="MS",
                       help="shared-memory files kept from job to job (operand slots, result "
                            "buffers) go once unused this long")
    serve.add_argument("--pin-limit", type=_bytes, default=None, metavar="BYTES",
                       help="most bytes of host memory registered with the GPU at once "
                            f"(default: an eighth of the memory, at most "
                            f"{hostmem.MAX_DEFAULT_LIMIT >> 30} GiB; 0: none)")
    serve.add_argument("--buffer-limit", type=_bytes, default=0, metavar="BYTES",
                       help="most bytes of buffers kept on each device (0: no limit but the "
                            "device's memory); past it a launch that keeps a vector gets "
                            "{cuda, out_of_memory, _}")
    serve.add_argument("--switch-interval-us", type=_int_in(0, 1 << 31), default=0,
                       metavar="US",
                       help="the interpreter's thread switch interval (0: Python's default)")
    return parser


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argument type: an integer from ``low`` to ``high``. A value the worker cannot use
    is a command-line mistake (exit status 2, which Erlang reports as ``bad_config``), not
    a worker that starts and fails for ever."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}")
        return value
    return parse


def _bytes(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of bytes")
    return value


def _devices(args: argparse.Namespace) -> int:
    backend, reason = select(args.backend, cpu_devices=args.cpu_devices)
    print(reason)
    for i in range(backend.device_count()):
        device = backend.open(i)
        try:
            print(f"device {i}: {device.info()}")
        finally:
            device.close()
    backend.close()
    return 0


def _run(args: argparse.Namespace) -> int:
    backend, reason = select(args.backend, cpu_devices=args.cpu_devices)
    print(reason)
    if not 0 <= args.device < backend.device_count():
        print(f"error: no device {args.device} ({backend.device_count()} present)",
              file=sys.stderr)
        return EXIT_USAGE
    rng = np.random.default_rng(0)
    n = args.size
    if args.kernel == "matmul":
        job = [rng.standard_normal(n * n, dtype=np.float32),
               rng.standard_normal(n * n, dtype=np.float32), n, n, n]
    else:
        job = [rng.standard_normal(n, dtype=np.float32) for _ in range(2)]
        job = job[:1] if args.kernel == "reduce" else job
    request = kernels.parse(args.kernel, job)
    device = backend.open(args.device)
    try:
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            (result,) = device.execute([request])
            times.append(time.perf_counter() - t0)
        if isinstance(result, np.ndarray):
            summary = f"{result.size} floats, first {np.array2string(result[:4], precision=4)}"
        else:
            summary = f"{result:.6g}"
        print(f"{args.kernel} size {n} on {backend.name}:{args.device}: {summary}")
        print(f"time: median {np.median(times) * 1e6:.1f} us, min {min(times) * 1e6:.1f} us "
              f"over {len(times)} runs")
    finally:
        device.close()
        backend.close()
    return 0


def _widen_pipes(size: int = 1 << 20) -> None:
    """Larger pipe buffers: fewer wake-ups per large frame. Best effort, Linux only."""
    for fd in (3, 4):
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
        except OSError:
            pass  # not a pipe, or over /proc/sys/fs/pipe-max-size: keep the default


def _serve(args: argparse.Namespace, extensions: Mapping[str, Extension]) -> int:
    # Before anything makes a file descriptor: the first new ones would be fds 3 and 4.
    try:
        portenv.check_port_fds()
    except portenv.PortEnvError as exc:
        print(f"erlcuda serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    portenv.die_with_parent()
    if portenv.keep_freed_memory():
        portenv.HeapTrim().start()
    _widen_pipes()
    writer = FrameWriter(4)
    logs.to_erlang(writer)
    logs.capture_std_streams()
    if args.switch_interval_us:
        sys.setswitchinterval(args.switch_interval_us / 1e6)
    if args.pin_limit is not None:
        hostmem.BUDGET.limit = args.pin_limit
    options = Options(backend=args.backend, cpu_devices=args.cpu_devices,
                      max_batch=args.max_batch, spin_us=args.spin_us,
                      device_thread=args.device_thread, buffer_limit=args.buffer_limit,
                      shm_keep_s=args.shm_keep_ms / 1000)
    shm, no_shm = _shared_folder(args.shm_dir) if args.shm_dir else (None, None)
    worker = Worker(FrameReader(3), writer, options, shm, extensions, shm_unavailable=no_shm)
    return worker.serve(once_open=portenv.settle_heap)


def _shared_folder(path: str) -> tuple[SharedFolder | None, str | None]:
    """The worker's shared-memory folder, with its reaper, and the stale folders beside it
    swept now and while the worker lives; or none and why (its lock held, the folder gone,
    no thread to sweep with). Not logged here: the hello says why, and Erlang, which then sends
    everything through the pipe, logs it once."""
    try:
        shm = SharedFolder(path)
        shm.start_reaper()
        shm.start_sweeps()
    except (ShmError, OSError, RuntimeError) as exc:  # RuntimeError: no thread to be had
        return None, str(exc)
    return shm, None


def main(argv: Sequence[str] | None = None,
         extensions: Mapping[str, Extension] | None = None) -> int:
    """The command line. ``extensions`` are calls that ``serve``'s worker adds to its own
    (``worker.Extension``): another package's entry point runs the worker with them."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "devices": _devices, "run": _run,
        "serve": lambda a: _serve(a, extensions or {})}
    try:
        return commands[args.command](args)
    except (BackendUnavailable, BackendError, kernels.BadArgs) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
