#include "examples/shapes.h"

#include <cmath>

#include "core/parallel.h"
#include "core/rng.h"

namespace minidl::examples {

namespace {

// Draws per image: centre x/y, size, rotation, brightness (one Philox call gives four), then the noise.
constexpr uint64_t kShapeDraws = 2;
constexpr int kSupersample = 4;  // 4 x 4 samples per pixel for the antialiased edge

// Is the point (u, v), in the shape's own frame scaled by its size, inside shape `cls`?
bool inside(int cls, float u, float v) {
  switch (cls) {
    case 0: return u * u + v * v <= 1.0f;                       // circle of radius 1
    case 1: return std::abs(u) <= 0.8f && std::abs(v) <= 0.8f;  // square, about the circle's area
    case 2: {                                                   // equilateral, circumradius 1.15
      const float r = 1.15f, s = std::sqrt(3.0f);
      return v >= -r / 2 && s * u + v <= r && -s * u + v <= r;
    }
    default: return (std::abs(u) <= 0.3f && std::abs(v) <= 1.0f) || (std::abs(v) <= 0.3f && std::abs(u) <= 1.0f);
  }
}

}  // namespace

ShapeSet make_shapes(const ShapesOptions& o, uint64_t split, int64_t count) {
  const int64_t S = o.image_size, pixels = S * S;
  ShapeSet set{count, std::vector<float>(size_t(count * pixels)), std::vector<int64_t>(size_t(count))};
  const Philox shape_rng(o.seed, 2 * split), noise_rng(o.seed, 2 * split + 1);
  parallel_for(0, count, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int cls = int(i % o.classes);
      set.labels[size_t(i)] = cls;
      uint4x a = shape_rng.draw(uint64_t(i) * kShapeDraws), b = shape_rng.draw(uint64_t(i) * kShapeDraws + 1);
      const float size = float(S) * (0.18f + 0.17f * Philox::to_unit(a.z));  // "radius" in pixels
      const float margin = size + 1.0f, room = float(S) - 2 * margin;
      const float cx = margin + room * Philox::to_unit(a.x), cy = margin + room * Philox::to_unit(a.y);
      const float angle = 6.2831853f * Philox::to_unit(a.w), c = std::cos(angle), s = std::sin(angle);
      const float brightness = 0.5f + 0.5f * Philox::to_unit(b.x);
      float* img = set.images.data() + i * pixels;
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x) {
          int hits = 0;
          for (int sy = 0; sy < kSupersample; ++sy)
            for (int sx = 0; sx < kSupersample; ++sx) {
              float px = float(x) + (float(sx) + 0.5f) / kSupersample - cx;
              float py = float(y) + (float(sy) + 0.5f) / kSupersample - cy;
              hits += inside(cls, (c * px + s * py) / size, (-s * px + c * py) / size);
            }
          float coverage = float(hits) / float(kSupersample * kSupersample);
          img[y * S + x] = brightness * coverage + float(o.noise) * noise_rng.normal(uint64_t(i * pixels + y * S + x));
        }
    }
  });
  return set;
}

}  // namespace minidl::examples
