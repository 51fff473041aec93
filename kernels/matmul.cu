// C = A * B for row-major f32 matrices: A is M x K, B is K x N, C is M x N.
//
// blockIdx.z selects a job of a batch: job z's matrices start at A + z*M*K, B + z*K*N and
// C + z*M*N (the host stacks the jobs contiguously). blockIdx.x numbers the 128 x 128 tiles
// of C; there are ceil(M/128) * ceil(N/128) of them.
//
// One kernel body, two instantiations:
//   * matmul_aligned: no bounds checks, float4 loads and stores. Only for M % 128 == 0,
//     N % 128 == 0, K % 8 == 0, K > 0 and 16-byte aligned A, B, C.
//   * matmul_checked: any M, N, K >= 0. Loads outside A or B read as zero and stores
//     outside C are skipped, so edge tiles need no second kernel. K == 0 writes zeros.
//
// Each block computes a 128 x 128 tile of C with 256 threads; each thread owns an 8 x 8
// micro-tile made of rows {4ty..4ty+3, 64+4ty..64+4ty+3} and columns {4tx..4tx+3,
// 64+4tx..64+4tx+3}, so its shared-memory reads and global stores are float4s. K is walked
// in steps of 8 through two shared-memory buffers: the next step's tiles are loaded from
// global memory into registers while the current one is multiplied (double buffering, one
// barrier per step). The A tile is stored transposed (k-major) so that a thread's eight A
// values for one k are two float4 reads.
#include "common.cuh"

namespace erlcuda_matmul {

constexpr int kBM = 128;      // tile rows (of C and A)
constexpr int kBN = 128;      // tile columns (of C and B)
constexpr int kBK = 8;        // K step
constexpr int kThreads = 256;
// Padding of the transposed A tile's rows: with rows of 132 floats the transposed stores
// are free of bank conflicts, and 132 * 4 bytes keeps every row 16-byte aligned.
constexpr int kAPad = 4;
// Tiles are visited in groups of kGroupM tile-rows, column by column inside a group, so that
// the blocks resident at one time share panels of A and B in L2.
constexpr int kGroupM = 8;

struct Tile {
    int row0;  // first row of C in this tile
    int col0;  // first column of C in this tile
};

__device__ __forceinline__ Tile tile_of_block(int M, int N) {
    const int tiles_m = (M + kBM - 1) / kBM;
    const int tiles_n = (N + kBN - 1) / kBN;
    const int per_group = kGroupM * tiles_n;
    const int bid = blockIdx.x;
    const int group = bid / per_group;
    const int first_m = group * kGroupM;
    const int group_m = min(tiles_m - first_m, kGroupM);
    const int in_group = bid - group * per_group;
    Tile t;
    t.row0 = (first_m + in_group % group_m) * kBM;
    t.col0 = (in_group / group_m) * kBN;
    return t;
}

template <bool CHECKED>
__device__ __forceinline__ void gemm(const float* __restrict__ A, const float* __restrict__ B,
                                     float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[2][kBK][kBM + kAPad];
    __shared__ __align__(16) float Bs[2][kBK][kBN];

    const long long z = blockIdx.z;
    A += z * M * K;
    B += z * K * N;
    C += z * M * N;

    const Tile tile = tile_of_block(M, N);
    const int tid = threadIdx.x;

    // Global-to-shared copy: A tile (128 x 8) one float4 per thread, B tile (8 x 128) likewise.
    const int a_row = tid >> 1;         // 0..127
    const int a_col = (tid & 1) << 2;   // 0 or 4
    const int b_row = tid >> 5;         // 0..7
    const int b_col = (tid & 31) << 2;  // 0..124
    // Checked variant only: how many of this thread's four B columns lie inside B (0..4)
    // and whether its A row lies inside A. Differences, so nothing overflows near 2^31.
    const int b_cols_ok = max(0, min(4, N - tile.col0 - b_col));
    const bool a_row_ok = a_row < M - tile.row0;
    // This thread's next four A and B elements. For threads past an edge of the checked
    // variant these point outside the matrices and are never dereferenced.
    const float* a_src = A + (static_cast<long long>(tile.row0) + a_row) * K + a_col;
    const float* b_src = B + static_cast<long long>(b_row) * N + tile.col0 + b_col;

    // Compute position: warps are 4 x 8 threads of the 16 x 16 thread grid, which makes
    // each warp's shared-memory reads one broadcast-friendly 64- or 128-byte span.
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int ty = (warp >> 1) * 4 + (lane >> 3);  // 0..15
    const int tx = (warp & 1) * 8 + (lane & 7);    // 0..15

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            acc[i][j] = 0.0f;
        }
    }

    float4 a_ld;
    float4 b_ld;
    // Loads the next K step into a_ld / b_ld; a_src / b_src point at its first k, and
    // k_left is K minus that k.
    auto load = [&](int k_left) {
        if (!CHECKED) {
            a_ld = *reinterpret_cast<const float4*>(a_src);
            b_ld = *reinterpret_cast<const float4*>(b_src);
        } else {
            // k_left > 0 of this step's k are inside A and B (all eight when k_left >= 8).
            const int a_ks_ok = a_row_ok ? k_left - a_col : 0;
            a_ld.x = 0 < a_ks_ok ? a_src[0] : 0.0f;
            a_ld.y = 1 < a_ks_ok ? a_src[1] : 0.0f;
            a_ld.z = 2 < a_ks_ok ? a_src[2] : 0.0f;
            a_ld.w = 3 < a_ks_ok ? a_src[3] : 0.0f;
            const int b_ks_ok = b_row < k_left ? b_cols_ok : 0;
            b_ld.x = 0 < b_ks_ok ? b_src[0] : 0.0f;
            b_ld.y = 1 < b_ks_ok ? b_src[1] : 0.0f;
            b_ld.z = 2 < b_ks_ok ? b_src[2] : 0.0f;
            b_ld.w = 3 < b_ks_ok ? b_src[3] : 0.0f;
        }
    };
    auto store = [&](int buf) {
        As[buf][a_col + 0][a_row] = a_ld.x;
        As[buf][a_col + 1][a_row] = a_ld.y;
        As[buf][a_col + 2][a_row] = a_ld.z;
        As[buf][a_col + 3][a_row] = a_ld.w;
        *reinterpret_cast<float4*>(&Bs[buf][b_row][b_col]) = b_ld;
    };

    if (K > 0) {
        load(K);
        store(0);
        __syncthreads();
        int cur = 0;
        // k_left: K minus the first k of the step being multiplied; > kBK means another step.
        for (int k_left = K; k_left > 0; k_left -= kBK) {
            const bool more = k_left > kBK;
            if (more) {
                a_src += kBK;
                b_src += static_cast<long long>(kBK) * N;
                load(k_left - kBK);
            }
#pragma unroll
            for (int k = 0; k < kBK; ++k) {
                const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][k][ty * 4]);
                const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][k][ty * 4 + 64]);
                const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][k][tx * 4]);
                const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][k][tx * 4 + 64]);
                const float ar[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float br[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
                    }
                }
            }
            if (more) {
                store(cur ^ 1);  // the buffer read in the previous step, fenced by its barrier
            }
            __syncthreads();
            cur ^= 1;
        }
    }

    // This thread's rows 4ty + {0..3} and 64 + 4ty + {0..3}, columns 4tx + {0..3} and
    // 64 + 4tx + {0..3} of the tile, relative to c_base (row 4ty, column 4tx).
    float* c_base = C + (static_cast<long long>(tile.row0) + ty * 4) * N + tile.col0 + tx * 4;
    const int rows_left = M - tile.row0 - ty * 4;  // checked variant: rows r < rows_left exist
    const int cols_left = N - tile.col0 - tx * 4;  // and columns c < cols_left
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = (i < 4 ? 0 : 64) + (i & 3);
        float* c_row = c_base + static_cast<long long>(r) * N;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = h * 64;
            const float* v = &acc[i][h * 4];
            if (!CHECKED) {
                *reinterpret_cast<float4*>(c_row + c) = make_float4(v[0], v[1], v[2], v[3]);
            } else if (r < rows_left) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (c + j < cols_left) {
                        c_row[c + j] = v[j];
                    }
                }
            }
        }
    }
}

}  // namespace erlcuda_matmul

extern "C" __global__ void __launch_bounds__(erlcuda_matmul::kThreads, 2)
matmul_aligned(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
               int M, int N, int K) {
    erlcuda_matmul::gemm<false>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(erlcuda_matmul::kThreads, 2)
matmul_checked(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
               int M, int N, int K) {
    erlcuda_matmul::gemm<true>(A, B, C, M, N, K);
}

// -- f64 ------------------------------------------------------------------------------------
// matmul_f64: C = A B for row-major f64 matrices, any M, N, K >= 0 (bounds checked; K == 0
// writes zeros), jobs of a batch in blockIdx.z as above. A plainer kernel than the f32 one:
// blockIdx.x numbers the 64 x 64 tiles of C (ceil(M/64) * ceil(N/64), row-major); each of
// the 256 threads computes a 4 x 4 micro-tile with rows ty + 16i and columns tx + 16j, so a
// warp's shared-memory reads are broadcasts or consecutive and its stores coalesce; K is
// walked in steps of 16 through shared memory. Bounds are compared as differences, so
// nothing overflows near 2^31.
namespace erlcuda_matmul_f64 {

constexpr int kBM = 64;
constexpr int kBN = 64;
constexpr int kBK = 16;
constexpr int kThreads = 256;
constexpr int kMicro = 4;  // micro-tile rows and columns per thread
constexpr int kSide = 16;  // threads per tile row and per tile column

}  // namespace erlcuda_matmul_f64

extern "C" __global__ void __launch_bounds__(erlcuda_matmul_f64::kThreads)
matmul_f64(const double* __restrict__ A, const double* __restrict__ B, double* __restrict__ C,
           int M, int N, int K) {
    using namespace erlcuda_matmul_f64;
    // +1: the transposed stores of the A tile spread over more banks.
    __shared__ double As[kBK][kBM + 1];
    __shared__ double Bs[kBK][kBN];

    const long long z = blockIdx.z;
    A += z * M * K;
    B += z * K * N;
    C += z * M * N;

    const int tiles_n = (N + kBN - 1) / kBN;
    const int row0 = static_cast<int>(blockIdx.x / tiles_n) * kBM;
    const int col0 = static_cast<int>(blockIdx.x % tiles_n) * kBN;
    const int rows_left = M - row0;  // rows r < rows_left of the tile exist
    const int cols_left = N - col0;
    const int tid = threadIdx.x;
    const int tx = tid % kSide;
    const int ty = tid / kSide;

    double acc[kMicro][kMicro];
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
            acc[i][j] = 0.0;
        }
    }

    for (int k_left = K; k_left > 0; k_left -= kBK) {
        const int k0 = K - k_left;
        // Each thread loads four elements of the A tile (64 x 16, stored k-major) and four of
        // the B tile (16 x 64); outside A or B they read as zero.
#pragma unroll
        for (int r = 0; r < (kBM * kBK) / kThreads; ++r) {
            const int e = tid + r * kThreads;
            const int ar = e / kBK;
            const int ak = e % kBK;
            As[ak][ar] = (ar < rows_left && ak < k_left)
                             ? A[static_cast<long long>(row0 + ar) * K + k0 + ak]
                             : 0.0;
            const int bk = e / kBN;
            const int bc = e % kBN;
            Bs[bk][bc] = (bk < k_left && bc < cols_left)
                             ? B[static_cast<long long>(k0 + bk) * N + col0 + bc]
                             : 0.0;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kBK; ++k) {
            double a[kMicro];
            double b[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
                a[i] = As[k][ty + kSide * i];
                b[i] = Bs[k][tx + kSide * i];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
#pragma unroll
                for (int j = 0; j < kMicro; ++j) {
                    acc[i][j] = fma(a[i], b[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
        const int r = ty + kSide * i;
        if (r < rows_left) {
            double* c_row = C + static_cast<long long>(row0 + r) * N + col0;
#pragma unroll
            for (int j = 0; j < kMicro; ++j) {
                const int c = tx + kSide * j;
                if (c < cols_left) {
                    c_row[c] = acc[i][j];
                }
            }
        }
    }
}
