// The roofline of one GPT training step (bench_gpu_roofline): for each kernel of the step, the FLOPs it does and
// the bytes it must move through HBM at least (every input read once, every output written once), and its ideal
// time on a named GPU, max(FLOPs / peak, bytes / bandwidth). Their sum is the step's lower bound; the model's
// FLOPs over (lower bound x peak) is the MFU no implementation of this kernel list can beat.
//
//   RooflineConfig cfg{12, 12, 768, 1024, 16, 50257, DType::bf16};
//   for (const KernelCost& k : step_kernels(cfg)) ... ideal_seconds(k, *find_gpu("H100"), cfg.amp) ...
//
// FLOPs follow nanoGPT's model-FLOP convention (nn::GPT::flops_per_token: 6 per parameter per token plus
// 12·L·C·T for attention, causal masking not halved), attributed to the kernel that touches the parameter: a
// linear layer's GEMMs carry its weight and bias, layernorm its gain and bias, the head the tied wte. Kernels
// that the convention does not count (attention's softmax aside, the loss, AdamW, casts) show 0 FLOPs and only
// bytes. Bytes: products and attention in the step's dtype (2 bytes with --amp, else 4), the residual stream,
// layernorm statistics, the loss, gradients and optimizer state in f32 (minidl's mixed-precision policy).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace minidl::bench {

// Dense peaks from NVIDIA's datasheets (H100 Tensor Core GPU datasheet, SXM5, which lists the H200 SXM beside it;
// A100 80GB datasheet, SXM4):
// bf16/f16 tensor-core TFLOP/s without sparsity, FP32 (non-tensor) TFLOP/s, HBM bandwidth in GB/s.
struct GpuPeak {
  const char* name;
  double half_tflops, f32_tflops, hbm_gbps;
};
inline constexpr GpuPeak kGpuPeaks[] = {
    {"H200", 989.0, 67.0, 4800.0},  // H200 SXM 141GB HBM3e: the H100's compute, 4.8 TB/s
    {"H100", 989.0, 67.0, 3350.0},  // H100 SXM5 80GB HBM3
    {"A100", 312.0, 19.5, 2039.0},  // A100 SXM4 80GB HBM2e
};

inline const GpuPeak* find_gpu(const std::string& name) {
  for (const GpuPeak& g : kGpuPeaks)
    if (name == g.name) return &g;
  return nullptr;
}

// Which kernels step_kernels() lists, for the comparison issue #15 asks for. The arithmetic is the same in all
// three; what differs is where it runs and what it moves. With 16-bit amp only (f32 runs the same kernels in all
// but for the residual add fused into ln_2 from kNow on, and over the padded vocabulary from kNow on: a padding whose
// gain, aligned rows, a roofline does not see):
//   kBefore: attention on the CUDA cores in f32 (the FP32 peak), one sequence per launch, its q, k, v, output and
//            their gradients copied to f32 and back; layernorm and bias + GELU in f32 between casts of their 16-bit
//            inputs and outputs; the residual add before ln_2 a kernel of its own; weight gradients written by the
//            GEMMs in 16 bits, then cast; plus everything kNow still does.
//   kNow:    what the code does today: flash attention on the tensor cores (16-bit in and out, all B*H in one
//            launch), layernorm reading and writing 16 bits directly, the MLP's bias + GELU in the c_fc GEMM's
//            epilogue (which also writes the GELU input) and its gradient with c_fc's bias gradient in the epilogue
//            of the c_proj input-gradient GEMM (which also reads the GELU input): no GELU kernel either way,
//            the residual add fused into ln_2 (forward and backward), weight gradients written in f32 by the GEMMs,
//            the vocabulary padded to a multiple of 64 (Vp: the head's GEMMs run over Vp rows) and the fused
//            classifier reading the 16-bit logits as they are (dlogits written over them, no casts). (kBefore: V
//            rows, and the cross-entropy in f32 between casts.)
//   kTarget: the 16-bit-native path of issue #15: no casts, the bias and GELU inside the GEMMs' epilogues,
//            weight gradients accumulated in f32 by the GEMM. (kNow reaches it.)
enum class KernelSet { kBefore, kNow, kTarget };

struct RooflineConfig {
  int64_t layers = 12, heads = 12, embd = 768, seq = 1024, batch = 16, vocab = 50257;
  DType amp = DType::bf16;  // f32 (off), bf16 or f16
  KernelSet kernels = KernelSet::kNow;
};

// One kind of kernel of the step: `launches` launches, each doing `flops` and moving `bytes`.
struct KernelCost {
  std::string name;
  int64_t launches = 0;
  double flops = 0, bytes = 0;
  bool cuda_cores = false;   // f32 arithmetic without tensor cores: bounded by the FP32 peak whatever the amp
  double padding_flops = 0;  // done on padding (the vocabulary's): in the kernel's time, not in the model's FLOPs
};

inline double peak_flops(const GpuPeak& gpu, DType amp) {
  return (amp == DType::f32 ? gpu.f32_tflops : gpu.half_tflops) * 1e12;
}

// max(FLOPs / peak, bytes / bandwidth) per launch, times the launches.
inline double ideal_seconds(const KernelCost& k, const GpuPeak& gpu, DType amp) {
  const double peak = peak_flops(gpu, k.cuda_cores ? DType::f32 : amp);
  return double(k.launches) * std::max((k.flops + k.padding_flops) / peak, k.bytes / (gpu.hbm_gbps * 1e9));
}

inline bool compute_bound(const KernelCost& k, const GpuPeak& gpu, DType amp) {
  return (k.flops + k.padding_flops) / peak_flops(gpu, k.cuda_cores ? DType::f32 : amp) >
         k.bytes / (gpu.hbm_gbps * 1e9);
}

// The kernels of one step (forward, backward, gradient clipping's norm, AdamW, zero_grad), per kind.
inline std::vector<KernelCost> step_kernels(const RooflineConfig& c) {
  const double L = double(c.layers), C = double(c.embd), T = double(c.seq), V = double(c.vocab);
  const double BT = double(c.batch) * T, s = double(dtype_size(c.amp)), f = 4.0;
  const double params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;  // wpe sized for T = block size
  // gelu_epilogue: the MLP's GELU (forward and backward) in the GEMMs' epilogues, since kNow;
  // f32_attention: attention on the CUDA cores, one sequence per launch (kBefore, with amp).
  const bool half = c.amp != DType::f32;
  const bool gelu_epilogue = c.kernels != KernelSet::kBefore, f32_attention = half && c.kernels == KernelSet::kBefore;
  // f32_norms: layernorm and bias + GELU between f32 copies; fused_residual: the add before ln_2 inside it.
  // dw16: weight gradients written in 16 bits by the GEMM, then cast to f32.
  const bool f32_norms = f32_attention, fused_residual = c.kernels != KernelSet::kBefore, dw16 = f32_attention;
  const double cast = s + f;  // a cast reads one dtype and writes the other
  // The head's table has Vp rows (nn::GPTConfig::vocab_pad's default 64) since kNow; the classifier reads 16-bit
  // logits as they are (V of each row of Vp) and writes dlogits over them (Vp), with amp, since kNow.
  const double Vp = c.kernels == KernelSet::kBefore ? V : std::ceil(V / 64) * 64;
  const bool classifier_f32 = half && c.kernels == KernelSet::kBefore;
  const double ce = classifier_f32 ? f : s;
  const double hn = f32_norms ? f : s;  // what layernorm and bias + GELU move per 16-bit element
  std::vector<KernelCost> k;
  auto add = [&](std::string name, double launches, double flops, double bytes, bool cuda_cores = false,
                 double padding_flops = 0) {
    k.push_back({std::move(name), int64_t(launches), flops, bytes, cuda_cores, padding_flops});
  };
  // A linear layer x (BT, in) -> (BT, out) with bias: forward, then the input's and the weight's gradients (the
  // bias gradient, a column sum of dy, with the weight's; the convention's 6 FLOPs per bias element per token
  // split 2 forward, 4 there). Before: the weight gradient written in 16 bits, then cast to f32.
  auto linear = [&](const std::string& name, double in, double out, bool bias) {
    const double b = bias ? out : 0;
    add(name + " fwd", L, 2 * BT * (in * out + b), s * (BT * in + in * out + b + BT * out));
    add(name + " bwd dx", L, 2 * BT * in * out, s * (BT * out + in * out + BT * in));
    add(name + " bwd dw", L, 2 * BT * (in * out + 2 * b), s * (BT * in + BT * out) + (dw16 ? s : f) * (in * out + b));
    if (dw16) add(name + " dw cast to f32", L, 0, cast * (in * out + b));
  };
  // A GEMM's epilogue that reads or writes one more (BT, n) matrix: bytes in the same launch.
  auto epilogue_bytes = [&](const std::string& name, double bytes) {
    for (KernelCost& kc : k)
      if (kc.name == name) kc.bytes += bytes;
  };
  add("embedding fwd (wte + wpe)", 1, 0, 8 * BT + f * (BT * C + T * C) + f * BT * C);
  // ln_2 with the residual add fused: reads the add's two inputs, writes the sum and the normalised rows.
  const double ln_fwd_bytes = BT * C * (f + hn) + 2 * C * f + 2 * BT * f;
  if (fused_residual) {
    add("layernorm fwd", L + 1, 2 * BT * 2 * C, ln_fwd_bytes);
    add("residual add + layernorm fwd", L, 2 * BT * 2 * C, ln_fwd_bytes + f * 2 * BT * C);
  } else {
    add("layernorm fwd", 2 * L + 1, 2 * BT * 2 * C, ln_fwd_bytes);
  }
  if (f32_norms) add("layernorm fwd out cast", 2 * L + 1, 0, cast * BT * C);
  linear("linear qkv", C, 3 * C, true);
  if (f32_attention) {
    // One sequence per launch, f32 on the CUDA cores; q, k, v cast to f32 before, the output back after.
    add("attention fwd (f32, per sequence)", L * double(c.batch), 4 * T * T * C,
        f * 4 * T * C + f * T * double(c.heads), true);
    add("attention fwd casts", L, 0, cast * 4 * BT * C);
  } else {
    add("attention fwd", L, 4 * BT * T * C, s * 4 * BT * C + f * BT * double(c.heads));
  }
  linear("linear attn proj", C, C, true);
  add("residual add", fused_residual ? L : 2 * L, 0, f * 3 * BT * C);
  linear("linear fc", C, 4 * C, true);
  if (f32_norms) {
    add("bias + gelu fwd (f32)", L, 0, f * 2 * 4 * BT * C + f * 4 * C);
    add("bias + gelu fwd casts", L, 0, cast * 2 * 4 * BT * C);
  } else if (gelu_epilogue) {
    epilogue_bytes("linear fc fwd", s * 4 * BT * C);  // GELU_AUX_BIAS also writes the GELU input for backward
  } else {
    add("bias + gelu fwd", L, 0, s * 2 * 4 * BT * C + s * 4 * C);
  }
  linear("linear mlp proj", 4 * C, C, true);
  // The tied head: logits = ln_f(x) wte^T, no bias; in linear()'s terms one "layer".
  // The padded rows' products are work the GEMMs do but not model FLOPs (MFU counts the model's).
  const double pad = 2 * BT * C * (Vp - V);
  add("lm head fwd", 1, 2 * BT * C * V, s * (BT * C + Vp * C + BT * Vp), false, pad);
  add("lm head bwd dx", 1, 2 * BT * C * V, s * (BT * Vp + Vp * C + BT * C), false, pad);
  add("lm head bwd dw", 1, 2 * BT * C * V, s * (BT * C + BT * Vp) + (dw16 ? s : f) * Vp * C, false, pad);
  if (dw16) add("lm head dw cast to f32", 1, 0, cast * Vp * C);
  add("cross-entropy fwd", 1, 0, ce * BT * V + 8 * BT + f * 2 * BT);
  add("cross-entropy bwd", 1, 0, ce * BT * (V + Vp) + 8 * BT + f * BT);
  if (classifier_f32) add("cross-entropy casts (logits in, dlogits out)", 1, 0, cast * 2 * BT * V);
  if (gelu_epilogue) {
    epilogue_bytes("linear mlp proj bwd dx", s * 4 * BT * C);  // DGELU_BGRAD also reads the GELU input
  } else {
    add("gelu bwd", L, 0, hn * 3 * 4 * BT * C);
    if (f32_norms) add("gelu bwd casts", L, 0, cast * 3 * 4 * BT * C);
  }
  if (f32_attention) {
    add("attention bwd (f32, per sequence)", L * double(c.batch), 8 * T * T * C,
        f * 8 * T * C + f * T * double(c.heads), true);
    add("attention bwd casts", L, 0, cast * 8 * BT * C);
  } else {
    add("attention bwd", L, 8 * BT * T * C, s * 8 * BT * C + f * BT * double(c.heads));
  }
  // Fused: dx also adds the residual stream's gradient, read in the same pass (no separate grad add).
  const double ln_bwd_bytes = BT * C * (hn + 2 * f) + 2 * BT * f + 2 * C * f;
  if (fused_residual) {
    add("layernorm bwd", L + 1, 4 * BT * 2 * C, ln_bwd_bytes);
    add("layernorm + residual grad bwd", L, 4 * BT * 2 * C, ln_bwd_bytes + f * BT * C);
  } else {
    add("layernorm bwd", 2 * L + 1, 4 * BT * 2 * C, ln_bwd_bytes);
  }
  if (f32_norms) add("layernorm bwd dy cast", 2 * L + 1, 0, cast * BT * C);
  add("residual grad add", fused_residual ? L : 2 * L, 0, f * 3 * BT * C);
  add("embedding bwd", 1, 0, f * BT * C + 8 * BT + f * (V * C + T * C));
  if (c.amp != DType::f32) add("weight cast to 16 bits", 1, 0, (f + s) * params);
  add("grad norm (clip)", 1, 0, f * params);
  add("AdamW", 1, 0, f * 7 * params);  // reads p, g, m, v; writes p, m, v
  add("zero_grad", 1, 0, f * params);
  return k;
}

// The model FLOPs of a step (equal to nn::GPT::flops_per_token(T) x B x T: tests/nn/test_roofline.cpp).
inline double step_flops(const std::vector<KernelCost>& kernels) {
  double total = 0;
  for (const KernelCost& k : kernels) total += double(k.launches) * k.flops;
  return total;
}

}  // namespace minidl::bench
