#include "comm/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include "core/error.h"

namespace glms::comm::nccl {

namespace {

constexpr const char* kDefaultName = "libnccl.so.2";

template <typename Function>
void resolve(const Library& lib, Function& slot, const char* symbol) {
  void* address = dlsym(lib.handle, symbol);
  if (!address)
    fail(lib.path + " has no " + symbol + ": glmserve needs NCCL 2.12 or newer (set GLMS_NCCL_LIBRARY to its libnccl.so.2)");
  slot = reinterpret_cast<Function>(address);
}

}  // namespace

std::shared_ptr<const Library> Library::load() {
  auto lib = std::make_shared<Library>();
  const char* named = std::getenv("GLMS_NCCL_LIBRARY");
  lib->path = named && *named ? named : kDefaultName;
  lib->handle = dlopen(lib->path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    const char* why = dlerror();
    fail("cannot load NCCL (" + lib->path + "): " + (why ? why : "unknown error") +
         ". Multi-GPU layouts need libnccl.so.2: set GLMS_NCCL_LIBRARY to its path (with PyTorch installed: "
         "python3 -c \"import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', "
         "'libnccl.so.2'))\"), or add its folder to LD_LIBRARY_PATH");
  }
  resolve(*lib, lib->get_version, "ncclGetVersion");
  resolve(*lib, lib->get_unique_id, "ncclGetUniqueId");
  resolve(*lib, lib->comm_init_rank, "ncclCommInitRank");
  resolve(*lib, lib->comm_init_all, "ncclCommInitAll");
  resolve(*lib, lib->comm_destroy, "ncclCommDestroy");
  resolve(*lib, lib->comm_abort, "ncclCommAbort");
  resolve(*lib, lib->get_error_string, "ncclGetErrorString");
  resolve(*lib, lib->all_reduce, "ncclAllReduce");
  resolve(*lib, lib->all_gather, "ncclAllGather");
  resolve(*lib, lib->reduce_scatter, "ncclReduceScatter");
  resolve(*lib, lib->group_start, "ncclGroupStart");
  resolve(*lib, lib->group_end, "ncclGroupEnd");
  lib->check(lib->get_version(&lib->version), "ncclGetVersion");
  if (lib->version < 21200)
    fail(lib->path + " is NCCL " + version_string(lib->version) + "; glmserve needs 2.12 or newer");
  return lib;
}

Library::~Library() {
  if (handle) dlclose(handle);
}

void Library::check(Result result, const char* call) const {
  if (result == 0) return;
  const char* message = get_error_string ? get_error_string(result) : nullptr;
  fail(std::string(call) + " failed: " + (message ? message : "NCCL error " + std::to_string(result)));
}

std::string version_string(int version) {
  // NCCL 2.9+ encodes major * 10000 + minor * 100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace glms::comm::nccl
