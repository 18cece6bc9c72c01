/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for a few rows m, float32; AVX2 + FMA, or AVX-512 where compiled
 * with -mavx512f (selfspec/few_row_linear.py picks the flags from what the CPU has).
 *
 * Streams each weight row from memory once for all rows of x: four weight rows at a time are multiplied by every
 * row of x, PASS_ROWS rows of x at a time (4 * PASS_ROWS accumulators in registers: 12 of AVX2's 16, 16 of
 * AVX-512's 32), over slices of K_SLICE columns so that the four weight slices and the rows' slices in use stay in
 * L1 (a row's partial sums wait in `partial` between slices).
 * While one block of weight rows is multiplied, the next block is prefetched a cache line at a time, spread over
 * all the block's passes so that memory streams while the arithmetic runs (an AMD EPYC with AVX2, SmolLM2's
 * shapes: over 8 rows the product costs 0.9-1.2 one-row products, over 16 1.1-1.8, over 32 1.6-2.9, against
 * 1.8-2.9, 2.2-3.5, 2.7-5.3 for F.linear; an Intel Xeon with AVX-512, weights streamed from memory:
 * AVX2 1.2-1.3 / 1.7-1.8 / 2.8-3.1, AVX-512 1.1-1.2 / 1.3-1.5 / 2.0-2.4, F.linear 1.8-3.4 / 2.1-3.1 / 2.5-3.4).
 * Every output element is the same sum in the same order whatever the number of rows (each lane of an accumulator
 * adds its products in k order, slice after slice, then the lanes are summed), so a row's result does not depend
 * on its neighbours. Requires k_dim % 8 == 0 and contiguous row-major x [rows, k_dim], w [n_dim, k_dim],
 * y [rows, n_dim]; bias may be NULL.
 * Two entry points: few_row_linear (float32 weights) and few_row_linear_bf16 (bfloat16 weights, widened to float32
 * exactly as they are loaded: half the bytes streamed, the same float32 arithmetic; for a drafter's layers, whose
 * products need not match the model's). One body serves both: `weight_bf16` is a constant at each entry point, so
 * the compiler builds two copies with no test left inside the loops.
 * One to four rows of float32 weights take a path of their own in the AVX-512 build (`short_rows`): plain
 * decoding's products, short chains' verify forwards, a drafter's float32 products. The general path repeats the
 * last row to fill PASS_ROWS and slices the columns, which so few rows do not need; streaming four weight rows at a
 * time over all their columns measured on an AMD EPYC (AVX-512; SmolLM2's layers and LM head, weights
 * streamed from memory) 0.70-0.75x of the general path's time for one row (~15 ms against ~21 ms a pass, ~37 GB/s
 * against ~26) and 0.82-0.85x for two to four (16.6 / 16.8 / 18.0 ms against 20.2 / 20.4 / 21.2). Not taken by the
 * AVX2 build or for bfloat16 weights, where one row measured slower that way (AVX2) or was not measured over 2-4.
 */
#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define PASS_ROWS 4        /* measured best of 3, 4 and 6 on an Intel Xeon */
#define ZERO() _mm512_setzero_ps()
#define LOAD(p) _mm512_loadu_ps(p)
#define LOAD8(p) _mm512_maskz_loadu_ps(0x00FF, p)  /* 8 columns, the other lanes 0 */
#define FMA(a, b, acc) _mm512_fmadd_ps(a, b, acc)
/* 16 (8) bfloat16 weights widened to float32: the 16 bits become a float32's high half */
#define LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32( \
    _mm256_loadu_si256((const __m256i *)(p))), 16))
#define LOAD8_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32( \
    _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(p)), 0)), 16))
static inline float sum_lanes(vec v) { return _mm512_reduce_add_ps(v); }
#else
typedef __m256 vec;
#define LANES 8
#define PASS_ROWS 3
#define ZERO() _mm256_setzero_ps()
#define LOAD(p) _mm256_loadu_ps(p)
#define LOAD8(p) _mm256_loadu_ps(p)
#define FMA(a, b, acc) _mm256_fmadd_ps(a, b, acc)
#define LOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32( \
    _mm_loadu_si128((const __m128i *)(p))), 16))
#define LOAD8_BF16(p) LOAD_BF16(p)
static inline float sum_lanes(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_movehdup_ps(s);
    s = _mm_add_ps(s, h);
    h = _mm_movehl_ps(h, s);
    return _mm_cvtss_f32(_mm_add_ss(s, h));
}
#endif

#define K_SLICE 256  /* columns per slice: 4 weight rows (4 KB in float32) + PASS_ROWS rows of x (3-4 KB) in L1 */
#define GROUP 48     /* rows of x per sweep over the weights (more rows: one sweep per group) */
_Static_assert(GROUP % PASS_ROWS == 0, "partial[] holds GROUP rows, filled PASS_ROWS at a time");
_Static_assert(K_SLICE % 16 == 0, "a slice is whole 16-column steps; only the last one may end in 8 columns");

#define INLINE static inline __attribute__((always_inline))

/* Weight row `w` (float32 or bfloat16), columns k .. k + LANES - 1 (k .. k + 7 with `eight`, the other lanes 0). */
INLINE vec load_weights(const void *w, long k, int weight_bf16, int eight) {
    if (weight_bf16)
        return eight ? LOAD8_BF16((const unsigned short *)w + k) : LOAD_BF16((const unsigned short *)w + k);
    return eight ? LOAD8((const float *)w + k) : LOAD((const float *)w + k);
}

/* One vector of columns (16 or the last 8: `eight`) of P rows of x (xr[0 .. P - 1]) against weight rows w0-w3. */
#define MULTIPLY(k, eight) { \
    vec q0 = load_weights(w0, k, weight_bf16, eight), q1 = load_weights(w1, k, weight_bf16, eight); \
    vec q2 = load_weights(w2, k, weight_bf16, eight), q3 = load_weights(w3, k, weight_bf16, eight); \
    _Pragma("GCC unroll 8") \
    for (int r = 0; r < P; r++) { \
        vec v = (eight) ? LOAD8(xr[r] + (k)) : LOAD(xr[r] + (k)); \
        acc[r][0] = FMA(v, q0, acc[r][0]); acc[r][1] = FMA(v, q1, acc[r][1]); \
        acc[r][2] = FMA(v, q2, acc[r][2]); acc[r][3] = FMA(v, q3, acc[r][3]); \
    } }

/* One weight row against every row of x (the last n_dim % 4 rows). */
INLINE void one_weight_row(const float *x, long rows, long k_dim, const void *w, float *y, long ldy,
                           int weight_bf16) {
    for (long m = 0; m < rows; m++) {
        const float *xm = x + m * k_dim;
        vec s = ZERO();
        long k = 0;
        for (; k + LANES <= k_dim; k += LANES)
            s = FMA(LOAD(xm + k), load_weights(w, k, weight_bf16, 0), s);
        if (k < k_dim)
            s = FMA(LOAD8(xm + k), load_weights(w, k, weight_bf16, 1), s);
        y[m * ldy] = sum_lanes(s);
    }
}

#if defined(__AVX512F__)
#define SHORT_ROWS_PATH 1
#else
#define SHORT_ROWS_PATH 0
#endif

/* P <= PASS_ROWS rows of x against every float32 weight row, four weight rows at a time over all their columns (no
 * slices: the rows of x stay in L1 / L2, and each weight row is read once whatever P). One row streams with no
 * software prefetch (the CPU's own prefetchers follow four sequential streams: measured faster); two to four fetch
 * the next four weight rows a line per row per 16 columns, as the general path does. The same sums in the same
 * order as the general path (each lane adds its products in k order; the lanes are summed at the end), so a row's
 * result is still the same whatever the rows beside it. */
INLINE void short_rows(const int P, const float *x, long k_dim, const float *w, long n_dim, long ldy, float *y) {
    const int weight_bf16 = 0;  /* (MULTIPLY's loads) */
    long n = 0;
    for (; n + 4 <= n_dim; n += 4) {
        const float *w0 = w + n * k_dim, *w1 = w0 + k_dim, *w2 = w1 + k_dim, *w3 = w2 + k_dim;
        const float *next = w3 + k_dim;  /* the next block of four weight rows */
        const int fetch = P > 1 && n + 8 <= n_dim;
        const float *xr[PASS_ROWS];
        vec acc[PASS_ROWS][4];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++) {
            xr[r] = x + r * k_dim;
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++)
                acc[r][j] = ZERO();
        }
        long k = 0;
        for (; k + 16 <= k_dim; k += 16) {
            if (fetch) {
                _mm_prefetch((const char *)(next + k), _MM_HINT_T0);
                _mm_prefetch((const char *)(next + k_dim + k), _MM_HINT_T0);
                _mm_prefetch((const char *)(next + 2 * k_dim + k), _MM_HINT_T0);
                _mm_prefetch((const char *)(next + 3 * k_dim + k), _MM_HINT_T0);
            }
            _Pragma("GCC unroll 2")
            for (long h = k; h < k + 16; h += LANES)
                MULTIPLY(h, 0)
        }
        if (k < k_dim)  /* the last 8 columns (k_dim % 16 == 8) */
            MULTIPLY(k, 1)
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++)
                y[r * ldy + n + j] = sum_lanes(acc[r][j]);
    }
    for (; n < n_dim; n++)
        one_weight_row(x, P, k_dim, w + n * k_dim, y + n, ldy, 0);
}

/* rows <= GROUP rows of x against every weight row. */
INLINE void row_group(const float *x, long rows, long k_dim, const void *w, long n_dim, long ldy, float *y,
                      int weight_bf16) {
    const int P = PASS_ROWS;  /* (MULTIPLY's rows: every pass has PASS_ROWS, repeating the last row past the end) */
    const long row_bytes = k_dim * (weight_bf16 ? 2 : 4);
    /* one 64-byte line of each of the next block's rows per this many 16-column steps of each pass */
    const long steps_per_line = weight_bf16 ? 2 : 1;
    vec partial[GROUP * 4];  /* [row][weight row of the block]: per-lane sums over the slices so far */
    long passes = (rows + PASS_ROWS - 1) / PASS_ROWS, n = 0;
    for (; n + 4 <= n_dim; n += 4) {
        const char *w0 = (const char *)w + n * row_bytes, *w1 = w0 + row_bytes, *w2 = w1 + row_bytes;
        const char *w3 = w2 + row_bytes;
        const char *next = w0 + 4 * row_bytes;  /* the next block of four weight rows */
        long fetch = n + 8 <= n_dim, fetched = 0, countdown = 0;
        for (long k0 = 0; k0 < k_dim; k0 += K_SLICE) {
            long k1 = k0 + K_SLICE < k_dim ? k0 + K_SLICE : k_dim;
            for (long m = 0; m < rows; m += PASS_ROWS) {  /* rows m .. m + PASS_ROWS - 1, repeating m past the last */
                const float *xr[PASS_ROWS];
                long row[PASS_ROWS];
                vec acc[PASS_ROWS][4];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < PASS_ROWS; r++) {
                    row[r] = m + r < rows ? m + r : m;
                    xr[r] = x + row[r] * k_dim;
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < PASS_ROWS; r++)
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < 4; j++)
                        acc[r][j] = k0 == 0 ? ZERO() : partial[4 * (m + r) + j];
                long k = k0;
                for (; k + 16 <= k1; k += 16) {  /* 16 columns of each of the four weight rows */
                    if (fetch && countdown-- == 0) {  /* one 64-byte line of the next block every few steps */
                        const char *p = next + fetched;
                        _mm_prefetch(p, _MM_HINT_T0);
                        _mm_prefetch(p + row_bytes, _MM_HINT_T0);
                        _mm_prefetch(p + 2 * row_bytes, _MM_HINT_T0);
                        _mm_prefetch(p + 3 * row_bytes, _MM_HINT_T0);
                        fetched += 64;
                        countdown = passes * steps_per_line - 1;
                    }
                    _Pragma("GCC unroll 2")
                    for (long h = k; h < k + 16; h += LANES)
                        MULTIPLY(h, 0)
                }
                if (k < k1)  /* the last 8 columns of a row (k_dim % 16 == 8) */
                    MULTIPLY(k, 1)
                if (k1 < k_dim) {
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < PASS_ROWS; r++)
                        _Pragma("GCC unroll 4")
                        for (int j = 0; j < 4; j++)
                            partial[4 * (m + r) + j] = acc[r][j];
                    continue;
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < PASS_ROWS; r++)  /* (a repeated row writes its row's own value again) */
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < 4; j++)
                        y[row[r] * ldy + n + j] = sum_lanes(acc[r][j]);
            }
        }
    }
    for (; n < n_dim; n++)
        one_weight_row(x, rows, k_dim, (const char *)w + n * row_bytes, y + n, ldy, weight_bf16);
}

/* Weight rows n_lo .. n_hi - 1 (n_lo a multiple of 4) against every row of x, into columns n_lo .. n_hi - 1 of y
 * [rows, ldy]: each block of four weight rows is the same sums in the same order as in a call over all of them. */
INLINE void weight_rows(const float *x, long rows, long k_dim, const void *w, long n_lo, long n_hi, long ldy, float *y,
                        int weight_bf16) {
    const void *wn = (const char *)w + n_lo * k_dim * (weight_bf16 ? 2 : 4);
    long n_dim = n_hi - n_lo;
    y += n_lo;
    if (SHORT_ROWS_PATH && rows <= PASS_ROWS && !weight_bf16) {
        const float *wf = (const float *)wn;  /* (P a constant in each call: its loops over rows unroll into registers) */
        if (rows == 1) short_rows(1, x, k_dim, wf, n_dim, ldy, y);
        else if (rows == 2) short_rows(2, x, k_dim, wf, n_dim, ldy, y);
        else if (rows == 3) short_rows(3, x, k_dim, wf, n_dim, ldy, y);
        else short_rows(PASS_ROWS, x, k_dim, wf, n_dim, ldy, y);
    } else
        for (long m = 0; m < rows; m += GROUP)
            row_group(x + m * k_dim, rows - m < GROUP ? rows - m : GROUP, k_dim, wn, n_dim, ldy, y + m * ldy,
                      weight_bf16);
}

/* Threads: where built with OpenMP (-fopenmp; it then shares the process's OpenMP runtime, the one torch runs its own
 * parallel loops in), the weight rows are split between up to omp_get_max_threads() threads in blocks of four
 * (torch's thread count: torch.set_num_threads sets it), each thread streaming its share of the weights, and each
 * thread given at least WEIGHTS_PER_THREAD weights (128 KB of float32: a share much smaller streams in less time than
 * waking a thread takes, so a product of SmolLM2's key projection, 110k weights, takes at most three threads however
 * many cores there are). A product called inside a parallel region stays on the calling thread. Every output element is
 * computed by one thread with the same code, so the result is bitwise the same for any number of threads.
 * An AMD EPYC with AVX-512 (2 vCPUs): one thread streams ~25-30 GB/s, two ~35-60 GB/s. */
#define WEIGHTS_PER_THREAD 32768

/* Threads for a product of n_dim x k_dim weights: at most one per WEIGHTS_PER_THREAD weights and per 4 weight rows;
 * the caller's thread alone inside a parallel region. */
INLINE int product_threads(long n_dim, long k_dim) {
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) {
        long most = n_dim * k_dim / WEIGHTS_PER_THREAD;
        threads = omp_get_max_threads();
        if (threads > most)
            threads = (int)most;
        if (threads > n_dim / 4)
            threads = (int)(n_dim / 4);
    }
#endif
    return threads;
}

INLINE void linear(const float *x, long rows, long k_dim, const void *w, long n_dim, const float *bias, float *y,
                   int weight_bf16) {
    int threads = product_threads(n_dim, k_dim);
    if (threads > 1) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        {
            long blocks = n_dim / 4, t = omp_get_thread_num(), T = omp_get_num_threads();
            long n_lo = 4 * (blocks * t / T), n_hi = t == T - 1 ? n_dim : 4 * (blocks * (t + 1) / T);
            weight_rows(x, rows, k_dim, w, n_lo, n_hi, n_dim, y, weight_bf16);
        }
#endif
    } else
        weight_rows(x, rows, k_dim, w, 0, n_dim, n_dim, y, weight_bf16);
    if (bias)
        for (long m = 0; m < rows; m++)
            for (long j = 0; j < n_dim; j++)
                y[m * n_dim + j] += bias[j];
}

void few_row_linear(const float *x, long rows, long k_dim, const float *w, long n_dim, const float *bias, float *y) {
    linear(x, rows, k_dim, w, n_dim, bias, y, 0);
}

void few_row_linear_bf16(const float *x, long rows, long k_dim, const unsigned short *w, long n_dim,
                         const float *bias, float *y) {
    linear(x, rows, k_dim, w, n_dim, bias, y, 1);
}

/* The most threads a product is split between when called here now: torch's thread count where built with OpenMP,
 * else 1 (a product takes fewer where it has fewer than WEIGHTS_PER_THREAD weights or four weight rows each). */
int few_row_linear_threads(void) {
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

/* The fewest weights (rows x columns) each thread of a split product gets. */
long few_row_linear_weights_per_thread(void) { return WEIGHTS_PER_THREAD; }

/* ---- GGUF quantized weights (selfspec/kernel/quantized.py) ----
 * y[m, n] = sum_k x[m, k] * w[n, k] with w stored as GGUF blocks of 32 weights along k, each weight row
 * `row_bytes = k_dim / 32 * BLOCK_BYTES(type)` bytes, as llama.cpp writes them (gguf.quants dequantizes the same):
 *   Q4_0 (type 2): f16 d, 16 bytes of nibbles; w[j] = d * (low nibble of byte j - 8), w[16 + j] = d * (high - 8)
 *   Q4_1 (type 3): f16 d, f16 m, 16 bytes of nibbles; w[j] = d * low nibble + m, w[16 + j] = d * high + m
 *   Q5_0 (type 6): f16 d, 4 bytes of fifth bits (bit j of the little-endian word: weight j's), 16 bytes of nibbles as
 *                  Q4_0's; w[j] = d * (nibble + 16 * fifth bit - 16)
 *   Q8_0 (type 8): f16 d, 32 int8; w[j] = q[j] * d
 * and two forms that are not the file's bytes but a K-quant's weights re-blocked exactly into blocks of 32
 * (`selfspec/kernel/reblock.py`; float32 scales, since a super-block's f16 scale times a sub-block's integer one needs
 * up to 19 significant bits):
 *   Q4_K (type 12): f32 d, f32 m, 16 bytes of nibbles as Q4_1's; w[j] = d * low nibble + m, w[16 + j] = d * high + m
 *   Q6_K (type 14): f32 d0, f32 d1, 32 int8; w[j] = d0 * q[j] for j < 16, d1 * q[j] for j >= 16
 * Each weight is dequantized in registers to the float32 value gguf's numpy dequantizer gives (a product, then a sum,
 * each rounded: the file is built with -ffp-contract=off so that d * q + m never becomes one fused rounding), and a
 * tile of a few weight rows is written to a small buffer in L1 and multiplied by every row of x by the float32 path
 * above (`weight_rows`). So the product is the dequantized model's up to the order of the float32 additions, the
 * sums are those of the float32 kernel over the dequantized weights (the same whatever the rows beside a row, or the
 * number of threads), and memory streams the blocks (Q4_1: 5 bits a weight, Q8_0: 8.5) instead of 32 bits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

INLINE long block_bytes(int type) {
    return type == Q8_0 ? 34 : type == Q4_1 ? 20 : type == Q4_0 ? 18 : type == Q5_0 ? 22 : type == Q4_K ? 24
         : type == Q6_K ? 40 : 0;
}
INLINE int float_scales(int type) { return type == Q4_K || type == Q6_K; }  /* (the re-blocked K-quants) */
/* the bytes opening a block: its scales (and Q5_0's fifth bits) */
INLINE long header_bytes(int type) { return type == Q4_1 ? 4 : type == Q5_0 ? 6 : float_scales(type) ? 8 : 2; }
INLINE int signed_bytes(int type) { return type == Q8_0 || type == Q6_K; }  /* else 16 bytes of nibbles */
INLINE int has_min(int type) { return type == Q4_1 || type == Q4_K; }

INLINE float half_at(const uint8_t *p) {
    unsigned short h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE float float_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* One block of a re-blocked K-quant -> its 32 float32 weights (a product, then Q4_K's sum, each rounded as gguf's). */
INLINE void dequantize_reblocked(const int type, const uint8_t *b, float *out) {
    const float d = float_at(b), second = float_at(b + 4);
    const uint8_t *q = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        if (type == Q4_K) {
            out[j] = d * (float)(q[j] & 15) + second;
            out[QK / 2 + j] = d * (float)(q[j] >> 4) + second;
        } else {
            out[j] = d * (float)(int8_t)q[j];
            out[QK / 2 + j] = second * (float)(int8_t)q[QK / 2 + j];
        }
    }
}

/* One Q5_0 block -> its 32 float32 weights (a product of d and the integer, rounded as gguf's). */
INLINE void dequantize_q5_0(const uint8_t *b, float *out) {
    const float d = half_at(b);
    uint32_t fifth;
    memcpy(&fifth, b + 2, 4);
    for (int j = 0; j < QK; j++) {
        const int nibble = j < QK / 2 ? b[6 + j] & 15 : b[6 + j - QK / 2] >> 4;
        out[j] = d * (float)(nibble + 16 * (int)(fifth >> j & 1) - 16);
    }
}

/* One block of `type` -> its 32 float32 weights in QK / LANES vectors (registers, where inlined). */
INLINE void dequantize_vecs(const int type, const uint8_t *b, vec *v) {
    if (float_scales(type) || type == Q5_0) {  /* (the float path here: correct, not tuned; int8 is their fast one) */
        float w[QK];
        if (type == Q5_0)
            dequantize_q5_0(b, w);
        else
            dequantize_reblocked(type, b, w);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < QK / LANES; i++)
            v[i] = LOAD(w + i * LANES);
        return;
    }
    const float d = half_at(b);
#if defined(__AVX512F__)
    const __m512 vd = _mm512_set1_ps(d);
    if (type == Q8_0) {
        v[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), vd);
        v[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), vd);
        return;
    }
    const uint8_t *qs = b + (type == Q4_1 ? 4 : 2);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    if (type == Q4_0) {
        const __m512i eight = _mm512_set1_epi32(8);
        v[0] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, eight)));
        v[1] = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, eight)));
    } else {
        const __m512 vm = _mm512_set1_ps(half_at(b + 2));
        v[0] = _mm512_add_ps(_mm512_mul_ps(vd, _mm512_cvtepi32_ps(lo)), vm);
        v[1] = _mm512_add_ps(_mm512_mul_ps(vd, _mm512_cvtepi32_ps(hi)), vm);
    }
#else
    const __m256 vd = _mm256_set1_ps(d);
    if (type == Q8_0) {
        _Pragma("GCC unroll 4")
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i)))), vd);
        return;
    }
    const uint8_t *qs = b + (type == Q4_1 ? 4 : 2);
    const __m256 vm = type == Q4_1 ? _mm256_set1_ps(half_at(b + 2)) : _mm256_setzero_ps();
    _Pragma("GCC unroll 2")
    for (int i = 0; i < 2; i++) {  /* bytes 8i .. 8i + 7: weights 8i .. (low nibbles) and 16 + 8i .. (high) */
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)));
        __m256i lo = _mm256_and_si256(q, _mm256_set1_epi32(15)), hi = _mm256_srli_epi32(q, 4);
        if (type == Q4_0) {
            const __m256i eight = _mm256_set1_epi32(8);
            v[i] = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, eight)));
            v[2 + i] = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, eight)));
        } else {
            v[i] = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(lo)), vm);
            v[2 + i] = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(hi)), vm);
        }
    }
#endif
}

/* One block of `type` -> 32 float32 weights at out. */
INLINE void dequantize_block(const int type, const uint8_t *b, float *out) {
    vec v[QK / LANES];
    dequantize_vecs(type, b, v);
    _Pragma("GCC unroll 4")
    for (int i = 0; i < QK / LANES; i++)
#if defined(__AVX512F__)
        _mm512_storeu_ps(out + i * LANES, v[i]);
#else
        _mm256_storeu_ps(out + i * LANES, v[i]);
#endif
}

/* P <= 5 rows of x against weight rows n_lo .. n_hi - 1 (plain decoding, short chains), each block dequantized into
 * registers once and multiplied there by every row, W weight rows at a time (4, or 2 for five rows: P * W <= 16
 * accumulators; six to eight rows spilled registers, 2-3x slower than the tiles on an AVX-512 EPYC, SmolLM2's Q4_1
 * MLP layer: 1 row 0.08 ms, 4 rows 0.11, 5 rows 0.13 against 0.22 through the tiles): one accumulator a (row,
 * weight row), its products added in k order, its lanes summed at the end, the same sums in the same order as the float32 paths
 * over the dequantized weights (so a row's result is the same whatever the rows beside it). */
INLINE void short_rows_quantized(const int P, const int W, const int type, const float *x, long k_dim, const uint8_t *w,
                                 long n_lo, long n_hi, long ldy, float *y) {
    const long per_block = block_bytes(type), row_bytes = k_dim / QK * per_block, blocks = k_dim / QK;
    long n = n_lo;
    for (; n + W <= n_hi; n += W) {
        const uint8_t *w0 = w + n * row_bytes;
        vec acc[5][4];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < W; j++)
                acc[r][j] = ZERO();
        for (long b = 0; b < blocks; b++) {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < W; j++) {
                vec v[QK / LANES];
                dequantize_vecs(type, w0 + j * row_bytes + b * per_block, v);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < QK / LANES; i++)
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < P; r++)
                        acc[r][j] = FMA(LOAD(x + r * k_dim + b * QK + i * LANES), v[i], acc[r][j]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < W; j++)
                y[r * ldy + n + j] = sum_lanes(acc[r][j]);
    }
    for (; n < n_hi; n++) {
        vec acc[5];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++)
            acc[r] = ZERO();
        for (long b = 0; b < blocks; b++) {
            vec v[QK / LANES];
            dequantize_vecs(type, w + n * row_bytes + b * per_block, v);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < QK / LANES; i++)
                _Pragma("GCC unroll 8")
                for (int r = 0; r < P; r++)
                    acc[r] = FMA(LOAD(x + r * k_dim + b * QK + i * LANES), v[i], acc[r]);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < P; r++)
            y[r * ldy + n] = sum_lanes(acc[r]);
    }
}

/* Weight rows `count` rows from `w` (row_bytes each) -> count * k_dim float32 at out. */
INLINE void dequantize_tile(const int type, const uint8_t *w, long count, long k_dim, float *out) {
    const long per_block = block_bytes(type), row_bytes = k_dim / QK * per_block;
    for (long r = 0; r < count; r++)
        for (long k = 0; k < k_dim; k += QK)
            dequantize_block(type, w + r * row_bytes + k / QK * per_block, out + r * k_dim + k);
}

/* Tiles of weight rows per call of the float32 path: a multiple of four rows, about 8 KB of float32 weights. */
INLINE long tile_rows(long k_dim) {
    long rows = 4 * (2048 / k_dim);
    return rows < 4 ? 4 : rows;
}

/* Weight rows n_lo .. n_hi - 1 (n_lo a multiple of 4) against every row of x, into columns n_lo .. n_hi - 1 of y. */
INLINE void quantized_weight_rows(const int type, const float *x, long rows, long k_dim, const uint8_t *w, long n_lo,
                                  long n_hi, long ldy, float *y, float *tile) {
    const long row_bytes = k_dim / QK * block_bytes(type), step = tile_rows(k_dim);
    switch (rows) {  /* (P a constant in each call: its loops over rows unroll into registers) */
    case 1: short_rows_quantized(1, 4, type, x, k_dim, w, n_lo, n_hi, ldy, y); return;
    case 2: short_rows_quantized(2, 4, type, x, k_dim, w, n_lo, n_hi, ldy, y); return;
    case 3: short_rows_quantized(3, 4, type, x, k_dim, w, n_lo, n_hi, ldy, y); return;
    case 4: short_rows_quantized(4, 4, type, x, k_dim, w, n_lo, n_hi, ldy, y); return;
    case 5: short_rows_quantized(5, 2, type, x, k_dim, w, n_lo, n_hi, ldy, y); return;
    }
    for (long n = n_lo; n < n_hi; n += step) {
        long count = n_hi - n < step ? n_hi - n : step;
        dequantize_tile(type, w + n * row_bytes, count, k_dim, tile);
        weight_rows(x, rows, k_dim, tile, 0, count, ldy, y + n, 0);
    }
}

INLINE void quantized_linear_of(const int type, const float *x, long rows, long k_dim, const uint8_t *w, long n_dim,
                                float *y) {
    int threads = product_threads(n_dim, k_dim);
    const size_t tile_bytes = (size_t)tile_rows(k_dim) * k_dim * sizeof(float);
    if (threads > 1) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        {
            long blocks = n_dim / 4, t = omp_get_thread_num(), T = omp_get_num_threads();
            long n_lo = 4 * (blocks * t / T), n_hi = t == T - 1 ? n_dim : 4 * (blocks * (t + 1) / T);
            float *tile = aligned_alloc(64, (tile_bytes + 63) / 64 * 64);
            quantized_weight_rows(type, x, rows, k_dim, w, n_lo, n_hi, n_dim, y, tile);
            free(tile);
        }
#endif
    } else {
        float *tile = aligned_alloc(64, (tile_bytes + 63) / 64 * 64);
        quantized_weight_rows(type, x, rows, k_dim, w, 0, n_dim, n_dim, y, tile);
        free(tile);
    }
}

/* y [rows, n_dim] = x [rows, k_dim] w^T for w [n_dim] rows of GGUF blocks of `type`; k_dim % 32 == 0. Returns 0, or
 * -1 for a type it does not know (nothing written). */
int quantized_linear(int type, const float *x, long rows, long k_dim, const uint8_t *w, long n_dim, float *y) {
    switch (type) {  /* (a constant type in each call: the block's code inlined without a test in the loops) */
    case Q4_0: quantized_linear_of(Q4_0, x, rows, k_dim, w, n_dim, y); return 0;
    case Q4_1: quantized_linear_of(Q4_1, x, rows, k_dim, w, n_dim, y); return 0;
    case Q5_0: quantized_linear_of(Q5_0, x, rows, k_dim, w, n_dim, y); return 0;
    case Q8_0: quantized_linear_of(Q8_0, x, rows, k_dim, w, n_dim, y); return 0;
    case Q4_K: quantized_linear_of(Q4_K, x, rows, k_dim, w, n_dim, y); return 0;
    case Q6_K: quantized_linear_of(Q6_K, x, rows, k_dim, w, n_dim, y); return 0;
    default: return -1;
    }
}

/* out [count, k_dim] float32 = the dequantized weight rows ids[0 .. count - 1] (or first .. first + count - 1 where
 * ids is NULL) of w. Returns 0, or -1 for a type it does not know. */
int dequantize_rows(int type, const uint8_t *w, long k_dim, const long *ids, long first, long count, float *out) {
    const long row_bytes = k_dim / QK * block_bytes(type);
    if (!row_bytes)
        return -1;
    for (long r = 0; r < count; r++) {
        const uint8_t *row = w + (ids ? ids[r] : first + r) * row_bytes;
        switch (type) {
        case Q4_0: dequantize_tile(Q4_0, row, 1, k_dim, out + r * k_dim); break;
        case Q4_1: dequantize_tile(Q4_1, row, 1, k_dim, out + r * k_dim); break;
        case Q5_0: dequantize_tile(Q5_0, row, 1, k_dim, out + r * k_dim); break;
        case Q4_K: dequantize_tile(Q4_K, row, 1, k_dim, out + r * k_dim); break;
        case Q6_K: dequantize_tile(Q6_K, row, 1, k_dim, out + r * k_dim); break;
        default: dequantize_tile(Q8_0, row, 1, k_dim, out + r * k_dim); break;
        }
    }
    return 0;
}

/* ---- GGUF blocks times int8 activations: integer dot products (llama.cpp's method; quantized.py's "int8" backend)
 * The float path above widens every weight to float32; this one rounds each row of x to int8 per block of 32 (the
 * block's scale dx = max |x| / 127, q = x * (1 / dx) rounded to the nearest, ties to even) and multiplies whole blocks
 * in integers, over weights whose rows are interleaved eight at a time (`interleave` in int8.py: a permutation of the
 * file's bytes, nothing rounded). Each output is this sum, in this order, on every path and whatever the rows beside
 * it (so a row's result never depends on its neighbours, and the three paths below agree bit for bit):
 *   for each block b in k order:  acc = fma((float)isum[b], dw[b] * dx[b], acc)    (isum: the exact integer sum of
 *                                                                                    the block's 32 products)
 *   Q4_1, Q4_K also:              macc = fma(m[b], sx[b], macc)                     (sx = dx * sum of the block's q)
 *   y = acc (Q4_1, Q4_K: acc + macc)
 * with the weight's integers Q8_0 and Q6_K q, Q4_0 nibble - 8, Q5_0 nibble + 16 * fifth bit - 16, Q4_1 and Q4_K
 * nibble, and dw * dx one rounded product;
 * Q6_K's block is two half-blocks of 16, each its own isum and scale, the first half's fma before the second's.
 *
 * The interleaved layout: the weight rows in groups of eight (a last group of fewer stays in the file's layout, after
 * the groups); a group's blocks in k order, each block of the eight rows stored as its eight scales (float16, the
 * re-blocked K-quants float32; Q4_1 and Q4_K: then its eight mins; Q6_K: then its eight second scales; Q5_0: then its
 * eight 32-bit words of fifth bits, one a 32-bit lane), then its quantized bytes in chunks of four: chunk c of rows
 * 0..7, then chunk c + 1 (Q4_0 and Q4_1: 4 chunks of nibble bytes, low nibbles weights 4c .. 4c + 3, high nibbles 16 + 4c ..; Q8_0: 8 chunks). So one
 * 32-byte load holds four consecutive weights of each of the eight rows, and multiplied by four bytes of x repeated
 * eight times gives each row's sum of those four products in its own 32-bit lane: the eight rows' outputs are the
 * eight lanes of one accumulator, their scales one load, and no lanes are ever summed across.
 * Paths, chosen per call by what the CPU has (`__builtin_cpu_supports`), each function compiled for its own
 * instructions, so one build runs on every x86 CPU: AVX-512 VNNI (vpdpbusd on 256-bit vectors), AVX2 (vpmaddubsw +
 * vpmaddwd: no pair of products reaches the int16 limit, |w| <= 128 and |q| <= 127, so the same integers), and a scalar
 * path (the definition, written out; fmaf is the same single rounding as the vector fused multiply-add). The
 * unsigned-by-signed instructions take Q4 nibbles as they are (Q4_0 subtracts 8 * sum of q after; Q5_0 ORs its fifth
 * bits in first, spread from each lane's word to bit 4 of four bytes by one multiply, and subtracts 16 * sum) and
 * Q8_0 as |w| times q with w's sign. */
#include <math.h>

enum { INT8_SCALAR = 0, INT8_AVX2 = 1, INT8_VNNI = 2 };
#define GROUP_ROWS 8       /* weight rows interleaved together: one 256-bit lane each */
#define INT8_PASS_ROWS 4   /* rows of x per pass over a group's block (its unpacked integers stay in registers) */

/* x [rows, k_dim] -> xq [rows, k_dim] int8, per block: xd the scale, xs = xd * sum of q, xsum the sum of q. */
static void quantize_activations(const float *x, long rows, long k_dim, int8_t *xq, float *xd, float *xs,
                                 int32_t *xsum) {
    for (long i = 0; i < rows * (k_dim / QK); i++) {
        const float *v = x + i * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            float r = __builtin_nearbyintf(v[j] * id);  /* (the default rounding: to nearest, ties to even) */
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            xq[i * QK + j] = (int8_t)r;
            sum += (int)r;
        }
        xd[i] = d;
        xs[i] = d * (float)sum;
        xsum[i] = sum;
    }
}

/* The weight integers of one block in the file's layout, in order (byte j: weight j). */
static inline void block_integers(const int type, const uint8_t *b, int8_t *q) {
    if (signed_bytes(type)) {
        memcpy(q, b + header_bytes(type), QK);
        return;
    }
    const uint8_t *qs = b + header_bytes(type);
    const int offset = type == Q4_0 ? 8 : type == Q5_0 ? 16 : 0;
    uint32_t fifth = 0;
    if (type == Q5_0)
        memcpy(&fifth, b + 2, 4);
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)((qs[j] & 15) + 16 * (int)(fifth >> j & 1) - offset);
        q[QK / 2 + j] = (int8_t)((qs[j] >> 4) + 16 * (int)(fifth >> (QK / 2 + j) & 1) - offset);
    }
}

/* Scale `which` (0: d; 1: Q4_1's and Q4_K's m, Q6_K's second d) of a block in the file's layout (lane < 0) or of
 * lane `lane` of an interleaved group's block. */
INLINE float block_scale(const int type, const uint8_t *b, int lane, int which) {
    const long unit = float_scales(type) ? 4 : 2, at = lane < 0 ? which * unit : (which * GROUP_ROWS + lane) * unit;
    return float_scales(type) ? float_at(b + at) : half_at(b + at);
}

/* Weight j of lane `lane` in an interleaved group's block `gb`, as an integer. */
INLINE int grouped_integer(const int type, const uint8_t *gb, int lane, int j) {
    const uint8_t *q = gb + GROUP_ROWS * header_bytes(type);
    if (signed_bytes(type))
        return (int8_t)q[(j / 4) * 32 + lane * 4 + j % 4];
    const int byte = j % 16, v = q[(byte / 4) * 32 + lane * 4 + byte % 4];
    const int nibble = j < 16 ? v & 15 : v >> 4;
    if (type == Q5_0) {
        uint32_t fifth;
        memcpy(&fifth, gb + 2 * GROUP_ROWS + 4 * lane, 4);
        return nibble + 16 * (int)(fifth >> j & 1) - 16;
    }
    return type == Q4_0 ? nibble - 8 : nibble;
}

/* The scalar path: one output, the definition above. Its weight row is lane `lane` of the group starting at `g`
 * (lane < 0: a row in the file's layout at `g`). */
static float int8_output_scalar(const int type, const int8_t *xq, const float *xd, const float *xs, long k_dim,
                                const uint8_t *g, int lane) {
    const long per_block = block_bytes(type), blocks = k_dim / QK;
    float acc = 0.0f, macc = 0.0f;
    for (long b = 0; b < blocks; b++) {
        int8_t q[QK];
        const uint8_t *block = lane < 0 ? g + b * per_block : g + b * GROUP_ROWS * per_block;
        if (lane < 0)
            block_integers(type, block, q);
        else
            for (int j = 0; j < QK; j++)
                q[j] = (int8_t)grouped_integer(type, block, lane, j);
        const float dw = block_scale(type, block, lane, 0);
        const float second = has_min(type) || type == Q6_K ? block_scale(type, block, lane, 1) : 0.0f;
        int isum = 0, isum1 = 0;
        for (int j = 0; j < QK; j++) {
            if (type == Q6_K && j >= QK / 2)
                isum1 += q[j] * xq[b * QK + j];
            else
                isum += q[j] * xq[b * QK + j];
        }
        acc = fmaf((float)isum, dw * xd[b], acc);
        if (type == Q6_K)
            acc = fmaf((float)isum1, second * xd[b], acc);
        if (has_min(type))
            macc = fmaf(second, xs[b], macc);
    }
    return has_min(type) ? acc + macc : acc;
}

/* One path's kernel for one interleaved group `g` of eight weight rows against P <= INT8_PASS_ROWS rows of x: eight
 * outputs of each row, written to y[r * ldy .. + 7]. DOT(acc, u, s): acc + in each 32-bit lane the sum of the four
 * products of bytes of u (unsigned) and s (signed). Written once as a macro because each path's instructions may be
 * inlined only into functions compiled for them. */
#define INT8_PATH(ISA, TARGET, DOT)                                                                                  \
__attribute__((always_inline, target(TARGET))) static inline void int8_group_##ISA(                                  \
        const int P, const int type, const int8_t *xq, const float *xd, const float *xs, const int32_t *xsum,        \
        long k_dim, const uint8_t *g, long ldy, float *y) {                                                          \
    const long blocks = k_dim / QK, group_block = GROUP_ROWS * block_bytes(type);                                    \
    __m256 acc[INT8_PASS_ROWS], macc[INT8_PASS_ROWS];                                                                \
    _Pragma("GCC unroll 4") for (int r = 0; r < P; r++) acc[r] = macc[r] = _mm256_setzero_ps();                     \
    for (long b = 0; b < blocks; b++) {                                                                              \
        const uint8_t *gb = g + b * group_block, *qs = gb + GROUP_ROWS * header_bytes(type);                         \
        const __m256 dw = float_scales(type) ? _mm256_loadu_ps((const float *)gb)                                    \
                                             : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb));               \
        /* Q4_1's and Q4_K's mins, Q6_K's second scales */                                                          \
        const __m256 second = float_scales(type) ? _mm256_loadu_ps((const float *)(gb + 32))                         \
                                                 : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16)));    \
        __m256i u[8], w[8];  /* chunk c: weights 4c .. 4c + 3 of each row; u unsigned, w the signed bytes */         \
        if (signed_bytes(type)) {                                                                                    \
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {                                                    \
                w[c] = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));                                           \
                u[c] = _mm256_abs_epi8(w[c]);                                                                        \
            }                                                                                                        \
        } else {                                                                                                     \
            const __m256i low = _mm256_set1_epi8(15);                                                                \
            /* Q5_0: each row's 32 fifth bits in its lane */                                                         \
            const __m256i fifth = type == Q5_0 ? _mm256_loadu_si256((const __m256i *)(gb + 2 * GROUP_ROWS))           \
                                               : _mm256_setzero_si256();                                             \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {                                                    \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));                                \
                u[c] = _mm256_and_si256(v, low);                                                                     \
                u[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                                           \
                if (type == Q5_0) {  /* bits 4c .. 4c + 3 (16 + 4c ..) to bit 4 of bytes 0..3: x * 0x00204081 */     \
                    const __m256i spread = _mm256_set1_epi32(0x00204081), ones = _mm256_set1_epi32(0x01010101);     \
                    const __m256i lo4 = _mm256_and_si256(_mm256_srli_epi32(fifth, 4 * c), _mm256_set1_epi32(15));   \
                    const __m256i hi4 = _mm256_and_si256(_mm256_srli_epi32(fifth, 16 + 4 * c), _mm256_set1_epi32(15));\
                    u[c] = _mm256_or_si256(u[c], _mm256_slli_epi32(                                                  \
                        _mm256_and_si256(_mm256_mullo_epi32(lo4, spread), ones), 4));                                \
                    u[4 + c] = _mm256_or_si256(u[4 + c], _mm256_slli_epi32(                                          \
                        _mm256_and_si256(_mm256_mullo_epi32(hi4, spread), ones), 4));                                \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < P; r++) {                                                        \
            const int8_t *xb = xq + r * k_dim + b * QK;                                                              \
            __m256i isum0 = _mm256_setzero_si256(), isum1 = _mm256_setzero_si256();  /* (two chains: exact ints) */ \
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {                                                    \
                int32_t four;                                                                                        \
                memcpy(&four, xb + 4 * c, 4);                                                                        \
                __m256i xv = _mm256_set1_epi32(four);                                                                \
                if (signed_bytes(type))                                                                              \
                    xv = _mm256_sign_epi8(xv, w[c]);                                                                 \
                /* (two chains of exact integers: Q6_K's are its two half-blocks, summed apart) */                   \
                if (type == Q6_K ? c >= 4 : c % 2) isum1 = DOT(isum1, u[c], xv);                                      \
                else isum0 = DOT(isum0, u[c], xv);                                                                   \
            }                                                                                                        \
            const __m256 vxd = _mm256_set1_ps(xd[r * blocks + b]);                                                   \
            if (type == Q6_K) {                                                                                      \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum0), _mm256_mul_ps(dw, vxd), acc[r]);                 \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum1), _mm256_mul_ps(second, vxd), acc[r]);             \
                continue;                                                                                            \
            }                                                                                                        \
            __m256i isum = _mm256_add_epi32(isum0, isum1);                                                           \
            if (type == Q4_0 || type == Q5_0)                                                                        \
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32((type == Q4_0 ? 8 : 16) * xsum[r * blocks + b]));    \
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, vxd), acc[r]);                      \
            if (has_min(type))                                                                                       \
                macc[r] = _mm256_fmadd_ps(second, _mm256_set1_ps(xs[r * blocks + b]), macc[r]);                      \
        }                                                                                                            \
    }                                                                                                                \
    _Pragma("GCC unroll 4") for (int r = 0; r < P; r++)                                                              \
        _mm256_storeu_ps(y + r * ldy, has_min(type) ? _mm256_add_ps(acc[r], macc[r]) : acc[r]);                      \
}                                                                                                                    \
                                                                                                                     \
__attribute__((target(TARGET))) static void int8_groups_##ISA(                                                       \
        const int type, const int8_t *xq, const float *xd, const float *xs, const int32_t *xsum, long rows,          \
        long k_dim, const uint8_t *w, long g_lo, long g_hi, long ldy, float *y) {                                    \
    const long group_bytes = GROUP_ROWS * (k_dim / QK) * block_bytes(type), blocks = k_dim / QK;                     \
    for (long g = g_lo; g < g_hi; g++)                                                                               \
        for (long m = 0; m < rows; m += INT8_PASS_ROWS) {                                                            \
            const long P = rows - m < INT8_PASS_ROWS ? rows - m : INT8_PASS_ROWS;                                    \
            const int8_t *xm = xq + m * k_dim;                                                                       \
            const float *dm = xd + m * blocks, *sm = xs + m * blocks;                                                \
            const int32_t *im = xsum + m * blocks;                                                                   \
            const uint8_t *wg = w + g * group_bytes;                                                                 \
            float *yg = y + m * ldy + g * GROUP_ROWS;                                                                \
            /* (P and the type constants in each call: the loops unroll into registers) */                          \
            _Pragma("GCC unroll 4") for (int p = 1; p <= INT8_PASS_ROWS; p++) {                                      \
                if (p != P) continue;                                                                                \
                if (type == Q4_0) int8_group_##ISA(p, Q4_0, xm, dm, sm, im, k_dim, wg, ldy, yg);                     \
                else if (type == Q5_0) int8_group_##ISA(p, Q5_0, xm, dm, sm, im, k_dim, wg, ldy, yg);                \
                else if (type == Q4_1) int8_group_##ISA(p, Q4_1, xm, dm, sm, im, k_dim, wg, ldy, yg);                \
                else if (type == Q4_K) int8_group_##ISA(p, Q4_K, xm, dm, sm, im, k_dim, wg, ldy, yg);                \
                else if (type == Q6_K) int8_group_##ISA(p, Q6_K, xm, dm, sm, im, k_dim, wg, ldy, yg);                \
                else int8_group_##ISA(p, Q8_0, xm, dm, sm, im, k_dim, wg, ldy, yg);                                  \
            }                                                                                                        \
        }                                                                                                            \
}

#define DOT_AVX2(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define DOT_VNNI(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
INT8_PATH(avx2, "avx2,fma,f16c", DOT_AVX2)
INT8_PATH(vnni, "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c", DOT_VNNI)

static void int8_groups_scalar(const int type, const int8_t *xq, const float *xd, const float *xs,
                               const int32_t *xsum, long rows, long k_dim, const uint8_t *w, long g_lo, long g_hi,
                               long ldy, float *y) {
    const long group_bytes = GROUP_ROWS * (k_dim / QK) * block_bytes(type), blocks = k_dim / QK;
    (void)xsum;
    for (long g = g_lo; g < g_hi; g++)
        for (int lane = 0; lane < GROUP_ROWS; lane++)
            for (long r = 0; r < rows; r++)
                y[r * ldy + g * GROUP_ROWS + lane] = int8_output_scalar(type, xq + r * k_dim, xd + r * blocks,
                                                                        xs + r * blocks, k_dim, w + g * group_bytes,
                                                                        lane);
}

/* The int8 paths this CPU has: bit INT8_SCALAR always, INT8_AVX2, INT8_VNNI where it has their instructions. */
int quantized_int8_paths(void) {
    __builtin_cpu_init();
    int paths = 1 << INT8_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        paths |= 1 << INT8_AVX2;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")
            && __builtin_cpu_supports("avx512bw"))
        paths |= 1 << INT8_VNNI;
    return paths;
}

INLINE void int8_groups(const int path, const int type, const int8_t *xq, const float *xd, const float *xs,
                        const int32_t *xsum, long rows, long k_dim, const uint8_t *w, long g_lo, long g_hi, long ldy,
                        float *y) {
    if (path == INT8_VNNI) int8_groups_vnni(type, xq, xd, xs, xsum, rows, k_dim, w, g_lo, g_hi, ldy, y);
    else if (path == INT8_AVX2) int8_groups_avx2(type, xq, xd, xs, xsum, rows, k_dim, w, g_lo, g_hi, ldy, y);
    else int8_groups_scalar(type, xq, xd, xs, xsum, rows, k_dim, w, g_lo, g_hi, ldy, y);
}

/* y [rows, n_dim] = x [rows, k_dim] (rounded to int8 per block) times w^T, w [n_dim] rows of GGUF blocks of `type` in
 * the interleaved layout, any number of rows; k_dim % 32 == 0. path: INT8_SCALAR / INT8_AVX2 / INT8_VNNI, or -1 for
 * the best this CPU has. Threads as the float path's, splitting the groups (each output computed by one thread with
 * the same code). Returns 0; -1 for a type it does not know, -2 for a path this CPU lacks, -3 where memory for the
 * quantized x ran out (nothing written). */
int quantized_linear_int8(int type, int path, const float *x, long rows, long k_dim, const uint8_t *w, long n_dim,
                          float *y) {
    const int paths = quantized_int8_paths();
    if (!block_bytes(type) || k_dim % QK)
        return -1;
    if (path < 0)
        path = paths & (1 << INT8_VNNI) ? INT8_VNNI : paths & (1 << INT8_AVX2) ? INT8_AVX2 : INT8_SCALAR;
    if (path > INT8_VNNI || !(paths & (1 << path)))
        return -2;
    const long blocks = k_dim / QK, groups = n_dim / GROUP_ROWS;
    int8_t *xq = malloc((size_t)rows * k_dim + 3 * (size_t)rows * blocks * sizeof(float) + 64);
    if (!xq)
        return -3;
    float *xd = (float *)(xq + (rows * k_dim + 15) / 16 * 16), *xs = xd + rows * blocks;
    int32_t *xsum = (int32_t *)(xs + rows * blocks);
    quantize_activations(x, rows, k_dim, xq, xd, xs, xsum);
    int threads = product_threads(n_dim, k_dim);
    if (threads > groups)
        threads = (int)groups;
    if (threads > 1) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        {
            long t = omp_get_thread_num(), T = omp_get_num_threads();
            int8_groups(path, type, xq, xd, xs, xsum, rows, k_dim, w, groups * t / T, groups * (t + 1) / T, n_dim, y);
        }
#endif
    } else
        int8_groups(path, type, xq, xd, xs, xsum, rows, k_dim, w, 0, groups, n_dim, y);
    const long row_bytes = blocks * block_bytes(type);
    for (long n = groups * GROUP_ROWS; n < n_dim; n++)  /* (the last rows, fewer than a group: the file's layout) */
        for (long r = 0; r < rows; r++)
            y[r * n_dim + n] = int8_output_scalar(type, xq + r * k_dim, xd + r * blocks, xs + r * blocks, k_dim,
                                                  w + n * row_bytes, -1);
    free(xq);
    return 0;
}

/* The file's bytes of lane `lane`'s block in an interleaved group's block gb (the inverse of the layout above), at b. */
INLINE void ungroup_block(const int type, const uint8_t *gb, int lane, uint8_t *b) {
    const long first = float_scales(type) ? 4 : 2, header = header_bytes(type), second = header - first;
    memcpy(b, gb + lane * first, first);
    if (second)
        memcpy(b + first, gb + GROUP_ROWS * first + lane * second, second);
    const uint8_t *q = gb + GROUP_ROWS * header;
    for (long c = 0; c < (block_bytes(type) - header) / 4; c++)
        memcpy(b + header + 4 * c, q + 32 * c + 4 * lane, 4);
}

/* out [count, k_dim] float32 = the dequantized rows ids[0 .. count - 1] of w [n_rows] in the interleaved layout (an
 * embedding's lookup in a tied LM head's blocks): each block's file bytes put back, then dequantized as
 * `dequantize_rows` does, so the same values. Returns 0, or -1 for a type it does not know. */
int dequantize_interleaved_rows(int type, const uint8_t *w, long n_rows, long k_dim, const long *ids, long count,
                                float *out) {
    const long per_block = block_bytes(type), blocks = k_dim / QK, full = n_rows / GROUP_ROWS * GROUP_ROWS;
    if (!per_block)
        return -1;
    for (long r = 0; r < count; r++) {
        const long id = ids[r];
        if (id >= full) {  /* (the last rows, fewer than a group: the file's layout) */
            dequantize_rows(type, w, k_dim, NULL, id, 1, out + r * k_dim);
            continue;
        }
        const uint8_t *group = w + id / GROUP_ROWS * GROUP_ROWS * blocks * per_block;
        uint8_t block[64];
        for (long b = 0; b < blocks; b++) {
            ungroup_block(type, group + b * GROUP_ROWS * per_block, (int)(id % GROUP_ROWS), block);
            dequantize_rows(type, block, QK, NULL, 0, 1, out + r * k_dim + b * QK);
        }
    }
    return 0;
}

/* ---- Attention in one fixed order (selfspec/kernel/attention.py; the engine's CPU attention where products round
 * activations to int8)
 * out[b, i, h, :] = softmax(q[b, h, i] . k[b, g, j] * scale over the keys j it sees) . v[b, g, j], g = h / (H / Hkv),
 * computed for each (b, h, i) alone by one fixed sequence of float operations over its visible keys in position
 * order: dot products over d in 8 lanes (fused multiply-adds, then the lanes summed in a fixed tree), the maximum, then
 * p_j = expf(s_j - max), their sum in ascending j, the weighted values accumulated in ascending j (per d), divided by
 * the sum. So a query's output is the same bits whether it is computed alone (a decode), with other queries (a
 * verify forward, a batch's rows) or beside masked keys: keys a query does not see add nothing. (PyTorch's attention
 * rounds a query's output differently for different numbers of queries; int8 activations can turn that ulp into a
 * whole int8 step, and a greedy token at a near-tie into another.) k and v: [B, Hkv, L, D] by strides (elements) for
 * the batch, the head and the position, the last dimension contiguous; q contiguous [B, H, W, D]; out contiguous
 * [B, W, H, D]; visible [B, W, L] (1 = attended) or NULL for causal (query i sees keys < L - W + i + 1). D % 8 == 0. */
__attribute__((target("avx2,fma"))) static float dot_ordered(const float *a, const float *b, long n) {
    __m256 acc = _mm256_setzero_ps();
    for (long d = 0; d < n; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((target("avx2,fma"))) static void attend_one(const float *q, const float *k, const float *v, long L,
                                                           long D, long k_sl, long v_sl, const uint8_t *visible,
                                                           long seen, float scale, float *scores, float *out) {
    float best = -INFINITY;
    for (long j = 0; j < L; j++) {
        const int sees = visible ? visible[j] : j < seen;
        scores[j] = sees ? dot_ordered(q, k + j * k_sl, D) * scale : -INFINITY;
        best = scores[j] > best ? scores[j] : best;
    }
    for (long d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_setzero_ps());
    float total = 0.0f;
    if (best == -INFINITY)
        return;  /* (no key to see: zeros, as a fully masked row gives nothing) */
    for (long j = 0; j < L; j++) {
        if (scores[j] == -INFINITY)
            continue;
        const float p = expf(scores[j] - best);
        total = total + p;
        const __m256 vp = _mm256_set1_ps(p);
        for (long d = 0; d < D; d += 8)
            _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + j * v_sl + d), _mm256_loadu_ps(out + d)));
    }
    const __m256 vt = _mm256_set1_ps(total);
    for (long d = 0; d < D; d += 8)
        _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_loadu_ps(out + d), vt));
}

int ordered_attention(const float *q, long B, long H, long W, long D, const float *k, const float *v, long Hkv,
                      long L, long k_sb, long k_sh, long k_sl, long v_sb, long v_sh, long v_sl,
                      const uint8_t *visible, float scale, float *out) {
    if (D % 8 || H % Hkv || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return -1;
    const long groups = H / Hkv, items = B * H * W;
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel() && items * L * D >= 4 * WEIGHTS_PER_THREAD)
        threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
#endif
    {
        float *scores = malloc((size_t)L * sizeof(float));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (long item = 0; item < items; item++) {
            const long b = item / (H * W), h = (item / W) % H, i = item % W, g = h / groups;
            attend_one(q + ((b * H + h) * W + i) * D, k + b * k_sb + g * k_sh, v + b * v_sb + g * v_sh, L, D, k_sl,
                       v_sl, visible ? visible + (b * W + i) * L : NULL, L - W + i + 1, scale, scores,
                       out + ((b * W + i) * H + h) * D);
        }
        free(scores);
    }
    return 0;
}

/* ---- One Llama decoder layer over the int8 products, in two calls: llama_layer.c (its own file, one library) */
#include "llama_layer.c"
