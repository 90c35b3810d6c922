#include <cstdlib>

#include "comm/mpi_world.h"

namespace glms::comm {

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (const char* value = std::getenv(name); value && *value) return true;
  return false;
}

}  // namespace glms::comm
