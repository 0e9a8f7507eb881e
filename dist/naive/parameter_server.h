// A parameter server in its shortest form: one server rank holds all of θ; W worker ranks each compute a gradient
// on their own data, push it, and pull θ back. Production (dist/parameter_server.h) shards θ over S servers, adds
// bounded staleness (SSP) and replays its logs; this is what it does at S = 1.
//
//   workers 0 .. W-1:  θ = pull();  for s: θ = push_pull(s, g(θ))       (work() below)
//   server W:          for each push: θ ← θ − apply(g), reply           (serve() below)
//
// Synchronous: the server waits for all W gradients of a step, averages them (summed in worker order 0 .. W−1, then
// divided by W: DDP's all-reduce average, done by one rank), steps θ once and sends it to every worker. Everyone
// waits for the slowest worker, every step.
//
// Asynchronous: the server applies each gradient as it arrives, divided by W (W pushes then move θ about as far
// as one synchronous step), and answers only its sender. Nobody waits; the price is staleness: a gradient computed
// on version v of θ may be applied to version v + k, after k other pushes. The log records (worker, step, v) for
// each push, which is all it takes to recompute the run in one process (dist::ps_replay).
//
// Communication per step: a worker sends and receives 4Ψ bytes (Ψ parameters); the server receives and sends
// W·4Ψ: the server's link is the bottleneck, which is why production shards θ over S servers (4Ψ·W/S each).
// Memory: the server holds θ (4Ψ) and, in sync, the W gradients of a step (4Ψ·W); a worker holds its model.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace minidl::dist::naive {

struct PsEntry {
  int worker = 0;
  int64_t step = 0, computed = 0;  // computed: the version of θ the gradient was computed on
};

using Apply = std::function<void(std::vector<float>& theta, const std::vector<float>& grad)>;
using Gradient = std::function<std::vector<float>(int64_t step, const std::vector<float>& theta)>;

constexpr int kHeaderTag = 1, kGradTag = 2, kThetaTag = 3;

inline void send_theta(MPI_Comm comm, int worker, int64_t version, const std::vector<float>& theta) {
  MPI_Send(&version, 1, MPI_INT64_T, worker, kHeaderTag, comm);
  MPI_Send(theta.data(), int(theta.size()), MPI_FLOAT, worker, kThetaTag, comm);
}

// The server (rank `workers` of `comm`): until each worker pushed `steps` gradients. Returns the log.
inline std::vector<PsEntry> serve(MPI_Comm comm, int workers, std::vector<float>& theta, int64_t steps, bool async,
                                  const Apply& apply) {
  std::vector<PsEntry> log;
  int64_t version = 0;
  for (int w = 0; w < workers; ++w) send_theta(comm, w, version, theta);  // everyone's first pull
  std::vector<std::vector<float>> grads(size_t(workers), std::vector<float>(theta.size()));
  std::vector<int64_t> computed(static_cast<size_t>(workers));
  // One push: its header (step, version computed on), then the gradient, from whichever worker is first.
  auto receive = [&]() {
    int64_t header[2];
    MPI_Status st;
    MPI_Recv(header, 2, MPI_INT64_T, MPI_ANY_SOURCE, kHeaderTag, comm, &st);
    const int w = st.MPI_SOURCE;
    MPI_Recv(grads[size_t(w)].data(), int(theta.size()), MPI_FLOAT, w, kGradTag, comm, MPI_STATUS_IGNORE);
    computed[size_t(w)] = header[1];
    return PsEntry{w, header[0], header[1]};
  };
  if (async) {
    for (int64_t k = 0; k < steps * workers; ++k) {
      const PsEntry e = receive();
      std::vector<float> g = grads[size_t(e.worker)];
      for (float& x : g) x = x / float(workers);
      apply(theta, g);
      ++version;
      log.push_back(e);
      send_theta(comm, e.worker, version, theta);  // only the sender: nobody waits for anybody
    }
    return log;
  }
  for (int64_t s = 0; s < steps; ++s) {
    for (int k = 0; k < workers; ++k) receive();  // any arrival order
    std::vector<float> mean = grads[0];           // summed in worker order: the same bits whoever came first
    for (int w = 1; w < workers; ++w)
      for (size_t i = 0; i < mean.size(); ++i) mean[i] = mean[i] + grads[size_t(w)][i];
    for (float& x : mean) x = x / float(workers);
    apply(theta, mean);
    ++version;
    for (int w = 0; w < workers; ++w) log.push_back({w, s, computed[size_t(w)]});
    for (int w = 0; w < workers; ++w) send_theta(comm, w, version, theta);
  }
  return log;
}

// A worker: pulls θ, then `steps` times pushes grad(step, θ) and pulls the θ the server answers with.
inline std::vector<float> work(MPI_Comm comm, int workers, int64_t numel, int64_t steps, const Gradient& grad) {
  std::vector<float> theta(static_cast<size_t>(numel));
  int64_t version = 0;
  auto pull = [&] {
    MPI_Recv(&version, 1, MPI_INT64_T, workers, kHeaderTag, comm, MPI_STATUS_IGNORE);
    MPI_Recv(theta.data(), int(numel), MPI_FLOAT, workers, kThetaTag, comm, MPI_STATUS_IGNORE);
  };
  pull();
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<float> g = grad(s, theta);
    const int64_t header[2] = {s, version};
    MPI_Send(header, 2, MPI_INT64_T, workers, kHeaderTag, comm);
    MPI_Send(g.data(), int(numel), MPI_FLOAT, workers, kGradTag, comm);
    pull();
  }
  return theta;
}

}  // namespace minidl::dist::naive
