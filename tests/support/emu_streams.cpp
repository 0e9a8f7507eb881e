// Linked into every GoogleTest binary (tests/CMakeLists.txt): the CUDA emulator's stream mode for the test
// process and the programs it starts, MINIDL_EMU_STREAMS=MINIDL_TEST_EMU_STREAMS (async unless the test's folder
// chose sync), set before main so the emulator reads it at its first use. A value already in the environment wins.
#include <cstdlib>

namespace {
[[maybe_unused]] const bool set = setenv("MINIDL_EMU_STREAMS", MINIDL_TEST_EMU_STREAMS, 0) == 0;
}  // namespace
