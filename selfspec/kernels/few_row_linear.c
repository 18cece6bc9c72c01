/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for a few rows m, float32, AVX2 + FMA.
 *
 * Streams each weight row from memory once for all rows of x: four weight rows at a time are multiplied by every
 * row of x, three rows of x at a time (12 accumulators in registers), over slices of K_SLICE columns so that the
 * four weight slices and the three rows' slices in use stay in L1 (a row's 8-lane partial sums wait in `partial`
 * between slices).
 * While one block of weight rows is multiplied, the next block is prefetched a cache line at a time, spread over
 * all the block's passes so that memory streams while the arithmetic runs (round 15, SmolLM2's shapes: over 8 rows
 * the product costs 0.9-1.2 one-row products, over 16 1.1-1.8, over 32 1.6-2.9, against 1.2-1.5 and 1.7-2.3 for
 * round 14's kernel, which fetched only during the first pass, and 1.8-2.9, 2.2-3.5, 2.7-5.3 for F.linear;
 * selfspec/few_row_linear.py).
 * Every output element is the same sum in the same order whatever the number of rows (each lane of an accumulator
 * adds its products in k order, slice after slice, then the 8 lanes are summed), so a row's result does not depend
 * on its neighbours. Requires k_dim % 8 == 0 and contiguous row-major x [rows, k_dim], w [n_dim, k_dim],
 * y [rows, n_dim]; bias may be NULL.
 */
#include <immintrin.h>

#define K_SLICE 256  /* columns per slice: 4 weight rows (4 KB) + 3 rows of x (3 KB) in L1 */
#define GROUP 48     /* rows of x per sweep over the weights (more rows: one sweep per group) */
_Static_assert(GROUP % 3 == 0, "row_group takes rows three at a time: partial[] holds GROUP rows");

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_movehdup_ps(s);
    s = _mm_add_ps(s, h);
    h = _mm_movehl_ps(h, s);
    return _mm_cvtss_f32(_mm_add_ss(s, h));
}

/* One weight row against every row of x (the last n_dim % 4 rows). */
static void one_weight_row(const float *x, long rows, long k_dim, const float *w, float *y, long n_dim) {
    for (long m = 0; m < rows; m++) {
        __m256 acc = _mm256_setzero_ps();
        for (long k = 0; k < k_dim; k += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * k_dim + k), _mm256_loadu_ps(w + k), acc);
        y[m * n_dim] = sum8(acc);
    }
}

/* Eight columns (k .. k + 7) of rows a, b, c of x against weight rows 0-3: 12 fused multiply-adds. */
#define COLUMNS(k) { \
    __m256 q0 = _mm256_loadu_ps(w0 + (k)), q1 = _mm256_loadu_ps(w1 + (k)); \
    __m256 q2 = _mm256_loadu_ps(w2 + (k)), q3 = _mm256_loadu_ps(w3 + (k)); \
    __m256 v = _mm256_loadu_ps(xa + (k)); \
    a0 = _mm256_fmadd_ps(v, q0, a0); a1 = _mm256_fmadd_ps(v, q1, a1); \
    a2 = _mm256_fmadd_ps(v, q2, a2); a3 = _mm256_fmadd_ps(v, q3, a3); \
    v = _mm256_loadu_ps(xb + (k)); \
    b0 = _mm256_fmadd_ps(v, q0, b0); b1 = _mm256_fmadd_ps(v, q1, b1); \
    b2 = _mm256_fmadd_ps(v, q2, b2); b3 = _mm256_fmadd_ps(v, q3, b3); \
    v = _mm256_loadu_ps(xc + (k)); \
    c0 = _mm256_fmadd_ps(v, q0, c0); c1 = _mm256_fmadd_ps(v, q1, c1); \
    c2 = _mm256_fmadd_ps(v, q2, c2); c3 = _mm256_fmadd_ps(v, q3, c3); }

/* rows <= GROUP rows of x against weight rows n .. n_dim - 1 (n a multiple of 4). */
static void row_group(const float *x, long rows, long k_dim, const float *w, long n_dim, float *y) {
    __m256 partial[GROUP * 4];  /* [row][weight row of the block]: 8-lane sums over the slices so far */
    long passes = (rows + 2) / 3, n = 0;
    for (; n + 4 <= n_dim; n += 4) {
        const float *w0 = w + n * k_dim, *w1 = w0 + k_dim, *w2 = w1 + k_dim, *w3 = w2 + k_dim;
        const char *next = (const char *)(w0 + 4 * k_dim);  /* the next block of four weight rows */
        long fetch = n + 8 <= n_dim, fetched = 0, countdown = 0;
        for (long k0 = 0; k0 < k_dim; k0 += K_SLICE) {
            long k1 = k0 + K_SLICE < k_dim ? k0 + K_SLICE : k_dim;
            for (long m = 0; m < rows; m += 3) {  /* rows m, mb, mc (repeating m past the last row) */
                long mb = m + 1 < rows ? m + 1 : m, mc = m + 2 < rows ? m + 2 : m;
                const float *xa = x + m * k_dim, *xb = x + mb * k_dim, *xc = x + mc * k_dim;
                __m256 *pa = partial + 4 * m, *pb = pa + 4, *pc = pa + 8;
                __m256 a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3;
                if (k0 == 0) {
                    a0 = _mm256_setzero_ps(); a1 = a0; a2 = a0; a3 = a0; b0 = a0; b1 = a0; b2 = a0; b3 = a0;
                    c0 = a0; c1 = a0; c2 = a0; c3 = a0;
                } else {
                    a0 = pa[0]; a1 = pa[1]; a2 = pa[2]; a3 = pa[3]; b0 = pb[0]; b1 = pb[1]; b2 = pb[2]; b3 = pb[3];
                    c0 = pc[0]; c1 = pc[1]; c2 = pc[2]; c3 = pc[3];
                }
                long k = k0;
                for (; k + 16 <= k1; k += 16) {
                    if (fetch && countdown-- == 0) {  /* one 64-byte column of the next block every `passes` */
                        const char *p = next + fetched;
                        _mm_prefetch(p, _MM_HINT_T0);
                        _mm_prefetch(p + 4 * k_dim, _MM_HINT_T0);
                        _mm_prefetch(p + 8 * k_dim, _MM_HINT_T0);
                        _mm_prefetch(p + 12 * k_dim, _MM_HINT_T0);
                        fetched += 64;
                        countdown = passes - 1;
                    }
                    COLUMNS(k)
                    COLUMNS(k + 8)
                }
                if (k < k1)
                    COLUMNS(k)
                if (k1 < k_dim) {
                    pa[0] = a0; pa[1] = a1; pa[2] = a2; pa[3] = a3; pb[0] = b0; pb[1] = b1; pb[2] = b2; pb[3] = b3;
                    pc[0] = c0; pc[1] = c1; pc[2] = c2; pc[3] = c3;
                    continue;
                }
                float *ya = y + m * n_dim + n, *yb = y + mb * n_dim + n, *yc = y + mc * n_dim + n;
                ya[0] = sum8(a0); ya[1] = sum8(a1); ya[2] = sum8(a2); ya[3] = sum8(a3);
                yb[0] = sum8(b0); yb[1] = sum8(b1); yb[2] = sum8(b2); yb[3] = sum8(b3);  /* (mb = m: the same) */
                yc[0] = sum8(c0); yc[1] = sum8(c1); yc[2] = sum8(c2); yc[3] = sum8(c3);
            }
        }
    }
    for (; n < n_dim; n++)
        one_weight_row(x, rows, k_dim, w + n * k_dim, y + n, n_dim);
}

void few_row_linear(const float *x, long rows, long k_dim, const float *w, long n_dim, const float *bias, float *y) {
    for (long m = 0; m < rows; m += GROUP)
        row_group(x + m * k_dim, rows - m < GROUP ? rows - m : GROUP, k_dim, w, n_dim, y + m * n_dim);
    if (bias)
        for (long m = 0; m < rows; m++)
            for (long j = 0; j < n_dim; j++)
                y[m * n_dim + j] += bias[j];
}
