/* Batched float32 product C[h] = A[h] @ B[h]^T written straight into a strided destination.

   The projector pieces of core.overlaps (and the bases of core.subspaces) are thousands of
   per-head products with a short inner dimension (d_head, 64 in GPT-2). Through torch each is
   one oneDNN call (~11 us fixed cost) returning a fresh tensor that is then copied into the
   stacked feature buffer; this kernel does all heads in one call and stores every result row
   where the caller wants it. AVX-512F on x86-64 only (chosen at run time); elsewhere
   `supported()` is False and headgraph keeps its torch path.

   nt_rows(a, a_hs, a_rs, a_cs, b, b_hs, b_rs, b_cs, c, c_hs, c_cs, c_chunk, c_rs,
           n, rows, width, k)
   All pointers are float32 addresses and strides are in elements:
     A[h, i, t] = a[h*a_hs + i*a_rs + t*a_cs]          h < n, i < rows, t < k
     B[h, j, t] = b[h*b_hs + j*b_rs + t*b_cs]          j < width
     C[h, i, j] = c[h*c_hs + (i / c_chunk)*c_cs + (i % c_chunk)*c_rs + j]
   C[h, i, j] = sum_t A[h, i, t] * B[h, j, t], float32 multiply-adds (FMA) in order of t.
   The caller (core/native.py) checks shapes, strides and bounds; the GIL is released. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HG_KERNEL 1
#include <immintrin.h>
#define HG_AVX512 __attribute__((target("avx512f,fma")))
/* Load once into a register: without the (empty) asm, compilers fold the load into every
   multiply-add that uses it, and the loads, not the multiply-adds, then bound the loop. */
#define HG_IN_REGISTER(var, value) \
  do {                             \
    (var) = (value);               \
    __asm__("" : "+v"(var));       \
  } while (0)

/* Two rows of A against NV 16-wide column vectors of packed B^T (bt: k rows of ldb floats);
   `last` masks the columns of the last vector that exist. */
#define HG_TILE(NV)                                                                          \
  static HG_AVX512 void tile2_##NV(const float *a0, const float *a1, int64_t acs,            \
                                   const float *bt, int64_t ldb, int64_t k, float *c0,        \
                                   float *c1, __mmask16 last) {                               \
    __m512 x[NV], y[NV];                                                                      \
    for (int v = 0; v < NV; v++) {                                                            \
      x[v] = _mm512_setzero_ps();                                                             \
      y[v] = _mm512_setzero_ps();                                                             \
    }                                                                                         \
    for (int64_t t = 0; t < k; t++) {                                                         \
      const float *b = bt + t * ldb;                                                          \
      __m512 bv[NV];                                                                          \
      for (int v = 0; v < NV; v++) HG_IN_REGISTER(bv[v], _mm512_load_ps(b + 16 * v));         \
      __m512 p = _mm512_set1_ps(a0[t * acs]);                                                 \
      for (int v = 0; v < NV; v++) x[v] = _mm512_fmadd_ps(p, bv[v], x[v]);                    \
      __m512 q = _mm512_set1_ps(a1[t * acs]);                                                 \
      for (int v = 0; v < NV; v++) y[v] = _mm512_fmadd_ps(q, bv[v], y[v]);                    \
    }                                                                                         \
    for (int v = 0; v < NV - 1; v++) {                                                        \
      _mm512_storeu_ps(c0 + 16 * v, x[v]);                                                    \
      _mm512_storeu_ps(c1 + 16 * v, y[v]);                                                    \
    }                                                                                         \
    _mm512_mask_storeu_ps(c0 + 16 * (NV - 1), last, x[NV - 1]);                               \
    _mm512_mask_storeu_ps(c1 + 16 * (NV - 1), last, y[NV - 1]);                               \
  }                                                                                           \
  static HG_AVX512 void tile1_##NV(const float *a0, int64_t acs, const float *bt,             \
                                   int64_t ldb, int64_t k, float *c0, __mmask16 last) {       \
    __m512 x[NV];                                                                             \
    for (int v = 0; v < NV; v++) x[v] = _mm512_setzero_ps();                                  \
    for (int64_t t = 0; t < k; t++) {                                                         \
      const float *b = bt + t * ldb;                                                          \
      __m512 p = _mm512_set1_ps(a0[t * acs]);                                                 \
      for (int v = 0; v < NV; v++) x[v] = _mm512_fmadd_ps(p, _mm512_load_ps(b + 16 * v), x[v]); \
    }                                                                                         \
    for (int v = 0; v < NV - 1; v++) _mm512_storeu_ps(c0 + 16 * v, x[v]);                     \
    _mm512_mask_storeu_ps(c0 + 16 * (NV - 1), last, x[NV - 1]);                               \
  }

/* Four rows against NV <= 4 vectors: narrow results (e.g. 64 columns) reuse each load of B
   for four rows, which matters when B is too large for L1 (long inner dimension). */
#define HG_TILE4(NV)                                                                         \
  static HG_AVX512 void tile4_##NV(const float *a0, int64_t ars, int64_t acs,                \
                                   const float *bt, int64_t ldb, int64_t k, float **c,        \
                                   __mmask16 last) {                                          \
    __m512 x[4][NV];                                                                          \
    for (int r = 0; r < 4; r++)                                                               \
      for (int v = 0; v < NV; v++) x[r][v] = _mm512_setzero_ps();                             \
    for (int64_t t = 0; t < k; t++) {                                                         \
      const float *b = bt + t * ldb;                                                          \
      __m512 bv[NV];                                                                          \
      for (int v = 0; v < NV; v++) HG_IN_REGISTER(bv[v], _mm512_load_ps(b + 16 * v));         \
      for (int r = 0; r < 4; r++) {                                                           \
        __m512 p = _mm512_set1_ps(a0[r * ars + t * acs]);                                     \
        for (int v = 0; v < NV; v++) x[r][v] = _mm512_fmadd_ps(p, bv[v], x[r][v]);            \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < 4; r++) {                                                             \
      for (int v = 0; v < NV - 1; v++) _mm512_storeu_ps(c[r] + 16 * v, x[r][v]);              \
      _mm512_mask_storeu_ps(c[r] + 16 * (NV - 1), last, x[r][NV - 1]);                        \
    }                                                                                         \
  }

/* bt[t * ldb + j] = src[j * rs + t] for j < rows, t < cols (both <= 16): a 16 x 16 block of
   a row-major B transposed in registers (unpack, then 128-bit lane shuffles); rows past
   `rows` are written as zeros, so the packed B^T is zero-padded. */
static HG_AVX512 void transpose16(const float *src, int64_t rs, int rows, int cols, float *bt,
                                  int64_t ldb) {
  __m512 r[16], t[16];
  __mmask16 cm = (__mmask16)((1u << cols) - 1u);
  for (int i = 0; i < 16; i++)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * rs) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
  for (int i = 0; i < cols; i++) _mm512_store_ps(bt + i * ldb, r[i]);
}

HG_TILE4(1)
HG_TILE4(2)
HG_TILE4(3)
HG_TILE4(4)

HG_TILE(1)
HG_TILE(2)
HG_TILE(3)
HG_TILE(4)
HG_TILE(5)
HG_TILE(6)
HG_TILE(7)
HG_TILE(8)

typedef void (*tile2_fn)(const float *, const float *, int64_t, const float *, int64_t, int64_t,
                         float *, float *, __mmask16);
typedef void (*tile1_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *,
                         __mmask16);
static const tile2_fn TILE2[8] = {tile2_1, tile2_2, tile2_3, tile2_4,
                                  tile2_5, tile2_6, tile2_7, tile2_8};
static const tile1_fn TILE1[8] = {tile1_1, tile1_2, tile1_3, tile1_4,
                                  tile1_5, tile1_6, tile1_7, tile1_8};
typedef void (*tile4_fn)(const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                         float **, __mmask16);
static const tile4_fn TILE4[4] = {tile4_1, tile4_2, tile4_3, tile4_4};

/* Columns per tile: 8 vectors of 16 (the 16 accumulators of two rows fit the 32 registers). */
#define HG_BLOCK 128

static HG_AVX512 int nt_rows_avx512(const float *a, int64_t a_hs, int64_t a_rs, int64_t a_cs,
                                    const float *b, int64_t b_hs, int64_t b_rs, int64_t b_cs,
                                    float *c, int64_t c_hs, int64_t c_cs, int64_t c_chunk,
                                    int64_t c_rs, int64_t n, int64_t rows, int64_t width,
                                    int64_t k) {
  int64_t ldb = (width + 15) / 16 * 16; /* packed B^T row: width rounded up to whole vectors */
  float *bt = (float *)aligned_alloc(64, (size_t)(k > 0 ? k : 1) * (size_t)ldb * sizeof(float));
  if (bt == NULL) return -1;
  for (int64_t h = 0; h < n; h++) {
    const float *ah = a + h * a_hs, *bh = b + h * b_hs;
    float *ch = c + h * c_hs;
    /* pack B[h]^T [k, ldb], zero-padded past width */
    if (b_cs == 1) { /* row-major B: 16 x 16 blocks transposed in registers */
      for (int64_t j0 = 0; j0 < width; j0 += 16)
        for (int64_t t0 = 0; t0 < k; t0 += 16)
          transpose16(bh + j0 * b_rs + t0, b_rs, (int)(width - j0 < 16 ? width - j0 : 16),
                      (int)(k - t0 < 16 ? k - t0 : 16), bt + t0 * ldb + j0, ldb);
    } else {
      for (int64_t t = 0; t < k; t++)
        for (int64_t j = 0; j < width; j++) bt[t * ldb + j] = bh[j * b_rs + t * b_cs];
    }
    for (int64_t t = 0; t < k; t++)
      for (int64_t j = width; j < ldb; j++) bt[t * ldb + j] = 0.0f;
    for (int64_t j0 = 0; j0 < width; j0 += HG_BLOCK) {
      int64_t cols = width - j0 < HG_BLOCK ? width - j0 : HG_BLOCK;
      int nv = (int)((cols + 15) / 16);
      int tail = (int)(cols - 16 * (nv - 1));
      __mmask16 last = (__mmask16)((1u << tail) - 1u);
      const float *btj = bt + j0;
      int64_t i = 0;
      if (nv <= 4) {
        for (; i + 3 < rows; i += 4) {
          float *c4[4];
          for (int r = 0; r < 4; r++)
            c4[r] = ch + ((i + r) / c_chunk) * c_cs + ((i + r) % c_chunk) * c_rs + j0;
          TILE4[nv - 1](ah + i * a_rs, a_rs, a_cs, btj, ldb, k, c4, last);
        }
      }
      for (; i + 1 < rows; i += 2) {
        float *c0 = ch + (i / c_chunk) * c_cs + (i % c_chunk) * c_rs + j0;
        float *c1 = ch + ((i + 1) / c_chunk) * c_cs + ((i + 1) % c_chunk) * c_rs + j0;
        TILE2[nv - 1](ah + i * a_rs, ah + (i + 1) * a_rs, a_cs, btj, ldb, k, c0, c1, last);
      }
      if (i < rows) {
        float *c0 = ch + (i / c_chunk) * c_cs + (i % c_chunk) * c_rs + j0;
        TILE1[nv - 1](ah + i * a_rs, a_cs, btj, ldb, k, c0, last);
      }
    }
  }
  free(bt);
  return 0;
}
#endif /* HG_KERNEL */

static int kernel_supported(void) {
#ifdef HG_KERNEL
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

static PyObject *py_supported(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return PyBool_FromLong(kernel_supported());
}

static PyObject *py_nt_rows(PyObject *self, PyObject *args) {
  (void)self;
  Py_ssize_t v[17];
  if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnnnnn", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                        &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13], &v[14],
                        &v[15], &v[16]))
    return NULL;
  if (!kernel_supported()) {
    PyErr_SetString(PyExc_RuntimeError, "the AVX-512 kernel is not supported on this CPU");
    return NULL;
  }
  if (v[11] < 1 || v[13] < 0 || v[14] < 0 || v[15] < 0 || v[16] < 0) {
    PyErr_SetString(PyExc_ValueError, "nt_rows: bad sizes");
    return NULL;
  }
  int rc = 0;
#ifdef HG_KERNEL
  if (v[13] > 0 && v[14] > 0 && v[15] > 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = nt_rows_avx512((const float *)(uintptr_t)v[0], v[1], v[2], v[3],
                        (const float *)(uintptr_t)v[4], v[5], v[6], v[7],
                        (float *)(uintptr_t)v[8], v[9], v[10], v[11], v[12], v[13], v[14],
                        v[15], v[16]);
    Py_END_ALLOW_THREADS
  }
#endif
  if (rc != 0) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"supported", py_supported, METH_NOARGS,
     "supported() -> bool: whether nt_rows can run on this CPU (x86-64 with AVX-512F)."},
    {"nt_rows", py_nt_rows, METH_VARARGS,
     "nt_rows(a, a_hs, a_rs, a_cs, b, b_hs, b_rs, b_cs, c, c_hs, c_cs, c_chunk, c_rs, n, rows, "
     "width, k): C[h] = A[h] @ B[h]^T into a strided destination (see the source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ntkernel",
                                    "Batched float32 A @ B^T into strided outputs (AVX-512).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__ntkernel(void) { return PyModule_Create(&module); }
