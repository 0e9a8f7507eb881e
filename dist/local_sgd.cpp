#include "dist/local_sgd.h"

#include <chrono>
#include <utility>

#include "core/trace.h"

namespace minidl::dist {

OuterKind outer_kind(const std::string& name) {
  if (name == "local-sgd") return OuterKind::kLocalSgd;
  if (name == "diloco") return OuterKind::kDiLoCo;
  MINIDL_CHECK(false, "outer synchronisation '", name, "': expected local-sgd or diloco");
  return OuterKind::kLocalSgd;
}

const char* outer_kind_name(OuterKind kind) { return kind == OuterKind::kLocalSgd ? "local-sgd" : "diloco"; }

OuterSync::OuterSync(std::vector<Tensor> params, ProcessGroup& replicas, OuterOptions options)
    : params_(std::move(params)), replicas_(replicas), options_(options) {
  check_params();
  // One starting point for every replica: replica 0's parameters.
  Tensor flat = Tensor::from_vector(read_params(), {numel_});
  replicas_.broadcast(flat, 0)->wait();
  std::vector<float> start = flat.to_float_vector();
  write_params(start);
  if (options_.kind == OuterKind::kDiLoCo) {
    global_ = std::move(start);
    momentum_.assign(size_t(numel_), 0.0f);
  }
}

OuterSync::OuterSync(std::vector<Tensor> params, ProcessGroup& replicas, OuterOptions options,
                     std::vector<float> global, std::vector<float> momentum)
    : params_(std::move(params)),
      replicas_(replicas),
      options_(options),
      global_(std::move(global)),
      momentum_(std::move(momentum)) {
  check_params();
  const size_t kept = options_.kind == OuterKind::kDiLoCo ? size_t(numel_) : 0;
  MINIDL_CHECK(global_.size() == kept && momentum_.size() == kept, "OuterSync: expected ", kept,
               " values each of θ_global and the outer momentum, got ", global_.size(), " and ", momentum_.size());
}

void OuterSync::check_params() {
  MINIDL_CHECK(options_.every >= 1, "OuterSync: every (H) must be at least 1, got ", options_.every);
  MINIDL_CHECK(options_.kind == OuterKind::kDiLoCo || options_.compression == Compression::kNone, "OuterSync: a ",
               compression_name(options_.compression),
               " hook compresses DiLoCo's pseudo-gradients; local SGD averages the parameters themselves (DiLoCo "
               "with outer lr 1 and no momentum is local SGD)");
  MINIDL_CHECK(replicas_.device().is_cpu(), "OuterSync: the replica group must serve the host (its buffers are there)");
  for (const Tensor& p : params_) {
    MINIDL_CHECK(p.dtype() == DType::f32 && p.is_contiguous(), "OuterSync: parameters must be contiguous f32, got ",
                 dtype_name(p.dtype()), p.is_contiguous() ? "" : " (not contiguous)");
    numel_ += p.numel();
  }
}

std::vector<float> OuterSync::read_params() const {
  std::vector<float> flat;
  flat.reserve(size_t(numel_));
  for (const Tensor& p : params_) {
    const std::vector<float> v = p.detach().to(Device::cpu()).to_float_vector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

void OuterSync::write_params(const std::vector<float>& flat) {
  int64_t at = 0;
  for (Tensor& p : params_) {
    const std::vector<float> piece(flat.begin() + at, flat.begin() + at + p.numel());
    p.detach().copy_(Tensor::from_vector(piece, p.shape()));
    at += p.numel();
  }
}

bool OuterSync::after_step(int64_t steps_done) {
  if (steps_done <= 0 || steps_done % options_.every != 0) return false;
  sync();
  return true;
}

bool OuterSync::finish(int64_t steps_done) {
  if (steps_done <= 0 || steps_done % options_.every == 0) return false;  // the last window was synced already
  sync();
  return true;
}

void OuterSync::sync() {
  const trace::Span span("outer sync");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> local = read_params();
  if (options_.kind == OuterKind::kDiLoCo)
    for (size_t i = 0; i < local.size(); ++i) local[i] = global_[i] - local[i];  // Δ_r = θ_global − θ_r
  Tensor flat = Tensor::from_vector(local, {numel_});
  average(replicas_, flat, options_.compression)->wait();  // mean over the replicas: of θ_r, or of Δ_r
  std::vector<float> mean = flat.to_float_vector();
  if (options_.kind == OuterKind::kDiLoCo) {
    const float mu = float(options_.momentum), lr = float(options_.lr);
    for (size_t i = 0; i < mean.size(); ++i) {
      const float d = mean[i];
      const float m = mu * momentum_[i] + d;
      momentum_[i] = m;
      const float update = options_.nesterov ? d + mu * m : m;
      global_[i] = global_[i] - lr * update;
    }
    write_params(global_);
  } else {
    write_params(mean);
  }
  stats_.syncs += 1;
  stats_.bytes += uint64_t(numel_) * (options_.compression == Compression::kNone ? sizeof(float) : 2);
  stats_.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace minidl::dist
