#include "train/checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>

#include "core/safetensors.h"
#include "model/checkpoint.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStepPrefix = "step_";
constexpr const char* kTempPrefix = ".tmp-";

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  BOTTLE_CHECK(fd >= 0, "{}: cannot open to sync", path.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  BOTTLE_CHECK(rc == 0, "{}: fsync failed", path.string());
}

// Test failpoint: BOTTLE_FAILPOINT=checkpoint_write:N kills the process (SIGKILL, no
// clean-up) after the N-th file of a checkpoint is written.
void failpoint(int files_written) {
  static const char* spec = std::getenv("BOTTLE_FAILPOINT");
  if (!spec) return;
  const std::string s(spec), prefix = "checkpoint_write:";
  if (s.rfind(prefix, 0) == 0 && std::atoi(s.c_str() + prefix.size()) == files_written)
    std::raise(SIGKILL);
}

bool is_step_dir(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  return e.is_directory() && name.rfind(kStepPrefix, 0) == 0 &&
         fs::exists(e.path() / kTrainerStateFile);
}

std::string moment_name(const char* which, const std::string& param) {
  return std::string(which) + "/" + param;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string folder, int keep)
    : folder_(std::move(folder)), keep_(keep) {}

std::string CheckpointStore::save(const LlamaModel& model, const AdamW& optimizer,
                                  const nlohmann::json& state, int64_t step, Communicator* dp,
                                  Communicator* world) {
  const std::string name = fmt::format("{}{:08d}", kStepPrefix, step);
  const fs::path final_dir = fs::path(folder_) / name;
  // Under tensor parallelism the slices are gathered and one rank writes the one model;
  // ZeRO-1's moment shards are gathered over the DP group first.
  Communicator* tp = model.tensor_parallel().comm;
  const ParameterStore& params = model.parameters();
  Arena moments_arena(MemoryTag::comm);
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  optimizer.gather_moments(m, v, dp);
  const bool writer = (!tp || tp->rank() == 0) && (!dp || dp->rank() == 0);
  auto done = [&] {
    if (world) world->barrier();  // every rank returns once the checkpoint is complete
    return final_dir.string();
  };
  if (dp && dp->rank() != 0) return done();  // the DP replicas hold the same model
  std::vector<std::vector<float>> moments_whole;
  for (const ParamSpec& spec : params.specs()) {
    moments_whole.push_back(gather_parameter(spec, m.f32() + spec.offset, tp));
    moments_whole.push_back(gather_parameter(spec, v.f32() + spec.offset, tp));
  }
  if (!writer) {
    save_model(model, "");  // takes part in the gathers; writes nothing
    return done();
  }
  fs::create_directories(folder_);
  // Clear what an interrupted earlier write left behind.
  for (const auto& e : fs::directory_iterator(folder_))
    if (e.path().filename().string().rfind(kTempPrefix, 0) == 0) fs::remove_all(e.path());
  const fs::path temp = fs::path(folder_) / fmt::format("{}{}-{}", kTempPrefix, name, ::getpid());
  fs::create_directories(temp);

  save_model(model, temp.string());
  fsync_path(temp / kConfigFile);
  fsync_path(temp / kWeightsFile);
  failpoint(2);
  std::vector<NamedTensor> moments;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    moments.push_back(
        {moment_name("exp_avg", spec.name), Tensor{moments_whole[2 * i].data(), spec.full_shape}});
    moments.push_back({moment_name("exp_avg_sq", spec.name),
                       Tensor{moments_whole[2 * i + 1].data(), spec.full_shape}});
  }
  write_safetensors((temp / kOptimizerFile).string(), moments,
                    {{"optimizer", "adamw"}, {"steps", std::to_string(optimizer.steps_taken())}});
  fsync_path(temp / kOptimizerFile);
  failpoint(3);
  {
    std::ofstream out(temp / kTrainerStateFile, std::ios::trunc);
    out << state.dump(2) << "\n";
    out.flush();
    BOTTLE_CHECK(out, "{}: write failed", (temp / kTrainerStateFile).string());
  }
  fsync_path(temp / kTrainerStateFile);
  fsync_path(temp);
  failpoint(4);

  // Re-saving a step (a resumed run that ends where it started) replaces it atomically too.
  const fs::path old =
      fs::path(folder_) / fmt::format("{}old-{}-{}", kTempPrefix, name, ::getpid());
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(temp, final_dir);
  fsync_path(folder_);
  if (fs::exists(old)) fs::remove_all(old);

  std::vector<std::string> all = list();
  for (size_t i = 0; i + size_t(keep_) < all.size(); ++i) fs::remove_all(all[i]);
  return done();
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> dirs;
  if (!fs::is_directory(folder_)) return dirs;
  for (const auto& e : fs::directory_iterator(folder_))
    if (is_step_dir(e)) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort in order
  return dirs;
}

std::optional<std::string> CheckpointStore::latest() const {
  std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

nlohmann::json CheckpointStore::load(const std::string& dir, LlamaModel& model, AdamW& optimizer) {
  load_model_weights(model, dir);
  const SafeTensorsReader reader((fs::path(dir) / kOptimizerFile).string());
  const ParameterStore& params = model.parameters();
  Arena moments_arena(MemoryTag::comm);
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  for (const ParamSpec& spec : params.specs()) {
    read_parameter_slice(reader, moment_name("exp_avg", spec.name), spec, m.f32() + spec.offset);
    read_parameter_slice(reader, moment_name("exp_avg_sq", spec.name), spec, v.f32() + spec.offset);
  }
  optimizer.load_moments(m, v);
  const fs::path state_path = fs::path(dir) / kTrainerStateFile;
  std::ifstream in(state_path);
  BOTTLE_CHECK(in, "{}: cannot open", state_path.string());
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", state_path.string(), e.what());
  }
  BOTTLE_CHECK(state.contains("optimizer_steps"), "{}: missing key 'optimizer_steps'",
               state_path.string());
  optimizer.set_steps_taken(state["optimizer_steps"].get<int64_t>());
  return state;
}

}  // namespace bottle
