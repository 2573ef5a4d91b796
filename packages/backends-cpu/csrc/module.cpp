// The extension module: ISA control plus every kernel family's bindings.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "isa.h"

namespace nb = nanobind;

namespace bnb {
std::vector<BindFn>& binding_registry() {
  static std::vector<BindFn> fns;
  return fns;
}
}  // namespace bnb

NB_MODULE(_C, m) {
  m.doc() = "Native CPU kernels of bitsandbytes (called through bitsandbytes_cpu, never directly)";
  m.def("isa", [] { return std::string(bnb::isa_name(bnb::active_isa())); }, "The ISA level kernels run at now.");
  m.def("best_isa", [] { return std::string(bnb::isa_name(bnb::best_isa())); });
  m.def(
      "supported_isas",
      [] {
        std::vector<std::string> out;
        for (auto isa : bnb::supported_isas()) out.emplace_back(bnb::isa_name(isa));
        return out;
      },
      "Levels this build and CPU can run, lowest first.");
  m.def(
      "compiled_isas",
      [] {
        std::vector<std::string> out;
        for (auto isa : bnb::compiled_isas()) out.emplace_back(bnb::isa_name(isa));
        return out;
      },
      "Levels this build compiled, lowest first (this CPU may run fewer: supported_isas).");
  m.def("set_isa", &bnb::set_active_isa, nb::arg("name"), "Run kernels at this level (at most best_isa()).");
  m.def(
      "map_lookup", [] { return std::string(bnb::map_in_registers() ? "registers" : "gather"); },
      "How AVX-512 kernels read 8-bit code tables now: 'registers' or 'gather' (the same bits either way).");
  m.def("set_map_lookup", &bnb::set_map_lookup, nb::arg("name"),
        "'auto' (by CPU vendor: registers on AMD, the gather elsewhere), 'gather' or 'registers'.");
  for (auto fn : bnb::binding_registry()) fn(m);
}
