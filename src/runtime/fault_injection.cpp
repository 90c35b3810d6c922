#include "runtime/fault_injection.h"

#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>

#include "core/error.h"

namespace glms::runtime {

FaultInjection::FaultInjection() {
  if (const char* fault = std::getenv("GLMS_TEST_FAULT_RANK"))
    if (std::sscanf(fault, "%d:%d", &rank_, &step_) != 2) rank_ = -1;
}

void FaultInjection::before_step(int world_rank) {
  if (world_rank != rank_) return;
  if (++steps_ == step_)
    fail(fmt::format("injected fault: rank {} at step {} (GLMS_TEST_FAULT_RANK)", rank_, step_));
}

}  // namespace glms::runtime
