// nn::ParamLayout: a parameter's place in the one-process model, carried by the parameter itself
// (nn/param_layout.h). The default is whole; a layout once set survives what training does to a parameter (a move
// to another device, set_data as ZeRO's flat buffers do); slice and scatter_into are inverse on the pieces, with
// q|k|v parts and a padded tail.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "nn/module.h"
#include "nn/param_layout.h"

namespace minidl {
namespace {

TEST(ParamLayout, DefaultIsWholeShapedLikeTheTensor) {
  Tensor w = Tensor::zeros({3, 4});
  const nn::ParamLayout l = nn::layout_of(w);
  EXPECT_EQ(l.full_shape, w.shape());
  EXPECT_FALSE(l.is_split());
  EXPECT_FALSE(l.is_replicated());
  EXPECT_FALSE(l.sequence_sliced);
  EXPECT_EQ(l.full_numel(), 12);
  EXPECT_EQ(l.group, nullptr);
}

TEST(ParamLayout, SurvivesSetDataAndIsSharedByTheTensorsOfOneParameter) {
  nn::ParamLayout split{{4, 6}, 1, 3, 2, 1};  // q|k|v of 2 columns each, rank 1 of 2
  Tensor w = Tensor::zeros(split.local_shape());
  ASSERT_EQ(w.shape(), Shape({4, 3}));
  nn::set_layout(w, split);
  Tensor alias = w;  // the same parameter
  EXPECT_TRUE(nn::layout_of(alias).is_split());
  w.set_data(Tensor::ones({4, 3}));  // ZeRO points parameters into its flat buffers this way
  EXPECT_EQ(nn::layout_of(w).full_shape, Shape({4, 6}));
  EXPECT_EQ(nn::layout_of(w).rank, 1);
  Tensor other = Tensor::zeros({4, 3});  // a different tensor knows nothing of it
  EXPECT_FALSE(nn::layout_of(other).is_split());
}

TEST(ParamLayout, SliceAndScatterAreInverseOnThePiecesWithPartsAndPadding) {
  // 3 parts of 5 columns (q|k|v) over 2 ranks: slices of ceil(5 / 2) = 3, rank 1's last column of each part is
  // padding.
  const Tensor whole = Tensor::randn({2, 15}, Philox(3));
  Tensor back = Tensor::zeros({2, 15});
  for (int r = 0; r < 2; ++r) {
    const nn::ParamLayout l{{2, 15}, 1, 3, 2, r};
    const Tensor mine = l.slice(whole);
    ASSERT_EQ(mine.shape(), Shape({2, 9}));
    if (r == 1)
      for (int64_t part = 0; part < 3; ++part)
        for (double v : mine.narrow(1, part * 3 + 2, 1).contiguous().to_vector())
          EXPECT_EQ(v, 0.0) << "padding of part " << part;
    l.scatter_into(back, mine);
  }
  EXPECT_EQ(back.to_vector(), whole.to_vector());
}

TEST(ParamLayout, SetLayoutChecksTheLocalShape) {
  Tensor w = Tensor::zeros({4, 4});
  EXPECT_THROW(nn::set_layout(w, nn::ParamLayout{{4, 6}, 1, 1, 2, 0}), std::exception);
}

}  // namespace
}  // namespace minidl
