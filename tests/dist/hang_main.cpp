// Jobs that would hang forever without the watchdog (dist/flight_recorder.h), run by test_hangs.py:
//   hang extra_all_reduce   rank 1 calls one all_reduce more than rank 0, which goes on to a barrier
//   hang send_without_recv  rank 0 waits for a message rank 1 never sends
// Each must end within the collective timeout (MINIDL_COLLECTIVE_TIMEOUT) with exit code 3, naming the call.
#include <cstdio>
#include <string>

#include "dist/init.h"
#include "dist/process_group.h"

int main(int argc, char** argv) {
  using namespace minidl;
  auto ctx = dist::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto world = dist::make_process_group("mpi", ctx.world());
  world->set_label("world");
  Tensor t = Tensor::ones({1024});
  world->all_reduce(t, dist::ReduceOp::kSum)->wait();
  if (mode == "extra_all_reduce") {
    if (ctx.rank() == 1) world->all_reduce(t, dist::ReduceOp::kSum)->wait();
    world->barrier()->wait();
  } else if (mode == "send_without_recv") {
    if (ctx.rank() == 0) world->recv(t, 1, 7)->wait();
  } else {
    std::fprintf(stderr, "hang: expected extra_all_reduce or send_without_recv, got '%s'\n", mode.c_str());
    return 2;
  }
  world->barrier()->wait();
  std::printf("rank %d: the job finished\n", ctx.rank());
  return 0;
}
