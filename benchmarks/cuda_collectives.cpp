// Bandwidth of the collectives the parallel model calls between its layers (all-reduce,
// all-gather, reduce-scatter) over NCCL between this machine's GPUs, one thread a GPU as the
// runtime runs its ranks. For each message size: the time of one collective (the slowest rank's
// mean over --reps, after --warmup) and its bus bandwidth as nccl-tests defines it, the figure to
// hold against the links' (glmserve plan's H200 row: NVLink 4, 450 GB/s a direction):
//   all-reduce      bytes x 2 (n - 1) / n / time   (bytes: the buffer every rank holds)
//   all-gather      bytes x (n - 1) / n / time     (bytes: the gathered output)
//   reduce-scatter  bytes x (n - 1) / n / time     (bytes: the input every rank holds)
// Each collective's result is checked once per size (every rank's values known in advance).
//   cuda_collectives [--gpus N] [--sizes-mib 1,8,64,256] [--reps 20] [--warmup 5] [--json FILE]
// Exits 77 (a skip) without a GPU or without libnccl.so.2 (GLMS_NCCL_LIBRARY names it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_communicator.h"
#include "comm/rank_barrier.h"
#include "core/error.h"
#include "micro_options.h"
#include "ops/cuda/cuda_ops.h"

namespace {

using namespace glms;
namespace cuda = glms::ops::cuda;

enum class Collective { kAllReduce, kAllGather, kReduceScatter };
const char* name_of(Collective c) {
  return c == Collective::kAllReduce ? "all_reduce" : c == Collective::kAllGather ? "all_gather" : "reduce_scatter";
}

// Rank r's input values: v(r, i) = r + 1 + (i % 7) / 8, exact in fp32 and summed exactly.
float input_value(int rank, size_t i) { return static_cast<float>(rank + 1) + static_cast<float>(i % 7) / 8.0f; }

// What rank `rank` of n must hold after the collective at element i of its output.
float expected_value(Collective c, int rank, int n, size_t count, size_t i) {
  switch (c) {
    case Collective::kAllReduce: return n * (n + 1) / 2.0f + n * static_cast<float>(i % 7) / 8.0f;
    case Collective::kAllGather: return input_value(static_cast<int>(i / count), i % count);
    case Collective::kReduceScatter: {
      const size_t source = rank * count + i;  // the element of every rank's input summed here
      return n * (n + 1) / 2.0f + n * static_cast<float>(source % 7) / 8.0f;
    }
  }
  return 0;
}

// One rank's run of one collective at `count` fp32 elements a rank (all-gather: sent,
// reduce-scatter: received): times `reps` calls after `warmup`, then checks one call's result.
struct RankRun {
  comm::Communicator& comm;
  cuda::DeviceBuffer& send;
  cuda::DeviceBuffer& recv;
  cuda::Stream& stream;

  void call(Collective c, size_t count) {
    const comm::Element f32 = comm::Element::F32;
    if (c == Collective::kAllReduce) comm.all_reduce_sum(recv.data(), count, f32, stream.get());
    if (c == Collective::kAllGather) comm.all_gather(send.data(), recv.data(), count, f32, stream.get());
    if (c == Collective::kReduceScatter) comm.reduce_scatter_sum(send.data(), recv.data(), count, f32, stream.get());
  }

  void fill_input(Collective c, size_t count) {
    const int rank = comm.rank(), n = comm.size();
    const size_t elements = c == Collective::kReduceScatter ? count * n : count;
    std::vector<float> host(elements);
    for (size_t i = 0; i < elements; ++i) host[i] = input_value(rank, i);
    (c == Collective::kAllReduce ? recv : send).upload(host.data(), elements * sizeof(float));
    // A copy from pageable memory may return before its DMA lands, and the collective's stream
    // does not wait for the default stream's work.
    cuda::synchronize_stream(nullptr);
  }

  bool result_correct(Collective c, size_t count) {
    const int rank = comm.rank(), n = comm.size();
    const size_t elements = c == Collective::kAllGather ? count * n : count;
    std::vector<float> host(elements);
    recv.download(host.data(), elements * sizeof(float));
    for (size_t i = 0; i < elements; ++i)
      if (host[i] != expected_value(c, rank, n, count, i)) return false;
    return true;
  }

  // Seconds a call, this rank's mean; whether the checked call's result was right.
  std::pair<double, bool> run(Collective c, size_t count, int warmup, int reps, comm::RankBarrier& barrier) {
    fill_input(c, count);
    call(c, count);
    stream.synchronize();
    const bool correct = result_correct(c, count);
    for (int i = 0; i < warmup; ++i) call(c, count);  // (all-reduce in place: values grow, time does not)
    stream.synchronize();
    barrier.arrive_and_wait();
    cuda::Event start, stop;
    start.record(stream.get());
    for (int i = 0; i < reps; ++i) call(c, count);
    stop.record(stream.get());
    stream.synchronize();
    return {stop.elapsed_ms_since(start) / 1e3 / reps, correct};
  }
};

double bus_factor(Collective c, int n) {
  return c == Collective::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

// fp32 elements a rank for a message of `mib` MiB: all-reduce holds the whole message, the
// others a rank's share of it (all-gather sends it, reduce-scatter receives it).
size_t rank_count(Collective c, int mib, int n) {
  const size_t bytes = mib * (size_t{1} << 20);
  return (c == Collective::kAllReduce ? bytes : bytes / n) / sizeof(float);
}
// The message's bytes as the bus bandwidth formulas count them.
double message_bytes(Collective c, int mib, int n) {
  return double(rank_count(c, mib, n)) * sizeof(float) * (c == Collective::kAllReduce ? 1 : n);
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = 0, reps = 20, warmup = 5;
  std::vector<int> sizes_mib = {1, 8, 64, 256};
  std::string json_path;
  if (!benchmarks::parse_options(argc, argv,
                                 {{"--gpus", [&](const char* v) { gpus = std::stoi(v); }},
                                  {"--sizes-mib", [&](const char* v) { sizes_mib = benchmarks::parse_int_list(v); }},
                                  {"--reps", [&](const char* v) { reps = std::stoi(v); }},
                                  {"--warmup", [&](const char* v) { warmup = std::stoi(v); }},
                                  {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  const int visible = cuda::device_count();
  if (visible == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (gpus <= 0) gpus = visible;
  if (gpus > visible) {
    std::fprintf(stderr, "--gpus %d: only %d visible\n", gpus, visible);
    return 2;
  }
  std::shared_ptr<const comm::nccl::Library> library;
  try {
    library = comm::nccl::Library::load();
  } catch (const Error& e) {
    std::printf("%s: skipped\n", e.what());
    return 77;
  }
  std::vector<int> devices(gpus);
  for (int d = 0; d < gpus; ++d) devices[d] = d;
  auto comms = comm::make_nccl_group(library, devices);
  comm::RankBarrier barrier(gpus);
  const std::vector<Collective> collectives = {Collective::kAllReduce, Collective::kAllGather,
                                               Collective::kReduceScatter};
  // [size][collective][rank]
  std::vector<double> seconds(sizes_mib.size() * collectives.size() * gpus);
  std::vector<char> correct(seconds.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < gpus; ++r) {
    ranks.emplace_back([&, r] {
      try {
        cuda::set_device(devices[r]);
        // The largest buffer a collective here takes: all-reduce's, reduce-scatter's input,
        // all-gather's output.
        const size_t most = *std::max_element(sizes_mib.begin(), sizes_mib.end()) * (size_t{1} << 20);
        cuda::DeviceBuffer send(most), recv(most);
        cuda::Stream stream;
        RankRun run{*comms[r], send, recv, stream};
        for (size_t s = 0; s < sizes_mib.size(); ++s)
          for (size_t c = 0; c < collectives.size(); ++c) {
            const auto [t, ok] =
                run.run(collectives[c], rank_count(collectives[c], sizes_mib[s], gpus), warmup, reps, barrier);
            const size_t at = (s * collectives.size() + c) * gpus + r;
            seconds[at] = t;
            correct[at] = ok;
          }
      } catch (const std::exception& e) {  // the peers would wait in NCCL for this rank for ever
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        std::_Exit(1);
      }
    });
  }
  for (std::thread& t : ranks) t.join();

  std::ostringstream json;
  json << "{\"gpus\": " << gpus << ", \"nccl\": \"" << comm::nccl::version_string(library->version)
       << "\", \"reps\": " << reps << ", \"points\": [";
  std::printf("%d GPUs, NCCL %s\n%-15s %10s %12s %12s %12s  %s\n", gpus,
              comm::nccl::version_string(library->version).c_str(), "collective", "MiB", "us", "algbw GB/s",
              "busbw GB/s", "result");
  bool all_correct = true, first = true;
  for (size_t s = 0; s < sizes_mib.size(); ++s)
    for (size_t c = 0; c < collectives.size(); ++c) {
      const size_t at = (s * collectives.size() + c) * gpus;
      double slowest = 0;
      bool ok = true;
      for (int r = 0; r < gpus; ++r) slowest = std::max(slowest, seconds[at + r]), ok = ok && correct[at + r];
      all_correct = all_correct && ok;
      const double bytes = message_bytes(collectives[c], sizes_mib[s], gpus);
      const double algbw = bytes / slowest / 1e9, busbw = algbw * bus_factor(collectives[c], gpus);
      std::printf("%-15s %10d %12.1f %12.1f %12.1f  %s\n", name_of(collectives[c]), sizes_mib[s], slowest * 1e6, algbw,
                  busbw, ok ? "ok" : "WRONG");
      json << (first ? "" : ",") << "\n  {\"collective\": \"" << name_of(collectives[c]) << "\", \"mib\": "
           << sizes_mib[s] << ", \"us\": " << slowest * 1e6 << ", \"algbw_gb_s\": " << algbw
           << ", \"busbw_gb_s\": " << busbw << ", \"correct\": " << (ok ? "true" : "false") << "}";
      first = false;
    }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return all_correct ? 0 : 1;
}
