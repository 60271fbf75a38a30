#pragma once
// One run per checkpoint.folder: `bottle train` holds an exclusive flock(2) on
// FOLDER/.bottle.lock for its lifetime. The kernel drops the lock when the process ends,
// however it ends (kill -9 included), so a lock file left behind never blocks a later run;
// the file holds the holder's host and pid for the refusal of a second run.
#include <string>

namespace bottle {

inline constexpr const char* kFolderLockFile = ".bottle.lock";

class FolderLock {
 public:
  // Locks `folder` (which exists) or throws naming it and the holder's host and pid.
  explicit FolderLock(const std::string& folder);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace bottle
