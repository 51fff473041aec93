// erlcuda's prelude for CUDA C compiled for the host (the cpu backend's user kernels).
//
// It gives a kernel source what nvcc gives it without an include: the function and variable
// qualifiers (as nothing, or their GCC meaning), the vector types, the launch's index
// variables and the common device math, mapped onto the host's. The launch itself is a loop
// (erlcuda::launch): every (block, thread) pair of the grid runs the kernel's body once, one
// after the other, on the calling thread. What a sequential loop cannot run (shared memory,
// barriers, atomics, warp intrinsics) is not defined here: the worker refuses a source that
// uses it before compiling, naming the feature.
#ifndef ERLCUDA_HOST_H
#define ERLCUDA_HOST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#include <utility>

// -- qualifiers -------------------------------------------------------------------------------
// The library is built with hidden symbols: a kernel is what it exports, as a GPU module's
// functions are its kernels (not its device functions).
#define __global__ __attribute__((visibility("default")))
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __cudart_builtin__

// -- vector types -----------------------------------------------------------------------------
#define ERLCUDA_VECTOR(T, name, align)                                                        \
  struct __attribute__((aligned(align))) name##1 { T x; };                                    \
  struct __attribute__((aligned(2 * align))) name##2 { T x, y; };                             \
  struct name##3 { T x, y, z; };                                                              \
  struct __attribute__((aligned(4 * align > 16 ? 16 : 4 * align))) name##4 { T x, y, z, w; }; \
  static inline name##1 make_##name##1(T x) { return name##1{x}; }                            \
  static inline name##2 make_##name##2(T x, T y) { return name##2{x, y}; }                    \
  static inline name##3 make_##name##3(T x, T y, T z) { return name##3{x, y, z}; }            \
  static inline name##4 make_##name##4(T x, T y, T z, T w) { return name##4{x, y, z, w}; }

ERLCUDA_VECTOR(float, float, 4)
ERLCUDA_VECTOR(double, double, 8)
ERLCUDA_VECTOR(int, int, 4)
ERLCUDA_VECTOR(unsigned int, uint, 4)
ERLCUDA_VECTOR(long long, longlong, 8)
ERLCUDA_VECTOR(unsigned long long, ulonglong, 8)
ERLCUDA_VECTOR(signed char, char, 1)
ERLCUDA_VECTOR(unsigned char, uchar, 1)
ERLCUDA_VECTOR(short, short, 2)
ERLCUDA_VECTOR(unsigned short, ushort, 2)
#undef ERLCUDA_VECTOR

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// -- the launch's index variables: one set per host thread, set by erlcuda::launch ------------
static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;
static const int warpSize = 32;

namespace erlcuda {
// Runs body() once for every (block, thread) pair of a grid of g[0..2] blocks of b[0..2]
// threads, blocks in order and the threads of a block in order: 0 once done, 1 where the body
// threw (nothing of a kernel's own throws on a GPU; a library call may on the host).
template <class Body>
int launch(const unsigned int *g, const unsigned int *b, Body body) {
  try {
    gridDim = dim3(g[0], g[1], g[2]);
    blockDim = dim3(b[0], b[1], b[2]);
    for (unsigned int bz = 0; bz < g[2]; ++bz)
      for (unsigned int by = 0; by < g[1]; ++by)
        for (unsigned int bx = 0; bx < g[0]; ++bx) {
          blockIdx = uint3{bx, by, bz};
          for (unsigned int tz = 0; tz < b[2]; ++tz)
            for (unsigned int ty = 0; ty < b[1]; ++ty)
              for (unsigned int tx = 0; tx < b[0]; ++tx) {
                threadIdx = uint3{tx, ty, tz};
                body();
              }
        }
  } catch (...) {
    return 1;
  }
  return 0;
}

// What a launcher calls where the source has no kernel of a declared name that takes the
// declared params: the worker sees it (erlcuda_found_<name> is 0) and refuses the module.
struct none {};
}  // namespace erlcuda

// -- device functions, mapped onto the host's ------------------------------------------------
// min and max as CUDA has them: of two values of one type, and of mixed arithmetic types in
// their common type.
#define ERLCUDA_MINMAX(T)                                    \
  static inline T min(T a, T b) { return b < a ? b : a; }    \
  static inline T max(T a, T b) { return a < b ? b : a; }
ERLCUDA_MINMAX(int)
ERLCUDA_MINMAX(unsigned int)
ERLCUDA_MINMAX(long)
ERLCUDA_MINMAX(unsigned long)
ERLCUDA_MINMAX(long long)
ERLCUDA_MINMAX(unsigned long long)
#undef ERLCUDA_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B, class C = typename std::common_type<A, B>::type,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
static inline C min(A a, B b) { return min(static_cast<C>(a), static_cast<C>(b)); }
template <class A, class B, class C = typename std::common_type<A, B>::type,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
static inline C max(A a, B b) { return max(static_cast<C>(a), static_cast<C>(b)); }

// The fast approximations: the host's accurate functions. (The C library may declare some
// of these names itself, so they are macros for functions of erlcuda's own.)
static inline float erlcuda_exp10f(float x) { return powf(10.0f, x); }
static inline void erlcuda_sincosf(float x, float *s, float *c) {
  *s = sinf(x);
  *c = cosf(x);
}
static inline float erlcuda_fdividef(float x, float y) { return x / y; }
#define __expf expf
#define __exp10f erlcuda_exp10f
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __sincosf erlcuda_sincosf
#define __powf powf
#define __fdividef erlcuda_fdividef
#define fdividef erlcuda_fdividef
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
static inline float saturate(float x) { return __saturatef(x); }
// Round-to-nearest arithmetic: the host's default rounding.
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
// Functions of CUDA's math library that C's lacks (or has only lately: macros again).
static inline float erlcuda_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double erlcuda_rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float erlcuda_rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline double erlcuda_rcbrt(double x) { return 1.0 / cbrt(x); }
static inline float erlcuda_sinpif(float x) { return sinf(static_cast<float>(M_PI) * x); }
static inline float erlcuda_cospif(float x) { return cosf(static_cast<float>(M_PI) * x); }
static inline double erlcuda_sinpi(double x) { return sin(M_PI * x); }
static inline double erlcuda_cospi(double x) { return cos(M_PI * x); }
#define rsqrtf erlcuda_rsqrtf
#define rsqrt erlcuda_rsqrt
#define rcbrtf erlcuda_rcbrtf
#define rcbrt erlcuda_rcbrt
#define exp10f erlcuda_exp10f
#define sinpif erlcuda_sinpif
#define cospif erlcuda_cospif
#define sinpi erlcuda_sinpi
#define cospi erlcuda_cospi
// Conversions with a rounding mode.
static inline int __float2int_rn(float x) { return static_cast<int>(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return static_cast<int>(truncf(x)); }
static inline int __float2int_rd(float x) { return static_cast<int>(floorf(x)); }
static inline int __float2int_ru(float x) { return static_cast<int>(ceilf(x)); }
static inline int __double2int_rn(double x) { return static_cast<int>(nearbyint(x)); }
static inline int __double2int_rz(double x) { return static_cast<int>(trunc(x)); }
static inline float __int2float_rn(int x) { return static_cast<float>(x); }
// Bits.
template <class To, class From>
static inline To erlcuda_bits(From from) {
  To to;
  memcpy(&to, &from, sizeof to);
  return to;
}
static inline float __int_as_float(int x) { return erlcuda_bits<float>(x); }
static inline int __float_as_int(float x) { return erlcuda_bits<int>(x); }
static inline float __uint_as_float(unsigned int x) { return erlcuda_bits<float>(x); }
static inline unsigned int __float_as_uint(float x) { return erlcuda_bits<unsigned int>(x); }
static inline double __longlong_as_double(long long x) { return erlcuda_bits<double>(x); }
static inline long long __double_as_longlong(double x) { return erlcuda_bits<long long>(x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz(static_cast<unsigned int>(x)) : 32; }
static inline int __clzll(long long x) {
  return x ? __builtin_clzll(static_cast<unsigned long long>(x)) : 64;
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  return __builtin_bswap32(x);
}
static inline int __mulhi(int a, int b) {
  return static_cast<int>((static_cast<long long>(a) * b) >> 32);
}
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
static inline long long __mul64hi(long long a, long long b) {
  return static_cast<long long>((static_cast<__int128>(a) * b) >> 64);
}
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
static inline int __mul24(int a, int b) {
  return static_cast<int>(static_cast<unsigned int>((a << 8) >> 8) *
                          static_cast<unsigned int>((b << 8) >> 8));
}
static inline unsigned int __umul24(unsigned int a, unsigned int b) {
  return (a & 0xFFFFFFu) * (b & 0xFFFFFFu);
}
// Loads through the read-only cache, and fences: on one thread that runs the threads one
// after the other, a plain load, and nothing to wait for.
template <class T>
static inline T __ldg(const T *p) { return *p; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __threadfence_system() {}

#endif  // ERLCUDA_HOST_H
