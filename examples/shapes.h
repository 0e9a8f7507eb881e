// A synthetic image-classification dataset that train_cnn draws itself: filled shapes (circle, square, triangle,
// cross) at a random position, size, rotation and brightness, antialiased, on a background of Gaussian noise.
// Every image is a pure function of (seed, split, index), so a run is reproducible and needs no download.
//
//   examples::ShapesOptions o{.image_size = 28, .classes = 4, .seed = 1};
//   ShapeSet train = make_shapes(o, /*split=*/0, 4096), test = make_shapes(o, 1, 1024);
//   // train.images: count x 28 x 28 floats (one channel, channels last), train.labels[i] in [0, classes)
#pragma once

#include <cstdint>
#include <vector>

namespace minidl::examples {

inline constexpr int kMaxShapeClasses = 4;
inline const char* const kShapeNames[kMaxShapeClasses] = {"circle", "square", "triangle", "cross"};

struct ShapesOptions {
  int64_t image_size = 28;  // images are image_size x image_size, one channel
  int64_t classes = 4;      // the first `classes` of kShapeNames
  double noise = 0.15;      // standard deviation of the background noise (shapes have brightness 0.5 to 1)
  uint64_t seed = 1;
};

struct ShapeSet {
  int64_t count = 0;
  std::vector<float> images;    // (count, image_size, image_size, 1), row-major
  std::vector<int64_t> labels;  // (count); image i shows shape i % classes, so the classes are balanced
};

// `count` images of split `split` (0: train, 1: test: disjoint random streams).
ShapeSet make_shapes(const ShapesOptions& o, uint64_t split, int64_t count);

}  // namespace minidl::examples
