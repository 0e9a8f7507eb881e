// Test-only fault injection: the one point where the training loop reads a MINIDL_TEST_* variable, so a test can
// make one rank late or slow and the production code names no test. Nothing happens unless a variable is set.
//   MINIDL_TEST_TRACE_LATE_RANK=R:MS  world rank R starts its trace clock MS ms late (the clock alignment's test)
//   MINIDL_TEST_SLOW_RANK=R:MS        world rank R sleeps MS ms at the start of every step (the straggler report's)
#pragma once

namespace minidl::train {

enum class TestHook { kTraceStart, kStepStart };

// Sleeps the milliseconds the variable for `hook` asks of world rank `rank`, if it names that rank.
void test_hook(TestHook hook, int rank);

}  // namespace minidl::train
