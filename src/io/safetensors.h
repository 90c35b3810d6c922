// Safetensors checkpoints: one file (mmap'd, zero-copy) or a sharded folder
// (model.safetensors.index.json). Every malformed input gives a glms::Error that names the file
// and the problem; nothing in a file can make the reader crash or read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace glms::io {

// One tensor inside a mapped file. `data` stays valid while the owning file/checkpoint lives.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  const std::filesystem::path* file = nullptr;  // the file it lives in (for error messages)

  int64_t numel() const;
  std::string shape_string() const;  // "[64, 32]"
};

// A single .safetensors file, memory-mapped read-only.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  // Parses a header + data held in memory (used by the fuzzer and tests); `bytes` must outlive
  // the returned object. `label` names the source in error messages.
  static std::unique_ptr<SafetensorsFile> from_memory(const std::byte* bytes, size_t size,
                                                      const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse(const std::byte* bytes, size_t size);

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a folder with model.safetensors, or model.safetensors.index.json + shards, or
// any *.safetensors files in the folder; or a single .safetensors file path.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& path);

  bool contains(const std::string& name) const;
  // Throws an Error naming the tensor and the checkpoint folder when absent.
  const TensorInfo& get(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::filesystem::path& path() const { return path_; }
  size_t total_bytes() const;

 private:
  std::filesystem::path path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// A tensor to write: bytes are copied as given (little-endian, row-major).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// Streams a .safetensors file: the header is written from the declared tensors, then each
// tensor's bytes in declared order, so a checkpoint of any size is written with one tensor in
// memory at a time. The file appears (renamed from PATH.tmp) only when finish() succeeds.
class SafetensorsWriter {
 public:
  struct TensorSpec {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the partial file unless finish() succeeded
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor's bytes (exactly its size).
  void write(const void* data, size_t bytes);
  void finish();

 private:
  std::filesystem::path path_, tmp_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> sizes_;
  std::ofstream out_;
  size_t next_ = 0;
  bool finished_ = false;
};

// Writes a .safetensors file (header padded to 8 bytes, tensors in the given order).
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Helpers for writing fp32 / int64 data.
TensorToWrite tensor_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
TensorToWrite tensor_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
TensorToWrite tensor_i64(const std::string& name, std::vector<int64_t> shape, const std::vector<int64_t>& values);

// Reads a whole tensor as fp32 (floating dtypes) / int64 (integer dtypes); throws on mismatch.
std::vector<float> read_f32(const TensorInfo& tensor);
std::vector<int64_t> read_i64(const TensorInfo& tensor);

}  // namespace glms::io
