// The grader of exercise ring_attention (dist/naive/ring_attention.h; scripts/minidl-exercise check ring_attention).
// Every rank builds the whole sequence's q, k, v from one seed, computes one process's causal attention (output,
// log-sum-exp, and the gradient of a random loss) and compares its own positions, chunks r and 2n-1-r of 2n
// (head-tail), within 1e-5; the traffic from the flight recorder.
//
// Diagnoses: an output equal to the attention over this rank's own keys alone is a block never used; a row whose
// log-sum-exp exceeds one process's saw keys it must not (a diagonal block attended in full, or this rank's own
// block taken for another's); dk and dv short of other ranks' shares with dq right are a gradient that did not
// travel all n hops home.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/rng.h"
#include "grader.h"
#include "ops/attention.h"
#include "ring_attention.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;

namespace {

constexpr int kH = 4, kHkv = 2;
constexpr int64_t kB = 2, kD = 8;

struct Whole {
  int n;
  int64_t T, c;
  Tensor qkv, dout;         // (B, T, (H + 2 Hkv) D), (B, T, H D)
  ops::AttentionForward f;  // one process's out (B, T, H D) and lse (B, H, T)
  Tensor dqkv;
};

Whole whole(int n) {
  Whole w{n, 6 * int64_t(n), 3, {}, {}, {}, {}};
  w.qkv = Tensor::randn({kB, w.T, (kH + 2 * kHkv) * kD}, Philox(41, uint64_t(n)));
  w.dout = Tensor::randn({kB, w.T, kH * kD}, Philox(42, uint64_t(n)));
  w.f = ops::causal_attention_forward(w.qkv, kH, kHkv);
  w.dqkv = ops::causal_attention_backward(w.dout, w.qkv, w.f.out, w.f.lse, kH, kHkv);
  return w;
}

// Rank r's positions of t along `dim`: chunks r and 2n-1-r.
Tensor mine(const Tensor& t, int dim, int r, const Whole& w) {
  const int64_t first = r * w.c, second = (2 * int64_t(w.n) - 1 - r) * w.c;
  return cat({t.narrow(dim, first, w.c), t.narrow(dim, second, w.c)}, dim).contiguous();
}

double max_rel(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to_vector(), b = want.to_vector();
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
  return diff / scale;
}

void forward(Run& run) {
  const Whole w = whole(run.size());
  const int r = run.rank();
  run.calling("ring_attention_forward", w.T);
  const dist::naive::RingAttentionForward got =
      dist::naive::ring_attention_forward(mine(w.qkv, 1, r, w), kH, kHkv, *run.exercise);
  if (got.out.size() != 2 || got.lse.size() != 2)
    fail("ring_attention_forward returned ", got.out.size(), " outputs and ", got.lse.size(),
         " lse tensors; expected one per query chunk (2)");
  const Tensor out = cat({got.out[0], got.out[1]}, 1), lse = cat({got.lse[0], got.lse[1]}, 2);
  const double err = max_rel(out, mine(w.f.out, 1, r, w)), lerr = max_rel(lse, mine(w.f.lse, 2, r, w));
  if (err <= 1e-5 && lerr <= 1e-5) return;
  // Attention over this rank's own positions' keys only: what a ring that never passes the block computes.
  const ops::AttentionForward own = ops::causal_attention_forward(mine(w.qkv, 1, r, w), kH, kHkv);
  if (run.size() > 1 && r > 0 && max_rel(out, own.out) <= 1e-5)
    fail("rank ", r,
         "'s output is the attention over its own keys only: the block was never passed on (or the "
         "step did not attend to the block it received)");
  // The lse of a causal row grows with the keys it sees: above one process's, the row saw keys it must not.
  const std::vector<double> g = lse.to_vector(), want = mine(w.f.lse, 2, r, w).to_vector();
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] > want[i] + 1e-4)
      fail("rank ", r, ": a row's log-sum-exp is above one process's (", g[i], " > ", want[i],
           "): it saw keys it must not: later positions (the diagonal block, a chunk against itself, is causal), or "
           "its own block again where another rank's belongs (pass the block on and attend the one received)");
  fail("rank ", r, " (", run.size(), " ranks, T ", w.T, "): the output differs from one process's causal attention by ",
       err, " and the lse by ", lerr, " (relative; at most 1e-5): check which key chunks each query chunk attends");
}

void backward(Run& run) {
  const Whole w = whole(run.size());
  const int r = run.rank();
  const Tensor q = mine(w.qkv, 1, r, w);
  // The forward's result from one process (this criterion grades the backward alone).
  dist::naive::RingAttentionForward f;
  for (int a = 0; a < 2; ++a) {
    const int64_t chunk = a == 0 ? r : 2 * int64_t(w.n) - 1 - r;
    f.out.push_back(w.f.out.narrow(1, chunk * w.c, w.c).contiguous());
    f.lse.push_back(w.f.lse.narrow(2, chunk * w.c, w.c).contiguous());
  }
  run.calling("ring_attention_backward", w.T);
  const Tensor got = dist::naive::ring_attention_backward(mine(w.dout, 1, r, w), q, f, kH, kHkv, *run.exercise);
  const Tensor want = mine(w.dqkv, 1, r, w);
  if (got.shape() != want.shape())
    fail("ring_attention_backward returned shape ", got.shape(), "; expected qkv's, ", want.shape());
  const int64_t HD = kH * kD, KV = kHkv * kD;
  const double dq = max_rel(got.narrow(2, 0, HD), want.narrow(2, 0, HD));
  const double dkv = max_rel(got.narrow(2, HD, 2 * KV), want.narrow(2, HD, 2 * KV));
  if (dq <= 1e-5 && dkv <= 1e-5) return;
  if (dq <= 1e-5)
    fail("rank ", r, ": dq is right but dk and dv differ from one process's by ", dkv,
         " (relative): the keys' gradient needs every rank's queries' share; pass it on with the block, n times, so "
         "that it comes home");
  fail("rank ", r, ": dq differs from one process's by ", dq, " (relative; dk and dv by ", dkv,
       "): each block's backward takes the row's merged out and lse, and every block a query chunk attended");
}

void traffic(Run& run) {
  const int n = run.size(), r = run.rank();
  const Whole w = whole(n);
  auto sends = [&](size_t from) {  // the learner's sends since entry `from`, every call checked a ring's
    int64_t count = 0;
    for (const dist::FlightEntry& e : exercises::ring_calls_since(from, r, n)) count += e.op == "send";
    return count;
  };
  const Tensor q = mine(w.qkv, 1, r, w);
  size_t from = dist::flight_entries().size();
  run.calling("ring_attention_forward", w.T);
  const dist::naive::RingAttentionForward f = dist::naive::ring_attention_forward(q, kH, kHkv, *run.exercise);
  if (const int64_t forward = sends(from); forward != n - 1)
    fail("rank ", r, " sent ", forward, " messages in the forward; the ring passes the block on n-1 = ", n - 1,
         " times");
  from = dist::flight_entries().size();
  run.calling("ring_attention_backward", w.T);
  dist::naive::ring_attention_backward(mine(w.dout, 1, r, w), q, f, kH, kHkv, *run.exercise);
  if (const int64_t backward = sends(from); backward != 2 * n - 1)
    fail("rank ", r, " sent ", backward, " messages in the backward; expected n-1 = ", n - 1, " blocks and n = ", n,
         " gradients (one hop more, home)");
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"forward",
           "each rank's output and lse equal one process's causal attention (head-tail)",
           {2, 3, 4},
           3,
           forward},
          {"backward",
           "dq, dk and dv of each rank's positions equal one process's",
           {2, 3, 4},
           3,
           backward,
           {"ring_attention.h:1"}},
          {"traffic",
           "send/recv to the neighbours only: n-1 blocks forward, n-1 blocks and n gradients backward",
           {2, 3, 4},
           1,
           traffic},
      });
}
