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
  // Every rank knows the temporary directory's name; world rank 0 owns it.
  const fs::path temp = fs::path(folder_) / fmt::format("{}{}", kTempPrefix, name);
  const bool leader = !world || world->rank() == 0;
  auto barrier = [&] {
    if (world) world->barrier();
  };
  if (leader) {
    fs::create_directories(folder_);
    // Clear what an interrupted earlier write left behind.
    for (const auto& e : fs::directory_iterator(folder_))
      if (e.path().filename().string().rfind(kTempPrefix, 0) == 0) fs::remove_all(e.path());
    fs::create_directories(temp);
    write_hf_config(model.config(), (temp / kConfigFile).string());
    fsync_path(temp / kConfigFile);
  }
  barrier();
  // Each pipeline stage writes its own shard: the TP slices are gathered to the stage's TP
  // rank 0 (and ZeRO-1's moment shards over the DP group); DP replicas write nothing.
  Arena moments_arena(MemoryTag::comm);
  const ParameterStore& params = model.parameters();
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  optimizer.gather_moments(m, v, dp);
  if (!dp || dp->rank() == 0) {
    Communicator* tp = model.tensor_parallel().comm;
    write_shard(temp.string(), "model", params, tp, model.stage(), {{"", params.values().f32()}},
                {{"format", "pt"}});
    failpoint(2);
    write_shard(temp.string(), "optimizer", params, tp, model.stage(),
                {{"exp_avg/", m.f32()}, {"exp_avg_sq/", v.f32()}},
                {{"optimizer", "adamw"}, {"steps", std::to_string(optimizer.steps_taken())}});
    failpoint(3);
  }
  barrier();
  if (leader) {
    const int tp_size = model.tensor_parallel().size();
    if (model.stage().stages * tp_size > 1) {
      write_shard_index(temp.string(), "model");
      write_shard_index(temp.string(), "optimizer");
    }
    for (const auto& e : fs::directory_iterator(temp)) fsync_path(e.path());
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
    const fs::path old = fs::path(folder_) / fmt::format("{}old-{}", kTempPrefix, name);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(temp, final_dir);
    fsync_path(folder_);
    if (fs::exists(old)) fs::remove_all(old);
    std::vector<std::string> all = list();
    for (size_t i = 0; i + size_t(keep_) < all.size(); ++i) fs::remove_all(all[i]);
  }
  barrier();  // every rank returns once the checkpoint is complete
  return final_dir.string();
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
  const ShardedReader files(dir, "optimizer");
  const ParameterStore& params = model.parameters();
  Arena moments_arena(MemoryTag::comm);
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  for (const ParamSpec& spec : params.specs()) {
    for (const auto& [which, flat] : {std::pair{"exp_avg", m}, std::pair{"exp_avg_sq", v}}) {
      const std::string tensor = moment_name(which, spec.name);
      read_parameter_slice(files.reader_for(tensor), tensor, spec, flat.f32() + spec.offset);
    }
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
