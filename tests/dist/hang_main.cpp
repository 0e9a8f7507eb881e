// Jobs whose ranks disagree, run by test_hangs.py at 2 ranks. Without --check-collectives each would hang (the
// watchdog ends it: dist/flight_recorder.h); with MINIDL_CHECK_COLLECTIVES=1 the mismatched ones stop at once:
//   hang extra_all_reduce   rank 1 calls one all_reduce more; rank 0 goes on to a barrier
//   hang count_mismatch     rank 1 all-reduces 512 elements, rank 0 1024
//   hang dtype_mismatch     rank 1 all-reduces f64, rank 0 f32
//   hang gather_vs_reduce   rank 0 all-gathers, rank 1 all-reduces
//   hang all_to_all_vs_reduce  rank 0 exchanges by all_to_all, rank 1 all-reduces
//   hang send_without_recv  rank 0 waits for a message rank 1 never sends
#include <cstdio>
#include <string>

#include "core/error.h"
#include "dist/init.h"
#include "dist/process_group.h"

int main(int argc, char** argv) {
  using namespace minidl;
  auto ctx = dist::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto world = dist::make_process_group("mpi", ctx.world());
    world->set_label("world");
    Tensor t = Tensor::ones({1024});
    world->all_reduce(t, dist::ReduceOp::kSum)->wait();
    const bool odd = ctx.rank() == 1;
    if (mode == "extra_all_reduce") {
      if (odd) world->all_reduce(t, dist::ReduceOp::kSum)->wait();
    } else if (mode == "count_mismatch") {
      Tensor half = Tensor::ones({512});
      world->all_reduce(odd ? half : t, dist::ReduceOp::kSum)->wait();
    } else if (mode == "dtype_mismatch") {
      Tensor wide = Tensor::ones({1024}, DType::f64);
      world->all_reduce(odd ? wide : t, dist::ReduceOp::kSum)->wait();
    } else if (mode == "gather_vs_reduce") {
      Tensor all = Tensor::empty({2048});
      if (odd)
        world->all_reduce(t, dist::ReduceOp::kSum)->wait();
      else
        world->all_gather(all, t)->wait();
    } else if (mode == "all_to_all_vs_reduce") {
      Tensor out = Tensor::empty({1024});
      if (odd)
        world->all_reduce(t, dist::ReduceOp::kSum)->wait();
      else
        world->all_to_all(out, t, {512, 512}, {512, 512})->wait();
    } else if (mode == "send_without_recv") {
      if (!odd) world->recv(t, 1, 7)->wait();
    } else {
      std::fprintf(stderr, "hang: expected a mode (see hang_main.cpp), got '%s'\n", mode.c_str());
      return 2;
    }
    world->barrier()->wait();
  } catch (const Error& e) {
    std::fprintf(stderr, "hang: error (rank %d): %s\n", ctx.rank(), e.what());
    return 2;
  }
  std::printf("rank %d: the job finished\n", ctx.rank());
  return 0;
}
