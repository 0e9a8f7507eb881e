// The CUDA backend fills every op's DeviceKernel table by itself: this program links minidl_cuda_backend_emu and
// names nothing of ops/cuda or of the backend (no register_* call, no launcher), so a table that is empty here is
// an entry the linker dropped (a self-registering object no symbol pulled in) or an op that never registers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "core/device_backend.h"
#include "core/tensor.h"
#include "ops/adamw.h"
#include "ops/grad_norm.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/conv.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gelu.h"
#include "ops/linear_gelu.h"
#include "ops/layernorm.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/rmsnorm.h"
#include "ops/attention_blocks.h"
#include "ops/rope.h"
#include "ops/sample_windows.h"
#include "ops/softmax.h"
#include "ops/swiglu.h"
#include "ops/unscale.h"
#include "ops/vocab_range.h"

namespace minidl {
namespace {

const Device kCuda = Device::cuda(0);

// Every DeviceKernel table of ops/*.h, by variable name. TableListCoversEveryHeader keeps it complete.
#define MINIDL_TABLE(t) \
  { #t, ops::t.has(kCuda) }
std::vector<std::pair<std::string, bool>> tables() {
  return {MINIDL_TABLE(fused_adamw_device),
          MINIDL_TABLE(fused_adamw_multi_device),
          MINIDL_TABLE(fused_adamw_multi_unless_device),
          MINIDL_TABLE(grad_norm_squared_multi_device),
          MINIDL_TABLE(clip_grads_multi_device),
          MINIDL_TABLE(unscale_and_check_by_device),
          MINIDL_TABLE(update_loss_scale_device),
          MINIDL_TABLE(add_to_count_device),
          MINIDL_TABLE(causal_attention_forward_device),
          MINIDL_TABLE(causal_attention_backward_device),
          MINIDL_TABLE(cast_into_device_kernel),
          MINIDL_TABLE(conv2d_forward_device),
          MINIDL_TABLE(conv2d_backward_device),
          MINIDL_TABLE(max_pool2d_forward_device),
          MINIDL_TABLE(max_pool2d_backward_device),
          MINIDL_TABLE(cross_entropy_forward_device),
          MINIDL_TABLE(cross_entropy_backward_device),
          MINIDL_TABLE(dropout_device),
          MINIDL_TABLE(add_device),
          MINIDL_TABLE(sub_device),
          MINIDL_TABLE(mul_device),
          MINIDL_TABLE(div_device),
          MINIDL_TABLE(tanh_backward_device),
          MINIDL_TABLE(add_scalar_device),
          MINIDL_TABLE(mul_scalar_device),
          MINIDL_TABLE(neg_device),
          MINIDL_TABLE(exp_device),
          MINIDL_TABLE(log_device),
          MINIDL_TABLE(tanh_device),
          MINIDL_TABLE(sqrt_device),
          MINIDL_TABLE(square_device),
          MINIDL_TABLE(add_inplace_device),
          MINIDL_TABLE(broadcast_to_device),
          MINIDL_TABLE(sum_to_shape_device),
          MINIDL_TABLE(embedding_forward_device),
          MINIDL_TABLE(embedding_backward_device),
          MINIDL_TABLE(gelu_forward_device),
          MINIDL_TABLE(gelu_backward_device),
          MINIDL_TABLE(bias_gelu_forward_device),
          MINIDL_TABLE(bias_gelu_backward_device),
          MINIDL_TABLE(layernorm_forward_device),
          MINIDL_TABLE(layernorm_backward_device),
          MINIDL_TABLE(add_layernorm_forward_device),
          MINIDL_TABLE(add_layernorm_backward_device),
          MINIDL_TABLE(matmul_device),
          MINIDL_TABLE(linear_device),
          MINIDL_TABLE(matmul_f32_device),
          MINIDL_TABLE(linear_gelu_device),
          MINIDL_TABLE(dgelu_bgrad_device),
          MINIDL_TABLE(linear_weight_bias_grad_device),
          MINIDL_TABLE(sum_device),
          MINIDL_TABLE(mean_device),
          MINIDL_TABLE(max_device),
          MINIDL_TABLE(sum_dim_device),
          MINIDL_TABLE(mean_dim_device),
          MINIDL_TABLE(max_dim_device),
          MINIDL_TABLE(max_backward_device),
          MINIDL_TABLE(rmsnorm_forward_device),
          MINIDL_TABLE(rmsnorm_backward_device),
          MINIDL_TABLE(rope_device),
          MINIDL_TABLE(attention_block_forward_device),
          MINIDL_TABLE(attention_block_backward_device),
          MINIDL_TABLE(merge_attention_blocks_device),
          MINIDL_TABLE(sample_windows_device),
          MINIDL_TABLE(softmax_forward_device),
          MINIDL_TABLE(softmax_backward_device),
          MINIDL_TABLE(swiglu_forward_device),
          MINIDL_TABLE(swiglu_backward_device),
          MINIDL_TABLE(unscale_and_check_device),
          MINIDL_TABLE(unscale_and_check_multi_device),
          MINIDL_TABLE(vocab_range_device)};
}
#undef MINIDL_TABLE

TEST(CudaRegistration, EveryOpHasItsCudaKernelWithoutARegisterCall) {
  for (const auto& [name, registered] : tables()) EXPECT_TRUE(registered) << name << " has no CUDA kernel";
  EXPECT_NE(find_device_backend(DeviceKind::kCUDA), nullptr) << "core's CUDA device backend is not registered";
}

// A fill that is not one repeated byte runs ops/cuda/fill.cu, which core's backend gets from ops' registration.
TEST(CudaRegistration, DeviceFillOfAMultiByteValueUsesTheRegisteredKernel) {
  Tensor x = Tensor::full({1000}, 1.5, DType::f32, kCuda);
  for (double v : x.to_vector()) ASSERT_EQ(v, 1.5);
}

// The names of the DeviceKernel variables declared in ops/*.h (declarations may list several and span lines).
std::vector<std::string> declared_tables() {
  std::vector<std::string> names;
  const std::regex name_re(R"((\w+)\{\s*")");
  for (const auto& entry : std::filesystem::directory_iterator(std::string(MINIDL_SOURCE_DIR) + "/ops")) {
    if (entry.path().extension() != ".h") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = text.find("\ninline DeviceKernel<"); at != std::string::npos;
         at = text.find("\ninline DeviceKernel<", at + 1)) {
      const std::string decl = text.substr(at, text.find(';', at) - at);
      for (std::sregex_iterator m(decl.begin(), decl.end(), name_re), end; m != end; ++m) names.push_back((*m)[1]);
    }
  }
  return names;
}

TEST(CudaRegistration, TableListCoversEveryHeader) {
  std::vector<std::string> listed;
  for (const auto& t : tables()) listed.push_back(t.first);
  const std::vector<std::string> declared = declared_tables();
  ASSERT_GE(declared.size(), 40u) << "the scan of " << MINIDL_SOURCE_DIR << "/ops/*.h found too few tables";
  for (const std::string& name : declared)
    EXPECT_NE(std::find(listed.begin(), listed.end(), name), listed.end())
        << name << " (ops/*.h) is missing from this test's table list";
  EXPECT_EQ(listed.size(), declared.size());
}

}  // namespace
}  // namespace minidl
