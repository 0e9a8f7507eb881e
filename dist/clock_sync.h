// How far this rank's clock is from rank 0's, measured by ping-pongs (Cristian's algorithm), so that per-rank
// timelines can be drawn on one clock (core/trace.h, scripts/merge_traces.py).
//
//   const dist::ClockOffset c = dist::clock_offset_to_rank0(ctx.world(), trace::now_us);
//   trace::set_clock_offset(c.offset_us, c.uncertainty_us);
//
// Each rank r > 0 in turn sends rank 0 a ping at its local time t0 and gets back rank 0's time t1, arriving at t2.
// Rank 0 read its clock somewhere inside [t0, t2] (on r's clock), so r's clock reads (t0 + t2) / 2 at rank 0's
// t1 within +-(t2 - t0) / 2: offset = t1 - (t0 + t2) / 2. Of several rounds the shortest round trip bounds the
// error best. Collective over `comm`: every rank must call it.
#pragma once

#include <mpi.h>

#include <functional>

namespace minidl::dist {

struct ClockOffset {
  double offset_us = 0;       // rank 0's clock minus this rank's (0 on rank 0)
  double uncertainty_us = 0;  // half the round trip of the round it was taken from
};

ClockOffset clock_offset_to_rank0(MPI_Comm comm, const std::function<double()>& now_us, int rounds = 10);

}  // namespace minidl::dist
