// The grader of exercise ring (dist/naive/ring.h; scripts/minidl-exercise check ring). Built against the reference
// by CMake (its criteria must all pass) and against a learner's exercises/ring/ by the command: "ring.h" is found
// on the include path the build puts first.
//
// The diagnosis. Rank r feeds 2^r (times a weight w(i) = 1 + i % 5 per element), so a wrong element of the sum
// names the ranks whose terms it lacks or holds twice: the bits of (2^N - 1) - value. The chunk is named by
// shard_range, as the ring cuts the buffer.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/shard.h"
#include "grader.h"
#include "ring.h"

using namespace minidl;
using exercises::fail;
using exercises::Run;

namespace {

double weight(int64_t i) { return double(1 + i % 5); }

// Rank r's buffer: element i = 2^r · w(i).
Tensor powers(int64_t numel, int rank) {
  std::vector<float> v(static_cast<size_t>(numel));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(std::ldexp(weight(int64_t(i)), rank));
  return Tensor::from_vector(v, {numel});
}

std::string ranks_in(int64_t bits) {
  std::string out;
  for (int r = 0; bits >> r; ++r)
    if ((bits >> r) & 1) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// What is wrong with element i (in chunk c) of a sum over n ranks that holds `got` times w(i).
std::string what_it_holds(double got, int n) {
  const int64_t full = (int64_t(1) << n) - 1, k = std::llround(got);
  if (std::abs(got - double(k)) > 1e-3 || k < 0)
    return "a value that no set of whole terms makes (" + std::to_string(got) +
           " w; a term scaled, or a partial slice added?)";
  if (k < full && (k & ~full) == 0)
    return "lacks the terms of ranks {" + ranks_in(full & ~k) + "} (holds those of {" + ranks_in(k) + "})";
  if (k > full && ((k - full) & ~full) == 0)
    return "holds the terms of ranks {" + ranks_in(k - full) + "} twice (a chunk added into more than once)";
  return "holds " + std::to_string(k) + " w where every rank's term once is " + std::to_string(full) + " w";
}

// Checks the chunks `which` of `buffer` (rank r's sum of powers). Names the first wrong chunk.
void expect_sum_of_powers(const Tensor& buffer, const std::vector<int>& which, int n, int rank, const char* after) {
  const std::vector<double> v = buffer.to_vector();
  const int64_t full = (int64_t(1) << n) - 1;
  for (int c : which) {
    const dist::ShardRange range = dist::shard_range(buffer.numel(), n, c);
    for (int64_t i = range.begin; i < range.end; ++i) {
      const double got = v[size_t(i)] / weight(i);
      if (std::abs(got - double(full)) > 1e-4)
        fail("after ", after, " (", buffer.numel(), " elements, ", n, " ranks) chunk ", c, " on rank ", rank,
             ", element ", i, ": ", what_it_holds(got, n), "; rank r fed 2^r, so every element should hold ", full,
             " w");
    }
  }
}

std::vector<int> all_chunks(int n) {
  std::vector<int> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[size_t(i)] = i;
  return c;
}

void reduce_scatter_powers(Run& run, int64_t numel) {
  Tensor buf = powers(numel, run.rank());
  run.calling("ring_reduce_scatter", numel);
  dist::naive::ring_reduce_scatter(*run.exercise, buf);
  expect_sum_of_powers(buf, {run.rank()}, run.size(), run.rank(), "ring_reduce_scatter");
}

void all_reduce_powers(Run& run, int64_t numel) {
  Tensor buf = powers(numel, run.rank());
  run.calling("ring_all_reduce kSum", numel);
  dist::naive::ring_all_reduce(*run.exercise, buf, dist::ReduceOp::kSum);
  expect_sum_of_powers(buf, all_chunks(run.size()), run.size(), run.rank(), "ring_all_reduce (kSum)");
}

// Chunk c on rank c holds (c + 1)·100 + i % 7, every other element -1.
void all_gather(Run& run, int64_t numel) {
  const int n = run.size(), r = run.rank();
  auto value = [](int c, int64_t i) { return double((c + 1) * 100 + i % 7); };
  std::vector<float> v(static_cast<size_t>(numel), -1.0f);
  const dist::ShardRange mine = dist::shard_range(numel, n, r);
  for (int64_t i = mine.begin; i < mine.end; ++i) v[size_t(i)] = float(value(r, i));
  Tensor buf = Tensor::from_vector(v, {numel});
  run.calling("ring_all_gather", numel);
  dist::naive::ring_all_gather(*run.exercise, buf);
  const std::vector<double> got = buf.to_vector();
  for (int c = 0; c < n; ++c) {
    const dist::ShardRange range = dist::shard_range(numel, n, c);
    for (int64_t i = range.begin; i < range.end; ++i) {
      if (got[size_t(i)] == value(c, i)) continue;
      std::string holds = got[size_t(i)] == -1.0 ? "nothing (never received)" : "another value";
      for (int d = 0; d < n; ++d)
        if (d != c && got[size_t(i)] == value(d, i - range.begin + dist::shard_range(numel, n, d).begin))
          holds = "rank " + std::to_string(d) + "'s chunk " + std::to_string(d) + " (a chunk index off by one?)";
      fail("after ring_all_gather (", numel, " elements, ", n, " ranks) rank ", r, "'s chunk ", c, ", element ", i,
           ", holds ", holds, "; expected rank ", c, "'s chunk ", c);
    }
  }
}

// Random data against the library's all-reduce (Open MPI's): within 1e-5, any ring order being as good as another.
void all_reduce_random(Run& run, dist::ReduceOp op, int64_t numel) {
  const int n = run.size(), r = run.rank();
  Tensor mine = Tensor::randn({numel}, Philox(11 + uint64_t(r), uint64_t(numel)));
  Tensor expected = mine.clone();
  run.grader->all_reduce(expected, op)->wait();
  run.calling(std::string("ring_all_reduce ") + dist::reduce_op_name(op), numel);
  dist::naive::ring_all_reduce(*run.exercise, mine, op);
  const std::vector<double> got = mine.to_vector(), want = expected.to_vector();
  double worst = 0, ratio_n = 0, ratio_inv = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 1e-5 * std::max(1.0, std::abs(want[i]));
    worst = std::max(worst, std::abs(got[i] - want[i]) / tol);
    ratio_n = std::max(ratio_n, std::abs(got[i] - n * want[i]) / tol);
    ratio_inv = std::max(ratio_inv, std::abs(got[i] - want[i] / n) / tol);
  }
  if (worst <= 1) return;
  if (op == dist::ReduceOp::kAvg && ratio_n <= 1)
    fail("ring_all_reduce (kAvg) gave N = ", n, " times the mean: summed, not averaged (divide your chunk by N)");
  if (op == dist::ReduceOp::kAvg && ratio_inv <= 1)
    fail("ring_all_reduce (kAvg) gave the mean divided by N = ", n, " again: divided twice (once, on your chunk)");
  if (op == dist::ReduceOp::kSum && ratio_inv <= 1)
    fail("ring_all_reduce (kSum) gave the sum divided by N = ", n, ": averaged where kSum asks for the sum");
  fail("ring_all_reduce (", dist::reduce_op_name(op), ") differs from the library's all-reduce by up to ", worst * 1e-5,
       " (relative) on random data; see the kSum criteria for which terms are missing");
}

}  // namespace

int main(int argc, char** argv) {
  return exercises::run_grader(
      argc, argv,
      {
          {"reduce_scatter",
           "rank r's chunk r holds every rank's terms after ring_reduce_scatter",
           {2, 3, 4},
           5,
           [](Run& run) { reduce_scatter_powers(run, 4 * run.size()); }},
          {"all_gather",
           "every rank holds every rank's own chunk after ring_all_gather",
           {2, 3, 4},
           5,
           [](Run& run) { all_gather(run, 4 * run.size()); }},
          {"all_reduce",
           "kSum and kAvg equal the library's all-reduce (random data, a count N divides)",
           {2, 3, 4},
           5,
           [](Run& run) {
             all_reduce_powers(run, 4 * run.size());
             all_reduce_random(run, dist::ReduceOp::kSum, 8 * run.size());
             all_reduce_random(run, dist::ReduceOp::kAvg, 8 * run.size());
           },
           {"ring.h:1", "ring.h:2"}},
          {"uneven_counts",
           "counts N does not divide, below N, 1 and 0",
           {2, 3, 4},
           5,
           [](Run& run) {
             const int n = run.size();
             for (int64_t numel : {int64_t(7 * n + 3), int64_t(n + 1), int64_t(n - 1), int64_t(1), int64_t(0)}) {
               reduce_scatter_powers(run, numel);
               all_reduce_powers(run, numel);
               all_gather(run, numel);
             }
           }},
          {"traffic",
           "only send/recv to the neighbours, 2(N-1)/N of the buffer sent per rank",
           {2, 3, 4},
           1,
           [](Run& run) {
             const int n = run.size(), r = run.rank();
             const int64_t numel = 12 * n, before = int64_t(dist::flight_entries().size());
             Tensor buf = powers(numel, r);
             run.calling("ring_all_reduce kSum", numel);
             dist::naive::ring_all_reduce(*run.exercise, buf, dist::ReduceOp::kSum);
             int64_t sent = 0, sends = 0;
             for (const dist::FlightEntry& e : exercises::ring_calls_since(size_t(before), r, n))
               if (e.op == "send") sent += e.count, ++sends;
             const int64_t expected = 2 * (n - 1) * numel / n;
             if (sent != expected || sends != 2 * (n - 1))
               fail("rank ", r, " sent ", sent, " elements in ", sends, " messages; a ring all-reduce of ", numel,
                    " elements over ", n, " ranks sends 2(N-1)/N of them, ", expected, ", in 2(N-1) = ", 2 * (n - 1),
                    " messages of one chunk each");
           }},
      });
}
