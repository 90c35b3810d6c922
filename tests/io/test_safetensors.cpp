#include "io/safetensors.h"

#include <cmath>
#include <cstring>

#include "io_test_util.h"

namespace glms::io {
namespace {

using testing::expect_error;
using testing::raw_safetensors;
using testing::TempDir;
using testing::write_file;

std::vector<std::byte> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((seed + 37 * i) & 0xff);
  return out;
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const DType all[] = {DType::BF16, DType::F16, DType::F32, DType::F64, DType::F8_E4M3, DType::F8_E5M2,
                       DType::U8, DType::I8, DType::I16, DType::I32, DType::I64, DType::BOOL};
  std::vector<TensorToWrite> tensors;
  uint8_t seed = 1;
  for (DType dtype : all) {
    const std::vector<int64_t> shape = {3, 5};
    tensors.push_back({"t." + std::string(dtype_name(dtype)), dtype, shape,
                       pattern_bytes(15 * dtype_size(dtype), seed++)});
  }
  tensors.push_back({"scalar", DType::F32, {}, pattern_bytes(4, 9)});
  tensors.push_back({"empty", DType::BF16, {0, 7}, {}});
  const auto path = dir / "all.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "x"}});

  const std::string bytes = testing::read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->tensors().size(), tensors.size());
  EXPECT_EQ(file->metadata().at("format"), "pt");
  for (const auto& want : tensors) {
    const TensorInfo* got = file->find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->nbytes, want.bytes.size());
    EXPECT_EQ(got->file, &file->path());
    if (!want.bytes.empty()) {
      EXPECT_EQ(std::memcmp(got->data, want.bytes.data(), want.bytes.size()), 0);
    }
  }
  EXPECT_EQ(file->find("nope"), nullptr);
  EXPECT_EQ(file->find("scalar")->numel(), 1);
  EXPECT_EQ(file->find("scalar")->shape_string(), "[]");
  EXPECT_EQ(file->find("empty")->numel(), 0);
  EXPECT_EQ(file->find("t.F32")->shape_string(), "[3, 5]");
}

TEST(Safetensors, ReadF32AndI64Convert) {
  TempDir dir;
  const std::vector<float> values = {1.0f, -2.5f, 0.375f, 1024.0f};
  std::vector<TensorToWrite> tensors = {
      tensor_f32("f32", {2, 2}, values), tensor_bf16("bf16", {4}, values),
      tensor_i64("i64", {3}, {-5, 0, int64_t{1} << 40})};
  std::vector<std::byte> f16(8), f64(32), i8(3), i16(6), i32(12), u8(2), e4m3(2);
  for (size_t i = 0; i < 4; ++i) {
    const uint16_t h = f32_to_f16(values[i]);
    std::memcpy(&f16[2 * i], &h, 2);
    const double d = values[i];
    std::memcpy(&f64[8 * i], &d, 8);
  }
  const int8_t i8v[] = {-128, 0, 127};
  const int16_t i16v[] = {-32768, 1, 32767};
  const int32_t i32v[] = {-7, 0, 2147483647};
  std::memcpy(i8.data(), i8v, 3);
  std::memcpy(i16.data(), i16v, 6);
  std::memcpy(i32.data(), i32v, 12);
  u8[0] = std::byte{255};
  e4m3[0] = std::byte{0x38};  // 1.0
  e4m3[1] = std::byte{0xc0};  // -2.0
  tensors.push_back({"f16", DType::F16, {4}, f16});
  tensors.push_back({"f64", DType::F64, {4}, f64});
  tensors.push_back({"i8", DType::I8, {3}, i8});
  tensors.push_back({"i16", DType::I16, {3}, i16});
  tensors.push_back({"i32", DType::I32, {3}, i32});
  tensors.push_back({"u8", DType::U8, {2}, u8});
  tensors.push_back({"e4m3", DType::F8_E4M3, {2}, e4m3});
  const auto path = dir / "conv.safetensors";
  write_safetensors(path, tensors);
  auto file = SafetensorsFile::open(path);
  for (const char* name : {"f32", "bf16", "f16", "f64"}) EXPECT_EQ(read_f32(*file->find(name)), values) << name;
  EXPECT_EQ(read_f32(*file->find("e4m3")), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(read_i64(*file->find("i64")), (std::vector<int64_t>{-5, 0, int64_t{1} << 40}));
  EXPECT_EQ(read_i64(*file->find("i8")), (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(read_i64(*file->find("i16")), (std::vector<int64_t>{-32768, 1, 32767}));
  EXPECT_EQ(read_i64(*file->find("i32")), (std::vector<int64_t>{-7, 0, 2147483647}));
  EXPECT_EQ(read_i64(*file->find("u8")), (std::vector<int64_t>{255, 0}));

  expect_error([&] { read_f32(*file->find("i32")); }, {"read_f32", "'i32'", "conv.safetensors", "I32"});
  expect_error([&] { read_i64(*file->find("bf16")); }, {"read_i64", "'bf16'", "BF16"});
}

TEST(Safetensors, ReadF32FromUnalignedOffset) {
  TempDir dir;
  const float v[2] = {3.5f, -1.25f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(v), 8);
  const auto path = dir / "unaligned.safetensors";
  write_file(path, raw_safetensors(
                       R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})",
                       data));
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(read_f32(*file->find("f")), (std::vector<float>{3.5f, -1.25f}));
}

TEST(Safetensors, ZeroSizeTensorsAndEmptyHeaderAreFine) {
  TempDir dir;
  const auto path = dir / "zero.safetensors";
  write_file(path, raw_safetensors(
                       R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("c":{"dtype":"I64","shape":[2,0,3],"data_offsets":[2,2]},"__metadata__":null})",
                       std::string(4, '\0')));
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->find("c")->nbytes, 0u);
  EXPECT_TRUE(read_i64(*file->find("c")).empty());

  const auto empty = dir / "nothing.safetensors";
  write_file(empty, raw_safetensors("{}"));
  EXPECT_TRUE(SafetensorsFile::open(empty)->tensors().empty());
}

struct BadHeaderCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> fragments;
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

TEST(Safetensors, EveryMalformedFileGivesANamedError) {
  const std::string four(4, '\0');
  const std::vector<BadHeaderCase> cases = {
      {"short", "abc", {"3 bytes", "shorter than the 8-byte header length"}},
      {"len_beyond", raw_safetensors("{}", "", 500), {"header length 500 exceeds the 2 bytes"}},
      {"len_absurd", raw_safetensors("{}", "", int64_t{1} << 40), {"absurd", "1099511627776"}},
      {"len_u64max", std::string(8, '\xff') + "{}", {"absurd"}},
      {"not_json", raw_safetensors("{\"a\": "), {"not valid JSON"}},
      {"not_object", raw_safetensors("[1,2]"), {"header must be a JSON object", "array"}},
      {"entry_not_object", raw_safetensors(R"({"w": 5})"), {"tensor 'w'", "entry must be an object", "integer"}},
      {"missing_dtype", raw_safetensors(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", four),
       {"tensor 'w'", "missing field 'dtype'"}},
      {"missing_shape", raw_safetensors(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", four),
       {"missing field 'shape'"}},
      {"missing_offsets", raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", four),
       {"missing field 'data_offsets'"}},
      {"dtype_not_string", raw_safetensors(R"({"w":)" + entry("7", "[1]", "[0,4]") + "}", four),
       {"'dtype' must be a string", "integer"}},
      {"shape_not_list", raw_safetensors(R"({"w":)" + entry("\"F32\"", "\"1\"", "[0,4]") + "}", four),
       {"'shape' must be a list of integers", "string"}},
      {"offsets_not_list", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[1]", "{}") + "}", four),
       {"'data_offsets' must be [begin, end]"}},
      {"offsets_three", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[1]", "[0,4,4]") + "}", four),
       {"'data_offsets' must be [begin, end]", "[0,4,4]"}},
      {"offsets_negative", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[1]", "[-4,0]") + "}", four),
       {"'data_offsets' must be [begin, end] of non-negative integers"}},
      {"unknown_dtype", raw_safetensors(R"({"w":)" + entry("\"F4\"", "[1]", "[0,4]") + "}", four),
       {"tensor 'w'", "unknown dtype 'F4'"}},
      {"negative_dim", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[2,-1]", "[0,4]") + "}", four),
       {"shape[1] = -1 is not a non-negative integer"}},
      {"float_dim", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[2.5]", "[0,4]") + "}", four),
       {"shape[0] = 2.5 is not a non-negative integer"}},
      {"string_dim", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[\"2\"]", "[0,4]") + "}", four),
       {"shape[0] = \"2\""}},
      {"numel_overflow",
       raw_safetensors(R"({"w":)" + entry("\"F32\"", "[4294967296,4294967296]", "[0,4]") + "}", four),
       {"overflows the element count"}},
      {"bytes_overflow",
       raw_safetensors(R"({"w":)" + entry("\"F64\"", "[4611686018427387904]", "[0,4]") + "}", four),
       {"overflows the byte size"}},
      {"begin_after_end", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[1]", "[4,0]") + "}", four),
       {"data_offsets [4, 0] have begin > end"}},
      {"truncated", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[4]", "[0,16]") + "}", four),
       {"tensor 'w'", "data ends at byte 16", "only 4 bytes are present", "truncated",
        "expected at least", "file has"}},
      {"size_mismatch", raw_safetensors(R"({"w":)" + entry("\"F32\"", "[2]", "[0,4]") + "}", four),
       {"tensor 'w'", "span 4 bytes but F32 [2] needs 8"}},
      {"overlap",
       raw_safetensors(R"({"a":)" + entry("\"F32\"", "[2]", "[0,8]") + R"(,"b":)" +
                           entry("\"F32\"", "[1]", "[4,8]") + "}",
                       std::string(8, '\0')),
       {"tensors 'a' [0, 8) and 'b' [4, 8) overlap"}},
      {"metadata_not_string", raw_safetensors(R"({"__metadata__":{"format":"pt","n":3}})"),
       {"__metadata__ value for 'n' must be a string", "integer"}},
      {"metadata_not_object", raw_safetensors(R"({"__metadata__":[1]})"),
       {"__metadata__ must be an object"}},
      {"duplicate",
       raw_safetensors(R"({"a":)" + entry("\"F32\"", "[1]", "[0,4]") + R"(,"a":)" +
                           entry("\"F32\"", "[1]", "[4,8]") + "}",
                       std::string(8, '\0')),
       {"duplicate tensor name 'a'"}},
      {"deep", raw_safetensors(R"({"a":)" + std::string(100, '[') + std::string(100, ']') + "}"),
       {"nested deeper"}},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const auto path = dir / (std::string(c.label) + ".safetensors");
    write_file(path, c.bytes);
    auto fragments = c.fragments;
    fragments.push_back(path.string() + ": ");
    expect_error([&] { SafetensorsFile::open(path); }, fragments);
    // The same bytes from memory name the label instead.
    fragments.back() = "mem:" + std::string(c.label) + ": ";
    expect_error([&] {
      SafetensorsFile::from_memory(reinterpret_cast<const std::byte*>(c.bytes.data()),
                                   c.bytes.size(), "mem:" + std::string(c.label));
    }, fragments);
  }
}

TEST(Safetensors, FileSystemErrors) {
  TempDir dir;
  const auto empty = dir / "empty.safetensors";
  write_file(empty, "");
  expect_error([&] { SafetensorsFile::open(empty); }, {empty.string(), "file is empty (0 bytes)"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {dir.path().string(), "is a directory"});
  const auto missing = dir / "missing.safetensors";
  expect_error([&] { SafetensorsFile::open(missing); }, {missing.string(), "no such file"});
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  TempDir dir;
  const auto path = dir / "bad.safetensors";
  expect_error([&] { write_safetensors(path, {{"w", DType::F32, {3}, pattern_bytes(8, 0)}}); },
               {path.string(), "tensor 'w'", "8 bytes given", "needs 12"});
  expect_error([&] {
    write_safetensors(path, {tensor_f32("w", {1}, {1.0f}), tensor_f32("w", {1}, {2.0f})});
  }, {"duplicate tensor name 'w'"});
  expect_error([&] { tensor_f32("w", {2, 2}, {1.0f}); }, {"'w'", "1 values given"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace glms::io
