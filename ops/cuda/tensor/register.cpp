#include "ops/cuda/tensor/register.h"

#include <vector>

namespace minidl::ops::cuda {
namespace {

// A function-local static: registrars run during static initialisation, in any order of the files.
std::vector<void (*)()>& registrars() {
  static std::vector<void (*)()> list;
  return list;
}

}  // namespace

namespace detail {
bool add_registrar(void (*registrar)()) {
  registrars().push_back(registrar);
  registrar();
  return true;
}
}  // namespace detail

void register_kernels() {
  for (auto* registrar : registrars()) registrar();
}

}  // namespace minidl::ops::cuda
