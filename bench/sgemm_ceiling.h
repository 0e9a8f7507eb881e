// The sgemm ceiling of a GPT training step: what the step's own matrix products reach in OpenBLAS when each is
// timed alone, single-threaded, times the number of cores. A step that spends all its time in GEMMs at full speed
// on every core would reach it; the gap is the elementwise ops, attention and the threads' imbalance.
//
//   double ceiling = gpt_sgemm_ceiling_gflops({layers, embd, vocab, batch * seq}, threads);
//
// Products per linear layer (x: rows x in, W: in x out, the Conv1D layout of nn::Linear): the forward x W, the
// input gradient dY W^T and the weight gradient x^T dY; the layers are c_attn (C -> 3C), attn.c_proj (C -> C),
// mlp.c_fc (C -> 4C) and mlp.c_proj (4C -> C) per block, and the tied head x wte^T (C -> V) with its two
// gradients. Attention's own tile products are not included (they are counted in the FLOPs, not here).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace minidl::bench {

struct GptShape {
  int64_t layers, embd, vocab, rows;  // rows = batch * seq tokens
};

namespace detail {

// Seconds of one row-major sgemm C(M,N) = op(A) op(B), the median of `reps` after a warm-up.
inline double time_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int reps) {
  std::vector<float> a(size_t(M * K), 0.01f), b(size_t(K * N), 0.02f), c(size_t(M * N));
  const int lda = int(ta ? M : K), ldb = int(tb ? K : N);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
                1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), int(N));
  };
  run();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace detail

// GFLOP/s: total FLOPs of the step's linear-layer products / their total single-threaded time * threads.
inline double gpt_sgemm_ceiling_gflops(const GptShape& s, int threads, int reps = 5) {
  const int64_t C = s.embd, R = s.rows;
  struct Linear {
    int64_t in, out, count;
    bool tied_head;  // x wte^T: wte is stored (V, C)
  };
  const Linear linears[] = {{C, 3 * C, s.layers, false}, {C, C, s.layers, false}, {C, 4 * C, s.layers, false},
                            {4 * C, C, s.layers, false}, {C, s.vocab, 1, true}};
  openblas_set_num_threads(1);
  double flops = 0, seconds = 0;
  for (const Linear& l : linears) {
    const double f = 2.0 * R * l.in * l.out;  // each of the three products
    // forward Y = X W; dX = dY W^T; dW = X^T dY. For the tied head W^T is stored, so the flags flip on W.
    double t = detail::time_sgemm(false, l.tied_head, R, l.out, l.in, reps) +
               detail::time_sgemm(false, !l.tied_head, R, l.in, l.out, reps) +
               detail::time_sgemm(true, false, l.in, l.out, R, reps);
    flops += 3 * f * double(l.count);
    seconds += t * double(l.count);
  }
  openblas_set_num_threads(threads);
  return flops / seconds / 1e9 * threads;
}

}  // namespace minidl::bench
