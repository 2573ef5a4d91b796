// Which threads run bnb::parallel_for (common.h): the OpenMP team torch already loaded, or our own pool.
#pragma once

namespace bnb {

// "auto", "openmp" or "pool": what parallel_for uses (the first call decides when nothing was set; "auto"
// where an OpenMP runtime is loaded: its team, or the pool while the machine is oversubscribed).
const char* thread_runtime();
// "openmp", "pool" or "auto" ("pool" when the process has no OpenMP runtime loaded). Throws
// std::invalid_argument for anything else, or for "openmp" when no runtime is loaded or after fork().
void set_thread_runtime(const char* name);

}  // namespace bnb
