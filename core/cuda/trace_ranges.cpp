// Every span of a trace (core/trace.h) as an NVTX range, so that a profile of a --trace run under Nsight Systems
// (nsys profile --trace cuda,nvtx) shows the steps, forwards and backwards, buckets, ZeRO's collectives and
// recomputations above the kernels they launched. NVTX 3 is header-only: with no profiler attached a range costs
// a call through a pointer that does nothing; under the emulator no profiler ever attaches.
#include <nvtx3/nvToolsExt.h>

#include "core/cuda/cuda.h"
#include "core/trace.h"

namespace minidl::cuda {

void install_trace_ranges() {
  trace::set_range_hooks({[](const char* name) { nvtxRangePushA(name); }, [] { nvtxRangePop(); }});
}

}  // namespace minidl::cuda
