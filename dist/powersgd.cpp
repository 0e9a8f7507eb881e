#include "dist/powersgd.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace minidl::dist {

namespace {

// Orthonormal columns, in place, by modified Gram-Schmidt (PyTorch's _orthogonalize_gram_schmidt). A column that
// the earlier ones nearly span (what is left of it below 1e-4 of its first length: a rank-deficient gradient's
// noise, which normalising would blow up into a direction not orthogonal to the others) becomes zero and adds
// nothing. `p`: rows × rank, row-major.
void orthonormalize(std::vector<float>& p, int64_t rows, int64_t rank) {
  auto norm = [&](int64_t i) {
    double n = 0;
    for (int64_t r = 0; r < rows; ++r) n += double(p[size_t(r * rank + i)]) * p[size_t(r * rank + i)];
    return std::sqrt(n);
  };
  std::vector<double> first(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) first[size_t(i)] = norm(i);
  for (int64_t i = 0; i < rank; ++i) {
    const double n = norm(i);
    const float scale = n > 1e-4 * first[size_t(i)] && n > 0 ? float(1.0 / n) : 0.0f;
    for (int64_t r = 0; r < rows; ++r) p[size_t(r * rank + i)] *= scale;
    for (int64_t j = i + 1; j < rank; ++j) {
      double dot = 0;
      for (int64_t r = 0; r < rows; ++r) dot += double(p[size_t(r * rank + i)]) * p[size_t(r * rank + j)];
      for (int64_t r = 0; r < rows; ++r) p[size_t(r * rank + j)] -= float(dot) * p[size_t(r * rank + i)];
    }
  }
}

Tensor flat(std::vector<float>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

}  // namespace

PowerSgd::PowerSgd(PowerSgdOptions options) : options_(options) {
  MINIDL_CHECK(options_.rank >= 1, "PowerSGD: the rank must be at least 1, got ", options_.rank);
  MINIDL_CHECK(options_.start_iter >= 0, "PowerSGD: start_iter must be >= 0, got ", options_.start_iter);
}

void PowerSgd::bind(const std::vector<BucketSpec>& buckets, const std::vector<Tensor>& params) {
  buckets_.assign(buckets.size(), {});
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (size_t k = 0; k < buckets[b].params.size(); ++k) {
      const Tensor& p = params[buckets[b].params[k]];
      const int64_t offset = buckets[b].offsets[k], numel = p.numel();
      const int64_t rows = p.shape().size() >= 2 ? p.shape()[0] : 1, cols = rows > 0 ? numel / rows : 0;
      const int64_t rank = std::min<int64_t>(options_.rank, std::min(rows, cols));
      const bool compress = p.shape().size() >= 2 && rank >= 1 &&
                            double(rows) * double(cols) >= options_.min_compression_rate * double(rows + cols) * rank;
      if (!compress) {
        buckets_[b].rest.emplace_back(offset, numel);
        continue;
      }
      Matrix m{offset, rows, cols, rank, std::vector<float>(size_t(cols * rank))};
      const Philox rng(options_.seed, uint64_t(b) * 1000003 + k);
      for (size_t i = 0; i < m.q.size(); ++i) m.q[i] = rng.normal(i);
      buckets_[b].matrices.push_back(std::move(m));
    }
  }
}

std::shared_ptr<Work> PowerSgd::reduce(ProcessGroup& group, size_t b, Tensor& buffer) {
  MINIDL_CHECK(b < buckets_.size(), "PowerSGD: bucket ", b, " was not bound (call bind with the reducer's buckets)");
  MINIDL_CHECK(buffer.device().is_cpu() && buffer.dtype() == DType::f32,
               "PowerSGD: compresses f32 buckets on the CPU, got ", dtype_name(buffer.dtype()), " on ",
               buffer.device());
  Bucket& bk = buckets_[b];
  if (bk.steps++ < options_.start_iter || group.size() == 1) return group.all_reduce(buffer, ReduceOp::kAvg);
  float* g = buffer.data<float>();
  const auto numel = size_t(buffer.numel());
  if (bk.error.empty()) bk.error.assign(numel, 0.0f);
  for (size_t i = 0; i < numel; ++i) g[i] += bk.error[i];  // M_k = g_k + e_k
  std::vector<float> input(g, g + numel);

  // P = M Q for every matrix, summed over the ranks in one all-reduce.
  std::vector<float> ps;
  for (const Matrix& m : bk.matrices)
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t j = 0; j < m.rank; ++j) {
        float s = 0;
        for (int64_t c = 0; c < m.cols; ++c) s += g[m.offset + r * m.cols + c] * m.q[size_t(c * m.rank + j)];
        ps.push_back(s);
      }
  Tensor p_all = flat(ps);
  group.all_reduce(p_all, ReduceOp::kSum)->wait();
  ps = p_all.to_float_vector();
  // Q = mean of Mᵀ P, after P's columns are made orthonormal.
  std::vector<float> qs;
  for (size_t at = 0, i = 0; i < bk.matrices.size(); ++i) {
    const Matrix& m = bk.matrices[i];
    std::vector<float> p(ps.begin() + int64_t(at), ps.begin() + int64_t(at) + m.rows * m.rank);
    orthonormalize(p, m.rows, m.rank);
    std::copy(p.begin(), p.end(), ps.begin() + int64_t(at));
    at += size_t(m.rows * m.rank);
    for (int64_t c = 0; c < m.cols; ++c)
      for (int64_t j = 0; j < m.rank; ++j) {
        float s = 0;
        for (int64_t r = 0; r < m.rows; ++r) s += g[m.offset + r * m.cols + c] * p[size_t(r * m.rank + j)];
        qs.push_back(s);
      }
  }
  // The spans sent whole ride in the same f32 all-reduce as the Qs.
  std::vector<float> both = qs;
  for (auto [offset, n] : bk.rest) both.insert(both.end(), g + offset, g + offset + n);
  Tensor q_all = flat(both);
  group.all_reduce(q_all, ReduceOp::kAvg)->wait();
  both = q_all.to_float_vector();
  // M̂ = P Qᵀ; the whole spans' mean as it came; e_k = M_k − M̂.
  size_t at_p = 0, at_q = 0;
  for (Matrix& m : bk.matrices) {
    std::copy(both.begin() + int64_t(at_q), both.begin() + int64_t(at_q) + m.cols * m.rank, m.q.begin());  // warm
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) {
        float s = 0;
        for (int64_t j = 0; j < m.rank; ++j) s += ps[at_p + size_t(r * m.rank + j)] * m.q[size_t(c * m.rank + j)];
        g[m.offset + r * m.cols + c] = s;
      }
    at_p += size_t(m.rows * m.rank);
    at_q += size_t(m.cols * m.rank);
  }
  for (auto [offset, n] : bk.rest) {
    std::copy(both.begin() + int64_t(at_q), both.begin() + int64_t(at_q + size_t(n)), g + offset);
    at_q += size_t(n);
  }
  for (size_t i = 0; i < numel; ++i) bk.error[i] = input[i] - g[i];
  return completed_work();
}

}  // namespace minidl::dist
