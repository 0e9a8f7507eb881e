#include "dist/clock_sync.h"

#include "dist/init.h"

namespace minidl::dist {

ClockOffset clock_offset_to_rank0(MPI_Comm comm, const std::function<double()>& now_us, int rounds) {
  MINIDL_CHECK(rounds >= 1, "clock_offset_to_rank0: expected at least one round, got ", rounds);
  constexpr int kTag = 0x7c10c;  // no other traffic shares it
  int rank = 0, size = 1;
  MINIDL_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MINIDL_MPI_CHECK(MPI_Comm_size(comm, &size));
  ClockOffset best;
  if (rank == 0) {  // answer every other rank's pings, one rank after another
    for (int peer = 1; peer < size; ++peer)
      for (int i = 0; i < rounds; ++i) {
        double ping = 0;
        MINIDL_MPI_CHECK(MPI_Recv(&ping, 1, MPI_DOUBLE, peer, kTag, comm, MPI_STATUS_IGNORE));
        const double t1 = now_us();
        MINIDL_MPI_CHECK(MPI_Send(&t1, 1, MPI_DOUBLE, peer, kTag, comm));
      }
  } else {
    best.uncertainty_us = -1;
    for (int i = 0; i < rounds; ++i) {
      const double t0 = now_us();
      double t1 = 0;
      MINIDL_MPI_CHECK(MPI_Send(&t0, 1, MPI_DOUBLE, 0, kTag, comm));
      MINIDL_MPI_CHECK(MPI_Recv(&t1, 1, MPI_DOUBLE, 0, kTag, comm, MPI_STATUS_IGNORE));
      const double t2 = now_us();
      if (best.uncertainty_us < 0 || (t2 - t0) / 2 < best.uncertainty_us) best = {t1 - (t0 + t2) / 2, (t2 - t0) / 2};
    }
  }
  MINIDL_MPI_CHECK(MPI_Barrier(comm));  // the pings are done before anyone's traffic starts
  return best;
}

}  // namespace minidl::dist
