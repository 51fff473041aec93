"""``python -m erlcuda`` as a process: --version, serve outside Erlang, a parent that dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import erlcuda
from erlcuda import contract

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))


def erlcuda_cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "erlcuda", *args], env=ENV, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=30,
                          check=False, **kwargs)  # type: ignore[call-overload]


def test_version() -> None:
    done = erlcuda_cli("--version")
    assert done.returncode == 0
    assert done.stdout == f"erlcuda {erlcuda.__version__} (protocol {contract.PROTOCOL})\n"


def test_serve_from_a_shell_says_it_runs_under_erlang() -> None:
    # fds 3 and 4 closed, as from a shell: it used to capture its own output there and hang.
    done = erlcuda_cli("serve", "--backend", "cpu", close_fds=True)
    assert done.returncode == 2
    assert "fd 3 is not open; fd 4 is not open" in done.stderr
    assert "runs under Erlang" in done.stderr and "nouse_stdio" in done.stderr
    assert done.stdout == ""


def test_serve_with_files_on_fds_3_and_4_refuses_them() -> None:
    with tempfile.TemporaryFile() as f3, tempfile.TemporaryFile() as f4:
        def remap() -> None:
            os.dup2(f3.fileno(), 3)
            os.dup2(f4.fileno(), 4)

        done = erlcuda_cli("serve", "--backend", "cpu", pass_fds=(3, 4), preexec_fn=remap)
    assert done.returncode == 2
    assert "fd 3 is not a pipe or a socket; fd 4 is not a pipe or a socket" in done.stderr


# A parent that starts a worker as Erlang does (fds 3 and 4 pipes), waits for the answer to an
# info call (the worker is serving, past its start-up), prints the worker's pid and sleeps.
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    high = [os.dup(fd) for fd in (to_child_r, from_child_w)]

    def remap():
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    worker = subprocess.Popen([sys.executable, "-m", "erlcuda", "serve", "--backend", "cpu"],
                              pass_fds=(3, 4), preexec_fn=remap, stdin=subprocess.DEVNULL)
    for fd in (to_child_r, from_child_w, *high):
        os.close(fd)
    call = b"\\x83h\\x05w\\x01Ca\\x01w\\x07erlcudaw\\x04infoj"  # {'C', 1, erlcuda, info, []}
    os.write(to_child_w, len(call).to_bytes(4, "big") + call)
    assert len(os.read(from_child_r, 4)) == 4
    print(worker.pid, flush=True)
    time.sleep(600)
""")


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its new parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "running"])
def test_the_worker_dies_with_its_parent(stopped: bool) -> None:
    # A stopped worker never reads the end of its input, so only the kernel can end it.
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=ENV, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    try:
        if stopped:
            os.kill(worker, signal.SIGSTOP)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while not gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(worker)
    finally:
        if not gone(worker):
            os.kill(worker, signal.SIGKILL)
        parent.stdout.close()


def test_a_worker_whose_parent_is_already_gone_exits_at_once() -> None:
    code = textwrap.dedent("""
        import os
        from erlcuda import portenv
        portenv.die_with_parent(parent=os.getppid())
        print("parent alive", flush=True)
        portenv.die_with_parent(parent=-1)  # as if the parent had died before prctl
        print("orphan still running", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                          text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (1, "parent alive\n", "")
