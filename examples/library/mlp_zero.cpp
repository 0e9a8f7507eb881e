// The MLP of mlp.cpp under ZeRO stage 1, 2 or 3: the same training as DDP, with AdamW's state (1), the gradients
// too (2) and the parameters too (3, each of the MLP's blocks gathered only while it runs) sharded over the ranks
// (docs/library.md).
//
//   mpirun -n 2 build/bin/example_mlp_zero 3     # the same losses as example_mlp, to float rounding
#include <cstdio>
#include <memory>
#include <string>

#include "dist/init.h"
#include "dist/zero.h"
#include "dist/zero3.h"
#include "mlp.h"
#include "optim/adamw.h"

using namespace minidl;

int main(int argc, char** argv) {
  dist::Context ctx = dist::init(argc, argv);
  const std::string arg = argc > 1 ? argv[1] : "1";
  if (arg != "1" && arg != "2" && arg != "3") {
    std::fprintf(stderr, "example_mlp_zero: expected a ZeRO stage 1, 2 or 3, got '%s'\n", arg.c_str());
    return 2;
  }
  const int stage = arg[0] - '0';
  auto group = dist::make_process_group("mpi", ctx.world());
  nn::manual_seed(0);
  mlp_example::Mlp model(16, 64, 1);
  std::unique_ptr<dist::ZeroShards> zero;  // broadcasts rank 0's weights, then shards them
  if (stage == 3)
    zero = std::make_unique<dist::ZeroStage3>(model, *group);
  else
    zero = std::make_unique<dist::ZeroDataParallel>(model, *group, dist::ZeroOptions{.stage = stage});
  // The optimizer steps this rank's shard: built over the model's parameters instead, it throws saying so.
  optim::AdamW opt(zero->shard_groups(optim::decay_groups(model.named_parameters(), 0.01)), {.lr = 1e-2});
  const mlp_example::Data data = mlp_example::make_data(256);
  const int64_t rows = 256 / ctx.world_size(), first = ctx.rank() * rows;
  const Tensor x = data.x.narrow(0, first, rows), y = data.y.narrow(0, first, rows);
  double loss = 0;
  for (int step = 1; step <= 200; ++step) {
    opt.zero_grad();
    Tensor l = mlp_example::mse(model.forward(x), y);
    l.backward();  // each bucket's average reduce-scattered into its owner's shard
    opt.step();
    zero->gather_parameters();  // every rank gets the updated parameters (forgetting it throws at the next backward)
    Tensor mean = l.detach().contiguous();
    group->all_reduce(mean, dist::ReduceOp::kAvg)->wait();
    loss = mean.item();
    if (step % 50 == 0 && ctx.rank() == 0) std::printf("step %d: loss %.6f\n", step, loss);
  }
  if (ctx.rank() == 0) std::printf("final loss %.9g\n", loss);
}
