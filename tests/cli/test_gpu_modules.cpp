// The GPU modules (issue 57 item 7; docs/design.md §19 "Build"): bottle links no CUDA library,
// so that a CPU run starts on any machine, under a small address-space limit too, and a run
// that asks for the cuda backend where its module cannot be loaded ends at once with one clear
// error naming what could not be loaded, on every rank. Before, a CUDA build linked cuBLASLt,
// the CUDA runtime and NCCL: under `ulimit -v 600000` even `bottle --version` died in the
// loader (exit 127, no word of bottle's).
#include <chrono>
#include <fstream>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

// `ulimit -v 600000`, the issue's limit, in bytes: cuBLASLt alone maps more (541 MB of file).
constexpr const char* kSmallAddressSpace = "prlimit --as=614400000";
constexpr int kTimeoutS = 20;

class GpuModules : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    write_random_shard(*dir_ / "train.bin", 4000, 64, 1);
    std::ofstream(*dir_ / "tiny.toml") << kTinyColaModelToml
                                       << fmt::format(R"([training]
steps = 2
micro_batch_size = 2
seq_len = 16

[data]
train = "{}"

[checkpoint]
folder = "{}"
)",
                                                      *dir_ / "train.bin", *dir_ / "run");
    std::filesystem::create_directories(*dir_ / "empty");
  }
  static void TearDownTestSuite() { dir_.reset(); }

  // `args` after `prefix` (an environment or a limit), {dir} filled in, under a timeout.
  static CommandResult bottle(const std::string& prefix, const std::string& args) {
    std::string expanded = args;
    for (size_t at; (at = expanded.find("{dir}")) != std::string::npos;)
      expanded.replace(at, 5, dir_->str());
    return run(
        fmt::format("{} timeout -k 2 {} {} {}", prefix, kTimeoutS, bottle_binary(), expanded));
  }

  // Whether this build has the cuda backend (and so the modules): `bottle --version` says.
  static bool built_with_cuda() {
    return bottle("", "--version").output.find("backend cuda: ") != std::string::npos;
  }

  static std::unique_ptr<TempDir> dir_;
};

std::unique_ptr<TempDir> GpuModules::dir_;

// The binary's dynamic section names no CUDA library: they are the modules' alone.
TEST_F(GpuModules, BottleLinksNoCudaLibrary) {
  const CommandResult r = run(fmt::format("readelf -d {}", bottle_binary()));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("(NEEDED)"), std::string::npos) << r.output;
  for (const char* library : {"libcudart", "libcublas", "libnccl", "libcudnn", "libcuda."})
    EXPECT_EQ(r.output.find(library), std::string::npos) << library << " is linked:\n" << r.output;
}

// A CPU run, and --version, under the address-space limit that the CUDA libraries exceed.
TEST_F(GpuModules, CpuRunStartsUnderASmallAddressSpace) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan reserves terabytes of shadow address space at start, so an "
                  "instrumented binary cannot run under an address-space limit";
#endif
  const CommandResult version = bottle(kSmallAddressSpace, "--version");
  ASSERT_EQ(version.status, 0) << version.output;
  EXPECT_NE(version.output.find("backend cpu: "), std::string::npos) << version.output;
  const CommandResult train =
      bottle(kSmallAddressSpace, "train {dir}/tiny.toml --set checkpoint.folder={dir}/limited");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("done: 2 steps"), std::string::npos) << train.output;
}

// The cuda backend where its module cannot be loaded: not found (BOTTLE_MODULE_DIR names an
// empty folder), or found but its CUDA libraries do not fit the address space. One error line
// naming what could not be loaded, exit 1, in seconds; a CPU run beside it still works, and
// --version says why there is no cuda backend instead of failing.
TEST_F(GpuModules, AnUnloadableModuleIsOneClearError) {
  if (!built_with_cuda()) GTEST_SKIP() << "this build has no cuda backend, hence no module";
  const std::string missing = fmt::format("BOTTLE_MODULE_DIR={}", *dir_ / "empty");
  struct Case {
    std::string prefix;
    const char* names;  // what the message must name
  };
  std::vector<Case> cases = {{missing, "libbottle_cuda.so was not found in "}};
#if !defined(__SANITIZE_ADDRESS__)
  cases.push_back({kSmallAddressSpace, "cannot load "});
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(c.prefix);
    const auto start = std::chrono::steady_clock::now();
    const CommandResult r = bottle(c.prefix, "train {dir}/tiny.toml --set training.backend=cuda");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_LT(seconds, 10.0) << r.output;
    EXPECT_EQ(count_occurrences(r.output, "bottle: error: "), 1) << r.output;
    for (const char* part : {"training.backend = \"cuda\": this build's CUDA module could not be "
                             "loaded (",
                             c.names, "libbottle_cuda.so"})
      EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
    const CommandResult version = bottle(c.prefix, "--version");
    EXPECT_EQ(version.status, 0) << version.output;
    EXPECT_NE(version.output.find("backend cuda: this build's CUDA module could not be loaded ("),
              std::string::npos)
        << version.output;
  }
  const CommandResult nccl = bottle(missing, "--version");
  EXPECT_NE(nccl.output.find("communicator nccl: this build's NCCL module could not be loaded "
                             "(libbottle_nccl.so was not found in "),
            std::string::npos)
      << nccl.output;
  const CommandResult cpu =
      bottle(missing, "train {dir}/tiny.toml --set checkpoint.folder={dir}/without_modules");
  EXPECT_EQ(cpu.status, 0) << cpu.output;
}

// Under mpirun every rank says it and the job ends.
TEST_F(GpuModules, EveryRankSaysTheModuleCannotBeLoaded) {
  if (!built_with_cuda()) GTEST_SKIP() << "this build has no cuda backend, hence no module";
  const CommandResult r = bottle(
      fmt::format("BOTTLE_MODULE_DIR={} {} -x BOTTLE_MODULE_DIR", *dir_ / "empty", mpirun(2, 60)),
      "train {dir}/tiny.toml --set training.backend=cuda");
  EXPECT_NE(r.status, 0) << r.output;
  for (const char* rank : {"bottle: error: rank 0: ", "bottle: error: rank 1: "})
    EXPECT_NE(r.output.find(std::string(rank) + (*dir_ / "tiny.toml") +
                            ": training.backend = \"cuda\": this build's CUDA module could not "
                            "be loaded (libbottle_cuda.so was not found in "),
              std::string::npos)
        << rank << "\n"
        << r.output;
}

// Where the modules are found, they load into every kind of executable that may open them: the
// bottle binary and a test program (which export bottle's symbols to them and hold the backend
// and comm layers whole). A module missing one of bottle's symbols, or built from other
// sources, would say so here rather than as a skipped GPU test.
TEST_F(GpuModules, TheModulesLoadWhereTheyAreFound) {
  if (!built_with_cuda()) GTEST_SKIP() << "this build has no cuda backend, hence no module";
  std::vector<std::string> lines{bottle("", "--version").output, backend_unavailable("cuda")};
  for (const std::string& line : backend_names()) lines.push_back(line);
  for (const std::string& line : comm_backends()) lines.push_back(line);
  for (const std::string& line : lines)
    for (const char* broken :
         {"undefined symbol", "was built from other sources", "no entry point"})
      EXPECT_EQ(line.find(broken), std::string::npos) << line;
}

}  // namespace
}  // namespace bottle::testing
