// CPU ranks as threads: every collective against the same sums computed directly, results the
// same bits on every rank, abort waking blocked ranks; the NCCL loader's errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <thread>

#include "comm/cpu_group.h"
#include "comm/nccl_library.h"
#include "core/dtype.h"
#include "core/error.h"
#include "support/numerics.h"

using namespace glms;

namespace {

// Runs body(rank) on `size` threads and rethrows the first failure.
void run_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<float> rank_values(int rank, size_t count) { return glms::testing::random_values(count, 100 + rank); }

}  // namespace

TEST(CpuGroup, AllReduceSumsInRankOrderAndAgreesBitForBit) {
  for (int size : {1, 2, 3, 4}) {
    comm::CpuGroup group(size);
    const size_t count = 1001;
    std::vector<std::vector<float>> results(size);
    run_ranks(size, [&](int r) {
      std::vector<float> data = rank_values(r, count);
      for (int repeat = 0; repeat < 3; ++repeat) {  // the group is reusable step after step
        data = rank_values(r, count);
        group.rank(r).all_reduce_sum(data.data(), count, comm::Element::F32);
      }
      results[r] = data;
    });
    std::vector<float> expected(count, 0.0f);
    for (int r = 0; r < size; ++r) {
      const auto v = rank_values(r, count);
      for (size_t i = 0; i < count; ++i) expected[i] += v[i];
    }
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float))) << "rank " << r;
      EXPECT_EQ(results[r], expected) << "size " << size;
    }
  }
}

TEST(CpuGroup, AllReduceBf16AndInt32) {
  comm::CpuGroup group(3);
  std::vector<std::vector<uint16_t>> bf16(3);
  std::vector<std::vector<int32_t>> ints(3);
  run_ranks(3, [&](int r) {
    bf16[r] = {f32_to_bf16(1.5f * (r + 1)), f32_to_bf16(-0.25f)};
    ints[r] = {r, -7 * r, 1 << 20};
    group.rank(r).all_reduce_sum(bf16[r].data(), 2, comm::Element::BF16);
    group.rank(r).all_reduce_sum(ints[r].data(), 3, comm::Element::I32);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bf16_to_f32(bf16[r][0]), 9.0f);
    EXPECT_EQ(bf16_to_f32(bf16[r][1]), -0.75f);
    EXPECT_EQ(ints[r], (std::vector<int32_t>{3, -21, 3 << 20}));
  }
}

TEST(CpuGroup, AllGatherPlacesEachRankAtItsOffset) {
  const int size = 4;
  const size_t count = 37;
  comm::CpuGroup group(size);
  std::vector<std::vector<float>> gathered(size);
  run_ranks(size, [&](int r) {
    const auto mine = rank_values(r, count);
    gathered[r].resize(size * count);
    group.rank(r).all_gather(mine.data(), gathered[r].data(), count, comm::Element::F32);
  });
  for (int r = 0; r < size; ++r)
    for (int from = 0; from < size; ++from) {
      const auto expected = rank_values(from, count);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), gathered[r].begin() + from * count))
          << "rank " << r << " slot " << from;
    }
}

TEST(CpuGroup, ReduceScatterGivesEachRankTheSumOfItsSlice) {
  const int size = 3;
  const size_t count = 50;
  comm::CpuGroup group(size);
  std::vector<std::vector<float>> received(size);
  run_ranks(size, [&](int r) {
    const auto send = rank_values(r, size * count);
    received[r].resize(count);
    group.rank(r).reduce_scatter_sum(send.data(), received[r].data(), count, comm::Element::F32);
  });
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int from = 0; from < size; ++from) sum += rank_values(from, size * count)[r * count + i];
      EXPECT_EQ(received[r][i], sum) << "rank " << r << " element " << i;
    }
}

TEST(CpuGroup, AbortWakesRanksBlockedInACollective) {
  comm::CpuGroup group(3);
  std::vector<std::string> errors(3);
  run_ranks(3, [&](int r) {
    if (r == 2) {  // this rank fails instead of joining the collective
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      group.abort("rank 2 failed: test");
      return;
    }
    float value = 1.0f;
    try {
      group.rank(r).all_reduce_sum(&value, 1, comm::Element::F32);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 2 failed: test"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 2 failed: test"), std::string::npos) << errors[1];
  float value = 1.0f;
  EXPECT_THROW(group.rank(0).all_reduce_sum(&value, 1, comm::Element::F32), Error);  // stays aborted
}

TEST(NcclLibrary, AMissingLibraryIsAClearError) {
  setenv("GLMS_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  try {
    comm::nccl::Library::load();
    FAIL() << "loaded a library that does not exist";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent/libnccl.so.2"), std::string::npos) << message;
    EXPECT_NE(message.find("GLMS_NCCL_LIBRARY"), std::string::npos) << message;
  }
  unsetenv("GLMS_NCCL_LIBRARY");
}

TEST(NcclLibrary, ALibraryWithoutNcclIsAClearError) {
  setenv("GLMS_NCCL_LIBRARY", "libm.so.6", 1);  // loads, but has none of NCCL's calls
  try {
    comm::nccl::Library::load();
    FAIL() << "accepted a library without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ncclGetVersion"), std::string::npos) << e.what();
  }
  unsetenv("GLMS_NCCL_LIBRARY");
}

TEST(NcclLibrary, VersionStrings) {
  EXPECT_EQ(comm::nccl::version_string(22703), "2.27.3");
  EXPECT_EQ(comm::nccl::version_string(21805), "2.18.5");
}
