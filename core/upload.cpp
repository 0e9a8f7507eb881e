#include "core/upload.h"

#include "core/device_backend.h"

namespace minidl {

void upload_async(const Tensor& dst, const Tensor& src) {
  MINIDL_CHECK(src.defined() && dst.defined(), "upload_async: expected two defined tensors");
  MINIDL_CHECK(src.device().is_cpu() && !dst.device().is_cpu(),
               "upload_async: expected a host source and a device "
               "destination, got ",
               src.device(), " -> ", dst.device());
  MINIDL_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(),
               "upload_async: expected a source of the "
               "destination's shape ",
               dst.shape(), " and dtype ", dst.dtype(), ", got ", src.shape(), " ", src.dtype());
  MINIDL_CHECK(src.is_contiguous() && dst.is_contiguous(), "upload_async: expected contiguous tensors");
  if (src.numel() == 0) return;
  const DeviceBackend& b = device_backend(dst.device(), "upload");
  if (b.upload_async)
    b.upload_async(dst.raw_device_data(), src.raw_data(), src.nbytes(), dst.device().index);
  else
    b.copy(dst.raw_device_data(), dst.device(), src.raw_data(), src.device(), src.nbytes());
}

Tensor upload_async(const Tensor& src, Device device) {
  const Tensor host = src.contiguous();
  Tensor dst = Tensor::empty(host.shape(), host.dtype(), device);
  upload_async(dst, host);
  return dst;
}

}  // namespace minidl
