// OpenMP threads that spin while waiting (libgomp's default) make every parallel region a
// disaster when the cores are shared: with an HTTP thread, the engine thread and other
// processes on the same cores, measured decode fell from ~700 to ~10 tokens/s. libgomp reads
// OMP_WAIT_POLICY once, when it is loaded, so setting it from main() is too late: the process
// re-executes itself once with OMP_WAIT_POLICY=passive unless the user chose a policy.
#include <unistd.h>

#include <cstdlib>

#include "cli/commands.h"

namespace glms::cli {

void ensure_openmp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default policy
}

}  // namespace glms::cli
