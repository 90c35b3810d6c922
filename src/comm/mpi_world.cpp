#include "comm/mpi_world.h"

#include <mpi.h>

#include <cstdlib>

#include <cstring>
#include <string>

#include "core/error.h"

namespace glms::comm {

namespace {

void check(int result, const char* call) {
  if (result == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(result, message, &length);
  fail(std::string(call) + " failed: " + std::string(message, static_cast<size_t>(length)));
}

MPI_Datatype mpi_type(Element type) {
  switch (type) {
    case Element::F32: return MPI_FLOAT;
    case Element::I32: return MPI_INT32_T;
    case Element::BF16: return MPI_UINT16_T;  // moved, never summed: MPI has no bf16
  }
  return MPI_BYTE;
}

// One rank of a group of processes: host buffers, MPI's collectives.
class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(void* data, size_t count, Element type, Stream) override {
    if (type == Element::BF16) fail("MPI sums of bf16 are not supported");
    check(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(type), MPI_SUM, comm_), "MPI_Allreduce");
  }
  void all_gather(const void* send, void* recv, size_t count, Element type, Stream) override {
    check(MPI_Allgather(send, static_cast<int>(count), mpi_type(type), recv, static_cast<int>(count), mpi_type(type),
                        comm_),
          "MPI_Allgather");
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, Element type, Stream) override {
    if (type == Element::BF16) fail("MPI sums of bf16 are not supported");
    check(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(type), MPI_SUM, comm_),
          "MPI_Reduce_scatter_block");
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

MpiWorld::MpiWorld() {
  int provided = 0;
  // Control messages and collectives come from different threads of a process, one at a time.
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) fail("this MPI cannot be called from several threads (MPI_THREAD_SERIALIZED)");
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

int MpiWorld::rank() const {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int MpiWorld::size() const {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void MpiWorld::broadcast(std::vector<std::byte>& bytes, int root) const {
  uint64_t size = bytes.size();
  check(MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  bytes.resize(size);
  if (size > 0) check(MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
}

std::vector<std::vector<std::byte>> MpiWorld::gather(const std::vector<std::byte>& mine, int root) const {
  const int n = size(), me = rank();
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(me == root ? n : 0), offsets;
  check(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Gather");
  std::vector<std::byte> all;
  if (me == root) {
    int total = 0;
    for (int l : lengths) {
      offsets.push_back(total);
      total += l;
    }
    all.resize(static_cast<size_t>(total));
  }
  check(MPI_Gatherv(mine.data(), length, MPI_BYTE, all.data(), lengths.data(), offsets.data(), MPI_BYTE, root,
                    MPI_COMM_WORLD),
        "MPI_Gatherv");
  std::vector<std::vector<std::byte>> out;
  for (size_t p = 0; p < lengths.size(); ++p)
    out.emplace_back(all.begin() + offsets[p], all.begin() + offsets[p] + lengths[p]);
  return out;
}

void MpiWorld::abort_all(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, end this process anyway
}

int MpiWorld::min_over_processes(int value) const {
  int result = value;
  check(MPI_Allreduce(&value, &result, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  return result;
}

std::unique_ptr<Communicator> MpiWorld::communicator(const std::vector<int>& members) const {
  const int me = rank();
  int color = MPI_UNDEFINED, key = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == me) {
      color = members.front();  // groups are told apart by their first member
      key = static_cast<int>(i);
    }
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace glms::comm
