#include "train/checkpoint_store.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

#include "core/json_io.h"
#include "core/safetensors.h"
#include "model/checkpoint.h"
#include "train/data_loader.h"
#include "train/run_tokenizer.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

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
    : folder_(std::move(folder)), keep_(keep) {
  // Every rank checks, before any work: a folder that cannot hold checkpoints fails the job
  // at once on all of them rather than as a filesystem exception at the first save.
  std::error_code ec;
  const fs::file_status st = fs::status(folder_, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail("{}: checkpoint.folder cannot be used: {}", folder_, ec.message());
  if (fs::exists(st)) {
    BOTTLE_CHECK(fs::is_directory(st), "{}: checkpoint.folder exists and is not a directory",
                 folder_);
    BOTTLE_CHECK(::access(folder_.c_str(), W_OK | X_OK) == 0,
                 "{}: checkpoint.folder is not writable: {}", folder_, std::strerror(errno));
    return;
  }
  // Missing: its nearest existing ancestor must be a directory we may create it in.
  fs::path ancestor = fs::absolute(fs::path(folder_), ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path())
    ancestor = ancestor.parent_path();
  BOTTLE_CHECK(fs::is_directory(ancestor, ec),
               "{}: checkpoint.folder cannot be created: {} is not a directory", folder_,
               ancestor.string());
  BOTTLE_CHECK(::access(ancestor.c_str(), W_OK | X_OK) == 0,
               "{}: checkpoint.folder cannot be created: {} is not writable ({})", folder_,
               ancestor.string(), std::strerror(errno));
  // access() grants root everything but a read-only mount; only creating it tells.
  fs::create_directories(folder_, ec);
  if (ec) fail("{}: checkpoint.folder cannot be created: {}", folder_, ec.message());
}

std::string CheckpointStore::save(const LlamaModel& model, const AdamW& optimizer,
                                  const TrainerState& state, int64_t step, Communicator* dp,
                                  Communicator* world) {
  try {
    return save_unchecked(model, optimizer, state, step, dp, world);
  } catch (const fs::filesystem_error& e) {
    // A full disk, a folder removed or made read-only while training: name the path.
    fail("{}: cannot write the checkpoint of step {} in checkpoint.folder: {}",
         e.path1().empty() ? folder_ : e.path1().string(), step, e.code().message());
  }
}

std::string CheckpointStore::save_unchecked(const LlamaModel& model, const AdamW& optimizer,
                                            const TrainerState& state, int64_t step,
                                            Communicator* dp, Communicator* world) {
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
    for (const fs::path& file :
         write_model_description(model.config(), temp, DType::f32, special_token_ids(tokenizer_)))
      fsync_path(file);
    if (tokenizer_) tokenizer_->save(temp);
  }
  barrier();
  // Each pipeline stage writes its own shard: the TP slices are gathered to the stage's TP
  // rank 0 (and ZeRO-1's moment shards over the DP group); DP replicas write nothing.
  const ParameterStore& params = model.parameters();
  Arena moments_arena(MemoryTag::comm, params.backend());
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  optimizer.gather_moments(m, v, dp);
  if (!dp || dp->rank() == 0) {
    Communicator* tp = model.tensor_parallel().comm;
    write_shard(temp.string(), "model", params, tp, model.stage(), {{"", params.values()}},
                {{"format", "pt"}});
    failpoint(2);
    write_shard(temp.string(), "optimizer", params, tp, model.stage(),
                {{"exp_avg/", m}, {"exp_avg_sq/", v}},
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
    write_trainer_state(temp, state);
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

std::vector<std::string> CheckpointStore::list(bool complete) const {
  std::vector<std::string> dirs;
  try {
    if (!fs::is_directory(folder_)) return dirs;
    for (const auto& e : fs::directory_iterator(folder_))
      if (is_step_dir(e) == complete && e.is_directory() &&
          e.path().filename().string().rfind(kStepPrefix, 0) == 0)
        dirs.push_back(e.path().string());
  } catch (const fs::filesystem_error& e) {
    fail("{}: cannot read checkpoint.folder: {}", folder_, e.code().message());
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort in order
  return dirs;
}

std::vector<std::string> CheckpointStore::list() const { return list(true); }

std::vector<std::string> CheckpointStore::incomplete() const { return list(false); }

std::optional<std::string> CheckpointStore::latest() const {
  std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

TrainerState CheckpointStore::load(const std::string& dir, LlamaModel& model, AdamW& optimizer) {
  // The small file first: a damaged state fails before the weights are read.
  const TrainerState state = read_trainer_state(dir);
  load_model_weights(model, dir);
  const ShardedReader files(dir, "optimizer");
  const ParameterStore& params = model.parameters();
  Arena moments_arena(MemoryTag::comm, params.backend());
  const Tensor m = moments_arena.alloc(params.values().shape),
               v = moments_arena.alloc(params.values().shape);
  for (const ParamSpec& spec : params.specs()) {
    for (const auto& [which, flat] : {std::pair{"exp_avg", m}, std::pair{"exp_avg_sq", v}}) {
      const std::string tensor = moment_name(which, spec.name);
      const std::vector<float> slice = read_parameter_slice(files.reader_for(tensor), tensor, spec);
      params.backend().from_host(flat.view(spec.offset, spec.shape), slice.data());
    }
  }
  optimizer.load_moments(m, v);
  optimizer.set_steps_taken(state.optimizer_steps);
  return state;
}

}  // namespace bottle
