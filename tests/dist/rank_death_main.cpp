// A job in which rank 1 dies (std::_Exit(3)) just before a collective that rank 0 is waiting in. Run under
// mpiexec by expect_job_fails.sh: the job must end with a non-zero status, promptly, instead of hanging.
//   rank_death <backend>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dist/init.h"
#include "dist/process_group.h"

int main(int argc, char** argv) {
  using namespace minidl;
  auto ctx = dist::init(argc, argv);
  const std::string backend = argc > 1 ? argv[1] : "mpi";
  auto world = dist::make_process_group(backend, ctx.world());
  world->barrier()->wait();
  if (ctx.rank() == 1) std::_Exit(3);
  Tensor t = Tensor::ones({1 << 20});
  world->all_reduce(t, dist::ReduceOp::kSum)->wait();
  std::printf("rank %d finished an all_reduce that a dead rank was part of\n", ctx.rank());
  return 0;
}
