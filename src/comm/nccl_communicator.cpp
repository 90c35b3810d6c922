#include "comm/nccl_communicator.h"

#include <atomic>
#include <thread>
#include <utility>

#include "core/error.h"

namespace glms::comm {

namespace {

nccl::DataType nccl_type(Element type) {
  switch (type) {
    case Element::F32: return nccl::kFloat32;
    case Element::BF16: return nccl::kBfloat16;
    case Element::I32: return nccl::kInt32;
  }
  fail("unknown element type");
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<const nccl::Library> library, nccl::Comm comm, int rank, int size)
      : library_(std::move(library)), comm_(comm), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (nccl::Comm comm = comm_.load()) library_->comm_destroy(comm);
  }
  void begin_group() override { library_->check(library_->group_start(), "ncclGroupStart"); }
  void end_group() override { library_->check(library_->group_end(), "ncclGroupEnd"); }
  // From another thread, while this rank may wait in a collective. ncclCommAbort sets the flag
  // that ends the communicator's kernels, then waits until every CUDA graph that captured one of
  // its collectives has been destroyed (NCCL 2.26 and later): those graphs belong to the ranks'
  // runners, which stay until the process ends after a failed step. So it runs on a thread of its
  // own, holding the library and the handle, and this call returns at once.
  void abort() override {
    nccl::Comm comm = comm_.exchange(nullptr);
    if (!comm) return;
    std::thread([library = library_, comm] { library->comm_abort(comm); }).detach();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool graph_capturable() const override { return true; }

  void all_reduce_sum(void* data, size_t count, Element type, Stream stream) override {
    if (count == 0) return;
    library_->check(library_->all_reduce(data, data, count, nccl_type(type), nccl::kSum, live(), stream),
                    "ncclAllReduce");
  }
  void all_gather(const void* send, void* recv, size_t count, Element type, Stream stream) override {
    if (count == 0) return;
    library_->check(library_->all_gather(send, recv, count, nccl_type(type), live(), stream), "ncclAllGather");
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, Element type, Stream stream) override {
    if (count == 0) return;
    library_->check(library_->reduce_scatter(send, recv, count, nccl_type(type), nccl::kSum, live(), stream),
                    "ncclReduceScatter");
  }

 private:
  nccl::Comm live() const {
    nccl::Comm comm = comm_.load();
    if (!comm) fail("the NCCL communicator was aborted after a peer failed: restart glmserve");
    return comm;
  }

  std::shared_ptr<const nccl::Library> library_;
  std::atomic<nccl::Comm> comm_;
  int rank_, size_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::shared_ptr<const nccl::Library> library,
                                                           const std::vector<int>& devices) {
  GLMS_CHECK(!devices.empty(), "make_nccl_group: no devices");
  std::vector<nccl::Comm> comms(devices.size(), nullptr);
  library->check(library->comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
                 "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> group;
  for (size_t i = 0; i < devices.size(); ++i)
    group.push_back(std::make_unique<NcclCommunicator>(library, comms[i], static_cast<int>(i),
                                                       static_cast<int>(devices.size())));
  return group;
}

nccl::UniqueId make_nccl_unique_id(const nccl::Library& library) {
  nccl::UniqueId id{};
  library.check(library.get_unique_id(&id), "ncclGetUniqueId");
  return id;
}

std::unique_ptr<Communicator> join_nccl_group(std::shared_ptr<const nccl::Library> library, const nccl::UniqueId& id,
                                              int rank, int size) {
  nccl::Comm comm = nullptr;
  library->check(library->comm_init_rank(&comm, size, id, rank), "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(std::move(library), comm, rank, size);
}

std::vector<std::unique_ptr<Communicator>> join_nccl_group_ranks(std::shared_ptr<const nccl::Library> library,
                                                                 const nccl::UniqueId& id, const std::vector<int>& ranks,
                                                                 const std::vector<int>& devices, int size,
                                                                 const std::function<void(int)>& set_device) {
  GLMS_CHECK(ranks.size() == devices.size(), "join_nccl_group_ranks: a device per rank");
  std::vector<nccl::Comm> comms(ranks.size(), nullptr);
  library->check(library->group_start(), "ncclGroupStart");
  for (size_t i = 0; i < ranks.size(); ++i) {
    set_device(devices[i]);
    library->check(library->comm_init_rank(&comms[i], size, id, ranks[i]), "ncclCommInitRank");
  }
  library->check(library->group_end(), "ncclGroupEnd");
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(library, comms[i], ranks[i], size));
  return out;
}

}  // namespace glms::comm
