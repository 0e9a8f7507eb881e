// The sgemm ceiling of a GPT training step: what the step's own matrix products reach in the f32 GEMM the step
// itself runs (ops::matmul: minidl's kernel, or OpenBLAS where ops::cpu_gemm() says so) when each is timed alone,
// single-threaded, times the number of cores. Timing OpenBLAS instead would misjudge a CPU its build does not know
// (it falls back to a generic kernel: on a family 6 model 207 Xeon, OpenBLAS 0.3.21 picks "Prescott", a third of
// minidl's kernel's speed). A step that spends all its time in GEMMs at full speed
// on every core would reach it; the gap is the elementwise ops, attention and the threads' imbalance.
//
//   ops::SgemmCeiling ceiling({layers, embd, vocab, batch * seq});
//   double gflops = ceiling.measure(threads);   // one round: every product once, warm, on one thread
//
// Products per linear layer (x: rows x in, W: in x out, the Conv1D layout of nn::Linear): the forward x W, the
// input gradient dY W^T and the weight gradient x^T dY; the layers are c_attn (C -> 3C), attn.c_proj (C -> C),
// mlp.c_fc (C -> 4C) and mlp.c_proj (4C -> C) per block, and the tied head x wte^T (C -> V) with its two
// gradients. Attention's own tile products are not included (they are counted in the FLOPs, not here).
//
// A shared machine's speed drifts over seconds (a cloud VM's neighbours), so a ceiling measured once, before or
// after the steps, can be 20% off the speed the steps saw. bench_gpt_step therefore measures a round between
// groups of steps and compares each step with the round nearest in time; train_gpt measures one round before its
// first step, for the MFU its lines print on the CPU.
#pragma once

#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/matmul.h"

namespace minidl::ops {

struct GptShape {
  int64_t layers, embd, vocab, rows;  // rows = batch * seq tokens
};

class SgemmCeiling {
 public:
  explicit SgemmCeiling(const GptShape& s) {
    const int64_t C = s.embd, R = s.rows;
    struct Linear {
      int64_t in, out, count;
      bool tied_head;  // x wte^T: wte is stored (V, C)
    };
    const Linear linears[] = {{C, 3 * C, s.layers, false},
                              {C, C, s.layers, false},
                              {C, 4 * C, s.layers, false},
                              {4 * C, C, s.layers, false},
                              {C, s.vocab, 1, true}};
    for (const Linear& l : linears) {
      // forward Y = X W; dX = dY W^T; dW = X^T dY. For the tied head W^T is stored, so the flags flip on W.
      products_.push_back({false, l.tied_head, R, l.out, l.in, l.count});
      products_.push_back({false, !l.tied_head, R, l.in, l.out, l.count});
      products_.push_back({true, false, l.in, l.out, R, l.count});
    }
  }

  // GFLOP/s of one round times `threads`: each product runs once untimed (its operands come into the caches, as
  // a step's do from the op before), then once timed; the total FLOPs (each product times its layer count) over
  // the total time. The operands are minidl tensors that live only while their product runs: they have the shapes
  // of the step's own activations, weights and gradients, so the CPU allocator's cache (core/memory.h) serves
  // them from blocks the step freed. The weight-shaped outputs of the weight-gradient products find no free
  // block (the step's gradients are alive between steps) and add their bytes to the process's peak (peak_MB):
  // about 1 MB for the baby config (63.0 -> 64.1 MB).
  double measure(int threads) const {
    const int previous = openblas_get_num_threads(), previous_threads = num_threads();  // restored after
    openblas_set_num_threads(1);
    set_num_threads(1);
    double flops = 0, seconds = 0;
    for (const Product& p : products_) {
      // Stored as the step stores them: op(A) is (M, K), op(B) is (K, N).
      const Tensor a = Tensor::full(p.ta ? Shape{p.K, p.M} : Shape{p.M, p.K}, 0.01),
                   b = Tensor::full(p.tb ? Shape{p.N, p.K} : Shape{p.K, p.N}, 0.02);
      const auto run = [&] { return ops::matmul(a, b, p.ta, p.tb); };
      run();
      const auto t0 = std::chrono::steady_clock::now();
      run();
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * double(p.count);
      flops += 2.0 * double(p.M) * double(p.N) * double(p.K) * double(p.count);
    }
    set_num_threads(previous_threads);
    openblas_set_num_threads(previous);
    return flops / seconds / 1e9 * threads;
  }

 private:
  struct Product {  // row-major C(M,N) = op(A) op(B), `count` times per step
    bool ta, tb;
    int64_t M, N, K, count;
  };
  std::vector<Product> products_;
};

}  // namespace minidl::ops
