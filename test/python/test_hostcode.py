"""User CUDA C built for the host (``usercode.compile_host``, ``hostcode``) and run by the
cpu backend (``backends/hostlib.py``): what it refuses and why, its compile errors, nvcc's
options for the host, the one cache, and what only the host does (each device's own copy
of a module, a kernel that throws, arguments checked against the declaration). What runs
alike on every backend is test_user_kernels.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from erlcuda import compile as compiler
from erlcuda import hostcode, usercode
from erlcuda.backends.base import BackendError
from erlcuda.backends.cpu import CpuDevice
from erlcuda.usercode import CompileError, NoCompiler, Unsupported, compile_host

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

SCALE = """extern "C" __global__ void scale(float *x, float a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""
SCALE_KERNELS = [("scale", [("inout", "f32"), ("scalar", "f32"), ("scalar", "i64")])]


def build(source: str, cache: Path, options: list[str] | None = None,
          kernels: Any = None) -> bytes:
    return compile_host(source, options or [], kernels or SCALE_KERNELS, what="kernel scale",
                        cache=cache)


def kernel(body: str, head: str = "") -> str:
    """A scale kernel with ``body`` on its line 4 (after ``head``'s lines)."""
    return (f"{head}\n" if head else "") + (
        'extern "C" __global__ void scale(float *x, float a, long long n) {\n'
        "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n"
        f"    {body}\n"
        "    x[i] *= a;\n"
        "}\n")


@pytest.fixture
def no_compile(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """g++ may preprocess, never compile: the preprocessor runs are recorded."""
    real = compiler._cxx
    runs: list[list[str]] = []

    def preprocess_only(cxx: str, texts: Any, options: list[str], *, preprocess: bool = False,
                        **kwargs: Any) -> bytes:
        if not preprocess:
            raise AssertionError("g++ compiled a source the cpu backend refuses")
        runs.append(options)
        return real(cxx, texts, options, preprocess=True, **kwargs)

    monkeypatch.setattr(compiler, "_cxx", preprocess_only)
    return runs


# -- what the cpu backend refuses: found in the preprocessed source, before compiling ---------

#: Each use the cpu backend cannot run: (head, body, the word named, the feature named).
REFUSED = {
    "shared": ("", "__shared__ float s[32]; s[threadIdx.x % 32] = x[i];", "__shared__",
               "shared memory"),
    "dynamic-shared": ("", "extern __shared__ float buf[]; buf[0] = x[i];", "__shared__",
                       "shared memory"),
    "syncthreads": ("", "__syncthreads();", "__syncthreads", "barriers"),
    "syncthreads_or": ("", "if (__syncthreads_or(x[i] > 0)) a = 1;", "__syncthreads_or",
                       "barriers"),
    "syncwarp": ("", "__syncwarp();", "__syncwarp", "barriers"),
    "atomicAdd": ("", "atomicAdd(x, 1.0f);", "atomicAdd", "atomics"),
    "atomicCAS": ("", "atomicCAS((int*)x, 0, 1);", "atomicCAS", "atomics"),
    "atomicMax_block": ("", "atomicMax_block((int*)x, 1);", "atomicMax_block", "atomics"),
    "shfl": ("", "a = __shfl_down_sync(0xffffffffu, a, 1);", "__shfl_down_sync",
             "warp shuffles"),
    "ballot": ("", "if (__ballot_sync(0xffffffffu, x[i] > 0)) a = 1;", "__ballot_sync",
               "warp votes"),
    "activemask": ("", "if (__activemask()) a = 1;", "__activemask", "warp votes"),
    "cooperative-groups": ("#include <cooperative_groups.h>\n"
                           "namespace cg = cooperative_groups;",
                           "cg::this_thread_block().sync();", "cooperative_groups",
                           "cooperative groups"),
    "asm": ("", 'asm volatile("membar.gl;");', "asm", "inline assembly"),
    "texture": ("", "cudaTextureObject_t t = 0; a = tex1Dfetch<float>(t, 0);",
                "cudaTextureObject_t", "textures and surfaces"),
    "child-launch": ('extern "C" __global__ void child(float *x) { x[0] = 1; }',
                     "child<<<1, 1>>>(x);", "<<<", "launches from a kernel"),
    "through-a-macro": ("#define SYNC() __syncthreads()", "SYNC();", "__syncthreads",
                        "barriers"),
}


@needs_gxx
@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_what_the_cpu_cannot_run_is_refused_before_compiling(
        case: tuple[str, str, str, str], tmp_path: Path, no_compile: list[list[str]]) -> None:
    head, body, word, feature = case
    source = kernel(body, head)
    # the first line that uses it, as the preprocessor sees it (a macro: where it expands)
    lines = source.split("\n")
    line = next((i for i, text in enumerate(lines, 1)
                 if word in text and not text.startswith("#")), lines.index(f"    {body}") + 1)
    with pytest.raises(Unsupported) as info:
        build(source, tmp_path / "cache")
    text = str(info.value)
    assert text.startswith("kernel scale uses "), text
    assert f"{word} ({feature}, kernel.cu:{line})" in text, text
    assert "cpu backend cannot run" in text and "cuda backend" in text, text
    assert no_compile  # it was preprocessed, and that was all
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


@needs_gxx
def test_a_refusal_names_every_feature_and_where(tmp_path: Path,
                                                 no_compile: list[list[str]]) -> None:
    source = kernel("__shared__ float s[4];\n    s[0] = x[i];\n    __syncthreads();\n"
                    "    atomicAdd(x, s[0]);")
    with pytest.raises(Unsupported) as info:
        compile_host(source, [], [*SCALE_KERNELS, ("other", [])], what="module m",
                     cache=tmp_path)
    assert str(info.value).startswith(
        "module m uses __shared__ (shared memory, kernel.cu:4), __syncthreads (barriers, "
        "kernel.cu:6), atomicAdd (atomics, kernel.cu:7), which"), info.value


@needs_gxx
def test_the_words_in_comments_strings_and_dead_code_are_not_refused(tmp_path: Path) -> None:
    source = kernel('if (a > 1e30f) printf("no __syncthreads or atomicAdd here\\n"); '
                    "// __shared__\n    /* __shfl_sync */",
                    "#if 0\n__device__ void f() { __syncthreads(); }\n#endif\n"
                    "// cooperative_groups\n#include <cuda_runtime.h>")
    device = CpuDevice(0)
    device.load_module("m", build(source, tmp_path), ["scale"])
    x = np.arange(4, dtype=np.float32)
    device.launch_user("m", "scale", [x, np.float32(3), np.int64(4)], (1, 1, 1), (4, 1, 1), 0)
    np.testing.assert_array_equal(x, [0, 3, 6, 9])
    device.close()


def test_the_scan_reads_the_preprocessors_line_markers() -> None:
    ours = hostcode.INCLUDE_DIR / "erlcuda_host.h"
    text = "\n".join([
        '# 1 "erlcuda_unit.cpp"',
        f'# 1 "{ours}" 1',
        "int atomicAdd_in_the_prelude_is_ours;",
        '# 10 "/usr/include/stdio.h" 1 3 4',
        "extern int __syncthreads;",  # a system header's: not the user's
        '# 1 "kernel.cu" 1',
        "",
        'const char *s = "__shared__";',
        "void k() { atomicOr(0, 1); }",
        '# 1 "erlcuda_launchers"',
        "void __syncwarp();",
    ])
    with pytest.raises(Unsupported) as info:
        hostcode.check(text, "kernel k")
    assert "uses atomicOr (atomics, kernel.cu:3), which" in str(info.value)
    hostcode.check(text.replace("atomicOr", "atomic_or"), "kernel k")


# -- compile errors and nvcc's options ---------------------------------------------------------


@needs_gxx
def test_a_host_compile_error_is_the_compilers_log(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as info:
        build(SCALE + "\nint broken = ;\n", tmp_path)
    log = info.value.log
    assert "kernel.cu:6:" in log and "error" in log, log
    assert "int broken = ;" in log, log  # the line shown is the user's own
    assert "/tmp" not in log and "erlcuda-g++-" not in log, log
    assert not list(tmp_path.iterdir())  # nothing cached


@needs_gxx
def test_a_compile_error_is_plain_ascii_whatever_the_locale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # g++ quotes names with curly quotes in a UTF-8 locale, which an Erlang shell printing
    # the log with ~p cannot show: the log is cut short before the error itself.
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    with pytest.raises(CompileError) as info:
        build(SCALE + "\nint broken = undeclared_name;\n", tmp_path)
    log = info.value.log
    assert "undeclared_name" in log, log
    assert log.isascii(), [c for c in log if not c.isascii()]


@needs_gxx
def test_an_operation_error_names_the_operation(tmp_path: Path) -> None:
    source = usercode.elementwise_source("ew", [("x", "f32", "vector")], [("y", "f32")],
                                         "y = x +\n  undeclared_thing")
    with pytest.raises(CompileError) as info:
        compile_host(source, [], [("ew", [("in", "f32"), ("out", "f32"), ("scalar", "i64")])],
                     what="kernel ew", cache=tmp_path)
    assert "operation:2:" in info.value.log and "undeclared_thing" in info.value.log


@pytest.mark.parametrize(("options", "want"), [
    ([], ["-std=c++17", "-O2", "-ffp-contract=fast"]),
    (["-O3", "-DW=4", "--define-macro=V", "-std=c++20", "--fmad=false"],
     ["-std=c++20", "-O3", "-ffp-contract=off", "-DW=4", "-DV"]),
    (["-std=c++03", "-O0"], ["-std=c++11", "-O0"]),
    (["--use_fast_math", "-lineinfo", "-maxrregcount=32", "--restrict", "--ftz=true",
      "--prec-div=false", "--extended-lambda", "--expt-relaxed-constexpr"],
     ["-std=c++17", "-O2"]),
])
def test_nvccs_options_for_the_host(options: list[str], want: list[str]) -> None:
    got = hostcode.host_options(options)
    assert all(w in got for w in want), got
    assert "-fno-strict-aliasing" in got and "-fvisibility=hidden" in got
    assert not [o for o in got if o in options and not o.startswith(("-D", "-O", "-std"))]


@needs_gxx
@pytest.mark.parametrize("option", ["-O0", "-O3", "-std=c++03", "-std=c++14", "-std=c++20",
                                    "--use_fast_math", "--fmad=false", "-lineinfo",
                                    "-maxrregcount=16", "--extended-lambda"])
def test_gxx_takes_each_mapped_option(option: str, tmp_path: Path) -> None:
    device = CpuDevice(0)
    device.load_module("m", build(SCALE, tmp_path, [option]), ["scale"])
    x = np.ones(3, np.float32)
    device.launch_user("m", "scale", [x, np.float32(2), np.int64(3)], (1, 1, 1), (4, 1, 1), 0)
    np.testing.assert_array_equal(x, [2, 2, 2])
    device.close()


def no_process(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("a process ran")


@pytest.mark.parametrize("source,options", [
    (SCALE, ["-O3", "-Xcompiler", "-o/tmp/x"]),
    (SCALE, ["-ccbin", "/tmp"]),
    ('#include "/etc/passwd"\n' + SCALE, []),
    (SCALE + "\0", []),
])
def test_a_refused_source_or_option_runs_no_compiler(source: str, options: list[str],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.subprocess, "Popen", no_process)
    monkeypatch.setattr(compiler.subprocess, "run", no_process)
    with pytest.raises(ValueError, match=r"not allowed|include path|NUL"):
        build(source, tmp_path, options)


@needs_gxx
def test_the_host_build_needs_no_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_nvcc(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("nvcc was looked for or run")

    for name in ("find_nvcc", "_nvcc", "_nvcc_version"):
        monkeypatch.setattr(compiler, name, no_nvcc)
    assert build(SCALE, tmp_path)[:4] == b"\x7fELF"


def test_without_gxx_the_host_build_needs_a_compiler(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NoCompiler, match="g\\+\\+"):
        build(SCALE, tmp_path)


# -- the one cache ---------------------------------------------------------------------------


@needs_gxx
def test_a_host_cache_hit_runs_only_the_preprocessor(tmp_path: Path,
                                                     forbid_compiling: Callable[[], None]) -> None:
    first = build(SCALE, tmp_path, ["-O3"])
    [cached] = list(tmp_path.iterdir())  # one file, no temporaries left behind
    assert cached.suffix == ".so" and cached.read_bytes().endswith(first)
    assert first[:4] == b"\x7fELF"

    forbid_compiling()
    assert build(SCALE, tmp_path, ["-O3"]) == first
    # Another source, option list or declaration is another key: g++ would run.
    for source, options, kernels in [
            (SCALE + " ", ["-O3"], SCALE_KERNELS), (SCALE, [], SCALE_KERNELS),
            (SCALE, ["-O3"], [("scale", [("inout", "f32"), ("scalar", "f32"),
                                         ("scalar", "i32")])])]:
        with pytest.raises(AssertionError, match="g\\+\\+ ran"):
            build(source, tmp_path, options, kernels)


@needs_gxx
def test_a_host_library_and_a_cubin_are_other_keys(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(compiler, "_nvcc_version", lambda _path: "v")
    monkeypatch.setattr(compiler, "_nvcc", lambda *_a, preprocess=False, **_k: (
        b"text" if preprocess else b"cubin"))
    build(SCALE, tmp_path)
    usercode.compile_module(SCALE, [], "sm_90", cache=tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cubin", ".so"]


# -- what only the cpu backend does ----------------------------------------------------------


@needs_gxx
def test_each_device_has_its_own_copy_of_a_module(tmp_path: Path) -> None:
    source = """
__device__ int launches;
extern "C" __global__ void count(int* out) { out[0] = ++launches; }
"""
    kernels = [("count", [("out", "i32")])]
    image = compile_host(source, [], kernels, what="kernel count", cache=tmp_path)
    one, two = CpuDevice(0), CpuDevice(1)
    one.load_module("m", image, ["count"])
    two.load_module("m", image, ["count"])
    out = np.zeros(1, np.int32)
    for device, want in ((one, 1), (one, 2), (two, 1), (one, 3)):
        device.launch_user("m", "count", [out], (1, 1, 1), (1, 1, 1), 0)
        assert out[0] == want
    one.close()
    two.launch_user("m", "count", [out], (1, 1, 1), (1, 1, 1), 0)  # the other still runs
    assert out[0] == 2
    two.close()


@needs_gxx
def test_a_kernel_that_takes_other_params_than_declared_is_refused(tmp_path: Path) -> None:
    device = CpuDevice(0)
    declared = [("scale", [("inout", "f64"), ("scalar", "f32"), ("scalar", "i64")])]
    image = compile_host(SCALE, [], declared, what="kernel scale", cache=tmp_path)
    with pytest.raises(BackendError) as info:
        device.load_module("m", image, ["scale"])
    assert info.value.code == "invalid_value"
    assert "does not take the declared params (double*, float, long long)" in str(info.value)
    device.close()


@needs_gxx
def test_arguments_are_checked_against_the_declaration(tmp_path: Path) -> None:
    device = CpuDevice(0)
    device.load_module("m", build(SCALE, tmp_path), ["scale"])
    x = np.ones(4, np.float32)
    bad: list[list[Any]] = [
        [x.astype(np.float64), np.float32(2), np.int64(4)],  # another element type
        [x, np.float64(2), np.int64(4)],  # a scalar of another type
        [x, 2.0, np.int64(4)],  # not typed
        [x[::2], np.float32(2), np.int64(2)],  # not contiguous
        [np.frombuffer(x.tobytes(), np.float32), np.float32(2), np.int64(4)],  # read-only
        [x, np.float32(2)],  # too few
    ]
    for args in bad:
        with pytest.raises(BackendError) as info:
            device.launch_user("m", "scale", args, (1, 1, 1), (4, 1, 1), 0)
        assert info.value.code == "invalid_value" and not info.value.fatal
    np.testing.assert_array_equal(x, np.ones(4))  # none of them ran
    device.close()


@needs_gxx
def test_a_kernel_that_throws_is_a_failed_launch(tmp_path: Path) -> None:
    source = ('#include <stdexcept>\nextern "C" __global__ void k(int *out, int n) {\n'
              '  if (threadIdx.x == n) throw std::runtime_error("no");\n'
              "  out[threadIdx.x] = 1;\n}\n")
    image = compile_host(source, [], [("k", [("out", "i32"), ("scalar", "i32")])],
                         what="kernel k", cache=tmp_path)
    device = CpuDevice(0)
    device.load_module("m", image, ["k"])
    out = np.zeros(4, np.int32)
    with pytest.raises(BackendError) as info:
        device.launch_user("m", "k", [out, np.int32(2)], (1, 1, 1), (4, 1, 1), 0)
    assert (info.value.code, info.value.fatal) == ("launch_failed", False)
    assert out.tolist() == [1, 1, 0, 0]  # the threads before it ran, in order
    device.launch_user("m", "k", [out, np.int32(-1)], (1, 1, 1), (4, 1, 1), 0)
    assert out.tolist() == [1, 1, 1, 1]
    device.close()
