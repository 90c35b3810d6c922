// CPU ranks as threads of one process: a group of `size` ranks exchanging through shared memory.
// Each rank's thread uses the communicator of its rank. Sums add the ranks' values in rank order
// in fp32 (bf16 rounded once at the end), the same on every rank. A collective blocks until every
// rank has entered it; abort() wakes them all with an error, so that one failing rank does not
// leave its peers waiting for ever.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_barrier.h"

namespace glms::comm {

class CpuGroup {
 public:
  explicit CpuGroup(int size);
  ~CpuGroup();
  CpuGroup(const CpuGroup&) = delete;
  CpuGroup& operator=(const CpuGroup&) = delete;

  int size() const;
  // Rank `rank`'s communicator (owned by the group; one thread uses it at a time).
  Communicator& rank(int rank);
  // Every collective in progress or to come throws glms::Error naming `reason`.
  void abort(const std::string& reason);
  // Makes an aborted group usable again; only once no rank is inside a collective.
  void reset();

 private:
  class Rank;
  std::shared_ptr<RankBarrier> barrier_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace glms::comm
