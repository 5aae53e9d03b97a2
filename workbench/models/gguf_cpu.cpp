// GGUF Q4_1 / Q8_0 blocks multiplied as they are stored: the CPU product behind `workbench.models.gguf_linear`.
//
// Why it exists: at batch 1 a decode step reads every weight once, so the product must read the 4-bit blocks
// (20 bytes per 32 weights) and never a float copy. Each block's weights are converted in registers to exactly
// the float32 numbers the dequantized checkpoint holds (Q4_1: d * q + m, one rounding, since d * q is exact;
// Q8_0: d * q, exact) and multiplied with the activations in float32: the same numbers as the float model,
// summed in another order. Built on first use by torch.utils.cpp_extension (`workbench.models.gguf_cpu`) with
// the build machine's vector instructions (-march=native): AVX-512, AVX2 + FMA, or plain C++.
//
// The fused decoder-layer halves that call these products are in gguf_cpu_layer.cpp.
//
// Block layouts (ggml's, 32 weights each, little-endian):
//   Q4_1  fp16 d, fp16 m, 16 bytes: byte j holds weight j in its low nibble and weight j + 16 in its high one
//   Q8_0  fp16 d, 32 int8
#include "gguf_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

using workbench_gguf::block_bytes;
using workbench_gguf::kBlock;
using workbench_gguf::kQ41;
using workbench_gguf::kQ80;

namespace {

constexpr int64_t kMaxRows = 4;  // activation rows sharing one pass over the weights

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// The 32 weights of one block as float32, exactly as the dequantized checkpoint has them.
inline void block_weights(const uint8_t* blk, int64_t kind, float* w) {
  const float d = half_at(blk);
  if (kind == kQ41) {
    const float m = half_at(blk + 2);
    const uint8_t* qs = blk + 4;
    for (int j = 0; j < 16; ++j) {
      w[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      w[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  } else {
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    for (int j = 0; j < 32; ++j) w[j] = d * static_cast<float>(qs[j]);
  }
}

#if defined(__AVX512F__)
using Vec = __m512;  // 16 floats: a block is two vectors
constexpr int kLanes = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
// A Q4_1 block has only 16 possible weights, fl(d * j + m) for j = 0..15: one FMA makes them all, and each code
// then picks its weight with a permute (which reads the low 4 bits of each index), instead of converting 32 codes
// to float and running 32 FMAs. The weights are the same float32 numbers either way.
inline void weights_q41(const uint8_t* blk, Vec* w) {
  int32_t dm_bits;
  std::memcpy(&dm_bits, blk, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // d, m
  const __m512 d = _mm512_broadcastss_ps(dm), m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
  const __m512 table = _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), d, m);
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4)));
  w[0] = _mm512_permutexvar_ps(q, table);
  w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}
inline void weights_q80(const uint8_t* blk, Vec* w) {
  const __m512 d = _mm512_set1_ps(half_at(blk));
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
  w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
}
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;  // 8 floats: a block is four vectors
constexpr int kLanes = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline void weights_q41(const uint8_t* blk, Vec* w) {
  const __m256 d = _mm256_set1_ps(half_at(blk)), m = _mm256_set1_ps(half_at(blk + 2));
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i a = _mm256_cvtepu8_epi32(raw), b = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
  w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), d, m);
  w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, mask)), d, m);
  w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m);
  w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), d, m);
}
inline void weights_q80(const uint8_t* blk, Vec* w) {
  const __m256 d = _mm256_set1_ps(half_at(blk));
  for (int i = 0; i < 4; ++i) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i));
    w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
}
#else
struct Vec {  // the portable path: one float per "vector"
  float v;
};
constexpr int kLanes = 1;
inline Vec vzero() { return {0.0f}; }
inline Vec vload(const float* p) { return {*p}; }
inline void vstore(float* p, Vec v) { *p = v.v; }
inline Vec vfma(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }
inline Vec vadd(Vec a, Vec b) { return {a.v + b.v}; }
inline float vsum(Vec v) { return v.v; }
inline void weights_q41(const uint8_t* blk, Vec* w) {
  float f[32];
  block_weights(blk, kQ41, f);
  for (int i = 0; i < 32; ++i) w[i].v = f[i];
}
inline void weights_q80(const uint8_t* blk, Vec* w) {
  float f[32];
  block_weights(blk, kQ80, f);
  for (int i = 0; i < 32; ++i) w[i].v = f[i];
}
#endif

constexpr int kVecs = kBlock / kLanes;  // vectors per block

// out[r][n] = x[r] . w[n] for ROWS activation rows and the weight rows n0..n1: each block is converted once and
// used by every activation row. Blocks go in pairs, each into its own accumulators, so that two chains of FMAs
// are in flight per row (indexed by constants only: the accumulators stay in registers).
template <int ROWS, int64_t KIND>
inline void accumulate(const uint8_t* blk, const float* x, int64_t ldx, Vec (&acc)[ROWS][kVecs]) {
  Vec wv[kVecs];
  if constexpr (KIND == kQ41) weights_q41(blk, wv);
  else weights_q80(blk, wv);
  for (int r = 0; r < ROWS; ++r)
    for (int i = 0; i < kVecs; ++i) acc[r][i] = vfma(vload(x + r * ldx + i * kLanes), wv[i], acc[r][i]);
}

template <int ROWS, int64_t KIND>
void rows_product(const float* x, int64_t ldx, const uint8_t* w, int64_t ldw, int64_t nb, float* out,
                  int64_t ldo, int64_t n0, int64_t n1) {
  constexpr int64_t bytes = KIND == kQ41 ? 20 : 34;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * ldw;
    Vec even[ROWS][kVecs], odd[ROWS][kVecs];
    for (int r = 0; r < ROWS; ++r)
      for (int i = 0; i < kVecs; ++i) even[r][i] = odd[r][i] = vzero();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
      accumulate<ROWS, KIND>(row + b * bytes, x + b * kBlock, ldx, even);
      accumulate<ROWS, KIND>(row + (b + 1) * bytes, x + (b + 1) * kBlock, ldx, odd);
    }
    if (b < nb) accumulate<ROWS, KIND>(row + b * bytes, x + b * kBlock, ldx, even);
    for (int r = 0; r < ROWS; ++r) {
      Vec total = vadd(even[r][0], odd[r][0]);
      for (int i = 1; i < kVecs; ++i) total = vadd(total, vadd(even[r][i], odd[r][i]));
      out[r * ldo + n] = vsum(total);
    }
  }
}

// Weight rows n0..n1 against all m activation rows, kMaxRows at a time. Over many activation rows the weight rows
// go in tiles of ~32 KB of blocks, so that every group of activation rows finds its tile in the core's cache
// instead of streaming the whole matrix again (a prefill's LM head would read its 30 MB once per 4 rows).
template <int64_t KIND>
void product_range(const float* x, int64_t ldx, int64_t m, const uint8_t* w, int64_t ldw, int64_t nb, float* out,
                   int64_t ldo, int64_t n0, int64_t n1) {
  const int64_t tile = m <= kMaxRows ? n1 - n0 : std::max<int64_t>(8, (32 << 10) / ldw);
  for (int64_t t0 = n0; t0 < n1; t0 += tile) {
    const int64_t t1 = std::min(n1, t0 + tile);
    for (int64_t r = 0; r < m; r += kMaxRows) {
      const float* xr = x + r * ldx;
      float* o = out + r * ldo;
      switch (m - r >= kMaxRows ? kMaxRows : m - r) {
        case 1: rows_product<1, KIND>(xr, ldx, w, ldw, nb, o, ldo, t0, t1); break;
        case 2: rows_product<2, KIND>(xr, ldx, w, ldw, nb, o, ldo, t0, t1); break;
        case 3: rows_product<3, KIND>(xr, ldx, w, ldw, nb, o, ldo, t0, t1); break;
        default: rows_product<4, KIND>(xr, ldx, w, ldw, nb, o, ldo, t0, t1); break;
      }
    }
  }
}

}  // namespace

namespace workbench_gguf {

void check_blocks(const at::Tensor& blocks, int64_t kind, int64_t in_features) {
  TORCH_CHECK(kind == kQ41 || kind == kQ80, "kind must be 3 (Q4_1) or 8 (Q8_0), got ", kind);
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                  blocks.is_contiguous(),
              "blocks must be a contiguous 2-D uint8 CPU tensor [out_features, blocks * bytes]");
  TORCH_CHECK(in_features % kBlock == 0 && blocks.size(1) == in_features / kBlock * block_bytes(kind),
              "blocks have ", blocks.size(1), " bytes per row; ", in_features, " inputs need ",
              in_features / kBlock * block_bytes(kind));
}

void product(const float* x, int64_t ldx, int64_t m, const at::Tensor& blocks, int64_t kind, float* out,
             int64_t ldo) {
  const int64_t n = blocks.size(0), k = blocks.size(1) / block_bytes(kind) * kBlock, nb = k / kBlock;
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  const int64_t ldw = blocks.size(1);
  // Enough rows per task that a small layer is not split finer than the cost of waking a thread.
  const int64_t grain = std::max<int64_t>(16, 8192 / std::max<int64_t>(k, 1));
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    if (kind == kQ41) product_range<kQ41>(x, ldx, m, wp, ldw, nb, out, ldo, n0, n1);
    else product_range<kQ80>(x, ldx, m, wp, ldw, nb, out, ldo, n0, n1);
  });
}

}  // namespace workbench_gguf

namespace {

using workbench_gguf::check_blocks;

// x [M, K] float32 times the blocks' weights [N, K] transposed: [M, N] float32.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t kind) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "x must be a 2-D float32 CPU tensor with unit stride along K");
  check_blocks(blocks, kind, x.size(1));
  at::Tensor out = at::empty({x.size(0), blocks.size(0)}, x.options());
  workbench_gguf::product(x.data_ptr<float>(), x.stride(0), x.size(0), blocks, kind, out.data_ptr<float>(),
                          blocks.size(0));
  return out;
}

// The blocks' weights as a float32 [N, K] matrix (for products over many rows, where a GEMM is faster).
at::Tensor gguf_dequantize(const at::Tensor& blocks, int64_t kind, int64_t in_features) {
  check_blocks(blocks, kind, in_features);
  const int64_t n = blocks.size(0), nb = in_features / kBlock, ldw = blocks.size(1);
  at::Tensor out = at::empty({n, in_features}, blocks.options().dtype(at::kFloat));
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const int64_t bytes = block_bytes(kind);
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    Vec wv[kVecs];
    for (int64_t r = n0; r < n1; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = wp + r * ldw + b * bytes;
        if (kind == kQ41) weights_q41(blk, wv);
        else weights_q80(blk, wv);
        float* dst = op + r * in_features + b * kBlock;
        for (int i = 0; i < kVecs; ++i) vstore(dst + i * kLanes, wv[i]);
      }
    }
  });
  return out;
}

// Which vector path this build took: "avx512", "avx2" or "portable".
std::string vector_path() {
  return kLanes == 16 ? "avx512" : kLanes == 8 ? "avx2" : "portable";
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(workbench_gguf, m) {
  m.def("linear(Tensor x, Tensor blocks, int kind) -> Tensor", &gguf_linear);
  m.def("dequantize(Tensor blocks, int kind, int in_features) -> Tensor", &gguf_dequantize);
  m.def("vector_path() -> str", &vector_path);
}
