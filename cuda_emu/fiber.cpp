#include "cuda_emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MINIDL_EMU_ASAN 1
#else
#define MINIDL_EMU_ASAN 0
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define MINIDL_EMU_TSAN 1
#else
#define MINIDL_EMU_TSAN 0
#endif

namespace minidl::emu::detail {

FiberStack::FiberStack(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  usable_bytes_ = (bytes + page - 1) / page * page;
  mapping_bytes_ = usable_bytes_ + page;
  mapping_ = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED || mprotect(mapping_, page, PROT_NONE) != 0) {
    std::fprintf(stderr, "cuda_emu: cannot map a %zu-byte fiber stack\n", mapping_bytes_);
    std::abort();
  }
  usable_ = static_cast<char*>(mapping_) + page;  // the guard page sits below: stacks grow down into it
#if MINIDL_EMU_TSAN
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
}

FiberStack::~FiberStack() {
#if MINIDL_EMU_TSAN
  __tsan_destroy_fiber(tsan_fiber_);
#endif
  munmap(mapping_, mapping_bytes_);
}

// No unpoisoning of a reused stack under ASan: every fiber returns from the kernel (whose frames unpoison
// themselves) before its stack is reused, and a block is only abandoned by a report that ends the process.
ctx::fcontext_t FiberStack::make_context(void (*entry)(ctx::transfer_t)) {
  return ctx::make_fcontext(static_cast<char*>(usable_) + usable_bytes_, usable_bytes_, entry);
}

ctx::fcontext_t resume_fiber(ctx::fcontext_t fiber, const FiberStack& stack, SwitchState& state, void* data) {
#if MINIDL_EMU_TSAN
  state.tsan_scheduler = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(stack.tsan_fiber(), 0);
#else
  (void)state;
#endif
#if MINIDL_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, stack.bottom(), stack.size());
#else
  (void)stack;
#endif
  const ctx::transfer_t back = ctx::jump_fcontext(fiber, data);
#if MINIDL_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  return back.fctx;
}

void fiber_started(SwitchState& self) {
#if MINIDL_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &self.from_bottom, &self.from_size);
#else
  (void)self;
#endif
}

void yield_to_scheduler(ctx::fcontext_t* scheduler, SwitchState& self) {
#if MINIDL_EMU_TSAN
  __tsan_switch_to_fiber(self.tsan_scheduler, 0);
#endif
#if MINIDL_EMU_ASAN
  __sanitizer_start_switch_fiber(&self.fake_stack, self.from_bottom, self.from_size);
#endif
  *scheduler = ctx::jump_fcontext(*scheduler, nullptr).fctx;
#if MINIDL_EMU_ASAN
  __sanitizer_finish_switch_fiber(self.fake_stack, &self.from_bottom, &self.from_size);
#else
  (void)self;
#endif
}

void exit_to_scheduler(ctx::fcontext_t scheduler, SwitchState& self) {
#if MINIDL_EMU_TSAN
  __tsan_switch_to_fiber(self.tsan_scheduler, 0);
#endif
#if MINIDL_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, self.from_bottom, self.from_size);  // nullptr: this fiber ends
#else
  (void)self;
#endif
  ctx::jump_fcontext(scheduler, nullptr);
  std::abort();  // never resumed
}

}  // namespace minidl::emu::detail
