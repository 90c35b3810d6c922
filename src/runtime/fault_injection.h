// Test-only fault injection: GLMS_TEST_FAULT_RANK=R:S makes world rank R fail its S-th forward
// step (1-based) with a glms::Error, as a device fault would. Read once from the environment by
// each executor (tests/e2e: one process and under mpirun).
#pragma once

namespace glms::runtime {

class FaultInjection {
 public:
  FaultInjection();  // off unless the environment asks
  // Counts rank `world_rank`'s forward steps; throws on the asked one.
  void before_step(int world_rank);

 private:
  int rank_ = -1, step_ = 0, steps_ = 0;
};

}  // namespace glms::runtime
