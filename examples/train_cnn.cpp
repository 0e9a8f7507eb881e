// train_cnn — trains a small ConvNet to tell procedurally drawn shapes apart (examples/shapes.h: circle, square,
// triangle, cross), on the CPU or a CUDA device, and reports its accuracy and speed.
//
//   build/bin/train_cnn                                # 4 classes of 28x28 images, 300 steps on the CPU
//   build/bin/train_cnn --classes 3 --steps 200 --batch 32
//   build/bin/train_cnn --device cuda                  # needs a build with a CUDA backend (minidl_device)
//
// The network, channels last throughout (N, H, W, C), w = --width:
//   [conv 3x3 + GELU, max-pool 2x2] x 3 with w, 2w, 4w channels, then linear -> classes
// trained with AdamW on softmax cross-entropy, the learning rate decaying along a cosine to a tenth.
// Three blocks rather than two: the last features then see about 22 pixels, the size of a whole shape, so the
// classifier need not learn a template for every position (two blocks need 2.5x as many steps to reach 90%).
// Each epoch prints its mean loss, its training accuracy (of the images as they were trained on) and the accuracy
// on a held-out test set. Ends with one line that scripts parse:
//   summary: steps=N train_loss=X train_acc=X test_acc=X ms_per_step=X images_per_s=X
// Bad input prints "train_cnn: error: ..." naming what was expected and what was found, and exits with 2.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/parallel.h"
#include "train/device.h"
#include "examples/shapes.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

using namespace minidl;

namespace {

struct Options {
  std::string device = "cpu";
  int64_t steps = 300, batch = 64, image_size = 28, classes = 4, width = 16, train_size = 4096, test_size = 1024;
  double lr = 3e-3, weight_decay = 0.0, noise = 0.15;
  uint64_t seed = 1;
  int threads = 0;
};

void add_flags(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--device", o.device, "Where to train: cpu, cuda or cuda:N (cuda needs a build with a CUDA backend)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps (epochs = steps * batch / train-size)")->capture_default_str();
  app.add_option("--batch", o.batch, "Images per optimizer step")->capture_default_str();
  app.add_option("--lr", o.lr, "Peak AdamW learning rate (cosine decay to lr/10 over --steps)")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay on conv and linear weights")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed for the dataset, the initialisation and the shuffling")->capture_default_str();
  app.add_option("--image-size", o.image_size, "Images are N x N pixels, one channel (16 to 128)")
      ->capture_default_str();
  app.add_option("--classes", o.classes, "Shapes to tell apart, in order circle, square, triangle, cross (2 to 4)")
      ->capture_default_str();
  app.add_option("--noise", o.noise, "Standard deviation of the Gaussian pixel noise (shapes are 0.5 to 1 bright)")
      ->capture_default_str();
  app.add_option("--width", o.width, "Channels of the first conv layer (the second and third have 2x and 4x as many)")
      ->capture_default_str();
  app.add_option("--train-size", o.train_size, "Training images, drawn once at start")->capture_default_str();
  app.add_option("--test-size", o.test_size, "Held-out test images (a different random stream)")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (kernels and BLAS); default: all cores");
}

void validate(const Options& o) {
  MINIDL_CHECK(o.steps >= 1, "--steps: expected at least 1, got ", o.steps);
  MINIDL_CHECK(o.batch >= 1, "--batch: expected at least 1, got ", o.batch);
  MINIDL_CHECK(o.lr > 0 && std::isfinite(o.lr), "--lr: expected a positive number, got ", o.lr);
  MINIDL_CHECK(o.weight_decay >= 0, "--weight-decay: expected 0 or more, got ", o.weight_decay);
  MINIDL_CHECK(o.image_size >= 16 && o.image_size <= 128, "--image-size: expected 16 to 128 pixels, got ",
               o.image_size);
  MINIDL_CHECK(o.classes >= 2 && o.classes <= examples::kMaxShapeClasses, "--classes: expected 2 to ",
               examples::kMaxShapeClasses, " (circle, square, triangle, cross), got ", o.classes);
  MINIDL_CHECK(o.noise >= 0 && o.noise <= 1, "--noise: expected 0 to 1, got ", o.noise);
  MINIDL_CHECK(o.width >= 1 && o.width <= 256, "--width: expected 1 to 256 channels, got ", o.width);
  MINIDL_CHECK(o.train_size >= o.batch, "--train-size: expected at least one batch (--batch ", o.batch, "), got ",
               o.train_size);
  MINIDL_CHECK(o.test_size >= 1, "--test-size: expected at least 1, got ", o.test_size);
  MINIDL_CHECK(o.threads >= 0, "--threads: expected a positive count, got ", o.threads);
}

// conv-GELU-pool three times, then a linear classifier. Parameters live on `device`.
class ConvNet : public nn::Module {
 public:
  ConvNet(int64_t image_size, int64_t classes, int64_t width, Device device)
      : features_(4 * width * (image_size / 8) * (image_size / 8)) {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(1, width, 3, 1, 1, true, device));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(width, 2 * width, 3, 1, 1, true, device));
    conv3 = register_module("conv3", std::make_shared<nn::Conv2d>(2 * width, 4 * width, 3, 1, 1, true, device));
    MemoryTagGuard tag(MemTag::kParams);
    head_weight = register_parameter("head_weight", Tensor::zeros({features_, classes}, DType::f32, device));
    head_bias = register_parameter("head_bias", Tensor::zeros({classes}, DType::f32, device));
  }

  // He initialisation for the GELU layers, 1/sqrt(fan_in) for the classifier; biases stay zero. Drawn on the
  // CPU (a pure function of the seed) and copied to the parameters' device.
  void init(uint64_t seed) {
    auto normal = [seed](Tensor& p, double std, uint64_t stream) {
      Tensor host = Tensor::empty(p.shape());
      nn::init_normal(host, std, seed, stream);
      p.copy_(host);
    };
    normal(conv1->weight, std::sqrt(2.0 / double(conv1->fan_in())), 0);
    normal(conv2->weight, std::sqrt(2.0 / double(conv2->fan_in())), 1);
    normal(conv3->weight, std::sqrt(2.0 / double(conv3->fan_in())), 2);
    normal(head_weight, 1.0 / std::sqrt(double(features_)), 3);
  }

  // x: (N, S, S, 1) -> logits (N, classes). The convs run without bias so that it fuses into bias_gelu: channels
  // last puts the channels where bias_gelu broadcasts its bias.
  Tensor forward(const Tensor& x) const {
    Tensor h = pool_.forward(bias_gelu(conv2d(x, conv1->weight, Tensor(), 1, 1), conv1->bias));
    h = pool_.forward(bias_gelu(conv2d(h, conv2->weight, Tensor(), 1, 1), conv2->bias));
    h = pool_.forward(bias_gelu(conv2d(h, conv3->weight, Tensor(), 1, 1), conv3->bias));
    return linear(h.reshape({h.size(0), features_}), head_weight, head_bias);
  }

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  Tensor head_weight, head_bias;

 private:
  int64_t features_;
  nn::MaxPool2d pool_{2};
};

// Images [order[first], ..., order[first + n - 1]] as a batch on `device`.
std::pair<Tensor, Tensor> batch_of(const examples::ShapeSet& set, int64_t S, const std::vector<int64_t>& order,
                                   int64_t first, int64_t n, Device device) {
  Tensor x = Tensor::empty({n, S, S, 1}), y = Tensor::empty({n}, DType::i64);
  float* px = x.data<float>();
  int64_t* py = y.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t k = order[size_t(first + i)];
    std::copy_n(set.images.data() + k * S * S, S * S, px + i * S * S);
    py[i] = set.labels[size_t(k)];
  }
  return {x.to(device), y.to(device)};
}

// How many rows of `logits` (N, classes) put their largest value on the label.
int64_t correct(const Tensor& logits, const Tensor& labels) {
  std::vector<float> l = logits.to_float_vector();
  std::vector<double> t = labels.to_vector();
  int64_t classes = logits.size(1), hits = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    auto row = l.begin() + int64_t(i) * classes;
    hits += std::max_element(row, row + classes) - row == int64_t(t[i]);
  }
  return hits;
}

double accuracy(const ConvNet& model, const examples::ShapeSet& set, int64_t S, int64_t batch, Device device) {
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> order(size_t(set.count));
  std::iota(order.begin(), order.end(), 0);
  int64_t hits = 0;
  for (int64_t i = 0; i < set.count; i += batch) {
    auto [x, y] = batch_of(set, S, order, i, std::min(batch, set.count - i), device);
    hits += correct(model.forward(x), y);
  }
  return double(hits) / double(set.count);
}

int run(const Options& o, Device device) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  const int64_t S = o.image_size;
  examples::ShapesOptions shapes{S, o.classes, o.noise, o.seed};
  examples::ShapeSet train = examples::make_shapes(shapes, 0, o.train_size);
  examples::ShapeSet test = examples::make_shapes(shapes, 1, o.test_size);

  ConvNet model(S, o.classes, o.width, device);
  model.init(o.seed);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), o.weight_decay), {.lr = o.lr});
  optim::CosineSchedule schedule(o.lr, o.lr / 10, 0, o.steps);
  std::printf(
      "train_cnn: %lld classes of %lldx%lld shapes, %lld train / %lld test images, %lld parameters, %s, %d "
      "threads\n",
      (long long)o.classes, (long long)S, (long long)S, (long long)o.train_size, (long long)o.test_size,
      (long long)model.num_parameters(), o.device.c_str(), num_threads());

  const int64_t steps_per_epoch = o.train_size / o.batch;
  std::vector<int64_t> order(size_t(o.train_size));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 shuffle_rng(o.seed);
  double epoch_loss = 0, timed_ms = 0, recent_loss = 0, train_acc = 0, test_acc = 0;
  int64_t epoch_hits = 0, epoch_images = 0, epoch_steps = 0, timed_steps = 0, recent = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    int64_t in_epoch = step % steps_per_epoch;
    if (in_epoch == 0) std::shuffle(order.begin(), order.end(), shuffle_rng);
    auto start = std::chrono::steady_clock::now();
    auto [x, y] = batch_of(train, S, order, in_epoch * o.batch, o.batch, device);
    Tensor logits = model.forward(x);
    Tensor loss = cross_entropy(logits, y);
    opt.zero_grad();
    loss.backward();
    opt.set_lr(schedule(step));
    opt.step();
    double l = loss.item();  // waits for the device: the step's time is all in
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    MINIDL_CHECK(std::isfinite(l), "training diverged: loss is ", l, " at step ", step + 1, "; try a lower --lr");
    if (step > 0 || o.steps == 1) {  // the first step warms caches and the allocator
      timed_ms += ms;
      ++timed_steps;
    }
    if (step >= o.steps - 10) {
      recent_loss += l;
      ++recent;
    }
    epoch_loss += l;
    epoch_hits += correct(logits.detach(), y);
    epoch_images += o.batch;
    ++epoch_steps;
    if (in_epoch + 1 == steps_per_epoch || step + 1 == o.steps) {
      train_acc = double(epoch_hits) / double(epoch_images);
      test_acc = accuracy(model, test, S, o.batch, device);
      std::printf("epoch %lld | step %lld/%lld | loss %.4f | train_acc %.2f%% | test_acc %.2f%% | %.2f ms/step\n",
                  (long long)(step / steps_per_epoch + 1), (long long)(step + 1), (long long)o.steps,
                  epoch_loss / double(epoch_steps), 100 * train_acc, 100 * test_acc,
                  timed_steps ? timed_ms / double(timed_steps) : ms);
      std::fflush(stdout);
      epoch_loss = 0;
      epoch_hits = epoch_images = epoch_steps = 0;
    }
  }
  double ms_per_step = timed_steps ? timed_ms / double(timed_steps) : 0.0;
  std::printf("summary: steps=%lld train_loss=%.4f train_acc=%.4f test_acc=%.4f ms_per_step=%.2f images_per_s=%.0f\n",
              (long long)o.steps, recent_loss / double(recent), train_acc, test_acc, ms_per_step,
              ms_per_step > 0 ? double(o.batch) / ms_per_step * 1e3 : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small ConvNet (channels last) to classify procedurally drawn shapes with minidl."};
  Options o;
  add_flags(app, o);
  Device device;
  try {
    app.parse(argc, argv);
    validate(o);
    device = train::select_device(o.device);
  } catch (const CLI::CallForHelp& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "train_cnn: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_cnn: error: %s\n", e.what());
    return 2;
  }
  try {
    return run(o, device);
  } catch (const Error& e) {
    std::fprintf(stderr, "\ntrain_cnn: error: %s\n", e.what());
    return 2;
  }
}
