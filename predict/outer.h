// The step beyond one synchronous group: local SGD's and DiLoCo's outer sync over R replicas, and a parameter
// server's exchange with W workers, from the α-β links of predict/collectives.h and memory-bound passes at the
// machine's bandwidth (a pass reads or writes 4 bytes a parameter, at mem_bw · eff.elementwise).
//
// Local SGD and DiLoCo (dist/local_sgd.cpp, OuterSync::sync), every H steps on each rank, over the Ψ parameters it
// holds: one all-reduce of 4Ψ bytes over the R replicas (the ranks at the same coordinates in each), and host
// passes: the parameters read out into one vector (4: each tensor to a vector, appended), into a tensor for the
// all-reduce (2), its mean (2: the division) and out again (2), and written back (6: a piece, a tensor, the copy):
// 16; DiLoCo adds the pseudo-gradient θ_global − θ_r (3) and the outer Nesterov step (5: reads Δ, m and θ_global,
// writes m and θ_global): 24. A step's share is 1/H of that:
//
//   outer = (all_reduce(R, 4Ψ) + passes · 4Ψ / (mem_bw · eff)) / H
//
// A parameter server (dist/parameter_server.cpp, train/ps_train.cpp): W workers each train the whole model on
// global batch / W, S servers each own Ψ/S of the parameters (whole tensors), messages over point-to-point links:
//   - a worker, every step: its gradient flattened (2 passes of 4Ψ), a message packed per server (2), the replies
//     received and copied out (4), the parameters written back (6): 14 passes of 4Ψ, and its forward and backward;
//   - a server, per push: a message of 4Ψ/S bytes received (α + 4Ψ/S / β) and copied out (2 passes of 4Ψ/S); per
//     reply: its shard packed (2) and sent (α + 4Ψ/S / β); per update: the shard and the gradient written into
//     its tensors (10 passes), AdamW (the optimizer's passes over Ψ/S) and the shard read back (2).
//   - sync: the W pushes one after another, summed in worker order (3 passes for each one added, 2 to divide),
//     one update, W replies; the workers wait for all of it:
//       step = worker + W · push + sum + update + W · reply
//   - async and SSP: each push divided (2) and applied at once, then answered; a worker's round is its own work
//     and one answer, and a server answers W pushes in a step's time:
//       step = max(worker + answer, W · answer),   answer = push + divide + update + reply
//     (SSP's bound only holds back a worker that is ahead, which equal workers never are).
#pragma once

#include "predict/machine.h"

namespace minidl::predict {

// Seconds of host passes over `params` f32 values, `passes` times.
double host_passes(double passes, double params, const Machine& m);

// One outer sync of local SGD (diloco false) or DiLoCo over `replicas`, for a rank holding `params` parameters.
double outer_sync_seconds(double params, int replicas, bool diloco, const Link& link, const Machine& m);

struct PsExchange {
  double exchange = 0;   // per step beyond the worker's forward and backward: passes, messages, waiting
  double optimizer = 0;  // the servers' AdamW on the step's critical path
};
// A parameter server's step for `params` parameters over `workers` and `servers`, synchronous or not, given one
// worker's forward and backward (`worker_compute`, seconds) and AdamW's time over one server's shard (`adamw`).
PsExchange ps_exchange(double params, int workers, int servers, bool sync, double worker_compute, double adamw,
                       const Link& link, const Machine& m);

}  // namespace minidl::predict
