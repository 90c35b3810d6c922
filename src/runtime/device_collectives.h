// Device collectives without NCCL (built with the CUDA backend):
// - a group of ranks that are threads sharing GPUs (several ranks on one GPU: how the tests run
//   CUDA layouts on a one-GPU machine): device copies and adds between the ranks' buffers in
//   rank order, with host barriers between them, so not graph-capturable;
// - the stand-in peers of a one-GPU rank simulation (bench-step --simulate-rank): each collective
//   becomes device copies of the bytes it would bring into this rank, on the stream (capturable);
//   the network's time is added from the plan's bandwidth, not measured.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "runtime/rank_groups.h"

namespace glms::runtime {

// A layout's groups over device copies (every rank's thread has set its device).
std::unique_ptr<RankGroups> make_device_copy_groups(const ParallelLayout& layout);

// Rank `rank` of `size` alone. all_gather copies this rank's values into every slot; I32 values
// (expert ids) land in slot r shifted by r * num_experts / size (mod num_experts, -1 kept), so
// that the stand-in peers' tokens choose other experts as real peers' would; reduce-scatter and
// all-reduce copy this rank's part. `max_all_reduce_bytes` sizes the all-reduce's scratch up front
// (no allocation inside a captured graph).
std::unique_ptr<comm::Communicator> make_simulated_peer(int rank, int size, int num_experts,
                                                        size_t max_all_reduce_bytes);

}  // namespace glms::runtime
