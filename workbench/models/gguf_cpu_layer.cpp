// A decoder layer's two halves around attention, each one call, for a few rows of GGUF-block weights on the CPU.
//
// Why it exists: at batch 1 a float32 decode step of SmolLM2-135M on two cores spends more time in the ~25
// small PyTorch operators per layer (norms, rotary, slices, SiLU, residual adds: a few microseconds of dispatch
// each, 30 layers) than in reading the 4-bit weights. Here each half is one operator; the arithmetic is the
// plain forward's (`workbench.models.llama.DecoderLayer.forward`), in the same order where it is elementwise:
//
//   attn_in:  h = rms_norm(x) * gain; qkv = h W_qkv^T; q and k rotated in place ("rotate half")
//   attn_out: x = x + attn W_o^T; h = rms_norm(x) * gain; g, u = h W_gu^T; x = x + (silu(g) * u) W_down^T
//
// Norm sums and the SiLU's exponential round differently from ATen's vectorised ones (a few float32 ulps).
#include "gguf_cpu.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using workbench_gguf::check_blocks;
using workbench_gguf::product;

// rows of x [m, width] -> out, each row times 1 / sqrt(mean(x^2) + eps), then times the gain (F.rms_norm's order).
void rms_norm_rows(const float* x, int64_t ldx, int64_t m, int64_t width, const float* gain, double eps,
                   float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    float sum = 0.0f;
    for (int64_t i = 0; i < width; ++i) sum += row[i] * row[i];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(width) + static_cast<float>(eps));
    for (int64_t i = 0; i < width; ++i) out[r * width + i] = row[i] * scale * gain[i];
  }
}

void check_rows(const char* name, const at::Tensor& t, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous() &&
                  t.size(1) == width,
              name, " must be a contiguous float32 CPU tensor [rows, ", width, "], got sizes ", t.sizes());
}

void check_gain(const char* name, const at::Tensor& t, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous() &&
                  t.size(0) == width,
              name, " must be a float32 CPU vector of ", width);
}

// qkv [m, (heads + kv_heads + kv_heads) * head_dim]: rotate the first heads + kv_heads heads of each row by that
// row's cos and sin [m, head_dim]: x * cos + rotate_half(x) * sin, two products and a sum as the plain forward.
void rotate(float* qkv, int64_t m, int64_t width, int64_t rotated_heads, int64_t head_dim, const float* cos,
            const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < m; ++r) {
    const float* c = cos + r * head_dim;
    const float* s = sin + r * head_dim;
    for (int64_t h = 0; h < rotated_heads; ++h) {
      float* x = qkv + r * width + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        const float a = x1 * c[i], b = (-x2) * s[i];
        const float e = x2 * c[i + half], f = x1 * s[i + half];
        x[i] = a + b;
        x[i + half] = e + f;
      }
    }
  }
}

at::Tensor attn_in(const at::Tensor& x, const at::Tensor& gain, double eps, const at::Tensor& qkv_blocks,
                   int64_t qkv_kind, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_dim) {
  const int64_t m = x.size(0), hidden = x.size(1), width = (num_heads + 2 * num_kv_heads) * head_dim;
  check_rows("x", x, hidden);
  check_gain("input_norm", gain, hidden);
  check_blocks(qkv_blocks, qkv_kind, hidden);
  TORCH_CHECK(qkv_blocks.size(0) == width, "qkv blocks have ", qkv_blocks.size(0), " rows, heads need ", width);
  check_rows("cos", cos, head_dim);
  check_rows("sin", sin, head_dim);
  TORCH_CHECK(cos.size(0) == m && sin.size(0) == m, "cos and sin need one row per token (", m, ")");
  std::vector<float> h(static_cast<size_t>(m * hidden));
  rms_norm_rows(x.data_ptr<float>(), hidden, m, hidden, gain.data_ptr<float>(), eps, h.data());
  at::Tensor qkv = at::empty({m, width}, x.options());
  product(h.data(), hidden, m, qkv_blocks, qkv_kind, qkv.data_ptr<float>(), width);
  rotate(qkv.data_ptr<float>(), m, width, num_heads + num_kv_heads, head_dim, cos.data_ptr<float>(),
         sin.data_ptr<float>());
  return qkv;
}

at::Tensor attn_out(const at::Tensor& x, const at::Tensor& attn, const at::Tensor& o_blocks, int64_t o_kind,
                    const at::Tensor& gain, double eps, const at::Tensor& gate_up_blocks, int64_t gate_up_kind,
                    const at::Tensor& down_blocks, int64_t down_kind) {
  const int64_t m = x.size(0), hidden = x.size(1), q_size = attn.size(1);
  const int64_t inter = gate_up_blocks.size(0) / 2;
  check_rows("x", x, hidden);
  check_rows("attn", attn, q_size);
  TORCH_CHECK(attn.size(0) == m, "attn has ", attn.size(0), " rows, x ", m);
  check_gain("post_attention_norm", gain, hidden);
  check_blocks(o_blocks, o_kind, q_size);
  check_blocks(gate_up_blocks, gate_up_kind, hidden);
  check_blocks(down_blocks, down_kind, inter);
  TORCH_CHECK(o_blocks.size(0) == hidden && down_blocks.size(0) == hidden, "o and down must have ", hidden, " rows");
  at::Tensor out = at::empty({m, hidden}, x.options());
  float* y = out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  product(attn.data_ptr<float>(), q_size, m, o_blocks, o_kind, y, hidden);
  for (int64_t i = 0; i < m * hidden; ++i) y[i] = xp[i] + y[i];  // the residual stream after attention
  std::vector<float> h(static_cast<size_t>(m * hidden)), gu(static_cast<size_t>(m * 2 * inter));
  std::vector<float> act(static_cast<size_t>(m * inter)), down(static_cast<size_t>(m * hidden));
  rms_norm_rows(y, hidden, m, hidden, gain.data_ptr<float>(), eps, h.data());
  product(h.data(), hidden, m, gate_up_blocks, gate_up_kind, gu.data(), 2 * inter);
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gu.data() + r * 2 * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float silu = g[i] / (1.0f + std::exp(-g[i]));
      act[r * inter + i] = silu * g[inter + i];
    }
  }
  product(act.data(), inter, m, down_blocks, down_kind, down.data(), hidden);
  for (int64_t i = 0; i < m * hidden; ++i) y[i] = y[i] + down[i];
  return out;
}

// One new token of one sequence over a contiguous KV buffer (`workbench.cache.contiguous`): writes its key and
// value from qkv [1, (H + 2 Hkv) D] (q and k already rotated) at position pos of layer `layer` in keys / values
// [layers, Hkv, max_len, D] (a slot's view: each layer's [Hkv, max_len, D] contiguous), then attends over
// positions 0..pos. Softmax as SDPA computes it: scores scaled, max subtracted, exponentials summed in float32.
at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& keys, const at::Tensor& values, int64_t layer,
                            int64_t pos, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale) {
  const int64_t width = (num_heads + 2 * num_kv_heads) * head_dim;
  check_rows("qkv", qkv, width);
  TORCH_CHECK(qkv.size(0) == 1, "decode_attention takes one token, got ", qkv.size(0));
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  for (const at::Tensor* t : {&keys, &values}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4 &&
                    t->size(1) == num_kv_heads && t->size(3) == head_dim && t->stride(3) == 1 &&
                    t->stride(2) == head_dim && t->stride(1) == t->size(2) * head_dim,
                "keys and values must be float32 CPU [layers, kv_heads, max_len, head_dim], each layer contiguous");
  }
  TORCH_CHECK(layer >= 0 && layer < keys.size(0), "layer ", layer, " outside 0..", keys.size(0) - 1);
  TORCH_CHECK(pos >= 0 && pos < keys.size(2), "position ", pos, " outside the buffer's 0..", keys.size(2) - 1);
  const int64_t max_len = keys.size(2), group = num_heads / num_kv_heads, seen = pos + 1;
  const float* src = qkv.data_ptr<float>();
  float* kbase = keys.data_ptr<float>() + layer * keys.stride(0);
  float* vbase = values.data_ptr<float>() + layer * values.stride(0);
  for (int64_t g = 0; g < num_kv_heads; ++g) {
    std::copy_n(src + (num_heads + g) * head_dim, head_dim, kbase + (g * max_len + pos) * head_dim);
    std::copy_n(src + (num_heads + num_kv_heads + g) * head_dim, head_dim, vbase + (g * max_len + pos) * head_dim);
  }
  at::Tensor out = at::zeros({1, num_heads * head_dim}, qkv.options());
  float* o = out.data_ptr<float>();
  std::vector<float> p(static_cast<size_t>(seen));
  const float fscale = static_cast<float>(scale);
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* q = src + h * head_dim;
    const float* kh = kbase + (h / group) * max_len * head_dim;
    const float* vh = vbase + (h / group) * max_len * head_dim;
    float top = -INFINITY;
    for (int64_t j = 0; j < seen; ++j) {
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < head_dim; ++i) dot += q[i] * kh[j * head_dim + i];
      p[j] = dot * fscale;
      top = std::max(top, p[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < seen; ++j) {
      p[j] = std::exp(p[j] - top);
      sum += p[j];
    }
    float* oh = o + h * head_dim;
    for (int64_t j = 0; j < seen; ++j) {
      const float w = p[j] / sum;
#pragma omp simd
      for (int64_t i = 0; i < head_dim; ++i) oh[i] += w * vh[j * head_dim + i];
    }
  }
  return out;
}

// Every decoder layer of one token over a contiguous KV buffer, in one call: attn_in, decode_attention and
// attn_out per layer, with no Python between layers. Each list holds one tensor per layer; kinds per layer.
at::Tensor decode_layers(const at::Tensor& x, at::TensorList input_norms, at::TensorList qkv_blocks,
                         at::IntArrayRef qkv_kinds, at::TensorList o_blocks, at::IntArrayRef o_kinds,
                         at::TensorList post_norms, at::TensorList gate_up_blocks, at::IntArrayRef gate_up_kinds,
                         at::TensorList down_blocks, at::IntArrayRef down_kinds, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values, int64_t pos,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  const size_t layers = input_norms.size();
  for (size_t n : {qkv_blocks.size(), o_blocks.size(), post_norms.size(), gate_up_blocks.size(), down_blocks.size(),
                   qkv_kinds.size(), o_kinds.size(), gate_up_kinds.size(), down_kinds.size()})
    TORCH_CHECK(n == layers, "every per-layer list must have ", layers, " entries, got one of ", n);
  TORCH_CHECK(keys.dim() == 4 && static_cast<size_t>(keys.size(0)) == layers, "keys must have one entry per layer");
  at::Tensor h = x;
  for (size_t i = 0; i < layers; ++i) {
    at::Tensor qkv = attn_in(h, input_norms[i], eps, qkv_blocks[i], qkv_kinds[i], cos, sin, num_heads, num_kv_heads,
                             head_dim);
    at::Tensor attn = decode_attention(qkv, keys, values, static_cast<int64_t>(i), pos, num_heads, num_kv_heads,
                                       head_dim, scale);
    h = attn_out(h, attn, o_blocks[i], o_kinds[i], post_norms[i], eps, gate_up_blocks[i], gate_up_kinds[i],
                 down_blocks[i], down_kinds[i]);
  }
  return h;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(workbench_gguf, m) {
  m.def("decode_layers(Tensor x, Tensor[] input_norms, Tensor[] qkv_blocks, int[] qkv_kinds, Tensor[] o_blocks, "
        "int[] o_kinds, Tensor[] post_norms, Tensor[] gate_up_blocks, int[] gate_up_kinds, Tensor[] down_blocks, "
        "int[] down_kinds, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int pos, int num_heads, "
        "int num_kv_heads, int head_dim, float eps, float scale) -> Tensor",
        &decode_layers);
  m.def("decode_attention(Tensor qkv, Tensor(a!) keys, Tensor(b!) values, int layer, int pos, int num_heads, "
        "int num_kv_heads, int head_dim, float scale) -> Tensor",
        &decode_attention);
  m.def("attn_in(Tensor x, Tensor gain, float eps, Tensor qkv_blocks, int qkv_kind, Tensor cos, Tensor sin, "
        "int num_heads, int num_kv_heads, int head_dim) -> Tensor",
        &attn_in);
  m.def("attn_out(Tensor x, Tensor attn, Tensor o_blocks, int o_kind, Tensor gain, float eps, "
        "Tensor gate_up_blocks, int gate_up_kind, Tensor down_blocks, int down_kind) -> Tensor",
        &attn_out);
}
