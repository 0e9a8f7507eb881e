// main() of the MPI test binaries: initialise MPI, run the tests on every rank, print from rank 0 (other ranks
// print only their failures, tagged "[rank k]"), and exit non-zero when any rank failed. A run in which no test
// ran, or every test skipped, exits with kSkippedExitCode (CTest's SKIP_RETURN_CODE, tests/CMakeLists.txt): CTest
// then reports it skipped, not passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "support/mpi_test.h"

namespace minidl::testing {

namespace {
const dist::Context* g_context = nullptr;
constexpr int kSkippedExitCode = 77;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is taken here: asking UnitTest for it inside OnTestPartResult would take a mutex that
  // GoogleTest already holds while reporting the failure (a self-deadlock).
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }

 private:
  int rank_;
  std::string test_ = "?";
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
  if (any_failed) return any_failed;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  int nothing_tested = unit.test_to_run_count() == unit.skipped_test_count() && !GTEST_FLAG_GET(list_tests);
  int everywhere = 0;
  MPI_Allreduce(&nothing_tested, &everywhere, 1, MPI_INT, MPI_MIN, ctx.world());
  if (!everywhere) return 0;
  if (ctx.rank() == 0)
    std::fprintf(stderr, "%d test(s) ran, all skipped: reported to CTest as skipped (exit code %d)\n",
                 unit.test_to_run_count(), minidl::testing::kSkippedExitCode);
  return minidl::testing::kSkippedExitCode;
}
