#include "autograd/autocast.h"

#include <map>
#include <utility>

#include "autograd/node.h"
#include "ops/cast.h"

namespace minidl::autograd {

namespace {

struct CachedCast {
  std::shared_ptr<TensorImpl> source;  // keeps the key's address from being reused while cached
  Tensor copy;                         // the cast data, without autograd history
};

struct AutocastState {
  DType dtype = DType::f32;
  int depth = 0;  // open guards; the cache is dropped when the last one closes
  std::map<std::pair<const TensorImpl*, DType>, CachedCast> cache;
};

thread_local AutocastState t_state;

bool is_cast_source(DType dt) { return dt == DType::f32 || ops::is_half(dt); }

}  // namespace

DType autocast_dtype() { return t_state.dtype; }

AutocastGuard::AutocastGuard(DType dtype) : prev_(t_state.dtype) {
  MINIDL_CHECK(dtype == DType::f32 || ops::is_half(dtype), "AutocastGuard: expected bf16, f16 or f32 (off), got ",
               dtype);
  t_state.dtype = dtype;
  ++t_state.depth;
}

AutocastGuard::~AutocastGuard() {
  t_state.dtype = prev_;
  if (--t_state.depth == 0) t_state.cache.clear();
}

Tensor autocast_to(const Tensor& t, DType dt) {
  if (!t.defined() || t.dtype() == dt) return t;
  Tensor data;
  bool cacheable = t_state.depth > 0 && t.is_leaf() && t.requires_grad();
  if (cacheable) {
    auto key = std::make_pair(static_cast<const TensorImpl*>(t.impl()), dt);
    auto it = t_state.cache.find(key);
    if (it == t_state.cache.end()) {
      MemoryTagGuard tag(MemTag::kParams);  // a working copy of a parameter, not an activation
      it = t_state.cache.emplace(key, CachedCast{t.impl_ptr(), ops::cast(t, dt)}).first;
    }
    data = it->second.copy;
  } else {
    data = ops::cast(t, dt);
  }
  // A fresh handle per use: each use records its own (stateless) cast node, so a cached copy can be
  // backpropagated through any number of times.
  DType src = t.dtype();
  return record("autocast_cast", {t}, data.detach(),
                [src](const Tensor& g) { return std::vector<Tensor>{ops::cast(g, src)}; });
}

Tensor autocast_to_half(const Tensor& t) {
  if (!autocast_enabled() || !t.defined() || !is_cast_source(t.dtype())) return t;
  return autocast_to(t, t_state.dtype);
}

Tensor autocast_to_f32(const Tensor& t) {
  if (!autocast_enabled() || !t.defined() || !ops::is_half(t.dtype())) return t;
  return autocast_to(t, DType::f32);
}

int64_t autocast_cached_weights() { return int64_t(t_state.cache.size()); }

void autocast_provide(const Tensor& param, const Tensor& copy) {
  MINIDL_ASSERT(t_state.depth > 0 && copy.shape() == param.shape(), "autocast_provide outside a guard or of shape ",
                copy.shape(), " for ", param.shape());
  t_state.cache[{param.impl(), copy.dtype()}] = CachedCast{param.impl_ptr(), copy};
}

void autocast_forget(const Tensor& param, DType dt) { t_state.cache.erase({param.impl(), dt}); }

}  // namespace minidl::autograd
