/* gnnc's compiled CPU kernels (built by native.py with the system's C compiler, loaded with ctypes).
 *
 * Plain C with OpenMP, no torch headers: it builds in about a second. Every function takes raw
 * pointers to contiguous tensors and the number of threads to use (torch's intra-op setting).
 * The kernels themselves are in native_kernels.inc, written once for a scalar type T and
 * instantiated here for float (suffix _f32) and double (_f64). Each has a torch implementation in
 * Python that computes the same values (the fallback where this library cannot be built, and what
 * the tests compare with):
 *
 *   dropout:   gnnc.runtime.rng's counter-based draws, bit for bit (lowbias32 per row and column
 *              pair, two 16-bit draws per hash), fused with the keep test and the 1/(1-p) scale.
 *   epilogue:  a layer's tail, drop(act(x [+ y] + bias)), in one pass, and its backward.
 *   attention: GAT's edge scores, softmax over each destination's in-edges, dropout of the
 *              coefficients and the weighted sum of source rows, per head, in one pass over the
 *              edges; the backward recomputes the coefficients (nothing of size [edges, heads] is
 *              kept from the forward; the backward's [edges, 2 heads] between its own two passes is
 *              the caller's scratch, from torch's allocator, so the block cache keeps it).
 *
 * No -ffast-math: sums keep the order written here, so results do not depend on the compiler.
 */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the counter-based hash (rng.py) */

static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

/* rng.draws16's key of a row: lowbias32((id * 0x9E3779B1) ^ key) on the low 32 bits. */
static inline uint32_t row_key(int64_t id, uint32_t key) {
    return lowbias32(((uint32_t)(uint64_t)id * 0x9E3779B1u) ^ key);
}

/* rng.draws16's key of a column pair. */
static inline uint32_t pair_key(int64_t pair) {
    return lowbias32((uint32_t)(uint64_t)pair * 0x85EBCA77u + 0x165667B1u);
}

/* The 16-bit draw of (row key, column key, the shift of the column's half): the low half for even columns. */
static inline uint32_t draw16(uint32_t rk, uint32_t pk, uint32_t shift) {
    return (lowbias32(rk ^ pk) >> shift) & 0xFFFFu;
}

/* The dropout of one call: keys of the columns [col_offset, col_offset + width) and the keep test. */
typedef struct {
    uint32_t key;      /* the stream's key (rng.stream_key) */
    uint32_t threshold; /* a draw d keeps its element when d >= threshold */
    uint32_t *pk;      /* [width] pair key of each column */
    uint32_t *shift;   /* [width] 0 or 16: which half of the pair's hash */
} Drop;

/* Fill d's column keys; 0, or -1 when out of memory. */
static int drop_init(Drop *d, uint32_t key, uint32_t threshold, int64_t width, int64_t col_offset) {
    d->key = key;
    d->threshold = threshold;
    d->pk = malloc(sizeof(uint32_t) * (size_t)(width > 0 ? 2 * width : 2));
    if (!d->pk) return -1;
    d->shift = d->pk + (width > 0 ? width : 1);
    for (int64_t j = 0; j < width; j++) {
        int64_t c = col_offset + j;
        d->pk[j] = pair_key(c >> 1);
        d->shift[j] = (uint32_t)(c & 1) * 16u;
    }
    return 0;
}

static void drop_free(Drop *d) { free(d->pk); }

static inline int keeps(const Drop *d, uint32_t rk, int64_t j) {
    return draw16(rk, d->pk[j], d->shift[j]) >= d->threshold;
}

/* Below this many elements a call runs on one thread (a parallel region costs a few microseconds). */
#define PARALLEL_MIN 32768

/* Activations of the epilogue (gnnc.runtime.fusion.ACTIVATIONS gives the same numbers). */
enum { ACT_IDENTITY = 0, ACT_RELU = 1, ACT_ELU = 2, ACT_LEAKY_RELU = 3 };

static int64_t max_degree(const int64_t *indptr, int64_t n) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (indptr[i + 1] - indptr[i] > m) m = indptr[i + 1] - indptr[i];
    return m;
}

/* Gathers of source rows are latency-bound: each edge's row is requested this many edges ahead. */
#define PREFETCH_EDGES 4

static inline void prefetch_row(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 1);
}

/* ---------------------------------------------------------------- exp for floats, vectorisable */

/* exp(x) in plain arithmetic, so that a loop calling it vectorises: libm's expf is a call per element
 * (without -ffast-math, which this file does not use), and ELU and the attention's softmax call it once per
 * element. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, then
 * 2^n applied as two powers of two, so subnormal results and overflow to +inf come out as expf's; within
 * 2 ulp of the exact exp (tests/test_native_kernels.py checks it over the float range); a NaN stays NaN. */
static inline float exp_f32(float x) {
    float xc = x == x ? x : 0.0f;  /* a NaN: computed as 0, replaced at the end */
    xc = xc < -104.0f ? -104.0f : (xc > 89.0f ? 89.0f : xc);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest: 1.5 2^23 (floorf does not vectorise) */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;  /* each within the normal exponents */
    uint32_t u1 = (uint32_t)(n1 + 127) << 23, u2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &u1, sizeof s1);
    memcpy(&s2, &u2, sizeof s2);
    float y = (p * s1) * s2;
    return x == x ? y : x;
}

/* ---------------------------------------------------------------- the kernels, per scalar type */

#define T float
#define F(name) name##_f32
#define EXP exp_f32
#define LOG logf
#include "native_kernels.inc"
#undef T
#undef F
#undef EXP
#undef LOG

#define T double
#define F(name) name##_f64
#define EXP exp
#define LOG log
#include "native_kernels.inc"
#undef T
#undef F
#undef EXP
#undef LOG
