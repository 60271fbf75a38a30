#include "train/checkpoint_store.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string_view>
#include <thread>

#include "core/arena.h"
#include "io/json_io.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "train/data_loader.h"
#include "train/job_agreement.h"
#include "train/run_tokenizer.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp-";
// A checkpoint being deleted (see prune).
const std::string kPruningPrefix = ".pruning-";

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  BOTTLE_CHECK(fd >= 0, "{}: cannot open to sync", path.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  BOTTLE_CHECK(rc == 0, "{}: fsync failed", path.string());
}

// Test failpoint: BOTTLE_FAILPOINT=checkpoint_write:N kills the process (SIGKILL, no
// clean-up) after the N-th file of a checkpoint is written.
// BOTTLE_FAILPOINT=slow_checkpoint:S makes every save take S seconds more (after its first
// file), as a large model's does: a launcher's kill then lands in the middle of it.
void failpoint(int files_written) {
  static const char* spec = std::getenv("BOTTLE_FAILPOINT");
  if (!spec) return;
  const std::string s(spec), prefix = "checkpoint_write:", slow = "slow_checkpoint:";
  if (s.rfind(prefix, 0) == 0 && std::atoi(s.c_str() + prefix.size()) == files_written)
    std::raise(SIGKILL);
  if (s.rfind(slow, 0) == 0 && files_written == 1)
    std::this_thread::sleep_for(std::chrono::seconds(std::atoi(s.c_str() + slow.size())));
}

// Why the entry `e`, named like a step folder, is not one the store wrote ("" when it is):
// ours carry the marker, or (written before the marker existed) a trainer_state.json that
// reads. A symbolic link is never ours, so pruning never follows one.
std::string why_not_ours(const fs::directory_entry& e) {
  std::error_code ec;
  if (e.is_symlink(ec)) return "it is a symbolic link";
  if (!e.is_directory(ec)) return "it is not a directory";
  if (fs::is_regular_file(e.path() / kCheckpointMarker, ec)) return "";
  const fs::path state = e.path() / kTrainerStateFile;
  if (!fs::exists(fs::symlink_status(state, ec)))
    return fmt::format("it has neither {} nor {}", kCheckpointMarker, kTrainerStateFile);
  if (!fs::is_regular_file(fs::symlink_status(state, ec)))
    return fmt::format("it has no {} and its {} is not a regular file", kCheckpointMarker,
                       kTrainerStateFile);
  try {
    read_trainer_state(e.path().string());
    return "";
  } catch (const Error& err) {
    return fmt::format("it has no {} and its {} does not read: {}", kCheckpointMarker,
                       kTrainerStateFile, err.what());
  }
}

// A temporary folder of the store's own: .tmp-step_N, .tmp-old-step_N or .pruning-step_N.
bool is_own_temporary(const std::string& name) {
  for (const std::string& prefix :
       {std::string(kTempPrefix) + "old-", std::string(kTempPrefix), std::string(kPruningPrefix)})
    if (name.rfind(prefix, 0) == 0 && CheckpointStore::step_of(name.substr(prefix.size())))
      return true;
  return false;
}

// Deletes the old checkpoint `dir`. Deleting a folder takes one system call per file, in the
// directory's order, so a process killed meanwhile could leave a step folder without its marker
// that every later --resume refuses as not the store's. The folder is renamed out of the way
// first (one atomic rename): a kill then leaves a .pruning-step_N folder, which no resume reads
// and the next save removes. BOTTLE_FAILPOINT=checkpoint_prune kills the process (SIGKILL) once
// the first pruned folder has lost its marker and trainer_state.json, as an interrupted deletion
// may leave it.
void prune(const fs::path& dir) {
  const fs::path doomed = dir.parent_path() / (kPruningPrefix + dir.filename().string());
  fs::rename(dir, doomed);
  static const char* spec = std::getenv("BOTTLE_FAILPOINT");
  if (spec && std::string_view(spec) == "checkpoint_prune") {
    fs::remove(doomed / kCheckpointMarker);
    fs::remove(doomed / kTrainerStateFile);
    std::raise(SIGKILL);
  }
  fs::remove_all(doomed);
}

std::string moment_name(const char* which, const std::string& param) {
  return std::string(which) + "/" + param;
}

// What this rank writes of a save, nullptr for nothing: every TP rank its slices (TP rank 0 the
// parameters they all hold whole), every pipeline stage its parameters; a DP replica nothing
// unless ZeRO shards the optimizer state (then each DP rank its owned slices of the masters
// and the moments). The last stage's copy of a tied table is the first stage's and is not
// written twice.
std::unique_ptr<RankPieces> held_pieces(const LlamaModel& model, const Optimizer& optimizer,
                                        const FlatSource& masters, Communicator* dp) {
  // Without ZeRO every DP rank holds the masters whole, and the first writes them.
  const bool zero = !(masters.owned.size() == 1 && masters.owned[0].begin == 0 &&
                      masters.owned[0].count == model.parameters().padded());
  if (!zero && dp && dp->rank() != 0) return nullptr;
  std::vector<FlatSource> sources{masters};
  for (FlatSource& state : optimizer.held_state()) sources.push_back(std::move(state));
  const Communicator* tp = model.tensor_parallel().comm;
  return std::make_unique<RankPieces>(model.parameters(), model.stage().stage, sources,
                                      !tp || tp->rank() == 0,
                                      model.holds_tied_copy() ? "model.embed_tokens.weight" : "");
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

std::string CheckpointStore::save(const LlamaModel& model, const Optimizer& optimizer,
                                  const FlatSource& masters, const TrainerState& state,
                                  int64_t step, Communicator* dp, Communicator* world) {
  const std::string name = fmt::format("{}{:08d}", kStepPrefix, step);
  const fs::path final_dir = fs::path(folder_) / name;
  // Every rank knows the temporary directory's name; world rank 0 owns it.
  const fs::path temp = fs::path(folder_) / fmt::format("{}{}", kTempPrefix, name);
  const bool leader = !world || world->rank() == 0;
  // The three parts of a save, each ended by every rank together: a part that fails on one
  // rank fails all of them at its end, rather than leaving the others in the next collective.
  if (leader)
    save_part(world, step, [&] { open_temporary(model, temp); });
  else
    save_part(world, step, [] {});
  save_part(world, step,
            [&] { write_shards(model, optimizer, masters, temp, dp, world ? world->rank() : 0); });
  if (leader)
    save_part(world, step, [&] {
      place(optimizer.name(), optimizer.steps_taken(), state, step, temp, final_dir);
    });
  else
    save_part(world, step, [] {});
  return final_dir.string();
}

void CheckpointStore::save_part(Communicator* world, int64_t step,
                                const std::function<void()>& part) const {
  auto checked = [&] {
    auto guard = [&] {
      if (guard_) guard_();
    };
    try {
      part();
    } catch (const fs::filesystem_error& e) {
      // A folder removed under the save is said as what it is (the guard); a full disk or a
      // folder made read-only names the path.
      guard();
      fail("{}: cannot write the checkpoint of step {} in checkpoint.folder: {}",
           e.path1().empty() ? folder_ : e.path1().string(), step, e.code().message());
    } catch (const Error&) {
      guard();
      throw;
    }
  };
  if (world)
    run_everywhere_or_fail_together(*world, checked);
  else
    checked();
}

// The leader's first part: the temporary folder with the marker and the model description.
void CheckpointStore::open_temporary(const LlamaModel& model, const fs::path& temp) const {
  if (guard_) guard_();
  fs::create_directories(folder_);
  // Clear what an interrupted earlier write left behind: the store's own names only.
  for (const auto& e : fs::directory_iterator(folder_))
    if (is_own_temporary(e.path().filename().string())) fs::remove_all(e.path());
  fs::create_directories(temp);
  // The marker first: whatever of this folder is renamed into place is recognisably ours.
  {
    std::ofstream marker(temp / kCheckpointMarker);
    marker << "a training checkpoint written by bottle: trainer_state.json holds its step\n";
    marker.close();
    BOTTLE_CHECK(marker, "{}: write failed", (temp / kCheckpointMarker).string());
  }
  failpoint(1);
  for (const fs::path& file :
       write_model_description(model.config(), temp, DType::f32, special_token_ids(tokenizer_)))
    fsync_path(file);
  if (tokenizer_) tokenizer_->save(temp);
}

// Every rank's part: each writes what it holds (held_pieces), into a file of its own, in
// parallel. Nothing is gathered and nothing of the model's size is allocated.
void CheckpointStore::write_shards(const LlamaModel& model, const Optimizer& optimizer,
                                   const FlatSource& masters, const fs::path& temp,
                                   Communicator* dp, int world_rank) const {
  const std::unique_ptr<RankPieces> pieces = held_pieces(model, optimizer, masters, dp);
  if (!pieces) return;
  const fs::path file = temp / rank_file_name(world_rank);
  pieces->write(file.string(), model.parameters().backend());
  failpoint(2);
  fsync_path(file);
  failpoint(3);
}

// The background thread's part of an asynchronous save, and what the others wait for.
struct CheckpointStore::Pending {
  int64_t step = 0, optimizer_steps = 0;
  std::string optimizer;  // its name
  TrainerState state;
  fs::path temp, final_dir;
  bool leader = false;
  std::unique_ptr<RankPieces> pieces;  // null: this rank writes nothing
  std::vector<float> copy;             // [pieces->values()] what this rank holds, at the step
  size_t counted = 0;                  // bytes of `copy` counted as the host backend's comm
  std::thread writer;
  std::exception_ptr error;  // the writer's failure
};

std::string CheckpointStore::save_async(const LlamaModel& model, const Optimizer& optimizer,
                                        const FlatSource& masters, const TrainerState& state,
                                        int64_t step, Communicator* dp, Communicator* world) {
  finish_pending(world);
  auto p = std::make_unique<Pending>();
  const std::string name = fmt::format("{}{:08d}", kStepPrefix, step);
  p->step = step;
  p->optimizer_steps = optimizer.steps_taken();
  p->optimizer = optimizer.name();
  p->state = state;
  p->final_dir = fs::path(folder_) / name;
  p->temp = fs::path(folder_) / fmt::format("{}{}", kTempPrefix, name);
  p->leader = !world || world->rank() == 0;
  if (p->leader)
    save_part(world, step, [&] { open_temporary(model, p->temp); });
  else
    save_part(world, step, [] {});
  // The copy is taken now, on the thread that owns the backend: the next step changes what it
  // copies. On a host backend it is the backend's memory, so it counts as its comm tag (and the
  // memory plan holds it, §10).
  save_part(world, step, [&] {
    p->pieces = held_pieces(model, optimizer, masters, dp);
    if (!p->pieces) return;
    Backend& be = model.parameters().backend();
    p->copy = p->pieces->snapshot(be);
    if (be.device() == Device::cpu) {
      p->counted = async_copy_bytes(p->pieces->values());
      MemoryStats::global().add(MemoryTag::comm, p->counted);
    }
  });
  const fs::path file = p->temp / rank_file_name(world ? world->rank() : 0);
  p->writer = std::thread([p = p.get(), file] {
    try {
      if (!p->pieces) return;
      p->pieces->write_snapshot(file.string(), p->copy);
      failpoint(2);
      fsync_path(file);
      failpoint(3);
    } catch (...) {
      p->error = std::current_exception();
    }
  });
  pending_ = std::move(p);
  return pending_->final_dir.string();
}

std::string CheckpointStore::finish_pending(Communicator* world) {
  if (!pending_) return "";
  const std::unique_ptr<Pending> p = std::move(pending_);
  p->writer.join();
  if (p->counted) MemoryStats::global().sub(MemoryTag::comm, p->counted);
  p->copy = {};
  // Every rank learns whether every write succeeded before the leader publishes.
  save_part(world, p->step, [&] {
    if (!p->error) return;
    try {
      std::rethrow_exception(p->error);
    } catch (const Error&) {
      throw;
    } catch (const fs::filesystem_error&) {
      throw;
    } catch (const std::exception& e) {
      fail("{}", e.what());
    }
  });
  if (p->leader)
    save_part(world, p->step, [&] {
      place(p->optimizer, p->optimizer_steps, p->state, p->step, p->temp, p->final_dir);
    });
  else
    save_part(world, p->step, [] {});
  return p->final_dir.string();
}

CheckpointStore::~CheckpointStore() {
  // A run that ends by an error leaves the save under way unpublished (its .tmp- folder goes
  // at the next save), but its thread ends first.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

// The leader's last part: the shard indexes and the trainer state, the temporary folder
// renamed into place, and the oldest checkpoints beyond `keep` pruned.
void CheckpointStore::place(const std::string& optimizer, int64_t optimizer_steps,
                            const TrainerState& state, int64_t step, const fs::path& temp,
                            const fs::path& final_dir) const {
  write_checkpoint_index(temp.string(),
                         {{"optimizer", optimizer}, {"steps", std::to_string(optimizer_steps)}});
  // The rank files were synced by their writers.
  for (const auto& e : fs::directory_iterator(temp))
    if (!is_rank_file_name(e.path().filename().string())) fsync_path(e.path());
  write_trainer_state(temp, state);
  fsync_path(temp / kTrainerStateFile);
  fsync_path(temp);
  failpoint(4);
  // Re-saving a step (a resumed run that ends where it started) replaces it atomically too.
  const fs::path old =
      fs::path(folder_) / fmt::format("{}old-{}", kTempPrefix, final_dir.filename().string());
  if (fs::exists(fs::symlink_status(final_dir))) {
    // Only a folder of ours is replaced; anything else under its name stays as it is.
    const std::string why = why_not_ours(fs::directory_entry(final_dir));
    BOTTLE_CHECK(why.empty(),
                 "{}: cannot save the checkpoint of step {}: a folder of that name is in "
                 "checkpoint.folder but bottle did not write it ({}); nothing was replaced: move "
                 "or rename it and resume",
                 final_dir.string(), step, why);
    fs::rename(final_dir, old);
  }
  if (guard_) guard_();
  fs::rename(temp, final_dir);
  fsync_path(folder_);
  if (fs::exists(old)) fs::remove_all(old);
  if (guard_) guard_();
  std::vector<std::string> all = list();
  for (size_t i = 0; i + size_t(keep_) < all.size(); ++i) prune(all[i]);
}

std::optional<int64_t> CheckpointStore::step_of(const std::string& dir) {
  fs::path where = fs::path(dir).lexically_normal();
  if (where.filename().empty()) where = where.parent_path();  // "run/step_5/"
  const std::string name = where.filename().string();
  const size_t prefix = std::strlen(kStepPrefix);
  // At most 18 digits: every such number fits an int64_t.
  if (name.size() <= prefix || name.size() > prefix + 18 || name.rfind(kStepPrefix, 0) != 0 ||
      name.find_first_not_of("0123456789", prefix) != std::string::npos)
    return std::nullopt;
  return std::stoll(name.substr(prefix));
}

CheckpointStore::Scan CheckpointStore::scan() const {
  Scan found;
  try {
    if (!fs::is_directory(folder_)) return found;
    for (const auto& e : fs::directory_iterator(folder_)) {
      const std::optional<int64_t> step = step_of(e.path().filename().string());
      if (!step) continue;  // not a step folder's name: not the store's
      if (std::string why = why_not_ours(e); !why.empty())
        found.foreign.emplace_back(e.path().string(), std::move(why));
      else if (fs::exists(e.path() / kTrainerStateFile))
        found.complete.emplace_back(*step, e.path().string());
      else
        found.incomplete.emplace_back(*step, e.path().string());
    }
  } catch (const fs::filesystem_error& e) {
    fail("{}: cannot read checkpoint.folder: {}", folder_, e.code().message());
  }
  // By the step's number, not its name: step_100000000 comes after step_99999999.
  std::sort(found.complete.begin(), found.complete.end());
  std::sort(found.incomplete.begin(), found.incomplete.end());
  std::sort(found.foreign.begin(), found.foreign.end());
  return found;
}

std::vector<std::string> CheckpointStore::list(bool complete) const {
  const Scan found = scan();
  std::vector<std::string> dirs;
  for (const auto& [step, dir] : complete ? found.complete : found.incomplete) dirs.push_back(dir);
  return dirs;
}

void CheckpointStore::check_no_foreign_steps() const {
  const Scan found = scan();
  if (found.foreign.empty()) return;
  const auto& [path, why] = found.foreign.front();
  fail(
      "{}: named like a checkpoint in checkpoint.folder, but bottle did not write it ({}); bottle "
      "never resumes from, replaces or deletes such a folder: move or rename it, or choose "
      "another checkpoint.folder",
      path, why);
}

std::vector<std::string> CheckpointStore::list() const { return list(true); }

std::vector<std::string> CheckpointStore::incomplete() const { return list(false); }

std::vector<int64_t> CheckpointStore::interrupted_saves() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  const std::string prefix = kTempPrefix;
  for (const auto& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && !name.starts_with(prefix + "old-"))
      if (const auto step = step_of(name.substr(prefix.size()))) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

CheckpointStore::CheckpointStore(ReadOnly, std::string folder)
    : folder_(std::move(folder)), keep_(0) {}

std::optional<std::string> CheckpointStore::newest(const std::string& folder) {
  return CheckpointStore(ReadOnly{}, folder).latest();
}

std::string model_directory(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "config.json", ec) || !fs::is_directory(path, ec)) return path;
  return CheckpointStore::newest(path).value_or(path);
}

void check_not_a_run_without_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "config.json", ec) ||
      CheckpointStore::newest(path))
    return;
  for (const char* file : {"train_config.toml", "metrics.jsonl", ".bottle.lock"})
    if (fs::exists(fs::path(path) / file, ec))
      fail(
          "{}: a run's folder (it holds {}) without a checkpoint yet: a run saves its first at "
          "checkpoint.interval, at a stop or at its end",
          path, file);
}

std::optional<std::string> CheckpointStore::latest() const {
  std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

TrainerState CheckpointStore::load(const std::string& dir, LlamaModel& model,
                                   Optimizer& optimizer) {
  // The small file first: a damaged state fails before the weights are read.
  const TrainerState state = read_trainer_state(dir);
  if (is_sharded_checkpoint(dir)) {
    // Each rank reads its own slices, of any layout's pieces, straight into place.
    const ShardedCheckpoint checkpoint(dir);
    const auto saved = checkpoint.metadata().find("optimizer");
    BOTTLE_CHECK(saved == checkpoint.metadata().end() || saved->second == optimizer.name(),
                 "{}: the optimizer state is {}'s; this run trains with {} (optimizer.name): "
                 "resume with optimizer.name = \"{}\", or start from its weights alone with "
                 "--init-from",
                 checkpoint.index_path(), saved->second, optimizer.name(), saved->second);
    load_model_weights(model, checkpoint);
    for (const FlatSource& state_part : optimizer.held_state())
      read_rank_pieces(checkpoint, model.parameters(), state_part);
    optimizer.set_steps_taken(state.optimizer_steps);
    return state;
  }
  // Checkpoints before the sharded format hold AdamW's moments whole, in optimizer.safetensors.
  BOTTLE_CHECK(std::string_view(optimizer.name()) == "adamw",
               "{}: the optimizer state is adamw's; this run trains with {} (optimizer.name): "
               "resume with optimizer.name = \"adamw\", or start from its weights alone with "
               "--init-from",
               dir, optimizer.name());
  load_model_weights(model, dir);
  const ShardedReader files(dir, "optimizer");
  const ParameterStore& params = model.parameters();
  Arena whole_arena(MemoryTag::comm, params.backend());
  const Tensor whole = whole_arena.alloc({params.padded()});
  for (const FlatSource& held : optimizer.held_state()) {
    params.backend().fill_zero(whole);
    const std::string which = held.prefix.substr(0, held.prefix.size() - 1);  // "exp_avg"
    for (const ParamSpec& spec : params.specs()) {
      const std::string tensor = moment_name(which.c_str(), spec.name);
      const std::vector<float> slice = read_parameter_slice(files.reader_for(tensor), tensor, spec);
      params.backend().from_host(whole.view(spec.offset, spec.shape), slice.data());
    }
    take_held(params.backend(), held, whole);
  }
  optimizer.set_steps_taken(state.optimizer_steps);
  return state;
}

}  // namespace bottle
