#include "model/cuda/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "model/cuda/out_of_memory.h"
#include "ops/cuda/linear_fp8.h"
#include "quant/formats.h"
#include "quant/mxfp4_tiles.h"

namespace glms::model {

namespace cuda = ops::cuda;
using cuda::DeviceBuffer;

void check_cuda_supported(const io::ModelConfig& c) {
  if (c.q_lora_rank <= 0) fail("the CUDA path needs q_lora_rank > 0 (GLM-5 checkpoints have 2048)");
  if (c.rope_type != "default") fail("rope_type '" + c.rope_type + "' is not supported on CUDA");
  if (c.kv_lora_rank > 512) fail("the CUDA attention kernel supports kv_lora_rank up to 512");
  if (c.n_routed_experts > 1024 || c.n_group > 32) fail("the CUDA router supports up to 1024 experts in 32 groups");
  if (c.num_hidden_layers > 0 && !c.indexer_full[0])
    fail("layer 0 shares an indexer that no earlier layer computes");
}

namespace {

// Whether every value of `w` is a bf16 value (stored as bf16, or fp32 values that are).
bool bf16_values(const WeightView& w) {
  if (w.format != ops::WeightFormat::Plain) return false;
  if (w.dtype == DType::BF16) return true;
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_f32(r, row.data());
    for (const float v : row)
      if (bf16_to_f32(f32_to_bf16(v)) != v) return false;
  }
  return true;
}

// Appends `w` as bf16 rows to `out` (the stored format is widened or dequantised per row).
void append_bf16(const WeightView& w, std::vector<uint16_t>& out) {
  const size_t start = out.size();
  out.resize(start + static_cast<size_t>(w.rows * w.cols));
  uint16_t* dst = out.data() + start;
  if (w.format == ops::WeightFormat::Plain && w.dtype == DType::BF16) {
    for (int64_t r = 0; r < w.rows; ++r)
      std::memcpy(dst + r * w.cols, static_cast<const uint16_t*>(w.data) + r * w.row_stride, sizeof(uint16_t) * w.cols);
    return;
  }
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_f32(r, row.data());
    for (int64_t k = 0; k < w.cols; ++k) dst[r * w.cols + k] = f32_to_bf16(row[k]);
  }
}

class Uploader {
 public:
  explicit Uploader(int64_t& bytes) : bytes_(bytes) {}

  DeviceBuffer bf16(const std::vector<const WeightView*>& parts) {
    std::vector<uint16_t> host;
    for (const WeightView* w : parts) append_bf16(*w, host);
    return device(host.data(), host.size() * sizeof(uint16_t));
  }
  DeviceBuffer bf16(const WeightView& w) { return bf16(std::vector<const WeightView*>{&w}); }
  // The parts stacked by rows as one linear layer: block FP8 where `linears` asks for it (and the
  // widths suit it), else bf16.
  LinearDevice linear(const std::vector<const WeightView*>& parts, CudaLinearWeights linears) {
    LinearDevice out;
    out.cols = parts.front()->cols;
    bool stored_fp8 = true;
    for (const WeightView* w : parts) {
      out.rows += w->rows;
      stored_fp8 &= w->format == ops::WeightFormat::Fp8Block;
    }
    const bool fp8 = linears == CudaLinearWeights::kFp8 || (linears == CudaLinearWeights::kAsStored && stored_fp8);
    ++linear_matrices;
    if (!fp8 || !fp8_linear_fits(out.rows, out.cols)) {
      out.w = bf16(parts);
      return out;
    }
    // Quantised here from the stored values: a checkpoint's FP8 blocks (amax / 448 scales, as
    // DeepSeek's and glmserve's quantisers make them) come back as the same codes and scales.
    std::vector<float> values(static_cast<size_t>(out.rows * out.cols));
    int64_t row = 0;
    for (const WeightView* w : parts)
      for (int64_t r = 0; r < w->rows; ++r, ++row) w->row_to_f32(r, values.data() + row * out.cols);
    std::vector<uint8_t> codes(values.size());
    std::vector<float> scale_inv(static_cast<size_t>(((out.rows + 127) / 128) * ((out.cols + 127) / 128)));
    quant::quantize_fp8_block(values.data(), out.rows, out.cols, codes.data(), scale_inv.data());
    out.format = ops::WeightFormat::Fp8Block;
    out.w = u8(codes);
    out.scales = f32(cuda::fp8_weight_scales_for_cublaslt(scale_inv.data(), out.rows, out.cols));
    ++fp8_linear_matrices;
    fp8_linear_parameters += out.rows * out.cols;
    return out;
  }
  LinearDevice linear(const WeightView& w, CudaLinearWeights linears) { return linear({&w}, linears); }
  int linear_matrices = 0, fp8_linear_matrices = 0;
  int64_t fp8_linear_parameters = 0;
  // Columns [first, first + count) of `w` as a bf16 [rows, count] matrix.
  DeviceBuffer bf16_columns(const WeightView& w, int64_t first, int64_t count) {
    GLMS_CHECK(first >= 0 && first + count <= w.cols, "bf16_columns out of range");
    std::vector<uint16_t> host(static_cast<size_t>(w.rows * count));
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      w.row_to_f32(r, row.data());
      for (int64_t k = 0; k < count; ++k) host[r * count + k] = f32_to_bf16(row[first + k]);
    }
    return device(host.data(), host.size() * sizeof(uint16_t));
  }
  DeviceBuffer f32(const std::vector<float>& v) { return device(v.data(), v.size() * sizeof(float)); }
  DeviceBuffer u8(const std::vector<uint8_t>& v) { return device(v.data(), v.size()); }
  DeviceBuffer f32(const WeightView& w) {
    std::vector<float> host(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) w.row_to_f32(r, host.data() + r * w.cols);
    return f32(host);
  }

 private:
  DeviceBuffer device(const void* host, size_t bytes) {
    DeviceBuffer buffer(bytes);
    buffer.upload(host, bytes);
    bytes_ += static_cast<int64_t>(bytes);
    return buffer;
  }
  int64_t& bytes_;
};

// The routed experts' device storage: the layer's quantised format when every expert matrix is
// in it and the widths suit the expert kernels, else bf16.
ops::WeightFormat experts_storage(const MoeWeights& moe, int64_t hidden, int64_t inter) {
  if (moe.experts.empty()) return ops::WeightFormat::Plain;
  const ops::WeightFormat format = moe.experts.front().gate_proj.format;
  for (const MlpWeights& e : moe.experts)
    for (const WeightView* w : {&e.gate_proj, &e.up_proj, &e.down_proj})
      if (w->format != format) return ops::WeightFormat::Plain;
  if (format == ops::WeightFormat::Mxfp4 && hidden % 32 == 0 && inter % 32 == 0) return format;
  if (format == ops::WeightFormat::Fp8Block && hidden % 16 == 0 && inter % 16 == 0) return format;
  return ops::WeightFormat::Plain;
}

// MXFP4 rows of `w` (a block of rows and columns of the stored matrix): packed [rows, cols / 2]
// and E8M0 scales [rows, cols / 32].
void append_mxfp4(const WeightView& w, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales) {
  const int64_t stored = w.whole_cols(), row_bytes = w.cols / 2, row_scales = w.cols / 32;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t row = w.first_row + r;
    const auto* data = static_cast<const uint8_t*>(w.data) + row * (stored / 2) + w.first_col / 2;
    const auto* scale = static_cast<const uint8_t*>(w.scales) + row * (stored / 32) + w.first_col / 32;
    packed.insert(packed.end(), data, data + row_bytes);
    scales.insert(scales.end(), scale, scale + row_scales);
  }
}

// Block-FP8 rows of `w`: codes [rows, cols] and, per row, its blocks' scales [ceil(cols / 128)].
void append_fp8(const WeightView& w, std::vector<uint8_t>& codes, std::vector<float>& scales) {
  const int64_t blocks = (w.cols + 127) / 128, stored_blocks = (w.row_stride + 127) / 128;
  const auto* scale_inv = static_cast<const float*>(w.scales);
  for (int64_t r = 0; r < w.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * w.row_stride;
    codes.insert(codes.end(), row, row + w.cols);
    const float* block_row = scale_inv + (w.first_row + r) / 128 * stored_blocks + w.first_col / 128;
    scales.insert(scales.end(), block_row, block_row + blocks);
  }
}

// Packed MXFP4 rows `cols` wide and their E8M0 scales, rewritten in the tile layout (in place).
void tile_in_place(std::vector<uint8_t>& packed, std::vector<uint8_t>& scales, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(packed.size()) / (cols / 2);
  quant::tile_mxfp4_rows(packed.data(), rows, cols, packed.data());
  quant::tile_mxfp4_scales(scales.data(), rows, cols, scales.data());
}

void upload_experts(Uploader& up, const MoeWeights& moe, int64_t hidden, MoeDevice& d) {
  d.first_expert = moe.first_expert;
  d.num_experts = static_cast<int>(moe.experts.size());
  d.expert_inter = moe.experts.empty() ? 0 : moe.experts.front().gate_proj.rows;
  const int64_t inter = d.expert_inter;
  d.experts_format = experts_storage(moe, hidden, inter);
  switch (d.experts_format) {
    case ops::WeightFormat::Plain: {
      std::vector<const WeightView*> gate_up, down;
      for (const MlpWeights& e : moe.experts) {
        gate_up.push_back(&e.gate_proj);
        gate_up.push_back(&e.up_proj);
        down.push_back(&e.down_proj);
      }
      d.experts_gate_up = up.bf16(gate_up);
      d.experts_down = up.bf16(down);
      return;
    }
    case ops::WeightFormat::Mxfp4: {
      std::vector<uint8_t> gate_up, gate_up_scales, down, down_scales;
      for (const MlpWeights& e : moe.experts) {
        append_mxfp4(e.gate_proj, gate_up, gate_up_scales);
        append_mxfp4(e.up_proj, gate_up, gate_up_scales);
        append_mxfp4(e.down_proj, down, down_scales);
      }
      // The tensor-core kernels' tile layout where they can read it (ops/cuda/moe.h).
      auto scales_fit = [](const std::vector<uint8_t>& codes) {
        return std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c >= 1 && c <= 254; });
      };
      d.experts_mxfp4_tiled = quant::mxfp4_tiles_fit(hidden) && quant::mxfp4_tiles_fit(inter) &&
                              scales_fit(gate_up_scales) && scales_fit(down_scales);
      if (d.experts_mxfp4_tiled) {
        tile_in_place(gate_up, gate_up_scales, hidden);
        tile_in_place(down, down_scales, inter);
      }
      d.experts_gate_up = up.u8(gate_up);
      d.experts_gate_up_scales = up.u8(gate_up_scales);
      d.experts_down = up.u8(down);
      d.experts_down_scales = up.u8(down_scales);
      return;
    }
    case ops::WeightFormat::Fp8Block: {
      std::vector<uint8_t> gate_up, down;
      std::vector<float> gate_up_scales, down_scales;
      for (const MlpWeights& e : moe.experts) {
        append_fp8(e.gate_proj, gate_up, gate_up_scales);
        append_fp8(e.up_proj, gate_up, gate_up_scales);
        append_fp8(e.down_proj, down, down_scales);
      }
      d.experts_gate_up = up.u8(gate_up);
      d.experts_gate_up_scales = up.f32(gate_up_scales);
      d.experts_down = up.u8(down);
      d.experts_down_scales = up.f32(down_scales);
      return;
    }
    default:
      fail("unexpected expert storage");  // experts_storage() keeps only the formats above
  }
}

MlpDevice upload_mlp(Uploader& up, const MlpWeights& w, CudaLinearWeights linears) {
  MlpDevice mlp;
  mlp.inter = w.gate_proj.rows;
  mlp.gate_up = up.linear({&w.gate_proj, &w.up_proj}, linears);
  mlp.down = up.linear(w.down_proj, linears);
  return mlp;
}

DecoderLayerDevice upload_layer(Uploader& up, const DecoderLayerWeights& layer, const io::ModelConfig& c,
                                CudaLinearWeights linears) {
  DecoderLayerDevice d;
  d.input_norm = up.f32(layer.input_norm);
  d.post_attention_norm = up.f32(layer.post_attention_norm);
  const AttentionWeights& a = layer.attention;
  d.attention.heads = a.heads;
  d.attention.q_a_proj = up.linear(a.q_a_proj, linears);
  d.attention.q_a_norm = up.f32(a.q_a_norm);
  d.attention.q_b_proj = up.linear(a.q_b_proj, linears);
  d.attention.kv_a_proj = up.linear(a.kv_a_proj, linears);
  d.attention.kv_a_norm = up.f32(a.kv_a_norm);
  d.attention.kv_b_proj = up.bf16(a.kv_b_proj);
  d.attention.o_proj = up.linear(a.o_proj, linears);
  d.attention.has_indexer = a.has_indexer;
  if (a.has_indexer) {
    d.attention.indexer.wq_b = up.bf16(a.indexer.wq_b);
    d.attention.indexer.wk = up.bf16(a.indexer.wk);
    d.attention.indexer.weights_proj = up.bf16(a.indexer.weights_proj);
    d.attention.indexer.k_norm_weight = up.f32(a.indexer.k_norm_weight);
    d.attention.indexer.k_norm_bias = up.f32(a.indexer.k_norm_bias);
  }
  d.is_moe = layer.is_moe;
  if (layer.is_moe) {
    d.moe.router = up.f32(layer.moe.router);
    if (bf16_values(layer.moe.router)) d.moe.router_bf16 = up.bf16(layer.moe.router);
    d.moe.correction_bias = up.f32(layer.moe.correction_bias);
    upload_experts(up, layer.moe, c.hidden_size, d.moe);
    d.moe.shared = upload_mlp(up, layer.moe.shared_expert, linears);
  } else {
    d.mlp = upload_mlp(up, layer.mlp, linears);
  }
  return d;
}

// Makes device buffers of seeded random values: each tensor gets its own stream of the
// counter-based generator, so a tensor's values do not depend on what else is made.
class RandomMaker {
 public:
  RandomMaker(uint64_t seed, int64_t& bytes) : seed_(seed), bytes_(bytes) {}

  // [rows, cols] bf16 with standard deviation 1/sqrt(cols) (uniform of half-width sqrt(3/cols)).
  DeviceBuffer matrix(int64_t count, int64_t fan_in) {
    DeviceBuffer buffer(sizeof(uint16_t) * count);
    cuda::fill_uniform_bf16(static_cast<uint16_t*>(buffer.data()), count, next(),
                            std::sqrt(3.0f / static_cast<float>(fan_in)), nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer constant(int64_t count, float value) {
    DeviceBuffer buffer(sizeof(float) * count);
    cuda::fill_f32(static_cast<float*>(buffer.data()), count, value, nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer widened(const DeviceBuffer& bf16, int64_t count) {
    DeviceBuffer buffer(sizeof(float) * count);
    cuda::widen_bf16(static_cast<const uint16_t*>(bf16.data()), count, static_cast<float*>(buffer.data()), nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer uniform_f32(int64_t count, float scale) {
    DeviceBuffer buffer(sizeof(float) * count);
    cuda::fill_uniform_f32(static_cast<float*>(buffer.data()), count, next(), scale, nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer bytes(int64_t count) {
    DeviceBuffer buffer(static_cast<size_t>(std::max<int64_t>(count, 1)));
    cuda::fill_random_bytes(static_cast<uint8_t*>(buffer.data()), count, next(), nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer constant_bytes(int64_t count, uint8_t value) {
    DeviceBuffer buffer(static_cast<size_t>(std::max<int64_t>(count, 1)));
    cuda::fill_bytes(static_cast<uint8_t*>(buffer.data()), count, value, nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  DeviceBuffer e4m3(int64_t count) {
    DeviceBuffer buffer(static_cast<size_t>(std::max<int64_t>(count, 1)));
    cuda::fill_uniform_e4m3(static_cast<uint8_t*>(buffer.data()), count, next(), nullptr);
    bytes_ += static_cast<int64_t>(buffer.bytes());
    return buffer;
  }
  // Routed experts [E, rows, cols] in `format` (ops/cuda/moe.h's layout), made directly in it
  // (no bf16 copy), standard deviation about 1/sqrt(fan_in).
  void experts(ops::WeightFormat format, int64_t E, int64_t rows, int64_t cols, int64_t fan_in, DeviceBuffer& data,
               DeviceBuffer& scales) {
    const int64_t count = E * rows * cols;
    switch (format) {
      case ops::WeightFormat::Plain:
        data = matrix(count, fan_in);
        return;
      case ops::WeightFormat::Mxfp4: {
        // Uniform E2M1 codes have an RMS of 2.93; one power-of-two scale brings it near 1/sqrt(fan_in).
        const double scale = 1.0 / (std::sqrt(static_cast<double>(fan_in)) * 2.926);
        data = bytes(count / 2);
        scales = constant_bytes(count / 32, static_cast<uint8_t>(127 + std::lround(std::log2(scale))));
        return;
      }
      case ops::WeightFormat::Fp8Block: {
        // Codes uniform in [-448, 448]: scale_inv maps them to +-sqrt(3 / fan_in).
        data = e4m3(count);
        scales = constant(E * rows * ((cols + 127) / 128), std::sqrt(3.0f / static_cast<float>(fan_in)) / 448.0f);
        return;
      }
      default:
        fail("synthetic experts are bf16, MXFP4 or FP8");
    }
  }
  // A [rows, cols] linear layer: block FP8 with `fp8` where the widths suit it (codes uniform in
  // [-448, 448], one block scale mapping them to +-sqrt(3 / fan_in)), else bf16.
  LinearDevice linear(int64_t rows, int64_t cols, int64_t fan_in, bool fp8) {
    LinearDevice out;
    out.rows = rows;
    out.cols = cols;
    ++linear_matrices;
    if (!fp8 || !fp8_linear_fits(rows, cols)) {
      out.w = matrix(rows * cols, fan_in);
      return out;
    }
    out.format = ops::WeightFormat::Fp8Block;
    out.w = e4m3(rows * cols);
    const int64_t scales = ((rows + 127) / 128) * cuda::fp8_scale_row_stride(cols);
    out.scales = constant(scales, std::sqrt(3.0f / static_cast<float>(fan_in)) / 448.0f);
    ++fp8_linear_matrices;
    fp8_linear_parameters += rows * cols;
    return out;
  }
  // An MLP `inter` wide (a shard of one `whole_inter` wide).
  MlpDevice mlp(int64_t inter, int64_t hidden, int64_t whole_inter, bool fp8) {
    MlpDevice m;
    m.inter = inter;
    m.gate_up = linear(2 * inter, hidden, hidden, fp8);
    m.down = linear(hidden, inter, whole_inter, fp8);
    return m;
  }
  int linear_matrices = 0, fp8_linear_matrices = 0;
  int64_t fp8_linear_parameters = 0;

 private:
  uint64_t next() { return seed_ * 1000003ull + counter_++; }
  uint64_t seed_;
  uint64_t counter_ = 0;
  int64_t& bytes_;
};

// What decoder layer l's weights are called when they do not fit, with the weight bytes
// already on the device.
std::string decoder_layer_weights(int l, int layers, int64_t bytes_before) {
  char before[64];
  std::snprintf(before, sizeof before, "%.2f GiB", static_cast<double>(bytes_before) / (1 << 30));
  return "the weights of decoder layer " + std::to_string(l) + " of " + std::to_string(layers) + " (" + before +
         " of weights on the GPU before it)";
}

}  // namespace

CudaWeights upload_weights(const ModelWeights& weights, const UploadProgress& progress, CudaLinearWeights linears) {
  const io::ModelConfig& c = weights.config;
  check_cuda_supported(c);
  CudaWeights out;
  Uploader up(out.bytes);
  out.embed_tokens = up.bf16(weights.embed_tokens);
  out.final_norm = up.f32(weights.final_norm);
  out.lm_head = up.bf16(weights.lm_head);
  const int layers = static_cast<int>(weights.layers.size());
  for (int l = 0; l < layers; ++l) {
    out.layers.push_back(naming_what_did_not_fit(decoder_layer_weights(l, layers, out.bytes), [&] {
      return upload_layer(up, weights.layers[l], c, linears);
    }));
    if (progress) progress(l + 1, layers, out.bytes);
  }
  for (const MtpWeights& m : weights.mtp) {
    MtpDevice d;
    d.enorm = up.f32(m.enorm);
    d.hnorm = up.f32(m.hnorm);
    d.eh_proj_embed = up.bf16_columns(m.eh_proj, 0, c.hidden_size);
    d.eh_proj_hidden = up.bf16_columns(m.eh_proj, c.hidden_size, c.hidden_size);
    d.block = upload_layer(up, m.block, c, linears);
    d.shared_head_norm = up.f32(m.shared_head_norm);
    if (m.shared_head.data != weights.lm_head.data) d.shared_head = up.bf16(m.shared_head);
    if (m.embed_tokens.data != weights.embed_tokens.data) d.embed_tokens = up.bf16(m.embed_tokens);
    out.mtp.push_back(std::move(d));
  }
  out.linear_matrices = up.linear_matrices;
  out.fp8_linear_matrices = up.fp8_linear_matrices;
  out.fp8_linear_parameters = up.fp8_linear_parameters;
  return out;
}

namespace {

// One decoder layer of seeded random weights (see RandomMaker), in `shard`'s shapes; fan-ins are
// the whole matrices' (the peers' partial sums add up to the whole model's scale).
DecoderLayerDevice synthetic_layer(RandomMaker& make, const io::ModelConfig& c, const ModelShard& shard,
                                   bool has_indexer, bool is_moe, ops::WeightFormat experts_format, bool fp8) {
  const int64_t hidden = c.hidden_size, H = shard.heads(c), L = c.kv_lora_rank, rd = c.qk_rope_head_dim;
  const int64_t q_lora = c.q_lora_rank, E = shard.experts(c), inter = shard.expert_width(c);
  const int64_t o_fan_in = int64_t{c.num_attention_heads} * c.v_head_dim;
  DecoderLayerDevice d;
  d.input_norm = make.constant(hidden, 1.0f);
  d.post_attention_norm = make.constant(hidden, 1.0f);
  AttentionDevice& a = d.attention;
  a.heads = static_cast<int>(H);
  a.q_a_proj = make.linear(q_lora, hidden, hidden, fp8);
  a.q_a_norm = make.constant(q_lora, 1.0f);
  a.q_b_proj = make.linear(H * c.qk_head_dim(), q_lora, q_lora, fp8);
  a.kv_a_proj = make.linear(L + rd, hidden, hidden, fp8);
  a.kv_a_norm = make.constant(L, 1.0f);
  a.kv_b_proj = make.matrix(H * (c.qk_nope_head_dim + c.v_head_dim) * L, L);
  a.o_proj = make.linear(hidden, H * c.v_head_dim, o_fan_in, fp8);
  a.has_indexer = has_indexer;
  if (a.has_indexer) {
    a.indexer.wq_b = make.matrix(int64_t{c.index_n_heads} * c.index_head_dim * q_lora, q_lora);
    a.indexer.wk = make.matrix(int64_t{c.index_head_dim} * hidden, hidden);
    a.indexer.weights_proj = make.matrix(int64_t{c.index_n_heads} * hidden, hidden);
    a.indexer.k_norm_weight = make.constant(c.index_head_dim, 1.0f);
    a.indexer.k_norm_bias = make.constant(c.index_head_dim, 0.0f);
  }
  d.is_moe = is_moe;
  if (d.is_moe) {
    // The router in bf16, as checkpoints keep it, and widened to fp32.
    d.moe.router_bf16 = make.matrix(int64_t{c.n_routed_experts} * hidden, hidden);
    d.moe.router = make.widened(d.moe.router_bf16, int64_t{c.n_routed_experts} * hidden);
    d.moe.correction_bias = make.uniform_f32(c.n_routed_experts, 0.01f);
    d.moe.first_expert = shard.first_expert(c);
    d.moe.num_experts = static_cast<int>(E);
    d.moe.expert_inter = inter;
    d.moe.experts_format = experts_format;
    // Random codes read the same in either layout; the one scale is near 2^-8 (RandomMaker::experts).
    d.moe.experts_mxfp4_tiled = experts_format == ops::WeightFormat::Mxfp4 && quant::mxfp4_tiles_fit(hidden) &&
                                quant::mxfp4_tiles_fit(inter);
    make.experts(experts_format, E, 2 * inter, hidden, hidden, d.moe.experts_gate_up, d.moe.experts_gate_up_scales);
    make.experts(experts_format, E, hidden, inter, c.moe_intermediate_size, d.moe.experts_down,
                 d.moe.experts_down_scales);
    const int64_t shared = int64_t{c.moe_intermediate_size} * c.n_shared_experts;
    d.moe.shared = make.mlp(shard.mlp_width(shared), hidden, shared, fp8);
  } else {
    d.mlp = make.mlp(shard.mlp_width(c.intermediate_size), hidden, c.intermediate_size, fp8);
  }
  return d;
}

}  // namespace

CudaWeights synthetic_weights(const io::ModelConfig& c, uint64_t seed, ops::WeightFormat experts_format,
                              bool with_mtp, const ModelShard& shard, bool fp8_linears) {
  check_shard(c, shard);
  const int64_t width = shard.expert_width(c);  // each expert's rows on this rank
  if (experts_format == ops::WeightFormat::Mxfp4 && (c.hidden_size % 32 != 0 || width % 32 != 0))
    fail("MXFP4 experts need hidden_size and each rank's expert width (" + std::to_string(width) +
         ") multiples of 32");
  if (experts_format == ops::WeightFormat::Fp8Block && (c.hidden_size % 16 != 0 || width % 16 != 0))
    fail("FP8 experts need hidden_size and each rank's expert width (" + std::to_string(width) + ") multiples of 16");
  check_cuda_supported(c);
  CudaWeights out;
  RandomMaker make(seed, out.bytes);
  const int64_t hidden = c.hidden_size;
  // Embedding rows of unit scale (fan-in 3 gives half-width 1): the first norm rescales anyway.
  out.embed_tokens = make.matrix(int64_t{c.vocab_size} * hidden, 3);
  out.final_norm = make.constant(hidden, 1.0f);
  out.lm_head = make.matrix(int64_t{c.vocab_size} * hidden, hidden);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    out.layers.push_back(naming_what_did_not_fit(decoder_layer_weights(l, c.num_hidden_layers, out.bytes), [&] {
      return synthetic_layer(make, c, shard, c.indexer_full[l], c.layer_is_moe[l], experts_format, fp8_linears);
    }));
  if (with_mtp) {
    // GLM-5's MTP layer: a full MoE block with its own indexer, its own shared head.
    MtpDevice m;
    m.enorm = make.constant(hidden, 1.0f);
    m.hnorm = make.constant(hidden, 1.0f);
    m.eh_proj_embed = make.matrix(hidden * hidden, 2 * hidden);
    m.eh_proj_hidden = make.matrix(hidden * hidden, 2 * hidden);
    m.block = synthetic_layer(make, c, shard, true, c.n_routed_experts > 0, experts_format, fp8_linears);
    m.shared_head_norm = make.constant(hidden, 1.0f);
    m.shared_head = make.matrix(int64_t{c.vocab_size} * hidden, hidden);
    out.mtp.push_back(std::move(m));
  }
  cuda::synchronize_device();  // the fills ran on the legacy stream; the model runs on its own
  out.linear_matrices = make.linear_matrices;
  out.fp8_linear_matrices = make.fp8_linear_matrices;
  out.fp8_linear_parameters = make.fp8_linear_parameters;
  return out;
}

}  // namespace glms::model
