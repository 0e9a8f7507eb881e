// The MLP of mlp.cpp under DDP: each of N ranks trains on its 1/N of the batch, and DDP averages the gradients
// during backward, so every rank takes the step one process takes on the whole batch (docs/library.md).
//
//   mpirun -n 2 build/bin/example_mlp_ddp      # the same losses as example_mlp, to float rounding
#include <cstdio>

#include "dist/ddp.h"
#include "dist/init.h"
#include "mlp.h"
#include "optim/adamw.h"

using namespace minidl;

int main(int argc, char** argv) {
  dist::Context ctx = dist::init(argc, argv);
  auto group = dist::make_process_group("mpi", ctx.world());
  nn::manual_seed(0);
  mlp_example::Mlp model(16, 64, 1);
  dist::DistributedDataParallel ddp(model, *group);  // rank 0's weights to every rank
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.01), {.lr = 1e-2});
  const mlp_example::Data data = mlp_example::make_data(256);
  const int64_t rows = 256 / ctx.world_size(), first = ctx.rank() * rows;  // this rank's slice of the batch
  const Tensor x = data.x.narrow(0, first, rows), y = data.y.narrow(0, first, rows);
  double loss = 0;
  for (int step = 1; step <= 200; ++step) {
    opt.zero_grad();
    Tensor l = mlp_example::mse(model.forward(x), y);
    l.backward();  // gradients averaged over the ranks while backward runs
    opt.step();
    Tensor mean = l.detach().contiguous();
    group->all_reduce(mean, dist::ReduceOp::kAvg)->wait();  // the whole batch's loss, for printing
    loss = mean.item();
    if (step % 50 == 0 && ctx.rank() == 0) std::printf("step %d: loss %.6f\n", step, loss);
  }
  if (ctx.rank() == 0) std::printf("final loss %.9g\n", loss);
}
