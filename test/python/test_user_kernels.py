"""User kernels on a device, the same tests on each backend: CUDA C loaded as a module
(``Device.load_module``) and launched on device arrays (``Device.launch_user``), with the same
expected results. The cpu backend builds the source for the host (needs g++); the cuda one
compiles a cubin and runs it on the GPU (``gpu``: needs a GPU, PyCUDA and nvcc).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from erlcuda import usercode
from erlcuda.backends.base import BackendError, Device

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
BACKENDS = [pytest.param("cpu", marks=needs_gxx), pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8"), "i32": np.dtype("<i4"),
          "u32": np.dtype("<u4"), "i64": np.dtype("<i8"), "u8": np.dtype("u1")}
F32, F64 = DTYPES["f32"], DTYPES["f64"]
Params = Sequence[tuple[str, str]]


@dataclass
class Target:
    """A device of one backend, how a source is built for it, and the arrays made on it."""

    backend: str
    device: Device
    cache: Path
    arch: str = ""
    made: list[Any] = field(default_factory=list)

    def load(self, module: str, source: str, kernels: dict[str, Params],
             options: Sequence[str] = ()) -> None:
        self.device.load_module(module, self.build(source, kernels, options), list(kernels))

    def build(self, source: str, kernels: dict[str, Params], options: Sequence[str] = ()) -> (
            bytes):
        if self.backend == "cpu":
            return usercode.compile_host(source, options, list(kernels.items()),
                                         what=f"module of {', '.join(kernels)}",
                                         cache=self.cache)
        return usercode.compile_module(source, options, self.arch, cache=self.cache)

    def up(self, host: np.ndarray) -> Any:
        array = self.device.upload(host)
        self.made.append(array)
        return array

    def new(self, dtype: np.dtype[Any], count: int, *, zero: bool = False) -> Any:
        array = self.device.alloc(dtype, count, zero=zero)
        self.made.append(array)
        return array

    def down(self, array: Any) -> np.ndarray:
        return self.device.download(array)

    def address(self, array: Any) -> int:
        """Where ``array``'s elements are, as a kernel sees its pointer."""
        return int(array.ctypes.data) if self.backend == "cpu" else int(array.ptr)


@pytest.fixture(scope="module", params=BACKENDS)
def opened(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    cache = tmp_path_factory.mktemp("images")
    if request.param == "cpu":
        from erlcuda.backends.cpu import CpuBackend

        backend: Any = CpuBackend()
        device = backend.open(0)
        target = Target("cpu", device, cache)
    else:
        from erlcuda.backends.cuda import CudaBackend

        backend = CudaBackend()
        device = backend.open(0)
        target = Target("cuda", device, cache,
                        usercode.arch_of(device.info()["compute_capability"]))
    yield target
    device.close()
    backend.close()


@pytest.fixture
def target(opened: Target) -> Iterator[Target]:
    yield opened
    for array in opened.made:
        opened.device.free(array)
    opened.made.clear()


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def same_bytes(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def blocks(n: int) -> tuple[int, int, int]:
    return (max(1, -(-n // 256)), 1, 1)


SAXPY = """
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
SAXPY_PARAMS = {"saxpy": [("scalar", "f32"), ("in", "f32"), ("inout", "f32"),
                          ("scalar", "i64")]}

# Every scalar type between pointers, in an order that needs padding: checks the argument
# layout (each value at its own alignment, as the CUDA ABI lays parameters out).
SCALARS = """
extern "C" __global__ void scalars(unsigned char u8, double f64, int i32, const int* ptr,
                                   unsigned int u32, float f32, long long i64,
                                   unsigned char u8b, double* out, long long* ints) {
    out[0] = u8; out[1] = f64; out[2] = i32; out[3] = u32; out[4] = f32; out[5] = i64;
    out[6] = u8b; out[7] = ptr[0];
    ints[0] = i64; ints[1] = (long long)ptr;
}
"""
SCALARS_PARAMS = {"scalars": [("scalar", "u8"), ("scalar", "f64"), ("scalar", "i32"),
                              ("in", "i32"), ("scalar", "u32"), ("scalar", "f32"),
                              ("scalar", "i64"), ("scalar", "u8"), ("out", "f64"),
                              ("out", "i64")]}

GEOMETRY = """
extern "C" __global__ void where(int* out) {
    int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int threads = blockDim.x * blockDim.y * blockDim.z;
    out[bx * threads + tx] = bx * 1000 + tx;
}
"""


@pytest.mark.parametrize("n", [0, 1, 1000, (1 << 20) + 3])
def test_saxpy_raw_kernel(target: Target, n: int) -> None:
    target.load("saxpy_mod", SAXPY, SAXPY_PARAMS)
    gen = rng(n)
    # Small integers: a * x + y is exact, fused or not.
    x = gen.integers(-1000, 1000, n).astype(F32)
    y = gen.integers(-1000, 1000, n).astype(F32)
    dx, dy = target.up(x), target.up(y)
    target.device.launch_user("saxpy_mod", "saxpy", [np.float32(2.5), dx, dy, np.int64(n)],
                              blocks(n), (256, 1, 1), 0)
    np.testing.assert_array_equal(target.down(dy), np.float32(2.5) * x + y)
    same_bytes(target.down(dx), x)
    target.device.unload_module("saxpy_mod")


def test_scalar_arguments_of_every_type(target: Target) -> None:
    target.load("scalars_mod", SCALARS, SCALARS_PARAMS)
    ptr = target.up(np.array([-77], np.int32))
    out = target.new(F64, 8, zero=True)
    ints = target.new(np.dtype(np.int64), 2, zero=True)
    args = [np.uint8(250), np.float64(1.0 + 2.0**-40), np.int32(-123456), ptr,
            np.uint32(4_000_000_000), np.float32(0.1), np.int64(-(1 << 50) - 3), np.uint8(7),
            out, ints]
    target.device.launch_user("scalars_mod", "scalars", args, (1, 1, 1), (1, 1, 1), 0)
    want = [250.0, 1.0 + 2.0**-40, -123456.0, 4e9, float(np.float32(0.1)),
            float(-(1 << 50) - 3), 7.0, -77.0]
    np.testing.assert_array_equal(target.down(out), np.array(want))
    np.testing.assert_array_equal(target.down(ints), [-(1 << 50) - 3, target.address(ptr)])
    target.device.unload_module("scalars_mod")


@pytest.mark.parametrize(("grid", "block"), [((3, 2, 2), (4, 2, 3)), ((5, 3, 1), (16, 8, 1)),
                                             ((1, 1, 7), (1, 1, 64)), ((2, 1, 1), (1024, 1, 1))],
                         ids=["3d", "2d", "z-only", "full-block"])
def test_every_block_and_thread_runs_once(target: Target, grid: tuple[int, int, int],
                                          block: tuple[int, int, int]) -> None:
    target.load("where_mod", GEOMETRY, {"where": [("out", "i32")]})
    nblocks, threads = math.prod(grid), math.prod(block)
    out = target.new(np.dtype(np.int32), nblocks * threads + 1, zero=True)
    target.device.launch_user("where_mod", "where", [out], grid, block, 0)
    want = [b * 1000 + t for b in range(nblocks) for t in range(threads)] + [0]
    np.testing.assert_array_equal(target.down(out), want)
    target.device.unload_module("where_mod")


@pytest.mark.parametrize("n", [0, 1, 5000])
def test_elementwise_kernel(target: Target, n: int) -> None:
    inputs = [("a", "f64", "scalar"), ("x", "f64", "vector"), ("k", "i32", "vector"),
              ("b", "u8", "vector")]
    outputs = [("z", "f64"), ("w", "i64"), ("c", "u8")]
    source = usercode.elementwise_source(
        "ew_mix", inputs, outputs,
        "z = a * x + k; w = (long long)k * 3 - i; c = (unsigned char)(b + 1)")
    params = [("scalar" if kind == "scalar" else "in", t) for _, t, kind in inputs] + [
        ("out", t) for _, t in outputs] + [("scalar", "i64")]
    target.load("ew_mix", source, {"ew_mix": params})
    gen = rng(n)
    x = gen.integers(-100, 100, n).astype(F64)
    k = gen.integers(-(1 << 30), 1 << 30, n, dtype=np.int32)
    b = gen.integers(0, 256, n, dtype=np.uint8)
    z = target.new(F64, n)
    w = target.new(DTYPES["i64"], n)
    c = target.new(DTYPES["u8"], n)
    args = [np.float64(0.5), target.up(x), target.up(k), target.up(b), z, w, c, np.int64(n)]
    target.device.launch_user("ew_mix", "ew_mix", args, blocks(n), (256, 1, 1), 0)
    np.testing.assert_array_equal(target.down(z), 0.5 * x + k)
    np.testing.assert_array_equal(target.down(w), k.astype(np.int64) * 3 - np.arange(n))
    np.testing.assert_array_equal(target.down(c), (b + 1).astype(np.uint8))
    # A grid smaller than n: the grid-stride loop covers the rest.
    if n:
        z2 = target.new(F64, n)
        args[4] = z2
        target.device.launch_user("ew_mix", "ew_mix", args, (1, 1, 1), (32, 1, 1), 0)
        np.testing.assert_array_equal(target.down(z2), 0.5 * x + k)
    target.device.unload_module("ew_mix")


def test_reload_replaces_and_unload_forgets(target: Target) -> None:
    def source(value: int) -> str:
        return f'extern "C" __global__ void put(int* out) {{ out[0] = {value}; }}\n'

    out = target.new(np.dtype(np.int32), 1, zero=True)
    for value in (1, 2):
        target.load("put_mod", source(value), {"put": [("out", "i32")]})
        target.device.launch_user("put_mod", "put", [out], (1, 1, 1), (1, 1, 1), 0)
        assert target.down(out)[0] == value
    target.device.unload_module("put_mod")
    target.device.unload_module("put_mod")  # twice: nothing happens
    with pytest.raises(BackendError) as info:
        target.device.launch_user("put_mod", "put", [out], (1, 1, 1), (1, 1, 1), 0)
    assert info.value.code == "invalid_value" and not info.value.fatal


def test_module_globals_persist_between_launches(target: Target) -> None:
    source = """
__device__ int launches;
extern "C" __global__ void count(int* out) { out[0] = ++launches; }
"""
    target.load("count_mod", source, {"count": [("out", "i32")]})
    out = target.new(np.dtype(np.int32), 1, zero=True)
    for want in (1, 2, 3):
        target.device.launch_user("count_mod", "count", [out], (1, 1, 1), (1, 1, 1), 0)
        assert target.down(out)[0] == want
    target.load("count_mod", source, {"count": [("out", "i32")]})  # a new module: a new global
    target.device.launch_user("count_mod", "count", [out], (1, 1, 1), (1, 1, 1), 0)
    assert target.down(out)[0] == 1
    target.device.unload_module("count_mod")


def test_functions_that_are_not_kernels_are_refused_at_load(target: Target) -> None:
    put = 'extern "C" __global__ void put(int* out) { out[0] = 1; }\n'
    cases = {
        "absent": (put, {"put": [("out", "i32")], "absent": [("out", "i32")]}),
        "c++-linkage": ('__global__ void put(int* out) { out[0] = 1; }\n',
                        {"put": [("out", "i32")]}),
        "device-function": ('extern "C" __device__ int helper(int x) { return x + 1; }\n' + put,
                            {"helper": [("scalar", "i32")], "put": [("out", "i32")]}),
        "host-function": ('extern "C" void host(int* out) { out[0] = 2; }\n' + put,
                          {"host": [("out", "i32")]}),
        # the C library has them, which the host loader would find: they are no kernels
        "c-library-function": (put, {"free": [("inout", "f32")]}),
        "c-library-function-scalar": (put, {"exit": [("scalar", "i32")]}),
    }
    for case, (source, kernels) in cases.items():
        with pytest.raises(BackendError) as info:
            target.load("absent_mod", source, kernels)
        assert info.value.code == "invalid_value" and not info.value.fatal, (case, info.value)
    # Nothing was loaded under that name.
    with pytest.raises(BackendError):
        target.device.launch_user("absent_mod", "put", [target.new(np.dtype(np.int32), 1)],
                                  (1, 1, 1), (1, 1, 1), 0)


def test_launch_refusals(target: Target) -> None:
    target.load("refusals", 'extern "C" __global__ void put(int* out) { out[threadIdx.x] = 1; }',
                {"put": [("out", "i32")]})
    with pytest.raises(BackendError) as info:
        target.device.load_module("refused", b"not an image", ["put"])
    assert info.value.code == "invalid_value" and not info.value.fatal, info.value
    out = target.new(np.dtype(np.int32), 1024, zero=True)
    bad: list[tuple[str, list[Any], tuple[int, int, int], tuple[int, int, int], int]] = [
        ("put", [out], (1, 1, 1), (2048, 1, 1), 0),  # over any block
        ("put", [out], (1, 1, 1), (32, 32, 2), 0),  # 2048 threads in all
        ("put", [out], (1, 1, 1), (1, 1, 65), 0),  # over a block's z
        ("put", [out], (0, 1, 1), (32, 1, 1), 0),  # an empty grid
        ("put", [out], (1, 1, 1), (32, 1, 1), 1 << 30),  # far too much shared memory
        ("put", [out], (1 << 40, 1, 1), (32, 1, 1), 0),  # beyond C's unsigned int
        ("put", [out], (1, 1 << 16, 1), (32, 1, 1), 0),  # over a grid's y
        ("put", [1.5], (1, 1, 1), (32, 1, 1), 0),  # a Python float: not typed
        ("nope", [out], (1, 1, 1), (32, 1, 1), 0),
    ]
    for function, args, grid, block, shared in bad:
        with pytest.raises(BackendError) as info:
            target.device.launch_user("refusals", function, args, grid, block, shared)
        assert not info.value.fatal, (function, grid, block, shared, info.value)
        assert info.value.code in ("invalid_value", "launch_failed"), info.value
    # None of that hurt the device.
    target.device.launch_user("refusals", "put", [out], (1, 1, 1), (64, 1, 1), 0)
    got = target.down(out)
    assert got[:64].tolist() == [1] * 64 and not got[64:].any()
    target.device.unload_module("refusals")


def test_zero_size_arrays_pass_as_null(target: Target) -> None:
    source = 'extern "C" __global__ void null(const float* p, int* out) { out[0] = p == 0; }'
    target.load("null_mod", source, {"null": [("in", "f32"), ("out", "i32")]})
    out = target.new(np.dtype(np.int32), 1, zero=True)
    target.device.launch_user("null_mod", "null", [target.new(F32, 0), out], (1, 1, 1),
                              (1, 1, 1), 0)
    assert target.down(out)[0] == 1
    target.device.launch_user("null_mod", "null", [target.new(F32, 3), out], (1, 1, 1),
                              (1, 1, 1), 0)
    assert target.down(out)[0] == 0
    target.device.unload_module("null_mod")


def test_an_option_macro_is_compiled_in(target: Target) -> None:
    source = SAXPY.replace("a * x[i]", "a * WIDTH * x[i]")
    target.load("wide_mod", source, SAXPY_PARAMS, ["-DWIDTH=4", "-O3", "--use_fast_math"])
    x, y = target.up(np.arange(4, dtype=F32)), target.up(np.ones(4, F32))
    target.device.launch_user("wide_mod", "saxpy", [np.float32(1), x, y, np.int64(4)],
                              (1, 1, 1), (32, 1, 1), 0)
    np.testing.assert_array_equal(target.down(y), [1, 5, 9, 13])
    target.device.unload_module("wide_mod")


#: Device functions that nvcc gives a kernel without an include, and the host build maps
#: onto the host's: each as an expression of x (a float), n (an int) and u (an unsigned).
FLOAT_MATH = {
    "__expf": ("__expf(x)", np.exp),
    "__logf": ("__logf(x + 4.0f)", lambda x: np.log(x + 4)),
    "__sinf": ("__sinf(x)", np.sin),
    "__cosf": ("__cosf(x)", np.cos),
    "__powf": ("__powf(x + 4.0f, 1.5f)", lambda x: (x + 4) ** 1.5),
    "__fdividef": ("__fdividef(x, 3.0f)", lambda x: x / 3),
    "rsqrtf": ("rsqrtf(x + 4.0f)", lambda x: 1 / np.sqrt(x + 4)),
    "fmaf": ("fmaf(x, 2.0f, 1.0f)", lambda x: 2 * x + 1),
    "__saturatef": ("__saturatef(x)", lambda x: np.clip(x, 0, 1)),
    "min": ("min(x, 0.5f)", lambda x: np.fmin(x, 0.5)),
    "max": ("max(x, 1.0f)", lambda x: np.fmax(x, 1)),
    "exp10f": ("exp10f(x)", lambda x: 10.0**x),
    "sinpif": ("sinpif(x)", lambda x: np.sin(np.pi * x)),
}
INT_MATH = {
    "__popc": ("__popc(u)", lambda n, u: [bin(v).count("1") for v in u.tolist()]),
    "__clz": ("__clz(n)", lambda n, u: [32 - int(v).bit_length() if v >= 0 else 0
                                        for v in n.tolist()]),
    "__brev": ("(int)__brev(u)", lambda n, u: [np.int32(np.uint32(int(f"{v:032b}"[::-1], 2)))
                                               for v in u.tolist()]),
    "__umulhi": ("(int)__umulhi(u, 3000000000u)",
                 lambda n, u: [np.int32(np.uint32((v * 3000000000) >> 32)) for v in u.tolist()]),
    "min-mixed": ("(int)min(n, 7u)", lambda n, u: np.minimum(u, 7)),
    "max": ("max(n, -3)", lambda n, u: np.maximum(n, -3)),
    "__float2int_rn": ("__float2int_rn((float)(n % 1000) + 0.5f)",
                       lambda n, u: np.rint(np.fmod(n, 1000) + 0.5)),
}


def test_device_math(target: Target) -> None:
    floats = "\n".join(f"    f[{i} * count + j] = {expr};"
                       for i, (expr, _) in enumerate(FLOAT_MATH.values()))
    ints = "\n".join(f"    k[{i} * count + j] = {expr};"
                     for i, (expr, _) in enumerate(INT_MATH.values()))
    source = f"""
extern "C" __global__ void math(const float* xs, const int* ns, float* f, int* k, int count) {{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count) return;
    float x = xs[j]; int n = ns[j]; unsigned int u = (unsigned int)n;
{floats}
{ints}
}}
"""
    target.load("math_mod", source, {"math": [("in", "f32"), ("in", "i32"), ("out", "f32"),
                                              ("out", "i32"), ("scalar", "i32")]})
    gen = rng(5)
    x = np.concatenate([[-1.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, np.nan],
                        gen.uniform(-2, 2, 56)]).astype(F32)
    n = np.concatenate([[0, 1, -1, 7, -(1 << 31), (1 << 31) - 1, 12345, -12345],
                        gen.integers(-(1 << 31), 1 << 31, 56)]).astype(np.int32)
    count = x.size
    f = target.new(F32, count * len(FLOAT_MATH))
    k = target.new(np.dtype(np.int32), count * len(INT_MATH))
    target.device.launch_user("math_mod", "math", [target.up(x), target.up(n), f, k,
                                                   np.int32(count)], (1, 1, 1), (64, 1, 1), 0)
    got_f = target.down(f).reshape(len(FLOAT_MATH), count).astype(np.float64)
    got_k = target.down(k).reshape(len(INT_MATH), count)
    x64 = x.astype(np.float64)
    for row, (name, (_, ref)) in enumerate(FLOAT_MATH.items()):
        want = np.asarray(ref(x64), np.float64)
        if name == "__saturatef":
            want = np.where(np.isnan(x64), 0.0, want)  # CUDA's: NaN saturates to 0
        # the fast intrinsics are approximations on a GPU: a few ulp, more near a pole
        np.testing.assert_allclose(got_f[row], want, rtol=2e-5, atol=2e-6, equal_nan=True,
                                   err_msg=name)
    u = n.astype(np.uint32)
    for row, (name, (_, ref)) in enumerate(INT_MATH.items()):
        np.testing.assert_array_equal(got_k[row], np.asarray(ref(n, u), np.int64),
                                      err_msg=name)
    target.device.unload_module("math_mod")
