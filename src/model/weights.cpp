#include "model/weights.h"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "core/error.h"

namespace glms::model {

namespace {

class WeightLoader {
 public:
  // mx_weight_dtype: the config's MX element ("fp4", "fp6_e2m3", "fp6_e3m2").
  WeightLoader(const io::Checkpoint& checkpoint, std::string mx_weight_dtype, int64_t* parameter_count)
      : checkpoint_(checkpoint), mx_weight_dtype_(std::move(mx_weight_dtype)), parameter_count_(parameter_count) {}

  bool has(const std::string& name) const { return checkpoint_.contains(name); }

  const io::TensorInfo& tensor(const std::string& name, std::initializer_list<int64_t> shape) const {
    const io::TensorInfo& info = checkpoint_.get(name);
    const std::vector<int64_t> expected(shape);
    if (info.shape != expected) {
      std::string want = "[";
      for (size_t i = 0; i < expected.size(); ++i) want += (i ? ", " : "") + std::to_string(expected[i]);
      want += "]";
      fail(fmt::format("tensor '{}' in {} has shape {}, but config.json implies {}", name,
                       checkpoint_.path().string(), info.shape_string(), want));
    }
    return info;
  }

  // A weight matrix [rows, cols]: plain (BF16, F16, F32, F8_E4M3 per-tensor), block-scaled FP8
  // (`NAME_scale_inv` F32 [ceil(rows/128), ceil(cols/128)], DeepSeek-V3 / GLM-5-FP8 layout), or
  // MX as AMD Quark exports it (U8 + `NAME_scale` U8 E8M0 [rows, cols/32]): MXFP4 [rows, cols/2],
  // MXFP6 [rows, cols*3/4] with the element the config names.
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const io::TensorInfo& stored = checkpoint_.get(name);
    if (stored.dtype == DType::U8 && has(name + "_scale")) {
      const bool fp6 = mx_weight_dtype_ != "fp4";
      if (cols % 32 != 0)
        fail(fmt::format("tensor '{}' in {} is {} but its {} inputs are not a multiple of 32", name,
                         checkpoint_.path().string(), fp6 ? "MXFP6" : "MXFP4", cols));
      const int64_t row_bytes = fp6 ? cols / 4 * 3 : cols / 2;
      const io::TensorInfo& packed = tensor(name, {rows, row_bytes});
      const io::TensorInfo& scales = tensor(name + "_scale", {rows, cols / 32});
      if (scales.dtype != DType::U8)
        fail(fmt::format("tensor '{}_scale' in {} must be U8 (E8M0), not {}", name, checkpoint_.path().string(),
                         dtype_name(scales.dtype)));
      const ops::WeightFormat format = !fp6 ? ops::WeightFormat::Mxfp4
                                       : mx_weight_dtype_ == "fp6_e2m3" ? ops::WeightFormat::Mxfp6E2M3
                                                                         : ops::WeightFormat::Mxfp6E3M2;
      return WeightView{DType::U8, packed.data, rows, cols, row_bytes, format, scales.data, 0};
    }
    const io::TensorInfo& info = tensor(name, {rows, cols});
    switch (info.dtype) {
      case DType::BF16: case DType::F16: case DType::F32: case DType::F8_E4M3: break;
      default:
        fail(fmt::format("tensor '{}' in {} has dtype {}, which glmserve cannot use as a weight matrix", name,
                         checkpoint_.path().string(), dtype_name(info.dtype)));
    }
    if (info.dtype == DType::F8_E4M3 && has(name + "_scale_inv")) {
      const int64_t block_rows = (rows + 127) / 128, block_cols = (cols + 127) / 128;
      const io::TensorInfo& scales = tensor(name + "_scale_inv", {block_rows, block_cols});
      if (scales.dtype != DType::F32)
        fail(fmt::format("tensor '{}_scale_inv' in {} must be F32, not {}", name, checkpoint_.path().string(),
                         dtype_name(scales.dtype)));
      return WeightView{info.dtype, info.data, rows, cols, cols, ops::WeightFormat::Fp8Block, scales.data, 0};
    }
    return WeightView{info.dtype, info.data, rows, cols, cols};
  }

  // Rows [first, first + count) of the matrix `name` [rows, cols] (a tensor-parallel shard's).
  WeightView rows_of(const std::string& name, int64_t rows, int64_t cols, int64_t first, int64_t count) const {
    return counted(matrix(name, rows, cols).slice_rows(first, count));
  }
  // Columns [first, first + count) of it.
  WeightView columns_of(const std::string& name, int64_t rows, int64_t cols, int64_t first, int64_t count) const {
    return counted(matrix(name, rows, cols).slice_columns(first, count));
  }
  WeightView whole(const std::string& name, int64_t rows, int64_t cols) const {
    return counted(matrix(name, rows, cols));
  }

  std::vector<float> vector(const std::string& name, int64_t size) const {
    *parameter_count_ += size;
    return io::read_f32(tensor(name, {size}));
  }

 private:
  WeightView counted(WeightView view) const {
    *parameter_count_ += view.rows * view.cols;  // values this rank holds, not stored bytes
    return view;
  }

  const io::Checkpoint& checkpoint_;
  std::string mx_weight_dtype_;
  int64_t* parameter_count_;
};

// An MLP whose intermediate rows [first, first + width) of `inter` this rank holds: gate and up
// rows, down columns.
MlpWeights load_mlp(const WeightLoader& loader, const std::string& prefix, int64_t hidden, int64_t inter,
                    int64_t first, int64_t width) {
  MlpWeights mlp;
  mlp.gate_proj = loader.rows_of(prefix + "gate_proj.weight", inter, hidden, first, width);
  mlp.up_proj = loader.rows_of(prefix + "up_proj.weight", inter, hidden, first, width);
  mlp.down_proj = loader.columns_of(prefix + "down_proj.weight", hidden, inter, first, width);
  return mlp;
}

DecoderLayerWeights load_decoder_layer(const WeightLoader& loader, const io::ModelConfig& c, const ModelShard& shard,
                                       int index, bool indexer_full, bool is_moe) {
  const std::string p = fmt::format("model.layers.{}.", index);
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;
  DecoderLayerWeights layer;
  layer.input_norm = loader.vector(p + "input_layernorm.weight", hidden);
  layer.post_attention_norm = loader.vector(p + "post_attention_layernorm.weight", hidden);

  AttentionWeights& a = layer.attention;
  const std::string ap = p + "self_attn.";
  if (c.q_lora_rank <= 0)
    fail("config.json has q_lora_rank null: glm_moe_dsa needs the q_a/q_b projections (the indexer reads q_a)");
  // This rank's heads: their rows of q_b and kv_b, their columns of o_proj.
  const int64_t local_heads = shard.heads(c), first_head = shard.first_head(c);
  const int64_t kv_b_head = c.qk_nope_head_dim + c.v_head_dim;
  a.heads = static_cast<int>(local_heads);
  a.q_a_proj = loader.whole(ap + "q_a_proj.weight", c.q_lora_rank, hidden);
  a.q_a_norm = loader.vector(ap + "q_a_layernorm.weight", c.q_lora_rank);
  a.q_b_proj = loader.rows_of(ap + "q_b_proj.weight", heads * c.qk_head_dim(), c.q_lora_rank,
                              first_head * c.qk_head_dim(), local_heads * c.qk_head_dim());
  a.kv_a_proj = loader.whole(ap + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, hidden);
  a.kv_a_norm = loader.vector(ap + "kv_a_layernorm.weight", c.kv_lora_rank);
  a.kv_b_proj = loader.rows_of(ap + "kv_b_proj.weight", heads * kv_b_head, c.kv_lora_rank, first_head * kv_b_head,
                               local_heads * kv_b_head);
  a.o_proj = loader.columns_of(ap + "o_proj.weight", hidden, heads * c.v_head_dim, first_head * c.v_head_dim,
                               local_heads * c.v_head_dim);
  if (c.attention_bias) fail("attention_bias = true is not supported (no GLM-5 checkpoint uses it)");
  a.has_indexer = indexer_full;
  if (indexer_full) {
    const std::string ip = ap + "indexer.";
    a.indexer.wq_b = loader.whole(ip + "wq_b.weight", int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank);
    a.indexer.wk = loader.whole(ip + "wk.weight", c.index_head_dim, hidden);
    a.indexer.weights_proj = loader.whole(ip + "weights_proj.weight", c.index_n_heads, hidden);
    a.indexer.k_norm_weight = loader.vector(ip + "k_norm.weight", c.index_head_dim);
    a.indexer.k_norm_bias = loader.vector(ip + "k_norm.bias", c.index_head_dim);
  }

  layer.is_moe = is_moe;
  const std::string mp = p + "mlp.";
  if (!is_moe) {
    const int64_t inter = c.intermediate_size;
    layer.mlp = load_mlp(loader, mp, hidden, inter, shard.mlp_first(inter), shard.mlp_width(inter));
    return layer;
  }
  MoeWeights& moe = layer.moe;
  moe.router = loader.whole(mp + "gate.weight", c.n_routed_experts, hidden);
  moe.correction_bias = loader.vector(mp + "gate.e_score_correction_bias", c.n_routed_experts);
  moe.first_expert = shard.first_expert(c);
  const int local_experts = shard.experts(c);
  moe.experts.reserve(local_experts);
  for (int e = moe.first_expert; e < moe.first_expert + local_experts; ++e)
    moe.experts.push_back(load_mlp(loader, fmt::format("{}experts.{}.", mp, e), hidden, c.moe_intermediate_size,
                                   shard.expert_first(c), shard.expert_width(c)));
  const int64_t shared = int64_t{c.moe_intermediate_size} * c.n_shared_experts;
  moe.shared_expert = load_mlp(loader, mp + "shared_experts.", hidden, shared, shard.mlp_first(shared),
                               shard.mlp_width(shared));
  return layer;
}

}  // namespace

ModelWeights load_weights(const std::string& dir, const LoadOptions& options) {
  ModelWeights weights;
  weights.config = io::load_model_config(dir);
  io::ModelConfig& c = weights.config;
  check_shard(c, options.shard);
  weights.shard = options.shard;
  weights.checkpoint = std::make_shared<io::Checkpoint>(io::Checkpoint::open(dir));
  int64_t parameters = 0;
  WeightLoader loader(*weights.checkpoint, c.mx_weight_dtype, &parameters);

  const int stored_layers = c.num_hidden_layers;
  c.keep_first_layers(options.num_layers);
  weights.embed_tokens = loader.whole("model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  for (int i = 0; i < c.num_hidden_layers; ++i)
    weights.layers.push_back(load_decoder_layer(loader, c, options.shard, i, c.indexer_full[i], c.layer_is_moe[i]));
  weights.final_norm = loader.vector("model.norm.weight", c.hidden_size);
  if (c.tie_word_embeddings && !loader.has("lm_head.weight"))
    weights.lm_head = weights.embed_tokens;
  else
    weights.lm_head = loader.whole("lm_head.weight", c.vocab_size, c.hidden_size);

  for (int m = 0; options.load_mtp && m < c.num_nextn_predict_layers; ++m) {
    const int index = stored_layers + m;
    const std::string p = fmt::format("model.layers.{}.", index);
    if (!loader.has(p + "eh_proj.weight")) break;  // checkpoints may ship without the MTP layer
    MtpWeights mtp;
    mtp.enorm = loader.vector(p + "enorm.weight", c.hidden_size);
    mtp.hnorm = loader.vector(p + "hnorm.weight", c.hidden_size);
    mtp.eh_proj = loader.whole(p + "eh_proj.weight", c.hidden_size, int64_t{2} * c.hidden_size);
    // The MTP block runs its own indexer and MoE, as the layer before it would.
    mtp.block = load_decoder_layer(loader, c, options.shard, index, loader.has(p + "self_attn.indexer.wk.weight"), true);
    mtp.shared_head_norm = loader.vector(p + "shared_head.norm.weight", c.hidden_size);
    mtp.shared_head = loader.has(p + "shared_head.head.weight")
                          ? loader.whole(p + "shared_head.head.weight", c.vocab_size, c.hidden_size)
                          : weights.lm_head;
    mtp.embed_tokens = loader.has(p + "embed_tokens.weight")
                           ? loader.whole(p + "embed_tokens.weight", c.vocab_size, c.hidden_size)
                           : weights.embed_tokens;
    weights.mtp.push_back(std::move(mtp));
  }
  weights.parameters = parameters;
  return weights;
}

}  // namespace glms::model
