/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for a few rows m, float32, AVX2 + FMA.
 *
 * Streams each weight row from memory once for all rows of x (x stays in L1): over 2-4 rows the product costs about
 * one row's time, over 8-16 rows 1.3-2.3x, where BLAS's small-M GEMM on some CPUs costs 1.5-3.9x
 * (selfspec/few_row_linear.py).
 * Every output element is the same sum in the same order whatever the number of rows, so a row's result does not
 * depend on its neighbours. Requires k_dim % 8 == 0 and contiguous row-major x [rows, k_dim], w [n_dim, k_dim],
 * y [rows, n_dim]; bias may be NULL.
 */
#include <immintrin.h>

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_movehdup_ps(s);
    s = _mm_add_ps(s, h);
    h = _mm_movehl_ps(h, s);
    return _mm_cvtss_f32(_mm_add_ss(s, h));
}

/* One weight row against every row of x. */
static void one_weight_row(const float *x, long rows, long k_dim, const float *w, float *y, long n_dim) {
    for (long m = 0; m < rows; m++) {
        __m256 acc = _mm256_setzero_ps();
        for (long k = 0; k < k_dim; k += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * k_dim + k), _mm256_loadu_ps(w + k), acc);
        y[m * n_dim] = sum8(acc);
    }
}

void few_row_linear(const float *x, long rows, long k_dim, const float *w, long n_dim, const float *bias, float *y) {
    long n = 0;
    for (; n + 4 <= n_dim; n += 4) {  /* four weight rows at a time, two rows of x at a time */
        const float *w0 = w + n * k_dim, *w1 = w0 + k_dim, *w2 = w1 + k_dim, *w3 = w2 + k_dim;
        const char *next = (const char *)(w0 + 4 * k_dim);  /* the next four weight rows, fetched ahead */
        for (long m = 0; m < rows; m += 2) {
            int pair = m + 1 < rows;
            const float *xa = x + m * k_dim, *xb = pair ? xa + k_dim : xa;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (long k = 0; k < k_dim; k += 8) {
                if (m == 0 && n + 8 <= n_dim && (k & 15) == 0) {
                    const char *p = next + 4 * k;
                    _mm_prefetch(p, _MM_HINT_T0);
                    _mm_prefetch(p + 4 * k_dim, _MM_HINT_T0);
                    _mm_prefetch(p + 8 * k_dim, _MM_HINT_T0);
                    _mm_prefetch(p + 12 * k_dim, _MM_HINT_T0);
                }
                __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
                __m256 q0 = _mm256_loadu_ps(w0 + k), q1 = _mm256_loadu_ps(w1 + k);
                __m256 q2 = _mm256_loadu_ps(w2 + k), q3 = _mm256_loadu_ps(w3 + k);
                a0 = _mm256_fmadd_ps(va, q0, a0); a1 = _mm256_fmadd_ps(va, q1, a1);
                a2 = _mm256_fmadd_ps(va, q2, a2); a3 = _mm256_fmadd_ps(va, q3, a3);
                b0 = _mm256_fmadd_ps(vb, q0, b0); b1 = _mm256_fmadd_ps(vb, q1, b1);
                b2 = _mm256_fmadd_ps(vb, q2, b2); b3 = _mm256_fmadd_ps(vb, q3, b3);
            }
            float *ya = y + m * n_dim + n;
            ya[0] = sum8(a0); ya[1] = sum8(a1); ya[2] = sum8(a2); ya[3] = sum8(a3);
            if (pair) {
                float *yb = ya + n_dim;
                yb[0] = sum8(b0); yb[1] = sum8(b1); yb[2] = sum8(b2); yb[3] = sum8(b3);
            }
        }
    }
    for (; n < n_dim; n++)
        one_weight_row(x, rows, k_dim, w + n * k_dim, y + n, n_dim);
    if (bias)
        for (long m = 0; m < rows; m++)
            for (long j = 0; j < n_dim; j++)
                y[m * n_dim + j] += bias[j];
}
