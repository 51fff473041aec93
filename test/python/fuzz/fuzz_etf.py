"""Atheris harness for the ETF decoder: nothing but ``CodecError`` may escape ``decode``.

    pip install atheris
    python test/python/fuzz/fuzz_etf.py -max_total_time=60 [corpus_dir]

Not a pytest module (pytest only collects ``test_*.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))

with atheris.instrument_imports():
    from erlcuda.etf import CodecError, decode, encode_bytes


def TestOneInput(data: bytes) -> None:
    # Give inputs the version byte so that the fuzzer spends its time on the tags.
    if data[:1] != b"\x83":
        data = b"\x83" + data
    try:
        term = decode(data, max_depth=32)
    except CodecError:
        return
    # Whatever decodes must encode again (map keys and all), and decode to the same bytes.
    again = encode_bytes(term)
    assert encode_bytes(decode(again)) == again


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
