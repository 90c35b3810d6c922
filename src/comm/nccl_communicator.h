// Communicators over NCCL (nccl_library.h): one per GPU of a group. Within one process a group
// is made in one call over its devices (ncclCommInitAll); across processes (multi-node, one
// process per node started by mpirun) each rank joins with the group's unique id, which rank 0
// makes and the launcher passes on.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_library.h"

namespace glms::comm {

// Rank i of the returned group runs on devices[i].
std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::shared_ptr<const nccl::Library> library,
                                                           const std::vector<int>& devices);

// One rank of a group that spans processes; the calling thread's current device is the rank's.
nccl::UniqueId make_nccl_unique_id(const nccl::Library& library);
std::unique_ptr<Communicator> join_nccl_group(std::shared_ptr<const nccl::Library> library, const nccl::UniqueId& id,
                                              int rank, int size);
// Several ranks of one such group that this process hosts, joined together (one NCCL group call):
// ranks[i] runs on devices[i]; set_device makes a device current (the caller's CUDA API).
std::vector<std::unique_ptr<Communicator>> join_nccl_group_ranks(std::shared_ptr<const nccl::Library> library,
                                                                 const nccl::UniqueId& id, const std::vector<int>& ranks,
                                                                 const std::vector<int>& devices, int size,
                                                                 const std::function<void(int)>& set_device);

}  // namespace glms::comm
