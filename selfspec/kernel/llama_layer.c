/* One Llama decoder layer over the int8 products, in two calls (selfspec/kernel/llama_layer.py), so that a decode
 * step's Python makes two calls a layer instead of ~20 tensor operations and four products:
 *   llama_attention_in:  q, k, v = rotary(qkv(rms_norm(x)))            (the keys and values then go to the cache)
 *   llama_attention_out: x += o(attention(q, keys, values)); x += down(silu(gate(h)) * up(h)), h = rms_norm(x)
 * Each call is one OpenMP parallel region: products split by groups of eight weight rows between the threads, the
 * rest by rows of x or (attention) by query, with barriers between. Every output is computed by one thread with the
 * same code whatever the number of threads or of rows beside it, so a row's result does not depend on the rows (or
 * drafts) computed with it: what speculative decoding's exactness needs. The float operations around the products
 * are this file's own (a sum of squares in eight lanes summed in a fixed tree, expf), not PyTorch's: the layer
 * computes the GGUF model as llama.cpp does, not bit for bit what `transformers`' modules compute over the same
 * products. Included by few_row_linear.c (one library); needs AVX2 + FMA (as the ordered attention does). */

/* Every thread of the region waits here for the others (nothing outside a parallel region or without OpenMP). */
#ifdef _OPENMP
#define BARRIER() _Pragma("omp barrier")
#else
#define BARRIER()
#endif

/* This thread's share [lo, hi) of `count` items (all of them outside a parallel region). */
INLINE void thread_share(long count, long *lo, long *hi) {
#ifdef _OPENMP
    const long t = omp_get_thread_num(), T = omp_get_num_threads();
#else
    const long t = 0, T = 1;
#endif
    *lo = count * t / T;
    *hi = count * (t + 1) / T;
}

/* Activations rounded to int8 per block of 32 (quantize_activations' layout) for `rows` rows of `k_dim`. */
typedef struct {
    int8_t *q;
    float *d, *s;
    int32_t *sum;
} int8_rows;

static int8_rows int8_rows_in(void *memory, long rows, long k_dim) {
    const long blocks = k_dim / QK;
    int8_rows r;
    r.q = memory;
    r.d = (float *)(r.q + (rows * k_dim + 63) / 64 * 64);
    r.s = r.d + rows * blocks;
    r.sum = (int32_t *)(r.s + rows * blocks);
    return r;
}

INLINE size_t int8_rows_bytes(long rows, long k_dim) {
    return (size_t)((rows * k_dim + 63) / 64 * 64) + 3 * (size_t)rows * (k_dim / QK) * sizeof(float);
}

INLINE void quantize_row(const float *x, long r, long k_dim, int8_rows a) {
    const long blocks = k_dim / QK;
    quantize_activations(x, 1, k_dim, a.q + r * k_dim, a.d + r * blocks, a.s + r * blocks, a.sum + r * blocks);
}

/* Block `item` (row item / (k_dim / QK), its block item % (k_dim / QK)) of rows x [rows, k_dim] to int8: blocks are
 * rounded alone, so a row's few blocks can be shared between threads (one row of a decode would leave one idle). */
INLINE void quantize_block(const float *x, long item, int8_rows a) {
    quantize_activations(x + item * QK, 1, QK, a.q + item * QK, a.d + item, a.s + item, a.sum + item);
}

/* This thread's share of y [rows, n_dim] (rows ldy apart) = the int8 rows a times w (interleaved, n_dim %
 * GROUP_ROWS == 0). */
INLINE void shared_product(int path, int type, int8_rows a, long rows, long k_dim, const uint8_t *w, long n_dim,
                           long ldy, float *y) {
    long lo, hi;
    thread_share(n_dim / GROUP_ROWS, &lo, &hi);
    int8_groups(path, type, a.q, a.d, a.s, a.sum, rows, k_dim, w, lo, hi, ldy, y);
}

/* out = weight * (x / sqrt(mean(x^2) + eps)); n % 8 == 0. */
static void rms_norm_row(const float *x, long n, const float *weight, float eps, float *out) {
    const float scale = 1.0f / sqrtf(dot_ordered(x, x, n) / (float)n + eps);
    for (long j = 0; j < n; j++)
        out[j] = weight[j] * (x[j] * scale);
}

/* rotate-half rotary embedding of one head (x and out may not overlap): x * cos + (-x2, x1) * sin */
static void rotate_head(const float *x, const float *cos, const float *sin, long D, float *out) {
    const long half = D / 2;
    for (long j = 0; j < D; j++) {
        const float rotated = j < half ? -x[j + half] : x[j - half];
        out[j] = x[j] * cos[j] + rotated * sin[j];
    }
}

INLINE int layer_threads(long weights) {
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel() && weights >= 4 * WEIGHTS_PER_THREAD)
        threads = omp_get_max_threads();
#endif
    return threads;
}

static int layer_path(int path) {
    const int paths = quantized_int8_paths();
    if (path < 0)
        return paths & (1 << INT8_VNNI) ? INT8_VNNI : paths & (1 << INT8_AVX2) ? INT8_AVX2 : INT8_SCALAR;
    return path <= INT8_VNNI && (paths & (1 << path)) ? path : -1;
}

/* x [B * W, hidden] (rows b * W + i) -> q [B, H, W, D], k and v [B, Hkv, W, D]: the input norm (weight norm_w), the
 * q, k and v products (H D, Hkv D and Hkv D interleaved rows of their own types: a Q4_K_M file mixes them), rotary on
 * q and k (cos, sin [B * W, D]).
 * path: the int8 path (-1: the best this CPU has). Returns 0; -1 for shapes it does not take, -2 for a path this CPU
 * lacks, -3 where memory ran out. */
int llama_attention_in(int path, long B, long W, long hidden, const float *x, const float *norm_w, float eps,
                       int q_type, const uint8_t *q_w, int k_type, const uint8_t *k_w, int v_type, const uint8_t *v_w,
                       long H, long Hkv, long D, const float *cos, const float *sin, float *q, float *k, float *v) {
    const long rows = B * W, n_qkv = (H + 2 * Hkv) * D;
    if (!block_bytes(q_type) || !block_bytes(k_type) || !block_bytes(v_type) || hidden % QK || (H * D) % GROUP_ROWS
            || (Hkv * D) % GROUP_ROWS || D % 2 || hidden % 8)
        return -1;
    if ((path = layer_path(path)) < 0)
        return -2;
    char *memory = malloc(int8_rows_bytes(rows, hidden) + (size_t)rows * (hidden + n_qkv) * sizeof(float));
    if (!memory)
        return -3;
    float *normed = (float *)memory, *joined = normed + rows * hidden;
    const int8_rows a = int8_rows_in(joined + rows * n_qkv, rows, hidden);
#ifdef _OPENMP
#pragma omp parallel num_threads(layer_threads(n_qkv * hidden))
#endif
    {
        long lo, hi;
        thread_share(rows, &lo, &hi);
        for (long r = lo; r < hi; r++) {
            rms_norm_row(x + r * hidden, hidden, norm_w, eps, normed + r * hidden);
            quantize_row(normed + r * hidden, r, hidden, a);
        }
        BARRIER();
        /* (each thread its share of each product: their outputs are disjoint columns, no barrier between) */
        shared_product(path, q_type, a, rows, hidden, q_w, H * D, n_qkv, joined);
        shared_product(path, k_type, a, rows, hidden, k_w, Hkv * D, n_qkv, joined + H * D);
        shared_product(path, v_type, a, rows, hidden, v_w, Hkv * D, n_qkv, joined + (H + Hkv) * D);
        BARRIER();
        thread_share(rows * (H + 2 * Hkv), &lo, &hi);
        for (long item = lo; item < hi; item++) {
            const long r = item / (H + 2 * Hkv), head = item % (H + 2 * Hkv), b = r / W, i = r % W;
            const float *from = joined + r * n_qkv + head * D;
            if (head < H)
                rotate_head(from, cos + r * D, sin + r * D, D, q + ((b * H + head) * W + i) * D);
            else if (head < H + Hkv)
                rotate_head(from, cos + r * D, sin + r * D, D, k + ((b * Hkv + head - H) * W + i) * D);
            else
                memcpy(v + ((b * Hkv + head - H - Hkv) * W + i) * D, from, D * sizeof(float));
        }
    }
    free(memory);
    return 0;
}

/* The rest of the layer, x [B * W, hidden] updated in place: attention of q [B, H, W, D] over keys / values [B, Hkv,
 * L, D] by strides (elements; the last dimension contiguous) as `ordered_attention` computes it (visible [B, W, L] or
 * NULL for causal), the o product (o: hidden interleaved rows of o_type over H D), the residual; then the post-attention
 * norm, the gate and up products (I rows each, of their own types), silu(gate) * up, the down product (down: hidden
 * rows of down_type over I), the residual. Returns as llama_attention_in. */
int llama_attention_out(int path, long B, long W, long hidden, float *x, const float *q, long H, long D,
                        const float *k, const float *v, long Hkv, long L, long k_sb, long k_sh, long k_sl, long v_sb,
                        long v_sh, long v_sl, const uint8_t *visible, float scale, int o_type, const uint8_t *o,
                        const float *norm_w, float eps, long I, int gate_type, const uint8_t *gate, int up_type,
                        const uint8_t *up_w, int down_type, const uint8_t *down) {
    const long rows = B * W, HD = H * D, widest = HD > I ? (HD > hidden ? HD : hidden) : (I > hidden ? I : hidden);
    if (!block_bytes(o_type) || !block_bytes(gate_type) || !block_bytes(up_type) || !block_bytes(down_type) || HD % QK || hidden % QK || I % QK
            || hidden % GROUP_ROWS || I % GROUP_ROWS || D % 8 || H % Hkv || hidden % 8)
        return -1;
    if ((path = layer_path(path)) < 0)
        return -2;
    const size_t floats = (size_t)rows * (HD + hidden + 2 * I + I);
    char *memory = malloc(floats * sizeof(float) + int8_rows_bytes(rows, widest));
    if (!memory)
        return -3;
    float *attended = (float *)memory, *out = attended + rows * HD, *gu = out + rows * hidden, *act = gu + rows * 2 * I;
    int8_rows a_attended = int8_rows_in(act + rows * I, rows, HD), a_normed = int8_rows_in(act + rows * I, rows, hidden);
    int8_rows a_act = int8_rows_in(act + rows * I, rows, I);
    const long groups = H / Hkv;
#ifdef _OPENMP
#pragma omp parallel num_threads(layer_threads((HD + 3 * I) * hidden))
#endif
    {
        long lo, hi;
        float *scores = malloc((size_t)L * sizeof(float));
        thread_share(B * H * W, &lo, &hi);
        for (long item = lo; item < hi; item++) {  /* (b, h, i): attended[b * W + i, h * D ..] */
            const long b = item / (H * W), h = (item / W) % H, i = item % W, g = h / groups;
            attend_one(q + ((b * H + h) * W + i) * D, k + b * k_sb + g * k_sh, v + b * v_sb + g * v_sh, L, D, k_sl,
                       v_sl, visible ? visible + (b * W + i) * L : NULL, L - W + i + 1, scale, scores,
                       attended + (b * W + i) * HD + h * D);
        }
        free(scores);
        BARRIER();
        thread_share(rows * (HD / QK), &lo, &hi);
        for (long item = lo; item < hi; item++)
            quantize_block(attended, item, a_attended);
        BARRIER();
        shared_product(path, o_type, a_attended, rows, HD, o, hidden, hidden, out);
        BARRIER();
        thread_share(rows, &lo, &hi);
        for (long r = lo; r < hi; r++) {
            float *xr = x + r * hidden, *normed = out + r * hidden;
            for (long j = 0; j < hidden; j++)
                xr[j] = xr[j] + normed[j];
            rms_norm_row(xr, hidden, norm_w, eps, normed);  /* (out's row is free again: the norm goes there) */
            quantize_row(normed, r, hidden, a_normed);
        }
        BARRIER();
        shared_product(path, gate_type, a_normed, rows, hidden, gate, I, 2 * I, gu);
        shared_product(path, up_type, a_normed, rows, hidden, up_w, I, 2 * I, gu + I);
        BARRIER();
        thread_share(rows * (I / QK), &lo, &hi);
        for (long item = lo; item < hi; item++) {  /* (block b of row r: act[r, 32 b ..]) */
            const long r = item / (I / QK), b = item % (I / QK);
            const float *gate = gu + r * 2 * I + b * QK, *up = gate + I;
            float *ab = act + item * QK;
            for (long j = 0; j < QK; j++)
                ab[j] = gate[j] / (1.0f + expf(-gate[j])) * up[j];
            quantize_block(act, item, a_act);
        }
        BARRIER();
        shared_product(path, down_type, a_act, rows, I, down, hidden, hidden, out);
        BARRIER();
        thread_share(rows, &lo, &hi);
        for (long r = lo; r < hi; r++)
            for (long j = 0; j < hidden; j++)
                x[r * hidden + j] = x[r * hidden + j] + out[r * hidden + j];
    }
    free(memory);
    return 0;
}
