// What gguf_cpu.cpp (the block products) offers gguf_cpu_layer.cpp (the fused decoder-layer halves).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace workbench_gguf {

constexpr int64_t kBlock = 32;  // weights per block
constexpr int64_t kQ41 = 3;     // ggml type ids, as the gguf package numbers them
constexpr int64_t kQ80 = 8;

inline int64_t block_bytes(int64_t kind) { return kind == kQ41 ? 20 : 34; }

// Refuses (c10::Error, a RuntimeError in Python) blocks that are not contiguous uint8 CPU rows of this format.
void check_blocks(const at::Tensor& blocks, int64_t kind, int64_t in_features);

// out[r * ldo + n] = sum_k x[r * ldx + k] * w[n, k] for r < m and every weight row n of the blocks; threads over n.
void product(const float* x, int64_t ldx, int64_t m, const at::Tensor& blocks, int64_t kind, float* out,
             int64_t ldo);

}  // namespace workbench_gguf
