/* y[rows, out] = x[rows, in] @ W[out, in]^T in float32 on one CPU thread (AVX2 + FMA).
 *
 * What an SD verification on CPU runs: a handful of rows (1 + K tokens, times B) against every
 * weight of the model. That product is bound by streaming the weights from memory, so each weight
 * is read once per call and used by every row while it is in registers. W is packed
 * (`backend.native.pack`) in groups of 4 output rows, 8 inputs at a time:
 * packed[o / 4][i / 8][o % 4][i % 8], one sequential stream for the hardware prefetcher.
 *
 * Every output is the same sum in the same order whatever `rows` is (8 lanes over i, then
 * the lanes added pairwise): a row's result does not depend on the rows computed with it.
 * Requires in % 8 == 0 and out % 4 == 0 (the caller checks).
 */
#include <immintrin.h>
#include <stddef.h>

static inline float lanes_sum(__m256 v) {
    __m128 low = _mm256_castps256_ps128(v), high = _mm256_extractf128_ps(v, 1);
    low = _mm_add_ps(low, high);
    low = _mm_add_ps(low, _mm_movehl_ps(low, low));
    low = _mm_add_ss(low, _mm_movehdup_ps(low));
    return _mm_cvtss_f32(low);
}

/* ROWS input rows against one group of 4 output rows: 4 * ROWS accumulators in registers */
#define DEFINE_GROUP(ROWS)                                                                       \
    static inline void group_##ROWS(const float *x, const float *p, float *y, int in, int out) { \
        __m256 acc[ROWS][4];                                                                     \
        for (int t = 0; t < ROWS; t++)                                                           \
            for (int r = 0; r < 4; r++) acc[t][r] = _mm256_setzero_ps();                         \
        for (int i = 0; i < in; i += 8, p += 32) {                                               \
            __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8);                         \
            __m256 w2 = _mm256_loadu_ps(p + 16), w3 = _mm256_loadu_ps(p + 24);                   \
            for (int t = 0; t < ROWS; t++) {                                                     \
                __m256 xv = _mm256_loadu_ps(x + (size_t)t * in + i);                             \
                acc[t][0] = _mm256_fmadd_ps(w0, xv, acc[t][0]);                                  \
                acc[t][1] = _mm256_fmadd_ps(w1, xv, acc[t][1]);                                  \
                acc[t][2] = _mm256_fmadd_ps(w2, xv, acc[t][2]);                                  \
                acc[t][3] = _mm256_fmadd_ps(w3, xv, acc[t][3]);                                  \
            }                                                                                    \
        }                                                                                        \
        for (int t = 0; t < ROWS; t++)                                                           \
            for (int r = 0; r < 4; r++) y[(size_t)t * out + r] = lanes_sum(acc[t][r]);          \
    }

DEFINE_GROUP(1)
DEFINE_GROUP(2)
DEFINE_GROUP(3)

void dsd_rows_matmul(const float *x, const float *packed, float *y, int rows, int in, int out) {
    for (int o = 0; o < out; o += 4) {
        const float *p = packed + (size_t)o * in;
        int t = 0;
        /* three rows at a time (12 accumulators); the group's weights stay in L1 for the next */
        for (; t + 3 <= rows; t += 3) group_3(x + (size_t)t * in, p, y + (size_t)t * out + o, in, out);
        if (rows - t == 2) group_2(x + (size_t)t * in, p, y + (size_t)t * out + o, in, out);
        if (rows - t == 1) group_1(x + (size_t)t * in, p, y + (size_t)t * out + o, in, out);
    }
}
