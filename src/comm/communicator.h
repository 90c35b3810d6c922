// Collectives between the ranks of one parallel group (the tensor-parallel peers of an attention
// group, the data-parallel peers of a tensor-parallel rank): what the model calls between its
// layers. Two implementations: CPU ranks as threads of one process over shared memory
// (cpu_group.h, on any machine, so that every layout is tested in CI) and NCCL over GPUs
// (nccl_communicator.h, libnccl loaded at run time).
//
// Contract: every rank of a group calls the same collectives, with the same counts and element
// types, in the same order. A CPU collective returns when its result is in place; a device one
// when it is enqueued on `stream` (ordered after the work before it there). Sums are the same
// bits on every rank, so replicated state (the latent cache of tensor-parallel peers) stays
// identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace glms::comm {

enum class Element : uint8_t { F32, BF16, I32 };
size_t element_size(Element type);

// cudaStream_t for device communicators (declared opaquely so that no vendor header is needed);
// CPU communicators ignore it.
using Stream = void*;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "cpu", "nccl", ...
  // Whether the collectives can be captured into a CUDA graph (they only enqueue on the stream).
  virtual bool graph_capturable() const { return false; }
  // Ends every collective in flight (a peer failed), from any thread; the communicator cannot be
  // used afterwards. Returns without waiting for the collectives to end.
  virtual void abort() {}
  // Collectives between begin_group() and end_group() may go out as one launch (NCCL's group
  // calls): none of them may read another's result.
  virtual void begin_group() {}
  virtual void end_group() {}

  // data [count] on every rank becomes the element-wise sum over the ranks.
  virtual void all_reduce_sum(void* data, size_t count, Element type, Stream stream = nullptr) = 0;
  // send [count] on every rank; recv [size() * count], rank r's values at r * count.
  virtual void all_gather(const void* send, void* recv, size_t count, Element type, Stream stream = nullptr) = 0;
  // send [size() * count] on every rank; recv [count] = the sum over ranks of their
  // send[rank() * count, (rank() + 1) * count).
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, Element type,
                                  Stream stream = nullptr) = 0;
};

}  // namespace glms::comm
