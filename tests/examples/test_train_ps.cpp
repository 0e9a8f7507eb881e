// train_gpt --ps (train/ps_train.h) end to end:
// - --ps-mode sync is DDP: the saved model is the same bytes as DDP's at 2 workers, with 1 server and with 2;
// - async, ssp:1 and sync with a backup worker, a slow worker each time: --ps-replay of the run's --ps-log gives the
//   same model bytes in one process; SSP's bound is checked in the servers' logs; the staleness histogram and the
//   dropped late gradients are printed;
// - bad input is refused by name with exit code 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/run_program.h"
#include "tests/examples/checkpoint_files.h"

namespace fs = std::filesystem;

namespace {

using Result = minidl::testing::ProgramResult;
using minidl::testing::mpiexec;
using minidl::testing::read_file;

class TrainPs : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = minidl::testing::fresh_test_dir("minidl_ps_"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string flags() const {
    return std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4 --eval-every 0 "
           "--log-every 4 --lr 3e-3 --warmup 2 --min-lr 1e-4 --steps 8";
  }
  Result run(int ranks, const std::string& args) { return minidl::testing::run_program(mpiexec(ranks) + args); }
  fs::path dir_;
};

}  // namespace

TEST_F(TrainPs, SyncIsDdpBitwise) {
  for (const char* clip : {"", " --grad-clip 0"}) {
    SCOPED_TRACE(clip);
    Result ddp = run(2, flags() + clip + " --save " + path("ddp.safetensors"));
    ASSERT_EQ(ddp.code, 0) << ddp.out;
    const int servers = *clip ? 2 : 1;  // clipping needs the whole gradient on one server
    Result ps =
        run(2 + servers, flags() + clip + " --ps " + std::to_string(servers) + " --save " + path("ps.safetensors"));
    ASSERT_EQ(ps.code, 0) << ps.out;
    // No stale gradient in sync: 16 pushes, each applied on the version it was computed on, at every server.
    EXPECT_NE(ps.out.find("staleness (versions: count) 0:" + std::to_string(16 * servers)), std::string::npos)
        << ps.out;
    EXPECT_EQ(read_file(path("ps.safetensors")), read_file(path("ddp.safetensors")));
  }
}

TEST_F(TrainPs, AsyncAndSspReplayBitwise) {
  struct Case {
    int ranks;
    const char* args;
  };
  for (Case c : {Case{3, " --ps 1 --ps-mode async"}, Case{4, " --ps 2 --ps-mode async --grad-clip 0"},
                 Case{3, " --ps 1 --ps-mode ssp:1"}, Case{3, " --ps 1 --backup-workers 1"}}) {
    SCOPED_TRACE(c.args);
    const std::string log = path("run.jsonl");
    Result r =
        run(c.ranks, flags() + c.args + " --inject-delay 1:4 --ps-log " + log + " --save " + path("a.safetensors"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("staleness (versions: count)"), std::string::npos) << r.out;
    if (std::string(c.args).find("backup") != std::string::npos)
      EXPECT_NE(r.out.find("backup workers 1: each step took the first 1 gradients; dropped as late, per worker:"),
                std::string::npos)
          << r.out;
    if (std::string(c.args).find("ssp") != std::string::npos)
      EXPECT_NE(r.out.find("ssp: the bound 1 holds in every server's log"), std::string::npos) << r.out;
    std::string replay_flags = flags() + " --ps-replay " + log + " --save " + path("b.safetensors");
    if (std::string(c.args).find("--grad-clip 0") != std::string::npos) replay_flags += " --grad-clip 0";
    Result replay = run(1, replay_flags);
    ASSERT_EQ(replay.code, 0) << replay.out;
    EXPECT_EQ(read_file(path("a.safetensors")), read_file(path("b.safetensors")));
    EXPECT_EQ(minidl::testing::summary_text(replay.out, "val_loss"), minidl::testing::summary_text(r.out, "val_loss"));
  }
}

// A server's log travels to worker 0 at the end: 160 pushes are 5 KB, past Open MPI's eager limit (4 KB over shared
// memory), so the send waits for its receive. Sent before the reductions worker 0 is in, it hung the run.
TEST_F(TrainPs, ALogLongerThanAnEagerMessageReachesWorkerZero) {
  Result r = minidl::testing::run_program("timeout 120 " + mpiexec(3) + flags() +
                                          " --ps 1 --ps-mode async --steps 80 --log-every 80");
  ASSERT_NE(r.code, 124) << "the run hung (stopped after 120 s)\n" << r.out;
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parameter server: 160 pushes a server"), std::string::npos) << r.out;
}

TEST_F(TrainPs, RefusesByName) {
  ASSERT_EQ(run(3, flags() + " --ps 1 --ps-mode async --ps-log " + path("good.jsonl")).code, 0);
  struct Case {
    int ranks;
    std::string args, message;
  };
  const Case cases[] = {
      {3, flags() + " --ps 3", "--ps 3 leaves no worker among the 3 ranks"},
      {3, flags() + " --ps 1 --tp 2", "--ps trains whole models on its workers"},
      {4, flags() + " --ps 2", "--ps 2 with --grad-clip 1: clipping needs the whole gradient's norm"},
      {3, flags() + " --ps 1 --ps-mode ssp:-1", "expected sync, async or ssp:S"},
      {3, flags() + " --ps 1 --dropout 0.1", "--ps with --dropout 0.1"},
      {2, flags() + " --backup-workers 1", "--backup-workers 1: expected 1 .. workers - 1 with --ps 1 --ps-mode sync"},
      {3, flags() + " --ps 1 --backup-workers 2", "this job has 2 workers"},
      {2, flags() + " --ps-log " + path("x.jsonl"), "--ps-log needs --ps S"},
      {1, flags() + " --ps-replay " + path("missing.jsonl"),
       "--ps-replay: " + path("missing.jsonl") + " is not a file"},
      {1, flags() + " --steps 9 --ps-replay " + path("good.jsonl"), "the log is of 8 steps, this run has --steps 9"},
      {1, flags() + " --embd 32 --ps-replay " + path("good.jsonl"), "the log's servers split another model"},
  };
  for (const Case& c : cases) {
    Result r = run(c.ranks, c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.message << "\n" << r.out;
  }
}
