// A 2-layer MLP trained with AdamW in one process: the smallest program against minidl (docs/library.md).
//
//   build/bin/example_mlp        # prints the loss every 50 steps, then "final loss X"
#include <cstdio>

#include "mlp.h"
#include "optim/adamw.h"

using namespace minidl;

int main() {
  nn::manual_seed(0);  // the layers' default initialisation
  mlp_example::Mlp model(16, 64, 1);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.01), {.lr = 1e-2});
  const mlp_example::Data data = mlp_example::make_data(256);
  double loss = 0;
  for (int step = 1; step <= 200; ++step) {
    opt.zero_grad();
    Tensor l = mlp_example::mse(model.forward(data.x), data.y);
    l.backward();
    opt.step();
    loss = l.item();
    if (step % 50 == 0) std::printf("step %d: loss %.6f\n", step, loss);
  }
  std::printf("final loss %.9g\n", loss);
}
