#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"

namespace glms::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

// Levenshtein distance, or limit + 1 once it is certain to exceed `limit`.
size_t bounded_edit_distance(const std::string& a, const std::string& b, size_t limit) {
  const size_t diff = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  if (diff > limit) return limit + 1;
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    size_t row_min = cur[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      row_min = std::min(row_min, cur[j]);
    }
    if (row_min > limit) return limit + 1;
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string() + ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Shard names come from a file: keep them inside the checkpoint folder.
fs::path shard_path(const fs::path& dir, const std::string& shard, const fs::path& index) {
  const fs::path rel(shard);
  if (shard.empty() || rel.is_absolute() ||
      std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; }))
    fail(index.string() + ": shard name '" + shard + "' must be a file name inside " + dir.string());
  return dir / rel;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) fail("checkpoint " + path.string() + ": no such file or directory");

  Checkpoint ckpt;
  ckpt.path_ = path;
  std::vector<fs::path> shard_files;
  // tensor name -> shard file name, when an index says where each tensor lives.
  std::map<std::string, std::string> weight_map;
  fs::path index_path;

  if (fs::is_regular_file(status) && path.filename() == kIndexName) {
    index_path = path;
    ckpt.path_ = path.parent_path();
  } else if (fs::is_regular_file(status)) {
    shard_files.push_back(path);
  } else if (fs::is_directory(status)) {
    if (fs::exists(path / kIndexName, ec)) {
      index_path = path / kIndexName;
    } else if (fs::exists(path / "model.safetensors", ec)) {
      shard_files.push_back(path / "model.safetensors");
    } else {
      for (const auto& entry : fs::directory_iterator(path, ec))
        if (entry.path().extension() == ".safetensors" && !entry.is_directory())
          shard_files.push_back(entry.path());
      if (ec) fail("checkpoint " + path.string() + ": cannot list folder: " + ec.message());
      std::sort(shard_files.begin(), shard_files.end());
      if (shard_files.empty())
        fail("checkpoint " + path.string() + ": no " + kIndexName +
             ", model.safetensors or *.safetensors files in this folder");
    }
  } else {
    fail("checkpoint " + path.string() + ": not a file or folder");
  }

  if (!index_path.empty()) {
    const std::string where = index_path.string();
    json index = json::parse(read_text(index_path), nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded()) fail(where + ": not valid JSON");
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(where + ": expected an object with a 'weight_map' object (tensor name -> shard file)");
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string())
        fail(where + ": weight_map['" + name + "'] must be a shard file name (string)");
      weight_map[name] = shard.get<std::string>();
      shards.insert(shard.get<std::string>());
    }
    if (weight_map.empty()) fail(where + ": the weight_map lists no tensors");
    const fs::path dir = index_path.parent_path();
    for (const auto& shard : shards) {
      const fs::path file = shard_path(dir, shard, index_path);
      std::error_code missing;  // a name the file system refuses (too long, ...) is missing too
      if (!fs::exists(file, missing)) {
        size_t count = 0;
        std::string example;
        for (const auto& [name, s] : weight_map)
          if (s == shard && count++ == 0) example = name;
        fail(where + ": shard '" + shard + "' is missing (" + file.string() + " does not exist; " +
             std::to_string(count) + " tensors map to it, e.g. '" + example + "')");
      }
      shard_files.push_back(file);
    }
  }

  std::map<fs::path, const SafetensorsFile*> by_path;
  for (const auto& file : shard_files) {
    ckpt.files_.push_back(SafetensorsFile::open(file));
    const SafetensorsFile& shard = *ckpt.files_.back();
    by_path[file] = &shard;
    for (const auto& tensor : shard.tensors()) {
      auto [it, inserted] = ckpt.tensors_.emplace(tensor.name, &tensor);
      if (!inserted)
        fail("checkpoint " + ckpt.path_.string() + ": tensor '" + tensor.name + "' is in both " +
             it->second->file->string() + " and " + file.string());
    }
  }

  for (const auto& [name, shard] : weight_map) {
    const fs::path file = shard_path(index_path.parent_path(), shard, index_path);
    if (!by_path.at(file)->find(name))
      fail(index_path.string() + ": tensor '" + name + "' is mapped to shard '" + shard +
           "' but " + file.string() + " does not contain it");
  }
  return ckpt;
}

bool Checkpoint::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  if (const TensorInfo* t = find(name)) return *t;
  std::string message = "tensor '" + name + "' not found in checkpoint " + path_.string() + " (" +
                        std::to_string(tensors_.size()) + " tensors";
  const size_t limit = std::max<size_t>(2, name.size() / 8);
  size_t best_distance = limit + 1;
  std::string best;
  for (const auto& [candidate, info] : tensors_) {
    const size_t d = bounded_edit_distance(name, candidate, std::min(limit, best_distance));
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (!best.empty()) message += "; did you mean '" + best + "'?";
  fail(message + ")");
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, info] : tensors_) total += info->nbytes;
  return total;
}

}  // namespace glms::io
