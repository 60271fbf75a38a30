#pragma once
// One run per checkpoint.folder: `bottle train` holds an exclusive flock(2) on
// FOLDER/.bottle.lock for its lifetime. The kernel drops the lock when the process ends,
// however it ends (kill -9 included), so a lock file left behind never blocks a later run;
// the file holds the holder's host and pid for the refusal of a second run.
//
// The lock holds the file, not the name: a folder deleted under the run (rm -rf) or deleted
// and taken by another run leaves this lock on a file no longer there. lost() tells it, so
// that the run stops rather than save into, or report checkpoints of, a folder not its own.
#include <sys/types.h>

#include <string>

namespace bottle {

inline constexpr const char* kFolderLockFile = ".bottle.lock";

// What a lock guards, for its messages: "{target}: {name} is in use by another {holder}
// (held by host H pid P since T); {why}: wait for that run to end, or choose another {name}".
struct LockSubject {
  std::string name;    // as the user sets it: "checkpoint.folder", "metrics.jsonl", "--output"
  std::string target;  // the folder or file guarded
  std::string holder;  // the kind of process that holds such a lock: "bottle train"
  std::string why;     // what two writers would do
  bool remove_when_released = false;  // the lock file goes with the lock (outside a run's folder)
};

class FolderLock {
 public:
  // Locks `folder` (which exists) or throws naming it and the holder's host and pid.
  explicit FolderLock(const std::string& folder);
  // Locks the file `lock_path` (its directory exists) for `subject`: the same lock for the
  // files a run or prepare writes outside its folder (metrics, TensorBoard, prepare's output).
  FolderLock(const std::string& lock_path, const LockSubject& subject);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  // "" while the folder's lock file is the file this lock holds (the same device and inode);
  // else what became of it: gone (the folder deleted), or another file and who holds it.
  std::string lost() const;
  const std::string& path() const { return path_; }

 private:
  void lock_once(const LockSubject& subject);

  int fd_ = -1;
  std::string path_;  // FOLDER/.bottle.lock, or the lock file beside what it guards
  bool remove_when_released_ = false;
  dev_t device_ = 0;  // of the file held
  ino_t inode_ = 0;
};

}  // namespace bottle
