// Embedding on the CPU: a row copy per position forward; backward scatter-adds with each thread owning a range
// of vocabulary rows, so no two threads write one row and every row sums its positions in increasing order.
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/parallel.h"
#include "ops/embedding.h"

namespace minidl::ops {

// Throws naming the first id outside [0, V).
template <class I>
static void check_ids_in_range(const I* ids, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i)
    MINIDL_CHECK(ids[i] >= 0 && int64_t(ids[i]) < V, "embedding: id ", int64_t(ids[i]), " at position ", i,
                 " is out of range for a vocabulary of V = ", V, " rows (expected 0 <= id < ", V, ")");
}

static Shape output_shape(const Tensor& ids, int64_t C) {
  Shape s = ids.shape();
  s.push_back(C);
  return s;
}

static bool g_deterministic_embedding_backward = true;
void set_deterministic_embedding_backward(bool deterministic) { g_deterministic_embedding_backward = deterministic; }
bool deterministic_embedding_backward() { return g_deterministic_embedding_backward; }

static thread_local bool t_indices_checked_on_host = false;
HostCheckedIndicesGuard::HostCheckedIndicesGuard() : previous_(std::exchange(t_indices_checked_on_host, true)) {}
HostCheckedIndicesGuard::~HostCheckedIndicesGuard() { t_indices_checked_on_host = previous_; }
bool indices_checked_on_host() { return t_indices_checked_on_host; }

void embedding_check_ids(const Tensor& ids, int64_t vocab) {
  check_index("embedding", "ids", ids);
  dispatch_index(ids, [&](auto itag) {
    using I = decltype(itag);
    check_ids_in_range(ids.data<I>(), ids.numel(), vocab);
  });
}

Tensor embedding_forward(const Tensor& weight, const Tensor& ids) {
  check_embedding(weight, ids);
  MINIDL_CHECK(ids.device() == weight.device(), "embedding: expected ids on ", weight.device(), ", got ", ids.device());
  if (!weight.device().is_cpu()) return embedding_forward_device(weight.device())(weight, ids);
  int64_t V = weight.size(0), C = weight.size(1), n = ids.numel();
  Tensor out = Tensor::empty(output_shape(ids, C), weight.dtype(), weight.device());
  dispatch_index(ids, [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids_in_range(id, n, V);
    size_t row_bytes = size_t(C) * dtype_size(weight.dtype());
    const char* w = static_cast<const char*>(weight.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(o + i * row_bytes, w + int64_t(id[i]) * row_bytes, row_bytes);
    });
  });
  return out;
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t vocab_size) {
  check_index("embedding_backward", "ids", ids);
  check_float("embedding_backward", "grad_out", grad_out);
  MINIDL_CHECK(grad_out.dim() >= 1 && grad_out.shape() == output_shape(ids, grad_out.size(-1)),
               "embedding_backward: expected grad_out of shape (*ids.shape, C) with ids of shape ", ids.shape(),
               ", got ", grad_out.shape());
  MINIDL_CHECK(ids.device() == grad_out.device(), "embedding_backward: expected ids on ", grad_out.device(), ", got ",
               ids.device());
  if (!grad_out.device().is_cpu()) return embedding_backward_device(grad_out.device())(grad_out, ids, vocab_size);
  int64_t C = grad_out.size(-1), n = ids.numel();
  Tensor dweight = Tensor::zeros({vocab_size, C}, grad_out.dtype(), grad_out.device());
  dispatch_float("embedding_backward", grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad_out.data<T>();
    T* dw = dweight.data<T>();
    dispatch_index(ids, [&](auto itag) {
      using I = decltype(itag);
      const I* id = ids.data<I>();
      check_ids_in_range(id, n, vocab_size);
      // Each thread scans all positions (cheap: n ids) and adds only those in its vocabulary range.
      parallel_for(0, vocab_size, 1, [&](int64_t v0, int64_t v1) {
        for (int64_t i = 0; i < n; ++i) {
          int64_t v = int64_t(id[i]);
          if (v < v0 || v >= v1) continue;
          T* dst = dw + v * C;
          const T* src = g + i * C;
          for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
        }
      });
    });
  });
  return dweight;
}

}  // namespace minidl::ops
