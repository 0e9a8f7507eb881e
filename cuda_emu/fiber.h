// fiber.h — stacks and context switches for the emulated threads of a block (internal to minidl_cuda_emu).
//
// Built on boost.context's fcontext (make_fcontext/jump_fcontext: a register save and a stack-pointer swap,
// no system call; ucontext would cost a sigprocmask syscall per switch). Stacks are mmap'd with a PROT_NONE
// guard page below them, so a kernel that overflows its stack faults instead of corrupting a neighbour, and
// they are kept per worker and reused by every block.
//
// Under AddressSanitizer every switch is announced (__sanitizer_start/finish_switch_fiber) so ASan knows which
// stack is live; under ThreadSanitizer each emulated thread is a TSan fiber (__tsan_create_fiber) and every switch
// goes through __tsan_switch_to_fiber, which also orders what the two sides did (they share one OS thread).
#pragma once

#include <boost/context/detail/fcontext.hpp>
#include <cstddef>

namespace minidl::emu::detail {

namespace ctx = boost::context::detail;

class FiberStack {
 public:
  explicit FiberStack(size_t bytes);  // usable bytes, rounded up to pages; aborts if mmap fails
  ~FiberStack();
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;

  // A fresh context that calls entry(transfer) on this stack when first jumped to.
  ctx::fcontext_t make_context(void (*entry)(ctx::transfer_t));
  void* bottom() const { return usable_; }
  size_t size() const { return usable_bytes_; }
  void* tsan_fiber() const { return tsan_fiber_; }  // ThreadSanitizer's fiber for whoever runs on it (TSan builds)

 private:
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  void* usable_ = nullptr;
  size_t usable_bytes_ = 0;
  void* tsan_fiber_ = nullptr;
};

// One side of the scheduler <-> fiber switches. `fake_stack` is ASan's per-fiber bookkeeping; the stack bounds
// of the side we came from are remembered so the way back can be announced.
struct SwitchState {
  void* fake_stack = nullptr;
  const void* from_bottom = nullptr;
  size_t from_size = 0;
  void* tsan_scheduler = nullptr;  // ThreadSanitizer's fiber of the scheduler, to switch back to (TSan builds)
};

// Scheduler side: run `*fiber` (on `stack`, its switch state `state`) until it switches back; `data` reaches it.
ctx::fcontext_t resume_fiber(ctx::fcontext_t fiber, const FiberStack& stack, SwitchState& state, void* data);

// Fiber side, first thing in the entry function: finishes the switch that started it.
void fiber_started(SwitchState& self);
// Fiber side: switch back to the scheduler `*scheduler` and wait to be resumed (updates *scheduler).
void yield_to_scheduler(ctx::fcontext_t* scheduler, SwitchState& self);
// Fiber side: leave for good (the stack may be reused for a new fiber).
[[noreturn]] void exit_to_scheduler(ctx::fcontext_t scheduler, SwitchState& self);

}  // namespace minidl::emu::detail
