"""Every atom the worker can send must already exist on the Erlang side.

Erlang decodes the worker's frames with ``binary_to_term(B, [safe])``, which fails on an
atom the node has never seen: one stray atom would make a reply undecodable and lose a job.
"""

from __future__ import annotations

import re
from pathlib import Path

from erlcuda import protocol
from erlcuda.backends.base import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]


def erlang_atoms() -> set[str]:
    source = (ROOT / "erlang" / "erlcuda_port.erl").read_text()
    body = source.split("\nworker_atoms() ->", 1)[1].split("].", 1)[0]
    body = re.sub(r"%[^\n]*", "", body)
    return {atom.strip().strip("'") for atom in body.strip(" \n[").split(",")}


def python_atoms() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "python" / "erlcuda").rglob("*.py"):
        found |= set(re.findall(r'Atom\("([^"]+)"\)', path.read_text()))
    found |= set(ERROR_CODES) | set(protocol.LEVELS)
    # device info keys, which the worker turns into atoms
    found |= {"name", "total_memory", "free_memory", "compute_capability"}
    found |= {"cpu", "cuda"}  # backend names
    return found


def test_every_worker_atom_is_known_to_erlang() -> None:
    missing = python_atoms() - erlang_atoms()
    assert not missing, f"add to erlcuda_port:worker_atoms/0: {sorted(missing)}"


def test_device_info_keys_are_covered() -> None:
    from erlcuda.backends.cpu import CpuBackend

    keys = set(CpuBackend(1).open(0).info())
    assert keys <= erlang_atoms()
