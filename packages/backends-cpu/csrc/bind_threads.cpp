#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "thread_pool.h"

namespace bnb {

BNB_BINDINGS(threads) {
  // Which threads the kernels' parallel loops run on (thread_pool.cpp): "openmp" (torch's team) or
  // "pool" (ours). Settable for tests and benchmarks; BNB_CPU_THREADS sets the start value.
  m.def("thread_runtime", [] { return std::string(thread_runtime()); });
  m.def("set_thread_runtime", [](const std::string& name) { set_thread_runtime(name.c_str()); }, nanobind::arg("name"));
}

}  // namespace bnb
