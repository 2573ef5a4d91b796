// Which threads run bnb::parallel_for (common.h): the OpenMP team torch already loaded, or our own pool.
#pragma once

namespace bnb {

// "openmp" or "pool": what parallel_for uses now (the first call decides when nothing was set).
const char* thread_runtime();
// "openmp", "pool" or "auto" (openmp when the process has an OpenMP runtime loaded, else pool). Throws
// std::invalid_argument for anything else, or for "openmp" when no runtime is loaded or after fork().
void set_thread_runtime(const char* name);

}  // namespace bnb
