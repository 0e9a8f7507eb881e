// main() of the MPI test binaries: initialise MPI, run the tests on every rank, print from rank 0 (other ranks
// print only their failures, tagged "[rank k]"), and exit non-zero when any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "support/mpi_test.h"

namespace minidl::testing {

namespace {
const dist::Context* g_context = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[rank %d] %s.%s: %s:%d: Failure\n%s\n", rank_, test ? test->test_suite_name() : "?",
                 test ? test->name() : "?", result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};
}  // namespace

const dist::Context& mpi_context() { return *g_context; }

}  // namespace minidl::testing

int main(int argc, char** argv) {
  auto ctx = minidl::dist::init(argc, argv);
  minidl::testing::g_context = &ctx;
  ::testing::InitGoogleTest(&argc, argv);
  if (ctx.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new minidl::testing::RankFailurePrinter(ctx.rank()));
    if (GTEST_FLAG_GET(list_tests)) std::freopen("/dev/null", "w", stdout);
  }
  int failed = RUN_ALL_TESTS() != 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, ctx.world());
  if (ctx.rank() == 0 && any_failed && !failed) std::fprintf(stderr, "tests failed on another rank (see above)\n");
  return any_failed;
}
