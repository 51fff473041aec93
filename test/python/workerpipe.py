"""Drive a real ``python -m erlcuda serve`` through pipes on its fds 3 and 4, as Erlang does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from erlcuda import etf
from erlcuda.etf import Atom, Opaque
from erlcuda.framing import FrameReader, FrameWriter

ROOT = Path(__file__).resolve().parents[2]
# A real pid as erl encodes it (NEW_PID_EXT of nonode@nohost), so replies carry a true pid.
PID = Opaque(bytes.fromhex("58770d6e6f6e6f6465406e6f686f7374000000510000000000000000"))


class WorkerPipe:
    """A worker started with ``args``; ``record`` keeps every frame received and term sent."""

    def __init__(self, *args: str, record: bool = False) -> None:
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()
        high = [os.dup(fd) for fd in (to_child_r, from_child_w)]  # keep clear of 3 and 4

        def remap() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "erlcuda", "serve", *args], pass_fds=(3, 4),
            preexec_fn=remap, env=env, stdin=subprocess.DEVNULL)
        for fd in (to_child_r, from_child_w, *high):
            os.close(fd)
        self.writer = FrameWriter(self._to_child_w)
        self.reader = FrameReader(self._from_child_r)
        self.logs: list[tuple[str, str]] = []
        self.record = record
        self.received: list[bytes] = []
        self.sent: list[Any] = []
        self._next_call = 1

    def send(self, term: Any) -> None:
        if self.record:
            self.sent.append(term)
        self.writer.write(etf.encode(term))

    def launch(self, job_id: int, kernel: str, args: list[Any], *, device: int = 0,
               fmt: str = "list") -> None:
        self.send((Atom("M"), (Atom("launch"), job_id, PID, device, Atom(kernel), args,
                               {Atom("format"): Atom(fmt), Atom("trace"): False})))

    def receive(self) -> Any:
        """The next frame that is not a log line."""
        while True:
            frame = self.reader.read()
            assert frame is not None, "worker closed its output"
            if self.record:
                self.received.append(bytes(frame))
            term = etf.decode(frame)
            if term[0] == "L":
                self.logs.append((str(term[1]), bytes(term[2]).decode()))
                continue
            return term

    def result(self) -> tuple[int, Any]:
        """(JobId, Result) of the next reply."""
        tag, pid, (erlcuda, job_id, result) = self.receive()
        assert (tag, pid, erlcuda) == ("M", PID, "erlcuda")
        return job_id, result

    def call(self, function: str, *args: Any) -> Any:
        call_id = self._next_call
        self._next_call += 1
        self.send((Atom("C"), call_id, Atom("erlcuda"), Atom(function), list(args)))
        while True:
            term = self.receive()
            if term[0] in ("r", "e") and term[1] == call_id:
                return term
            raise AssertionError(f"unexpected frame {term!r:.200}")

    def close(self) -> int:
        os.close(self._to_child_w)
        try:
            while self.reader.read() is not None:
                pass
        finally:
            os.close(self._from_child_r)
        return self.proc.wait(timeout=20)
