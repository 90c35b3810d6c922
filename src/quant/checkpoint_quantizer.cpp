#include "quant/checkpoint_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "quant/formats.h"

namespace glms::quant {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative '*' / '?' matching with backtracking to the last star.
  size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> default_excludes(const fs::path& model_dir) {
  const io::ModelConfig config = io::load_model_config(model_dir);
  return {"*embed_tokens*", "lm_head*", "*.mlp.gate.weight", "*indexer.weights_proj*",
          "model.layers." + std::to_string(config.num_hidden_layers) + ".*"};
}

namespace {

bool quantisable(const io::TensorInfo& t, const std::vector<std::string>& exclude, const std::string& format) {
  if (t.shape.size() != 2 || t.name.size() < 7 || t.name.compare(t.name.size() - 7, 7, ".weight") != 0) return false;
  if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32) return false;
  if (format != "fp8" && t.shape[1] % kMxBlock != 0) return false;
  return std::none_of(exclude.begin(), exclude.end(), [&](const std::string& p) { return glob_match(p, t.name); });
}

json quantization_config(const std::string& format, const std::vector<std::string>& exclude) {
  if (format == "fp8")
    return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
            {"weight_block_size", {kFp8Block, kFp8Block}}, {"ignored_layers", exclude}};
  const char* dtype = format == "mxfp4" ? "fp4" : format == "mxfp6" ? "fp6_e2m3" : "fp6_e3m2";
  return {{"quant_method", "quark"},
          {"global_quant_config", {{"weight", {{"dtype", dtype}, {"qscheme", "per_group"}, {"group_size", kMxBlock},
                                               {"scale_format", "e8m0"}}}}},
          {"exclude", exclude}};
}

bool is_mxfp6(const std::string& format) { return format == "mxfp6" || format == "mxfp6_e3m2"; }

// The output files: tensors in order, cut into shards of at most `max_bytes` between groups
// (a source tensor with its scales is one group); write() streams each declared tensor's
// bytes into its shard, opening and finishing shard files as it goes.
class ShardedOutput {
 public:
  using Spec = io::SafetensorsWriter::TensorSpec;
  ShardedOutput(const fs::path& dir, const std::vector<std::vector<Spec>>& groups, uint64_t max_bytes) : dir_(dir) {
    uint64_t shard_bytes = 0;
    for (const auto& group : groups) {
      uint64_t bytes = 0;
      for (const Spec& spec : group) bytes += bytes_of(spec);
      if (shards_.empty() || (shard_bytes > 0 && shard_bytes + bytes > max_bytes)) {
        shards_.emplace_back();
        shard_bytes = 0;
      }
      shards_.back().insert(shards_.back().end(), group.begin(), group.end());
      shard_bytes += bytes;
      total_bytes_ += bytes;
    }
  }

  int num_shards() const { return static_cast<int>(shards_.size()); }

  void write(const void* data, size_t bytes) {
    if (!writer_ || written_in_shard_ == shards_[shard_].size()) open_next();
    writer_->write(data, bytes);
    ++written_in_shard_;
  }

  // Finishes the last shard and writes the index when there are several.
  void finish() {
    if (writer_) writer_->finish();
    if (shards_.size() <= 1) return;
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards_.size(); ++i)
      for (const Spec& spec : shards_[i]) weight_map[spec.name] = file_name(i);
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map}};
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(2) << "\n";
  }

 private:
  static uint64_t bytes_of(const Spec& spec) {
    uint64_t n = dtype_size(spec.dtype);
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    return n;
  }
  std::string file_name(size_t shard) const {
    if (shards_.size() == 1) return "model.safetensors";
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", shard + 1, shards_.size());
    return name;
  }
  void open_next() {
    if (writer_) {
      writer_->finish();
      ++shard_;
    }
    GLMS_CHECK(shard_ < shards_.size(), "more tensors written than declared");
    writer_ = std::make_unique<io::SafetensorsWriter>(dir_ / file_name(shard_), shards_[shard_],
                                                      std::map<std::string, std::string>{{"format", "pt"}, {"quantized_by", "glmserve"}});
    written_in_shard_ = 0;
  }

  fs::path dir_;
  std::vector<std::vector<Spec>> shards_;
  uint64_t total_bytes_ = 0;
  size_t shard_ = 0, written_in_shard_ = 0;
  std::unique_ptr<io::SafetensorsWriter> writer_;
};

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& options,
                                   const std::function<void(size_t, size_t, const std::string&)>& progress) {
  if (options.format != "mxfp4" && options.format != "fp8" && !is_mxfp6(options.format))
    fail("unknown quantisation format '" + options.format + "' (mxfp4, mxfp6, mxfp6_e3m2 or fp8)");
  if (fs::exists(out) && !fs::is_empty(out)) fail("output folder " + out.string() + " exists and is not empty");
  QuantizeReport report;
  report.exclude = options.default_excludes ? default_excludes(in) : std::vector<std::string>{};
  report.exclude.insert(report.exclude.end(), options.exclude.begin(), options.exclude.end());

  const io::Checkpoint checkpoint = io::Checkpoint::open(in);
  const std::vector<std::string> names = checkpoint.names();
  std::vector<std::vector<io::SafetensorsWriter::TensorSpec>> groups;  // per source tensor
  for (const std::string& name : names) {
    const io::TensorInfo& t = checkpoint.get(name);
    report.bytes_in += t.nbytes;
    auto& specs = groups.emplace_back();
    if (!quantisable(t, report.exclude, options.format)) {
      specs.push_back({name, t.dtype, t.shape});
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    if (options.format == "fp8") {
      specs.push_back({name, DType::F8_E4M3, {rows, cols}});
      specs.push_back({name + "_scale_inv", DType::F32, {(rows + kFp8Block - 1) / kFp8Block, (cols + kFp8Block - 1) / kFp8Block}});
    } else {
      specs.push_back({name, DType::U8, {rows, is_mxfp6(options.format) ? cols / 4 * 3 : cols / 2}});
      specs.push_back({name + "_scale", DType::U8, {rows, cols / kMxBlock}});
    }
  }

  if (options.max_shard_bytes == 0) fail("max_shard_bytes must be positive");
  fs::create_directories(out);
  // The folder was empty or absent: a failure part-way removes it, so that a rerun can start afresh.
  struct RemoveUnlessDone {
    const fs::path& dir;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ignored;
      if (!done) fs::remove_all(dir, ignored);
    }
  } cleanup{out};
  ShardedOutput writer(out, groups, options.max_shard_bytes);
  report.shards = writer.num_shards();
  for (size_t i = 0; i < names.size(); ++i) {
    const io::TensorInfo& t = checkpoint.get(names[i]);
    if (!quantisable(t, report.exclude, options.format)) {
      writer.write(t.data, t.nbytes);
      report.bytes_out += t.nbytes;
      ++report.kept;
    } else {
      const std::vector<float> values = io::read_f32(t);
      const int64_t rows = t.shape[0], cols = t.shape[1];
      if (options.format == "fp8") {
        std::vector<uint8_t> codes(values.size());
        std::vector<float> scale_inv(((rows + kFp8Block - 1) / kFp8Block) * ((cols + kFp8Block - 1) / kFp8Block));
        quantize_fp8_block(values.data(), rows, cols, codes.data(), scale_inv.data());
        writer.write(codes.data(), codes.size());
        writer.write(scale_inv.data(), scale_inv.size() * sizeof(float));
        report.bytes_out += codes.size() + scale_inv.size() * sizeof(float);
      } else if (is_mxfp6(options.format)) {
        const MiniFloat element = options.format == "mxfp6" ? MiniFloat::E2M3 : MiniFloat::E3M2;
        std::vector<uint8_t> codes(values.size()), packed(values.size() / 4 * 3), scales(values.size() / kMxBlock);
        quantize_mxfp6(element, values.data(), values.size(), codes.data(), scales.data());
        pack_mxfp6(codes.data(), codes.size(), packed.data());
        writer.write(packed.data(), packed.size());
        writer.write(scales.data(), scales.size());
        report.bytes_out += packed.size() + scales.size();
      } else {
        std::vector<uint8_t> packed(values.size() / 2), scales(values.size() / kMxBlock);
        for (int64_t r = 0; r < rows; ++r)
          quantize_mxfp4(values.data() + r * cols, cols, packed.data() + r * cols / 2, scales.data() + r * cols / kMxBlock);
        writer.write(packed.data(), packed.size());
        writer.write(scales.data(), scales.size());
        report.bytes_out += packed.size() + scales.size();
      }
      ++report.quantized;
    }
    if (progress) progress(i + 1, names.size(), names[i]);
  }
  writer.finish();

  std::ifstream config_in(in / "config.json");
  json config = json::parse(config_in);
  config["quantization_config"] = quantization_config(options.format, report.exclude);
  std::ofstream(out / "config.json") << config.dump(2) << "\n";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
    if (fs::exists(in / file)) fs::copy_file(in / file, out / file, fs::copy_options::overwrite_existing);
  cleanup.done = true;
  return report;
}

void QualityStats::add(const float* ref_logits, const float* quant_logits, int64_t rows, int vocab,
                       const int32_t* next_tokens) {
  std::vector<double> p(vocab), q(vocab);
  auto log_softmax = [vocab](const float* logits, std::vector<double>& out) {
    const double max_logit = *std::max_element(logits, logits + vocab);
    double total = 0.0;
    for (int i = 0; i < vocab; ++i) total += std::exp(logits[i] - max_logit);
    const double log_total = std::log(total) + max_logit;
    for (int i = 0; i < vocab; ++i) out[i] = logits[i] - log_total;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref_logits + r * vocab;
    const float* b = quant_logits + r * vocab;
    log_softmax(a, p);
    log_softmax(b, q);
    double kl = 0.0;
    for (int i = 0; i < vocab; ++i) kl += std::exp(p[i]) * (p[i] - q[i]);
    kl_sum += kl;
    top1_agree += (std::max_element(a, a + vocab) - a) == (std::max_element(b, b + vocab) - b) ? 1.0 : 0.0;
    nll_ref -= p[next_tokens[r]];
    nll_quant -= q[next_tokens[r]];
    ++positions;
  }
}

double QualityStats::perplexity_ref() const { return positions ? std::exp(nll_ref / positions) : 0.0; }
double QualityStats::perplexity_quant() const { return positions ? std::exp(nll_quant / positions) : 0.0; }

}  // namespace glms::quant
