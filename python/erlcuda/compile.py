"""The one compile cache: CUDA source to a cubin (nvcc), or to a shared library for the host
(the C++ compiler), compiled once per content and kept on disk.

Every image the worker loads comes from here: the built-in kernels (``kernels/*.cu``,
compiled for each device's architecture as the CUDA backend starts) and user code
(``usercode.compile_module`` for a GPU, ``usercode.compile_host`` for the cpu backend,
which check a user's source and options first). An entry's key hashes the source, the
options, the target (an architecture, or ``host``), the compiler's version and the
preprocessed source, so that a changed header is compiled again; an entry is read back
only where it is whole, this user's, and named for its key (``_read_entry``). A cubin is
loaded into each device's own context by the backend (PyCUDA ``module_from_buffer``), a
host library into each CPU device (``backends/hostlib.py``).

A cubin needs nvcc, not PyCUDA or a GPU; a host library needs g++ alone. Errors:
``CompileError`` (the compiler refused the source; ``.log`` is its message), ``NoCompiler``
(no nvcc, or no g++), ``ValueError`` (a bad architecture or a NUL byte in the source,
before a compiler runs).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "CompileError",
    "Compiled",
    "NoCompiler",
    "arch_of",
    "cache_dir",
    "cubin",
    "cubin_entry",
    "default_arch",
    "find_cxx",
    "find_nvcc",
    "host_library",
    "host_library_entry",
]

log = logging.getLogger("erlcuda.compile")

#: Seconds a compiler may take on one source.
NVCC_TIMEOUT = 300
#: The name nvcc sees the source under: its messages say ``kernel.cu(LINE): error: ...``
#: (and g++'s ``kernel.cu:LINE:COLUMN: error: ...``).
SOURCE_NAME = "kernel.cu"
#: The name of the file g++ compiles for a host library (which includes the source).
UNIT_NAME = "erlcuda_unit.cpp"
_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")

#: nvcc's intermediate files (/tmp/tmpxft_00001a2b_00000000-6_kernel.ptx): the prefix goes.
_TEMP_NAME = re.compile(r"\S*tmpxft_[0-9a-fA-F]+_[0-9a-fA-F]+-[0-9]+_")


class CompileError(Exception):
    """The compiler did not compile a source; ``log`` is what it said."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


class NoCompiler(Exception):
    """nvcc was not found (neither on PATH nor in ``$CUDA_HOME/bin``), or for a host build
    no C++ compiler (g++ on PATH)."""


class Compiled(NamedTuple):
    """A cubin, and whether the cache held it (``cache_hit``) or nvcc made it."""

    image: bytes
    cache_hit: bool


# -- compiling ------------------------------------------------------------------------------


def default_arch() -> str:
    """The architecture to compile for without a GPU to ask: ``$ERLCUDA_ARCH``, else sm_90."""
    return os.environ.get("ERLCUDA_ARCH") or "sm_90"


def arch_of(capability: tuple[int, int]) -> str:
    """The nvcc architecture of a compute capability: (9, 0) -> ``sm_90``."""
    return f"sm_{capability[0]}{capability[1]}"


def find_nvcc() -> str:
    """nvcc's path: on PATH, else ``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            return str(Path(home) / "bin" / "nvcc")
    raise NoCompiler("nvcc not found: put it on PATH or set CUDA_HOME")


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoCompiler(f"cannot run {nvcc}: {exc}") from exc
    if proc.returncode != 0:
        raise NoCompiler(f"{nvcc} --version failed: {proc.stderr.strip()}")
    return proc.stdout


def cache_dir() -> Path:
    """Where compiled images are kept: ``$ERLCUDA_CACHE_DIR``, else
    ``~/.cache/erlcuda/kernels``."""
    env = os.environ.get("ERLCUDA_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "erlcuda" / "kernels"


def cubin(source: str, options: Sequence[str], arch: str, *,
          include_dirs: Sequence[str | os.PathLike[str]] = (),
          cache: str | os.PathLike[str] | None = None,
          progress: Callable[[float], None] | None = None) -> bytes:
    """A cubin of ``source`` for ``arch`` (``sm_90``), compiled by ``nvcc --cubin`` with the
    extra ``options`` (taken as they are: the caller checks them) and headers found in
    ``include_dirs``, or the one cached under ``cache`` (default ``cache_dir()``) for the
    same source, preprocessed text, options, architecture and nvcc version. A cache that
    cannot be written is skipped. ``progress(seconds)`` is called every ``PROGRESS_EVERY``
    seconds while nvcc runs."""
    return cubin_entry(source, options, arch, include_dirs=include_dirs, cache=cache,
                       progress=progress).image


def cubin_entry(source: str, options: Sequence[str], arch: str, *,
                include_dirs: Sequence[str | os.PathLike[str]] = (),
                cache: str | os.PathLike[str] | None = None,
                progress: Callable[[float], None] | None = None) -> Compiled:
    """``cubin``, saying whether the cache held it."""
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"bad architecture {arch!r:.40}: expected one like sm_90")
    if "\0" in source:
        raise ValueError("the source holds a NUL byte")
    opts = [*options, *(f"-I{Path(d).resolve()}" for d in include_dirs)]
    nvcc = find_nvcc()
    # The files a source includes are part of what is compiled, and only the preprocessor
    # knows which (an include has many spellings): the key holds its output, so that a
    # changed header is compiled again, for one preprocessor run, a fraction of a compile.
    expanded = _nvcc(nvcc, source, opts, arch, preprocess=True)
    key = _key([source, opts, arch, _nvcc_version(nvcc), hashlib.sha256(expanded).hexdigest()])
    return _cached(key, "cubin", cache, lambda: _nvcc(
        nvcc, source, opts, arch, **({"progress": progress} if progress else {})))


def find_cxx() -> str:
    """The host's C++ compiler: g++ on PATH, the one nvcc runs for host code too."""
    found = shutil.which("g++")
    if found:
        return found
    raise NoCompiler("g++ not found: install the C++ compiler (Debian: apt-get install g++)")


@functools.cache
def _cxx_version(cxx: str) -> str:
    """The compiler's version and the machine it compiles for: a library is built for both."""
    answers = []
    for flag in ("--version", "-dumpmachine"):
        try:
            proc = subprocess.run([cxx, flag], capture_output=True, text=True, timeout=60,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NoCompiler(f"cannot run {cxx}: {exc}") from exc
        if proc.returncode != 0:
            raise NoCompiler(f"{cxx} {flag} failed: {proc.stderr.strip()}")
        answers.append(proc.stdout)
    return "".join(answers)


def host_library(unit: str, options: Sequence[str], *, files: Mapping[str, str] | None = None,
                 include_dirs: Sequence[str | os.PathLike[str]] = (),
                 check: Callable[[str], None] | None = None,
                 cache: str | os.PathLike[str] | None = None,
                 progress: Callable[[float], None] | None = None) -> bytes:
    """``host_library_entry``'s library."""
    return host_library_entry(unit, options, files=files, include_dirs=include_dirs,
                              check=check, cache=cache, progress=progress).image


def host_library_entry(unit: str, options: Sequence[str], *,
                       files: Mapping[str, str] | None = None,
                       include_dirs: Sequence[str | os.PathLike[str]] = (),
                       check: Callable[[str], None] | None = None,
                       cache: str | os.PathLike[str] | None = None,
                       progress: Callable[[float], None] | None = None) -> Compiled:
    """A shared library of the C++ ``unit`` for this host, built by g++ (``-shared
    -fPIC``) with the extra ``options`` (taken as they are: the caller makes them), the
    ``files`` it includes (by name: written beside it) and headers found in
    ``include_dirs``, or the one cached under ``cache`` (default ``cache_dir()``) for the
    same texts, preprocessed text, options and compiler. Before anything is compiled or
    read from the cache, ``check(text)`` sees the preprocessed text and may raise.
    ``progress`` as for ``cubin``."""
    texts = {UNIT_NAME: unit, **(files or {})}
    if any("\0" in text for text in texts.values()):
        raise ValueError("the source holds a NUL byte")
    opts = [*options, *(f"-I{Path(d).resolve()}" for d in include_dirs)]
    cxx = find_cxx()
    expanded = _cxx(cxx, texts, opts, preprocess=True)
    if check is not None:
        check(expanded.decode("utf-8", "replace"))
    key = _key(["host", sorted(texts.items()), opts, _cxx_version(cxx),
                hashlib.sha256(expanded).hexdigest()])
    return _cached(key, "so", cache, lambda: _cxx(
        cxx, texts, opts, **({"progress": progress} if progress else {})))


def _key(parts: list[object]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _cached(key: str, suffix: str, cache: str | os.PathLike[str] | None,
            build: Callable[[], bytes]) -> Compiled:
    """The entry of ``key`` in the cache folder (a hit), else ``build()``, stored there
    where the folder may be used."""
    folder = Path(cache) if cache is not None else cache_dir()
    usable = _private_folder(folder)
    entry = folder / f"{key}.{suffix}"
    found = _read_entry(entry, key) if usable else None
    if found is not None:
        return Compiled(found, cache_hit=True)
    image = build()
    if usable:
        _store(entry, _entry_head(key, image) + image)
    return Compiled(image, cache_hit=False)


#: How often a long compile reports that it is still running (the worker turns that into a
#: log line, which also tells Erlang's watchdog that the worker is alive).
PROGRESS_EVERY = 5.0


def _wait(proc: subprocess.Popen[str], progress: Callable[[float], None] | None,
          tool: str = "nvcc") -> str:
    """The compiler's output once it exits; killed past ``NVCC_TIMEOUT``."""
    start = time.monotonic()
    while True:
        try:
            out, _ = proc.communicate(timeout=PROGRESS_EVERY)
            return out or ""
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if elapsed > NVCC_TIMEOUT:
                proc.kill()
                proc.communicate()
                raise CompileError(f"{tool} took longer than {NVCC_TIMEOUT} s") from None
            if progress is not None:
                progress(elapsed)


def _nvcc(nvcc: str, source: str, options: list[str], arch: str, *,
          preprocess: bool = False, progress: Callable[[float], None] | None = None) -> bytes:
    """The cubin of ``source``, or with ``preprocess`` its preprocessed text."""
    out = "kernel.ii" if preprocess else "kernel.cubin"
    return _run(nvcc, ["-E" if preprocess else "--cubin", f"-arch={arch}", *options,
                       "-o", out, SOURCE_NAME], {SOURCE_NAME: source}, out, progress)


#: What makes a host build a library the worker can load, and unload again (a symbol of
#: GNU's "unique" binding would keep it mapped for good).
HOST_LIBRARY = ("-shared", "-fPIC", "-fno-gnu-unique")


def _cxx(cxx: str, texts: Mapping[str, str], options: list[str], *, preprocess: bool = False,
         progress: Callable[[float], None] | None = None) -> bytes:
    """The shared library of ``texts[UNIT_NAME]`` (which includes the other texts), or
    with ``preprocess`` its preprocessed text."""
    out = "kernel.ii" if preprocess else "kernel.so"
    return _run(cxx, ["-x", "c++", *(["-E"] if preprocess else HOST_LIBRARY), *options,
                      "-o", out, UNIT_NAME], texts, out, progress)


def _run(tool: str, args: list[str], texts: Mapping[str, str], out_name: str,
         progress: Callable[[float], None] | None) -> bytes:
    """Run ``tool args`` in a private temporary folder holding ``texts`` (file name ->
    text): the bytes it wrote to ``out_name``; ``CompileError`` with its message where it
    failed."""
    name = Path(tool).name
    with tempfile.TemporaryDirectory(prefix=f"erlcuda-{name}-") as tmp:
        for file_name, text in texts.items():
            (Path(tmp) / file_name).write_text(text, encoding="utf-8")
        try:
            # Run inside the temporary folder, so that messages name the file alone, and keep
            # the compiler's intermediate files there too (it puts them in $TMPDIR). The C
            # locale keeps the log ASCII: in a UTF-8 one g++ quotes names with curly quotes,
            # which an Erlang shell printing the error with ~p cannot show.
            env = {**os.environ, "TMPDIR": tmp, "LC_ALL": "C"}
            proc = subprocess.Popen([tool, *args], cwd=tmp, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    encoding="utf-8", errors="replace")
        except OSError as exc:
            raise NoCompiler(f"cannot run {tool}: {exc}") from exc
        output = _wait(proc, progress, name)
        log = _TEMP_NAME.sub("", output.replace(tmp + os.sep, "")).strip()
        if proc.returncode != 0:
            raise CompileError(log or f"{name} failed with status {proc.returncode}")
        try:
            return (Path(tmp) / out_name).read_bytes()
        except OSError as exc:
            raise CompileError(f"{name} wrote no {out_name}: {log}") from exc


# -- the cache ------------------------------------------------------------------------------
#
# An entry is a header, then the image: the header names the key the entry was written for
# and the image's sha256, so that a file under another key's name, or a partial one, is a
# miss. The folder and its entries must be this user's, and no one else may write to the
# folder: a cubin from the cache runs on the GPU, a host library in the worker itself, with
# this user's rights.

_ENTRY_MAGIC = b"erlcuda-cubin 1\n"


def _entry_head(key: str, cubin: bytes) -> bytes:
    return b"%s%s %s\n" % (_ENTRY_MAGIC, key.encode(), hashlib.sha256(cubin).hexdigest().encode())


_ENTRY_HEAD = len(_entry_head("0" * 64, b""))


def _private_folder(folder: Path) -> bool:
    """Whether the cache may use ``folder``: made (mode 0700) where missing, else a folder of
    this user that neither its group nor others may write to."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        log.warning("the kernel cache %s is not used: it must be a folder of this user that "
                    "no other may write to (chmod go-w)", folder)
        return False
    return True


def _read_entry(path: Path, key: str) -> bytes | None:
    """The cubin that ``path`` holds for ``key``; None where there is none, where the entry
    is not a regular file of this user (a symlink is not followed), or where its header
    names another key or another cubin."""
    try:
        # Without blocking: a FIFO there would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return None
            data = f.read()
    except OSError:
        return None
    cubin = data[_ENTRY_HEAD:]
    return cubin if data[:_ENTRY_HEAD] == _entry_head(key, cubin) else None


def _store(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees all of it or nothing), over
    whatever is there, a symlink included (the link is replaced, not its target)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
