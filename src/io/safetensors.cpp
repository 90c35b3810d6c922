#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace glms::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Largest header we accept; real checkpoints stay far below (a 100k-tensor header is ~10 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// JSON nesting deeper than this cannot be a safetensors header.
constexpr int kMaxJsonDepth = 64;

[[noreturn]] void fail_in(const std::string& file, const std::string& problem) {
  fail(file + ": " + problem);
}

// Names and JSON snippets from a corrupt file can be huge; messages keep the first part.
std::string clip(std::string text) {
  constexpr size_t kMax = 120;
  if (text.size() > kMax) {
    text.resize(kMax);
    text.append("...");
  }
  return text;
}

std::string in_quotes(const std::string& text) {
  std::string out(1, '\'');
  out.append(clip(text));
  out.push_back('\'');
  return out;
}
std::string snippet(const json& value) { return clip(value.dump()); }

std::string json_type_name(const json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "float";
  return value.type_name();
}

struct DepthExceeded {};

// Parses the header JSON: an object whose top-level keys must be unique.
json parse_header_json(std::string_view text, const std::string& file) {
  std::string duplicate;
  std::set<std::string> seen;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth) throw DepthExceeded{};
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const DepthExceeded&) {
    fail_in(file, "header JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::exception& e) {
    fail_in(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object())
    fail_in(file, "header must be a JSON object, got " + json_type_name(header));
  if (!duplicate.empty())
    fail_in(file, "duplicate tensor name " + in_quotes(duplicate) + " in header");
  return header;
}

uint64_t read_u64_le(const std::byte* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(p[i]);
  return value;
}

// A JSON value that must be a non-negative integer fitting in int64.
bool as_count(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return *out <= static_cast<uint64_t>(INT64_MAX);
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

struct Range {
  uint64_t begin, end;
  size_t tensor;
};


// The data region after the header: where it starts and its size, for the checks' messages the
// header's length and the file's size.
struct DataRegion {
  const std::byte* data;
  uint64_t size, header_len;
  size_t file_size;
};

// The __metadata__ entry (null, or an object of strings) into `metadata`.
void parse_metadata(const std::string& file, const json& entry, std::map<std::string, std::string>& metadata) {
  if (entry.is_null()) return;
  if (!entry.is_object())
    fail_in(file, "__metadata__ must be an object of strings, got " + json_type_name(entry));
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string())
      fail_in(file, "__metadata__ value for " + in_quotes(key) + " must be a string, got " + json_type_name(value));
    metadata[key] = value.get<std::string>();
  }
}

// Tensor `name`'s header entry checked (dtype, shape, data_offsets inside the region and of the
// shape's bytes): its TensorInfo (data, nbytes) and its byte range in the region.
TensorInfo parse_tensor(const std::string& file, const std::string& name, const json& entry, const DataRegion& region,
                        uint64_t& begin, uint64_t& end) {
  const uint64_t data_size = region.size, header_len = region.header_len;
  const size_t size = region.file_size;
  const std::string where = "tensor " + in_quotes(name);
  if (!entry.is_object())
    fail_in(file, where + ": entry must be an object, got " + json_type_name(entry));

  auto field = [&](const char* key) -> const json& {
    auto it = entry.find(key);
    if (it == entry.end()) fail_in(file, where + ": missing field '" + key + "'");
    return *it;
  };
  const json& dtype_json = field("dtype");
  if (!dtype_json.is_string())
    fail_in(file, where + ": 'dtype' must be a string, got " + json_type_name(dtype_json));
  const std::string dtype_str = dtype_json.get<std::string>();
  const auto dtype = parse_dtype(dtype_str);
  if (!dtype)
    fail_in(file, where + ": unknown dtype " + in_quotes(dtype_str) +
                      " (known: BF16, F16, F32, F64, F8_E4M3, F8_E5M2, U8, I8, I16, I32, I64, BOOL)");

  const json& shape_json = field("shape");
  if (!shape_json.is_array())
    fail_in(file, where + ": 'shape' must be a list of integers, got " + json_type_name(shape_json));
  TensorInfo info;
  info.name = name;
  info.dtype = *dtype;
  uint64_t numel = 1;
  for (size_t i = 0; i < shape_json.size(); ++i) {
    const json& dim = shape_json[i];
    uint64_t d = 0;
    if (!as_count(dim, &d))
      fail_in(file, where + ": shape[" + std::to_string(i) + "] = " + snippet(dim) +
                        " is not a non-negative integer");
    if (__builtin_mul_overflow(numel, d, &numel) || numel > static_cast<uint64_t>(INT64_MAX))
      fail_in(file, where + ": shape " + snippet(shape_json) + " overflows the element count");
    info.shape.push_back(static_cast<int64_t>(d));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(*dtype)), &expected_bytes))
    fail_in(file, where + ": shape " + snippet(shape_json) + " overflows the byte size");

  const json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !as_count(offsets[0], &begin) ||
      !as_count(offsets[1], &end))
    fail_in(file, where + ": 'data_offsets' must be [begin, end] of non-negative integers, got " +
                      snippet(offsets));
  if (begin > end)
    fail_in(file, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                      "] have begin > end");
  if (end > data_size)
    fail_in(file, where + ": data ends at byte " + std::to_string(end) +
                      " of the data region but only " + std::to_string(data_size) +
                      " bytes are present (file truncated? expected at least " +
                      std::to_string(8 + header_len + end) + " bytes, file has " +
                      std::to_string(size) + ")");
  if (end - begin != expected_bytes)
    fail_in(file, where + ": data_offsets span " + std::to_string(end - begin) + " bytes but " +
                      std::string(dtype_name(*dtype)) + " " + snippet(shape_json) + " needs " +
                      std::to_string(expected_bytes));
  info.data = region.data + begin;
  info.nbytes = static_cast<size_t>(expected_bytes);
  return info;
}

// No two tensors' byte ranges overlap.
void check_no_overlaps(const std::string& file, std::vector<Range>& ranges, const std::vector<TensorInfo>& tensors) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      const auto& a = tensors[ranges[i - 1].tensor];
      const auto& b = tensors[ranges[i].tensor];
      fail_in(file, "tensors " + in_quotes(a.name) + " [" + std::to_string(ranges[i - 1].begin) + ", " +
                        std::to_string(ranges[i - 1].end) + ") and " + in_quotes(b.name) + " [" +
                        std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) +
                        ") overlap in the data region");
    }
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) fail_in(name, "no such file");
  if (fs::is_directory(status))
    fail_in(name, "is a directory, expected a .safetensors file (use Checkpoint::open for folders)");
  if (!fs::is_regular_file(status)) fail_in(name, "not a regular file");

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_in(name, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail_in(name, std::string("cannot stat: ") + std::strerror(err));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    fail_in(name, "file is empty (0 bytes), not a safetensors file");
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) fail_in(name, std::string("mmap failed: ") + std::strerror(map_errno));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  file->parse(static_cast<const std::byte*>(mapping), size);
  return file;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const std::byte* bytes, size_t size,
                                                              const std::string& label) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = label;
  file->parse(bytes, size);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapping_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(const std::byte* bytes, size_t size) {
  const std::string file = path_.string();
  if (size == 0) fail_in(file, "file is empty (0 bytes), not a safetensors file");
  if (size < 8)
    fail_in(file, "file is " + std::to_string(size) +
                      " bytes, shorter than the 8-byte header length; not a safetensors file");
  const uint64_t header_len = read_u64_le(bytes);
  if (header_len > kMaxHeaderBytes)
    fail_in(file, "header length " + std::to_string(header_len) + " bytes is absurd (limit " +
                      std::to_string(kMaxHeaderBytes) + "); not a safetensors file or corrupt");
  if (header_len > size - 8)
    fail_in(file, "header length " + std::to_string(header_len) + " exceeds the " +
                      std::to_string(size - 8) + " bytes after the length field (file truncated?)");
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), header_len);
  const json header = parse_header_json(text, file);

  const DataRegion region{bytes + 8 + header_len, size - 8 - header_len, header_len, size};
  std::vector<Range> ranges;
  for (auto item = header.begin(); item != header.end(); ++item) {
    const std::string& name = item.key();
    if (name == "__metadata__") {
      parse_metadata(file, item.value(), metadata_);
      continue;
    }
    uint64_t begin = 0, end = 0;
    TensorInfo info = parse_tensor(file, name, item.value(), region, begin, end);
    info.file = &path_;
    if (begin != end) ranges.push_back({begin, end, tensors_.size()});
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }
  check_no_overlaps(file, ranges, tensors_);
}

// ---- writing ----------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(const fs::path& path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path.string() + ".tmp"), tensors_(std::move(tensors)) {
  const std::string file = path.string();
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    if (t.name == "__metadata__") fail_in(file, "cannot write a tensor named '__metadata__'");
    if (header.contains(t.name)) fail_in(file, "duplicate tensor name " + in_quotes(t.name));
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail_in(file, "tensor " + in_quotes(t.name) + " has a negative dimension");
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        fail_in(file, "tensor " + in_quotes(t.name) + ": shape overflows the element count");
    }
    const uint64_t bytes = numel * dtype_size(t.dtype);
    sizes_.push_back(bytes);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) fail_in(file, std::string("cannot create: ") + std::strerror(errno));
  char len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out_.write(len, 8);
  out_.write(text.data(), static_cast<std::streamsize>(text.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) {
    out_.close();
    std::error_code ignored;
    fs::remove(tmp_, ignored);
  }
}

void SafetensorsWriter::write(const void* data, size_t bytes) {
  const std::string file = path_.string();
  if (next_ >= tensors_.size()) fail_in(file, "more tensors written than declared");
  if (bytes != sizes_[next_])
    fail_in(file, "tensor " + in_quotes(tensors_[next_].name) + ": " + std::to_string(bytes) + " bytes given but " +
                      std::string(dtype_name(tensors_[next_].dtype)) + " of its shape needs " +
                      std::to_string(sizes_[next_]));
  out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  ++next_;
}

void SafetensorsWriter::finish() {
  const std::string file = path_.string();
  if (next_ != tensors_.size())
    fail_in(file, std::to_string(tensors_.size() - next_) + " declared tensors were not written");
  out_.flush();
  if (!out_) fail_in(file, std::string("write failed: ") + std::strerror(errno));
  out_.close();
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) fail_in(file, "cannot move the written file into place: " + ec.message());
  finished_ = true;
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const auto& t : tensors) writer.write(t.bytes.data(), t.bytes.size());
  writer.finish();
}

namespace {
TensorToWrite make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          size_t count) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel < 0 || static_cast<size_t>(numel) != count)
    fail("tensor '" + name + "': " + std::to_string(count) + " values given for shape of " +
         std::to_string(numel) + " elements");
  TensorToWrite t{name, dtype, std::move(shape), {}};
  t.bytes.resize(count * dtype_size(dtype));
  return t;
}
}  // namespace

TensorToWrite tensor_f32(const std::string& name, std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  auto t = make_tensor(name, DType::F32, std::move(shape), values.size());
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

TensorToWrite tensor_bf16(const std::string& name, std::vector<int64_t> shape,
                          const std::vector<float>& values) {
  auto t = make_tensor(name, DType::BF16, std::move(shape), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = f32_to_bf16(values[i]);
    std::memcpy(t.bytes.data() + 2 * i, &bits, 2);
  }
  return t;
}

TensorToWrite tensor_i64(const std::string& name, std::vector<int64_t> shape,
                         const std::vector<int64_t>& values) {
  auto t = make_tensor(name, DType::I64, std::move(shape), values.size());
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// ---- reading ----------------------------------------------------------------------------------

namespace {
std::string describe(const TensorInfo& t) {
  return "tensor " + in_quotes(t.name) + (t.file ? " in " + t.file->string() : std::string());
}

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
}  // namespace

std::vector<float> read_f32(const TensorInfo& tensor) {
  switch (tensor.dtype) {
    case DType::BF16: case DType::F16: case DType::F32: case DType::F64:
    case DType::F8_E4M3: case DType::F8_E5M2: break;
    default:
      fail("read_f32: " + describe(tensor) + " has dtype " + std::string(dtype_name(tensor.dtype)) +
           ", not a floating type");
  }
  const size_t count = tensor.nbytes / dtype_size(tensor.dtype);
  std::vector<float> out(count);
  if (count == 0) return out;
  const size_t align = dtype_size(tensor.dtype);
  if (reinterpret_cast<uintptr_t>(tensor.data) % align == 0) {
    convert_to_f32(tensor.dtype, tensor.data, out.data(), count);
  } else {
    // safetensors does not promise aligned offsets; convert_to_f32 reads typed elements.
    std::vector<double> aligned((tensor.nbytes + sizeof(double) - 1) / sizeof(double));
    std::memcpy(aligned.data(), tensor.data, tensor.nbytes);
    convert_to_f32(tensor.dtype, aligned.data(), out.data(), count);
  }
  return out;
}

std::vector<int64_t> read_i64(const TensorInfo& tensor) {
  const size_t count = tensor.nbytes / dtype_size(tensor.dtype);
  std::vector<int64_t> out(count);
  const std::byte* p = tensor.data;
  switch (tensor.dtype) {
    case DType::U8: case DType::BOOL:
      for (size_t i = 0; i < count; ++i) out[i] = load<uint8_t>(p + i);
      break;
    case DType::I8:
      for (size_t i = 0; i < count; ++i) out[i] = load<int8_t>(p + i);
      break;
    case DType::I16:
      for (size_t i = 0; i < count; ++i) out[i] = load<int16_t>(p + 2 * i);
      break;
    case DType::I32:
      for (size_t i = 0; i < count; ++i) out[i] = load<int32_t>(p + 4 * i);
      break;
    case DType::I64:
      if (count) std::memcpy(out.data(), p, count * 8);
      break;
    default:
      fail("read_i64: " + describe(tensor) + " has dtype " + std::string(dtype_name(tensor.dtype)) +
           ", not an integer type");
  }
  return out;
}

}  // namespace glms::io
