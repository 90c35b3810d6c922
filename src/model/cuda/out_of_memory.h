// Device out-of-memory errors named by what was being made when they happened, so that a rank
// that does not fit says which part did not (the message ops::cuda::DeviceBuffer writes says
// only the allocation's size and the device's memory).
#pragma once

#include <string>

#include "core/error.h"

namespace glms::model {

// Whether `e` is a device allocation that did not fit (ops::cuda::DeviceBuffer's error).
inline bool is_device_out_of_memory(const Error& e) {
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

// Runs make(); a device out of memory inside it is rethrown as "<its message> for <what>".
template <typename Make>
auto naming_what_did_not_fit(const std::string& what, Make&& make) {
  try {
    return make();
  } catch (const Error& e) {
    if (!is_device_out_of_memory(e)) throw;
    fail(std::string(e.what()) + " for " + what);
  }
}

}  // namespace glms::model
