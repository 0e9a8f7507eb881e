// nn::Conv2d and nn::MaxPool2d: parameter names and shapes, output shapes, equality with the functional ops.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "nn/conv.h"
#include "nn/layers.h"

namespace minidl::nn {
namespace {

TEST(Conv2dLayer, ParametersAreKRSCFiltersAndABias) {
  Conv2d conv(3, 8, 5, /*stride=*/2, /*padding=*/2);
  NamedTensors params = conv.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{8, 5, 5, 3}));
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_EQ(params[1].second.shape(), (Shape{8}));
  EXPECT_EQ(conv.fan_in(), 75);
  EXPECT_EQ(Conv2d(3, 8, 3, 1, 0, /*bias=*/false).named_parameters().size(), 1u);
}

TEST(Conv2dLayer, ForwardIsTheFunctionalOpAndPoolingHalves) {
  Conv2d conv(2, 4, 3, 1, 1);
  init_normal(conv.weight, 0.5, 1, 0);
  init_normal(conv.bias, 0.5, 1, 1);
  Tensor x = Tensor::ones({2, 6, 6, 2});
  Tensor y = conv.forward(x);
  EXPECT_EQ(y.shape(), (Shape{2, 6, 6, 4}));
  EXPECT_EQ(y.to_vector(), conv2d(x, conv.weight, conv.bias, 1, 1).to_vector());
  EXPECT_EQ(MaxPool2d(2).forward(y).shape(), (Shape{2, 3, 3, 4}));
  EXPECT_EQ(MaxPool2d(3, 1).forward(y).shape(), (Shape{2, 4, 4, 4}));
}

TEST(Conv2dLayer, BadSizesAreErrors) {
  EXPECT_THROW(Conv2d(0, 4, 3), Error);
  EXPECT_THROW(Conv2d(2, 4, 3, /*stride=*/0), Error);
  EXPECT_THROW(MaxPool2d(0), Error);
}

}  // namespace
}  // namespace minidl::nn
