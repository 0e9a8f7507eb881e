// The per-element AdamW update, shared by the CPU loop (ops/cpu/adamw.cpp) and the CUDA kernel.
//
// It follows torch.optim.AdamW (single-tensor path) operation for operation, so results match PyTorch to float
// rounding:
//   p = p * (1 - lr*wd)                                  decoupled weight decay
//   m = b1*m + (1-b1)*g
//   v = b2*v + (1-b2)*g*g
//   p = p - (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// which is p -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m/(1-b1^t), v_hat = v/(1-b2^t).
//
//   AdamWConstants c = adamw_constants(lr, 0.9, 0.999, 1e-8, 0.1, /*step=*/t);
//   for (i...) adamw_element(p[i], g[i], m[i], v[i], c);
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace minidl::kernels {

// What one step needs per element, precomputed once per step on the host (in double, then rounded to float), or
// on the device when the step count lives there (a step skipped on the device's overflow flag, ops/adamw.h).
// 1 - beta is computed in double too: in float, 1 - 0.999f is off by 1.3e-5 relative, a bias PyTorch does not have.
struct AdamWConstants {
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float decay;                  // 1 - lr * weight_decay
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

// t is the 1-based step count after this step (the first step uses t = 1).
MINIDL_HD AdamWConstants adamw_constants(double lr, double beta1, double beta2, double eps, double weight_decay,
                                         int64_t t) {
  double bias_correction1 = 1.0 - pow(beta1, double(t));
  double bias_correction2 = 1.0 - pow(beta2, double(t));
  return {float(beta1),
          float(beta2),
          float(eps),
          float(1.0 - beta1),
          float(1.0 - beta2),
          float(1.0 - lr * weight_decay),
          float(lr / bias_correction1),
          float(sqrt(bias_correction2))};
}

MINIDL_HD void adamw_element(float& p, float g, float& m, float& v, const AdamWConstants& c) {
  p *= c.decay;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  p -= c.step_size * m / (sqrtf(v) / c.bias_correction2_sqrt + c.eps);
}

}  // namespace minidl::kernels
