// Each bind_*.cpp adds its functions to the module through a registrar, so adding a kernel family
// touches no shared file: BNB_BINDINGS(blockwise) { m.def(...); }
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

namespace bnb {

using BindFn = void (*)(nanobind::module_&);
std::vector<BindFn>& binding_registry();

struct BindingRegistrar {
  explicit BindingRegistrar(BindFn fn) { binding_registry().push_back(fn); }
};

}  // namespace bnb

#define BNB_BINDINGS(family)                                                 \
  static void bnb_bind_##family(nanobind::module_& m);                       \
  static ::bnb::BindingRegistrar bnb_registrar_##family(&bnb_bind_##family); \
  static void bnb_bind_##family(nanobind::module_& m)
