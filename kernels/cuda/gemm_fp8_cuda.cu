// DeepGEMM-like FP8 block-scaled GEMM in plain CUDA C++ (no CUTLASS, no tensor cores: SIMT FFMA).
//
//   C[M, N] (bf16) = (A [M, K] e4m3 * SA [M, K/128]) @ (B [N, K] e4m3 * SB [ceil(N/128), K/128])^T
//
// A is scaled per 1x128 block (per token, per 128 channels), B per 128x128 block, as DeepGEMM's
// fp8_gemm_nt. One block computes a BLOCK_M x BLOCK_N tile of C; each thread a TM x TN micro-tile
// (rows ty + i * BLOCK_M/TM, columns tx + j * BLOCK_N/TN: a warp's loads of A are broadcasts and its
// stores of C coalesced). K is walked in 128-wide slabs, the scale granularity: every slab's products are
// summed in a per-thread `part` accumulator, then promoted into the fp32 `acc` with the slab's two
// scales (DeepGEMM's promotion, which bounds the error of the low-precision partial sums).
//
// Staging: STAGES slabs of A and B live in static shared memory, filled by cp.async (16 bytes a copy,
// zero-filled past M or N), a multistage pipeline with STAGES - 1 slabs in flight while one is
// computed. Rows are padded by 16 bytes (144 B stride): a quarter-warp's 16-byte reads of 8 different
// rows then fall in 8 different bank groups. Static shared memory is
//   STAGES * ((BLOCK_M + BLOCK_N) * 144 + BLOCK_M * 4) bytes,
// and ptxas refuses more than 48 KiB of it on sm_90 ("uses too much shared data (..., 0xc000 max)"):
// the deep pipelines of big tiles do not compile, and big micro-tiles (2 * TM * TN fp32 accumulators
// per thread) spill. Those are the facts a sweep reads on a host with no GPU.
//
// Requires K % 128 == 0 and 16-byte aligned rows (the host wrapper checks both).

#include <cuda_bf16.h>
#include <stdint.h>

#define KREGRESS_BK 128
#define KREGRESS_PAD 16

// One e4m3 byte (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities) as a float.
__device__ __forceinline__ float e4m3_to_float(uint32_t v) {
    const uint32_t sign = (v & 0x80u) << 24;
    const uint32_t exp = (v >> 3) & 0xFu;
    const uint32_t man = v & 0x7u;
    if (exp == 0u) {  // subnormal: man * 2^-9
        const float mag = static_cast<float>(man) * 0.001953125f;
        return __uint_as_float(__float_as_uint(mag) | sign);
    }
    if (exp == 0xFu && man == 0x7u) {
        return __uint_as_float(0x7FC00000u | sign);  // NaN
    }
    return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int src_bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <int BLOCK_M, int BLOCK_N, int STAGES, int TM, int TN>
__global__ void __launch_bounds__((BLOCK_M / TM) * (BLOCK_N / TN))
fp8_gemm_kernel(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B, const float* __restrict__ SA,
                const float* __restrict__ SB, __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    constexpr int BK = KREGRESS_BK;
    constexpr int ROW = BK + KREGRESS_PAD;
    constexpr int THREADS_N = BLOCK_N / TN;
    constexpr int THREADS = (BLOCK_M / TM) * THREADS_N;
    constexpr int CHUNKS = BK / 16;  // 16-byte copies per row of a slab

    __shared__ __align__(16) uint8_t sA[STAGES][BLOCK_M][ROW];
    __shared__ __align__(16) uint8_t sB[STAGES][BLOCK_N][ROW];
    __shared__ float sSA[STAGES][BLOCK_M];

    const int tid = threadIdx.x;
    const int tx = tid % THREADS_N;
    const int ty = tid / THREADS_N;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;
    const int kslabs = K / BK;

    auto load_slab = [&](int stage, int kb) {
        const size_t k0 = static_cast<size_t>(kb) * BK;
        for (int c = tid; c < BLOCK_M * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 16;
            const bool ok = m0 + r < M;
            cp_async_16(&sA[stage][r][col], A + (ok ? (static_cast<size_t>(m0 + r) * K + k0 + col) : 0), ok);
        }
        for (int c = tid; c < BLOCK_N * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 16;
            const bool ok = n0 + r < N;
            cp_async_16(&sB[stage][r][col], B + (ok ? (static_cast<size_t>(n0 + r) * K + k0 + col) : 0), ok);
        }
        for (int r = tid; r < BLOCK_M; r += THREADS) {
            sSA[stage][r] = (m0 + r < M) ? SA[static_cast<size_t>(m0 + r) * kslabs + kb] : 0.0f;
        }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // prologue: STAGES - 1 slabs in flight
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < kslabs) load_slab(s, s);
        cp_async_commit();
    }

    for (int kb = 0; kb < kslabs; ++kb) {
        const int stage = kb % STAGES;
        if constexpr (STAGES == 1) {
            load_slab(0, kb);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
        } else {
            cp_async_wait<STAGES - 2>();  // slab kb has landed
            __syncthreads();              // ... for every thread, and slab kb - 1 is no longer read
            const int next = kb + STAGES - 1;
            if (next < kslabs) load_slab(next % STAGES, next);
            cp_async_commit();
        }

        float part[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) part[i][j] = 0.0f;

#pragma unroll 1
        for (int k = 0; k < BK; k += 16) {
            uint4 ra[TM], rb[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = *reinterpret_cast<const uint4*>(&sA[stage][ty + i * (BLOCK_M / TM)][k]);
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = *reinterpret_cast<const uint4*>(&sB[stage][tx + j * THREADS_N][k]);
#pragma unroll
            for (int w = 0; w < 4; ++w) {
#pragma unroll
                for (int byte = 0; byte < 4; ++byte) {
                    float a[TM], b[TN];
#pragma unroll
                    for (int i = 0; i < TM; ++i) {
                        const uint32_t word = w == 0 ? ra[i].x : w == 1 ? ra[i].y : w == 2 ? ra[i].z : ra[i].w;
                        a[i] = e4m3_to_float((word >> (8 * byte)) & 0xFFu);
                    }
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        const uint32_t word = w == 0 ? rb[j].x : w == 1 ? rb[j].y : w == 2 ? rb[j].z : rb[j].w;
                        b[j] = e4m3_to_float((word >> (8 * byte)) & 0xFFu);
                    }
#pragma unroll
                    for (int i = 0; i < TM; ++i)
#pragma unroll
                        for (int j = 0; j < TN; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
                }
            }
        }

        // promotion: the slab's partial sums times its A (1x128) and B (128x128) scales
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx + j * THREADS_N;
            const float sb = n < N ? SB[static_cast<size_t>(n / BK) * kslabs + kb] : 0.0f;
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i][j] = fmaf(part[i][j], sSA[stage][ty + i * (BLOCK_M / TM)] * sb, acc[i][j]);
        }
        if constexpr (STAGES == 1) {
            __syncthreads();  // the one stage is refilled next slab
        }
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty + i * (BLOCK_M / TM);
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx + j * THREADS_N;
            if (n < N) C[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc[i][j]);
        }
    }
}
