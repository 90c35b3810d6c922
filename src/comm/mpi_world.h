// The processes mpirun started (one per node, each running its node's ranks): their ranks,
// control messages between them, and CPU communicators over them (one rank a process). MpiWorld
// is its own library (glms_comm_mpi), built where MPI is found at configure time (Debian's
// libopenmpi-dev; GLMS_HAVE_MPI) and linked only by what launches processes (MPI's memory
// hooks slow every allocation of a process that links it); launched_by_mpirun() is always
// built, so that a binary without MPI can say what is wrong.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace glms::comm {

// Whether the environment says a launcher (mpirun, srun) started this process as one of several.
bool launched_by_mpirun();

// The processes of a run as the runtime sees them: ranks, control messages, and communicators
// over groups of processes. MpiWorld is its MPI implementation.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Root's bytes to every process (receivers' vectors are resized).
  virtual void broadcast(std::vector<std::byte>& bytes, int root) const = 0;
  // Every process's bytes, in rank order, at root (empty elsewhere).
  virtual std::vector<std::vector<std::byte>> gather(const std::vector<std::byte>& mine, int root) const = 0;
  virtual int min_over_processes(int value) const = 0;
  // This process's communicator in the group of processes `members` (its rank there is its index
  // in `members`; null when it is not a member). Every process calls it with the same groups in
  // the same order.
  virtual std::unique_ptr<Communicator> communicator(const std::vector<int>& members) const = 0;
  // Ends every process of the run with `exit_code` (a rank that failed mid-step, whose peers
  // may be waiting for it inside a collective that nothing else can interrupt).
  [[noreturn]] virtual void abort_all(int exit_code) const = 0;
};

#ifdef GLMS_HAVE_MPI
class MpiWorld : public ProcessGroup {
 public:
  MpiWorld();   // MPI_Init_thread; throws glms::Error when MPI cannot start
  ~MpiWorld() override;  // MPI_Finalize
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const override;
  int size() const override;
  void broadcast(std::vector<std::byte>& bytes, int root) const override;
  std::vector<std::vector<std::byte>> gather(const std::vector<std::byte>& mine, int root) const override;
  int min_over_processes(int value) const override;
  std::unique_ptr<Communicator> communicator(const std::vector<int>& members) const override;
  [[noreturn]] void abort_all(int exit_code) const override;  // MPI_Abort(MPI_COMM_WORLD)
};
#endif

}  // namespace glms::comm
