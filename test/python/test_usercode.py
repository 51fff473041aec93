"""User code: elementwise sources, nvcc compiles and the on-disk cubin cache (no GPU needed).

Tests that run nvcc skip where it is not installed; the rest (names, types, options, the
cache's behaviour with nvcc stubbed out) run everywhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from erlcuda import compile as compiler
from erlcuda import usercode
from erlcuda.usercode import CompileError, NoCompiler, compile_module, elementwise_source

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
ARCH = "sm_90"
TYPES = list(usercode.C_TYPES)

SAXPY = elementwise_source(
    "saxpy", [("a", "f32", "scalar"), ("x", "f32", "vector"), ("y", "f32", "vector")],
    [("z", "f32")], "z = a * x + y")

RAW = """
extern "C" __global__ void scale(float* x, float a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


def is_cubin(image: bytes, *names: str) -> bool:
    return image[:4] == b"\x7fELF" and all(name.encode() in image for name in names)


# -- the generated source --------------------------------------------------------------------


def test_elementwise_signature_and_body() -> None:
    head = SAXPY.split("void saxpy(", 1)[1].split(") {")[0]
    # Inputs in order (scalars by value, vectors as const pointers), outputs, then n.
    assert [p.strip() for p in head.split(",")] == [
        "const float a",
        "const float* __restrict__ erlcuda_x",
        "const float* __restrict__ erlcuda_y",
        "float* __restrict__ erlcuda_z",
        "const long long n",
    ]
    assert 'extern "C" __global__ void saxpy(' in SAXPY
    assert "const float x = erlcuda_x[i];" in SAXPY
    assert "erlcuda_z[i] = z;" in SAXPY
    assert "z = a * x + y" in SAXPY


@needs_nvcc
@pytest.mark.parametrize(
    ("inputs", "outputs", "operation"),
    [
        ([("a", "f32", "scalar"), ("x", "f32", "vector"), ("y", "f32", "vector")],
         [("z", "f32")], "z = a * x + y"),
        ([("x", "f64", "vector"), ("k", "i32", "vector")], [("z", "f64"), ("w", "i64")],
         "z = x * k; w = (long long)k * i - n"),
        ([("b", "u8", "vector"), ("s", "u32", "scalar")], [("c", "u8")], "c = b ^ (s & 0xff)"),
        ([("x", "i64", "vector"), ("d", "f64", "scalar")], [("q", "u32"), ("r", "f32")],
         "q = (unsigned int)(x % 7); r = sqrtf((float)d) + expf(-1.0f)"),
        ([], [("z", "i32")], "z = (int)i"),
        ([(f"v{t}", t, "vector") for t in TYPES] + [(f"s{t}", t, "scalar") for t in TYPES],
         [(f"o{t}", t) for t in TYPES],
         "; ".join(f"o{t} = v{t} + s{t}" for t in TYPES)),
    ],
    ids=["saxpy", "f64-i32-to-f64-i64", "u8-u32", "i64-f64-math", "no-inputs", "all-types"],
)
def test_elementwise_compiles(inputs: list[tuple[str, str, str]],
                              outputs: list[tuple[str, str]], operation: str,
                              tmp_path: Path) -> None:
    image = compile_module(elementwise_source("ew", inputs, outputs, operation), [], ARCH,
                           cache=tmp_path)
    assert is_cubin(image, "ew")


@needs_nvcc
def test_bad_operation_is_a_compile_error_naming_it(tmp_path: Path) -> None:
    source = elementwise_source("bad", [("x", "f32", "vector")], [("z", "f32")],
                                "z = x +\n  undeclared_thing")
    with pytest.raises(CompileError) as info:
        compile_module(source, [], ARCH, cache=tmp_path)
    log = info.value.log
    assert "undeclared_thing" in log and "error" in log, log
    assert "operation(2)" in log, log  # the line of the operation, not of the generated file
    assert "/tmp" not in log and "erlcuda-nvcc-" not in log, log  # no temporary paths
    assert str(info.value) == log
    assert not list(tmp_path.iterdir())  # nothing cached


@needs_nvcc
def test_raw_source_error_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as info:
        compile_module(RAW + "\nint broken = ;\n", [], ARCH, cache=tmp_path)
    assert f"{usercode.SOURCE_NAME}(7): error" in info.value.log, info.value.log


@needs_nvcc
def test_raw_source_with_options(tmp_path: Path) -> None:
    image = compile_module(RAW, ["-O3", "--use_fast_math", "-DUNUSED=1", "-lineinfo"], ARCH,
                           cache=tmp_path)
    assert is_cubin(image, "scale")


@needs_nvcc
def test_a_macro_from_the_options_is_compiled_in(tmp_path: Path) -> None:
    source = RAW.replace("x[i] *= a", "x[i] *= a * WIDTH")  # no WIDTH: does not compile
    with pytest.raises(CompileError, match="WIDTH"):
        compile_module(source, ["-O3"], ARCH, cache=tmp_path)
    image = compile_module(source, ["-DWIDTH=4", "-O3", "--use_fast_math"], ARCH,
                           cache=tmp_path)
    assert is_cubin(image, "scale")


@needs_nvcc
def test_unknown_architecture_is_a_compile_error(tmp_path: Path) -> None:
    with pytest.raises(CompileError):
        compile_module(RAW, [], "sm_19", cache=tmp_path)


# -- the cache -------------------------------------------------------------------------------


@needs_nvcc
def test_cache_hit_runs_only_the_preprocessor(tmp_path: Path,
                                              forbid_compiling: Callable[[], None]) -> None:
    first = compile_module(SAXPY, ["-O3"], ARCH, cache=tmp_path)
    [cached] = list(tmp_path.iterdir())  # one file, no temporaries left behind
    assert cached.suffix == ".cubin" and cached.read_bytes().endswith(first)

    forbid_compiling()
    assert compile_module(SAXPY, ["-O3"], ARCH, cache=tmp_path) == first
    # Another source, option list or architecture is another key: nvcc would run.
    for source, options, arch in [(SAXPY + " ", ["-O3"], ARCH), (SAXPY, [], ARCH),
                                  (SAXPY, ["-O3"], "sm_80")]:
        with pytest.raises(AssertionError, match="nvcc ran"):
            compile_module(source, options, arch, cache=tmp_path)


def test_cache_key_and_atomic_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nvcc stubbed: one compile per key, written whole, read back on a hit."""
    calls: list[tuple[str, list[str], str]] = []

    def fake_nvcc(_nvcc: str, source: str, options: list[str], arch: str, *,
                  preprocess: bool = False) -> bytes:
        if preprocess:
            return f"preprocessed {source}".encode()
        calls.append((source, options, arch))
        return f"cubin of {source} {options} {arch}".encode()

    monkeypatch.setattr(compiler, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "Cuda compilation tools 99.9")
    monkeypatch.setattr(compiler, "_nvcc", fake_nvcc)
    one = compile_module("a", ["-O3"], "sm_90", cache=tmp_path / "c")
    assert compile_module("a", ["-O3"], "sm_90", cache=tmp_path / "c") == one
    assert len(calls) == 1
    compile_module("a", ["-O2"], "sm_90", cache=tmp_path / "c")
    compile_module("a", ["-O3"], "sm_90a", cache=tmp_path / "c")
    assert len(calls) == 3
    assert len(list((tmp_path / "c").iterdir())) == 3
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".tmp")]
    # Another nvcc version is another key.
    monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "Cuda compilation tools 100")
    compile_module("a", ["-O3"], "sm_90", cache=tmp_path / "c")
    assert len(calls) == 4


#: Every way of spelling an include that the preprocessor takes: the cache's key must see
#: what each one includes. Trigraphs (??=) count under -std=c++14.
SPELLINGS = {
    "plain": ("#include", []),
    "space": ("# include", []),
    "tab": ("#\tinclude", []),
    "comment": ("#/**/include", []),
    "comments": ("/* a */ # /* b\n */ include /* c */", []),
    "digraph": ("%:include", []),
    "continued": ("#\\\ninclude", []),
    "continued-crlf": ("#\\\r\ninclude", []),
    "continued-space": ("#\\  \ninclude", []),
    "include_next": ("#include_next", []),
    "trigraph": ("??=include", ["-std=c++14"]),
}


@needs_nvcc
@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_a_changed_header_is_compiled_again(spelling: tuple[str, list[str]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    directive, options = spelling
    # A header on the worker's include path (C++ sources take CPLUS_INCLUDE_PATH from the
    # environment, as system headers).
    (tmp_path / "inc").mkdir()
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", str(tmp_path / "inc"))
    header = tmp_path / "inc" / "value.h"
    source = (f'{directive} "value.h"\n'
              'extern "C" __global__ void k(float *x) { x[0] = VALUE; }\n')
    cache = tmp_path / "cache"
    header.write_text("#define VALUE 1.0f\n")
    one = compile_module(source, options, ARCH, cache=cache)
    header.write_text("#define VALUE nope\n")  # the same source text, a broken header
    with pytest.raises(CompileError, match="nope"):
        compile_module(source, options, ARCH, cache=cache)
    header.write_text("#define VALUE 2.0f\n")
    two = compile_module(source, options, ARCH, cache=cache)
    assert two != one
    header.write_text("#define VALUE 1.0f\n")
    assert compile_module(source, options, ARCH, cache=cache) == one  # a hit again


class FakeNvcc:
    """nvcc stubbed out: each compile is counted and makes a cubin naming its source."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compiles: list[str] = []
        monkeypatch.setattr(compiler, "find_nvcc", lambda: "/fake/nvcc")
        monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "v")
        monkeypatch.setattr(compiler, "_nvcc", self)

    def __call__(self, _nvcc: str, source: str, _options: list[str], _arch: str, *,
                 preprocess: bool = False, **_kwargs: object) -> bytes:
        if preprocess:
            return f"preprocessed {source}".encode()
        self.compiles.append(source)
        return f"cubin of {source} ".encode() * 50


def entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


def test_an_entry_under_another_keys_name_is_not_used(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    a = compile_module("a", [], ARCH, cache=tmp_path)
    [entry_a] = entries(tmp_path)
    b = compile_module("b", [], ARCH, cache=tmp_path)
    [entry_b] = [e for e in entries(tmp_path) if e != entry_a]
    entry_a.replace(entry_b)  # a's cubin where b's should be
    assert compile_module("b", [], ARCH, cache=tmp_path) == b
    assert nvcc.compiles == ["a", "b", "b"]
    # The bad entry was written over: b is a hit now.
    assert compile_module("b", [], ARCH, cache=tmp_path) == b and len(nvcc.compiles) == 3
    assert a != b


@pytest.mark.parametrize("cut", [1, 40, 200])
def test_a_truncated_entry_is_not_used(cut: int, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    a = compile_module("a", [], ARCH, cache=tmp_path)
    [entry] = entries(tmp_path)
    entry.write_bytes(entry.read_bytes()[:-cut])
    assert compile_module("a", [], ARCH, cache=tmp_path) == a
    assert nvcc.compiles == ["a", "a"]
    assert compile_module("a", [], ARCH, cache=tmp_path) == a and len(nvcc.compiles) == 2


def test_a_bare_cubin_is_not_an_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    a = compile_module("a", [], ARCH, cache=tmp_path)
    [entry] = entries(tmp_path)
    entry.write_bytes(b"\x7fELF not the cubin of a")
    assert compile_module("a", [], ARCH, cache=tmp_path) == a
    assert nvcc.compiles == ["a", "a"]


def test_a_symlink_entry_is_not_followed(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    cache = tmp_path / "cache"
    compile_module("a", [], ARCH, cache=cache)
    [entry_a] = entries(cache)
    b = compile_module("b", [], ARCH, cache=cache)
    [entry_b] = [e for e in entries(cache) if e != entry_a]
    elsewhere = tmp_path / "elsewhere"
    target = entry_a.read_bytes()
    elsewhere.write_bytes(target)
    for entry in (entry_a, entry_b):
        entry.unlink()
        entry.symlink_to(elsewhere)
    assert compile_module("b", [], ARCH, cache=cache) == b
    assert nvcc.compiles == ["a", "b", "b"]
    assert not entry_b.is_symlink()  # the link itself was replaced; its target is untouched
    assert elsewhere.read_bytes() == target


def test_a_fifo_entry_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    a = compile_module("a", [], ARCH, cache=tmp_path)
    [entry] = entries(tmp_path)
    entry.unlink()
    os.mkfifo(entry)  # opening it to read would wait for a writer
    assert compile_module("a", [], ARCH, cache=tmp_path) == a
    assert nvcc.compiles == ["a", "a"]


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777], ids=oct)
def test_a_folder_others_may_write_is_not_used(mode: int, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(mode)
    assert compile_module("a", [], ARCH, cache=cache) == compile_module("a", [], ARCH,
                                                                        cache=cache)
    assert nvcc.compiles == ["a", "a"]  # compiled each time, never cached
    assert entries(cache) == []


def test_a_new_cache_folder_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvcc(monkeypatch)
    monkeypatch.setattr(os, "umask", os.umask)  # restored whatever the test does
    old = os.umask(0o002)  # a umask that makes group-writable folders
    try:
        compile_module("a", [], ARCH, cache=tmp_path / "new" / "kernels")
    finally:
        os.umask(old)
    assert (tmp_path / "new" / "kernels").stat().st_mode & 0o777 == 0o700
    assert len(entries(tmp_path / "new" / "kernels")) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_entries_and_folders_of_another_user_are_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = FakeNvcc(monkeypatch)
    a = compile_module("a", [], ARCH, cache=tmp_path / "c")
    [entry] = entries(tmp_path / "c")
    os.chown(entry, 65534, 65534)
    assert compile_module("a", [], ARCH, cache=tmp_path / "c") == a
    assert nvcc.compiles == ["a", "a"]
    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 65534, 65534)
    compile_module("a", [], ARCH, cache=tmp_path / "theirs")
    assert nvcc.compiles == ["a", "a", "a"] and entries(tmp_path / "theirs") == []


def test_unwritable_cache_still_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "v")
    monkeypatch.setattr(compiler, "_nvcc", lambda *_args, **_kwargs: b"image")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert compile_module("a", [], "sm_90", cache=blocker / "kernels") == b"image"


def test_cache_dir_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ERLCUDA_CACHE_DIR", raising=False)
    assert usercode.cache_dir() == Path.home() / ".cache" / "erlcuda" / "kernels"
    monkeypatch.setenv("ERLCUDA_CACHE_DIR", str(tmp_path))
    assert usercode.cache_dir() == tmp_path


# -- refusals --------------------------------------------------------------------------------


def test_no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(NoCompiler):
        compile_module(RAW, [], ARCH, cache=tmp_path)


def test_cuda_home_is_searched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert usercode.find_nvcc() == str(nvcc)


# -- nvcc's options: an allow-list ----------------------------------------------------------


def no_process(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("a process ran")


#: Options that made nvcc run a command, write or read files of the caller's choosing, or
#: change what it makes; ``{m}`` is a file that must not appear, ``{d}`` an empty folder.
ATTACKS = [
    ["-DWIDTH=`touch {m}`"],
    ["-DWIDTH=$(touch {m})"],
    ["-DW=1;touch {m}"],
    ["-DW=1|touch {m}"],
    ["-DW=1&&touch {m}"],
    ["-DW=1 -o{m}"],
    ["-DW='1'"],
    ['-DW="1"'],
    ["-DW=a\\b"],
    ["-DW=<x>"],
    ["-DW=(1)"],
    ["-DW=1,X=2"],
    ["-D", "W=1"],
    ["-D1W=1"],
    ["--define-macro=W=`touch {m}`"],
    ["--keep", "--keep-dir", "{d}"],
    ["--keep-dir={d}"],
    ["-keep"],
    ["-Xcompiler", "-o{m}"],
    ["-Xcompiler=-o{m}"],
    ["--compiler-options=-o{m}"],
    ["-Xptxas", "-o{m}"],
    ["-Xlinker", "-o{m}"],
    ["-ccbin", "{d}"],
    ["-ccbin={d}"],
    ["--compiler-bindir={d}"],
    ["-I{d}"],
    ["-I", "/etc"],
    ["--include-path=/etc"],
    ["-isystem", "/etc"],
    ["-include", "/etc/passwd"],
    ["--pre-include=/etc/passwd"],
    ["--options-file={m}"],
    ["-optf", "{m}"],
    ["-o", "{m}"],
    ["-o={m}"],
    ["--output-file={m}"],
    ["-odir", "{d}"],
    ["--output-directory={d}"],
    ["-arch=sm_80"],
    ["--gpu-architecture=sm_80"],
    ["-gencode", "arch=compute_80,code=sm_80"],
    ["-code=sm_90"],
    ["--ptx"],
    ["-E"],
    ["-M"],
    ["-MF", "{m}"],
    ["--dependency-output={m}"],
    ["--run"],
    ["-G"],
    ["--no-such-option"],
    ["-O3 -o {m}"],
    ["-O4"],
    ["--ftz=maybe"],
    ["-maxrregcount=`id`"],
    ["-std=gnu++17"],
    [""],
]


@pytest.mark.parametrize("attack", ATTACKS, ids=[" ".join(a) for a in ATTACKS])
def test_options_outside_the_allow_list_are_refused(attack: list[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    marker, folder = tmp_path / "marker", tmp_path / "dir"
    folder.mkdir()
    options = ["-O3", *(a.format(m=marker, d=folder) for a in attack)]
    # Refused before anything runs: not nvcc, not its version check.
    monkeypatch.setattr(compiler.subprocess, "Popen", no_process)
    monkeypatch.setattr(compiler.subprocess, "run", no_process)
    with pytest.raises(ValueError, match="not allowed") as info:
        compile_module(RAW, options, ARCH, cache=tmp_path / "cache")
    # The flag that is refused is named, as given: the first one off the list.
    assert getattr(info.value, "option", None) == options[1]
    assert repr(options[1])[:20] in str(info.value)
    assert not marker.exists() and not list(folder.iterdir())
    assert not (tmp_path / "cache").exists()


@needs_nvcc
@pytest.mark.parametrize("attack", [["-DWIDTH=`touch {m}`"], ["-Xcompiler", "-o{m}"],
                                    ["--keep", "--keep-dir", "{d}"], ["-ccbin", "{d}"]],
                         ids=["backticks", "Xcompiler", "keep-dir", "ccbin"])
def test_a_refused_option_never_reaches_nvcc(attack: list[str], tmp_path: Path) -> None:
    """With the real nvcc: each of these ran a command or wrote a file."""
    marker, folder = tmp_path / "marker", tmp_path / "dir"
    folder.mkdir()
    script = folder / "gcc"  # -ccbin DIR runs DIR/gcc as the host compiler
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    options = [a.format(m=marker, d=folder) for a in attack]
    with pytest.raises(ValueError, match="not allowed"):
        compile_module(RAW, options, ARCH, cache=tmp_path / "cache")
    assert not marker.exists()
    assert [p.name for p in folder.iterdir()] == ["gcc"]


ALLOWED = ["-DWIDTH", "-DWIDTH=4", "-DW_2=1.5f", "-DW=-1", "-DW=a+b", "-DW=", "-D_W=x.y",
           "--define-macro=W=1", "-O0", "-O1", "-O2", "-O3", "--use_fast_math",
           "-use_fast_math", "--ftz=true", "-ftz=false", "--prec-div=false",
           "-prec-div=true", "--prec-sqrt=false", "-prec-sqrt=true", "--fmad=false",
           "-fmad=true", "-lineinfo", "--generate-line-info", "-maxrregcount=32",
           "--maxrregcount=255", "-std=c++03", "-std=c++11", "-std=c++14", "--std=c++17",
           "-std=c++20", "--restrict", "-restrict", "--extra-device-vectorization",
           "-extra-device-vectorization", "--expt-relaxed-constexpr",
           "-expt-relaxed-constexpr", "--extended-lambda", "--expt-extended-lambda"]


def test_the_allowed_options_reach_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_nvcc(_nvcc: str, source: str, options: list[str], arch: str, *,
                  preprocess: bool = False, **_: object) -> bytes:
        seen.append(options)
        return b"text" if preprocess else b"image"

    monkeypatch.setattr(compiler, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "v")
    monkeypatch.setattr(compiler, "_nvcc", fake_nvcc)
    assert compile_module(RAW, ALLOWED, ARCH, cache=tmp_path) == b"image"
    assert seen and all(options == ALLOWED for options in seen)


@needs_nvcc
@pytest.mark.parametrize("option", ALLOWED)
def test_nvcc_takes_each_allowed_option(option: str, tmp_path: Path) -> None:
    assert is_cubin(compile_module(RAW, [option], ARCH, cache=tmp_path), "scale")


# -- files a source may name: headers of the include path, by a relative name ---------------

K = '\nextern "C" __global__ void k(float *x) { x[0] = 1 }\n'  # a syntax error: a message
#: Sources that name a file outside the include path, which nvcc read (and showed the lines
#: of, in its message). A few gcc would not take (ucn, embed, backslash, empty), or sees no
#: directive in (comment-lines): the check refuses those too, rather than miss one.
FILE_READS = {
    "absolute": '#include "/etc/passwd"',
    "absolute-angle": "#include </etc/passwd>",
    "parent": '#include "../../../../../../etc/passwd"',
    "parent-angle": "#include <sys/../../../../../etc/passwd>",
    "parent-dot": '#include "./../x.h"',
    "space": '# include "/etc/passwd"',
    "tab": '#\tinclude "/etc/passwd"',
    "comment": '#/**/include "/etc/passwd"',
    "comment-before": '/* x */ #include "/etc/passwd"',
    "comment-lines": 'int a; /* x\n y */ #include "/etc/passwd"',
    "comment-name": '#include /* c */ "/etc/passwd"',
    "comment-in-directive": '# /* a\n b */ include "/etc/passwd"',
    "digraph": '%:include "/etc/passwd"',
    "continued": '#\\\ninclude "/etc/passwd"',
    "continued-name": '#include "/etc/pa\\\nsswd"',
    "continued-space": '#\\  \ninclude "/etc/passwd"',
    "trigraph": '??=include "/etc/passwd"',
    "trigraph-continued": '#??/\ninclude "/etc/passwd"',
    "crlf": 'int a;\r\n#include "/etc/passwd"\r\n',
    "cr": 'int a;\r#include "/etc/passwd"',
    "bom": '\ufeff#include "/etc/passwd"',
    "vertical-tab": '\v\f#include "/etc/passwd"',
    "ucn": '#incl\\u0075de "/etc/passwd"',
    "include_next": '#include_next "/etc/passwd"',
    "import": '#import "/etc/passwd"',
    "embed": '#embed "/etc/passwd"',
    "macro": '#define P "/etc/passwd"\n#include P',
    "macro-angle": "#define P </etc/passwd>\n#include P",
    "backslash": '#include "a\\b.h"',
    "empty": '#include ""',
    "line": '#line 1 "/etc/passwd"\n#error here',
    "line-parent": '#line 1 "../../../../etc/passwd"\n#error here',
    "line-escapes": '#line 1 "\\057etc\\057passwd"\n#error here',
    "line-macro": '#define F "/etc/passwd"\n#line 1 F\n#error here',
    "line-macro-number": '#define N 1 "/etc/passwd"\n#line N\n#error here',
    "linemarker": '# 1 "/etc/passwd"\n#error here',
    "has_include": '#if __has_include("/etc/passwd")\n#error here\n#endif',
    "has_include-alias": '#define H __has_include\n#if H("/etc/passwd")\n#error here\n#endif',
    "has_include-macro": '#define P "/etc/passwd"\n#if __has_include(P)\n#error here\n#endif',
}


@pytest.mark.parametrize("head", FILE_READS.values(), ids=FILE_READS.keys())
def test_a_file_outside_the_include_path_is_refused(head: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.subprocess, "Popen", no_process)
    monkeypatch.setattr(compiler.subprocess, "run", no_process)
    with pytest.raises(ValueError, match=r"include path|header name|#line") as info:
        compile_module(head + K, [], ARCH, cache=tmp_path)
    assert not isinstance(info.value, usercode.BadOption)
    assert "root:" not in str(info.value)


def test_the_check_reads_a_large_source_once(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Each directive starts a comment that ends only at the end: were each skip to look for
    # the end itself, this would take minutes (how long it takes is not timed here).
    FakeNvcc(monkeypatch)
    source = "# /*\n" * 100_000 + "*/" + K
    assert compile_module(source, [], ARCH, cache=tmp_path)


def test_an_operation_that_includes_a_file_is_refused(tmp_path: Path) -> None:
    source = elementwise_source("k", [("x", "f32", "vector")], [("y", "f32")],
                                'y = x;\n#include "/etc/passwd"\n')
    with pytest.raises(ValueError, match="include path"):
        compile_module(source, [], ARCH, cache=tmp_path)


@needs_nvcc
@pytest.mark.parametrize("head", [FILE_READS[k] for k in ("absolute", "parent", "macro",
                                                          "line", "linemarker", "comment")],
                         ids=["absolute", "parent", "macro", "line", "linemarker", "comment"])
def test_nvcc_never_shows_a_file_outside_the_include_path(head: str, tmp_path: Path) -> None:
    """With the real nvcc: each of these put lines of /etc/passwd in the compile error."""
    with pytest.raises(ValueError) as info:
        compile_module(head + K, [], ARCH, cache=tmp_path)
    assert "root:" not in str(info.value)


#: Sources that name files only as the rule allows, or mention an include where there is
#: none: not refused.
NOT_FILE_READS = {
    "system": "#include <stdint.h>\n#include <cuda_fp16.h>",
    "quoted-system": '#include "cuda_fp16.h"',
    "subfolder": "#include <cooperative_groups/reduce.h>",
    "dots-in-a-name": '#include "cuda_fp16.hpp"',
    "has_include": ("#ifdef __has_include\n#if __has_include(<cuda_bf16.h>)\n"
                    "#include <cuda_bf16.h>\n#endif\n#endif\n"
                    "#if defined(__has_include) && defined __has_include\n#endif"),
    "line": '#line 10 "kernel.cu"\n#line 20\n# 30 "other.cu" 2',
    "comments": "// see issue #12 here, and #include's manual\n/* # 1 is fine */",
    "strings": 'const char *s = "a #include </etc/passwd> in a string";',
}


@pytest.mark.parametrize("head", NOT_FILE_READS.values(), ids=NOT_FILE_READS.keys())
def test_headers_of_the_include_path_are_allowed(head: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvcc(monkeypatch)
    assert compile_module(head + K, [], ARCH, cache=tmp_path)


@needs_nvcc
def test_a_source_with_system_headers_compiles(tmp_path: Path) -> None:
    source = "\n".join(v for k, v in NOT_FILE_READS.items() if k != "line") + RAW
    assert is_cubin(compile_module(source, [], ARCH, cache=tmp_path), "scale")


@pytest.mark.parametrize("arch", ["", "90", "sm90", "compute_90", "sm_90 -o x", "SM_90"])
def test_bad_architectures_are_refused(arch: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="architecture"):
        compile_module(RAW, [], arch, cache=tmp_path)


@pytest.mark.parametrize(
    ("name", "inputs", "outputs", "operation", "match"),
    [
        ("1bad", [("x", "f32", "vector")], [("z", "f32")], "z = x", "identifier"),
        ("k-1", [("x", "f32", "vector")], [("z", "f32")], "z = x", "identifier"),
        ("", [("x", "f32", "vector")], [("z", "f32")], "z = x", "identifier"),
        ("float", [("x", "f32", "vector")], [("z", "f32")], "z = x", "reserved"),
        ("__k", [("x", "f32", "vector")], [("z", "f32")], "z = x", "reserved"),
        ("_K", [("x", "f32", "vector")], [("z", "f32")], "z = x", "reserved"),
        ("k" * 256, [("x", "f32", "vector")], [("z", "f32")], "z = x", "longer"),
        ("k", [("i", "f32", "vector")], [("z", "f32")], "z = i", "taken"),
        ("k", [("x", "f32", "vector")], [("n", "f32")], "n = x", "taken"),
        ("k", [("erlcuda_x", "f32", "vector")], [("z", "f32")], "z = 1", "erlcuda_"),
        ("k", [("x", "f32", "vector"), ("x", "f64", "scalar")], [("z", "f32")], "z = x",
         "twice"),
        ("k", [("x", "f32", "vector")], [("x", "f32")], "x = 1", "twice"),
        ("k", [("k", "f32", "vector")], [("z", "f32")], "z = k", "twice"),
        ("k", [("threadIdx", "f32", "vector")], [("z", "f32")], "z = 1", "reserved"),
        ("k", [("x y", "f32", "vector")], [("z", "f32")], "z = 1", "identifier"),
        ("k", [("x", "f16", "vector")], [("z", "f32")], "z = x", "element type"),
        ("k", [("x", "float", "vector")], [("z", "f32")], "z = x", "element type"),
        ("k", [("x", "f32", "vector")], [("z", "bf16")], "z = x", "element type"),
        ("k", [("x", "f32", "matrix")], [("z", "f32")], "z = x", "neither"),
        ("k", [("x", "f32")], [("z", "f32")], "z = x", "expected"),
        ("k", [("x", "f32", "vector")], [("z", "f32", "vector")], "z = x", "expected"),
        ("k", [("x", "f32", "vector")], [], "x", "output"),
        ("k", [("x", "f32", "vector")], [("z", "f32")], "  ", "empty"),
        ("k", [("x", "f32", "vector")], [("z", "f32")], "z = x\0", "NUL"),
    ],
)
def test_bad_elementwise_specs_are_refused(name: str, inputs: list[tuple[str, ...]],
                                           outputs: list[tuple[str, ...]], operation: str,
                                           match: str) -> None:
    with pytest.raises(ValueError, match=match):
        elementwise_source(name, inputs, outputs, operation)  # type: ignore[arg-type]


def test_architecture_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ERLCUDA_ARCH", raising=False)
    assert usercode.default_arch() == "sm_90"
    monkeypatch.setenv("ERLCUDA_ARCH", "sm_80")
    assert usercode.default_arch() == "sm_80"
    assert usercode.arch_of((9, 0)) == "sm_90"
    assert usercode.arch_of((12, 1)) == "sm_121"


@needs_nvcc
def test_a_long_compile_reports_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker logs each report: a compile longer than Erlang's watchdog must not look
    # like a stuck worker.
    monkeypatch.setattr(compiler, "PROGRESS_EVERY", 0.05)
    seen: list[float] = []
    compile_module(SAXPY, [], ARCH, cache=tmp_path, progress=seen.append)
    assert seen and seen == sorted(seen) and seen[0] >= 0.05
