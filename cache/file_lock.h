// Per-key cross-process locks: one lock file per key under <root>/v1/lock/, held with flock(2)
// (which Linux also maps onto NFS byte-range locks). Only a process that missed and is about to
// compile and publish takes one; readers never do. A waiter gives up after a timeout and goes
// on without the lock (a second compile of the same key is harmless, only wasted work: the
// publish is atomic either way). Lock files are left in place: removing one while another
// process waits on it would let two processes hold "the" lock.
#pragma once

#include <chrono>
#include <filesystem>
#include <string_view>

namespace kiln {

class KeyLock {
 public:
  enum class Outcome {
    acquired_at_once,  // nobody held it
    acquired_after_wait,
    timed_out,    // held by someone else past the timeout: proceed without it
    unavailable,  // could not create or lock the file (read-only folder, ...): proceed
  };

  // Blocks until the lock on `lock_file` is held or `timeout` passes.
  KeyLock(const std::filesystem::path& lock_file, std::chrono::duration<double> timeout);
  ~KeyLock();
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;

  Outcome outcome() const { return outcome_; }
  bool held() const { return fd_ >= 0; }
  // True when another process held the lock while we asked (we may find its result now).
  bool waited() const {
    return outcome_ == Outcome::acquired_after_wait || outcome_ == Outcome::timed_out;
  }
  double waited_seconds() const { return waited_seconds_; }

 private:
  int fd_ = -1;
  Outcome outcome_ = Outcome::unavailable;
  double waited_seconds_ = 0;
};

// <root>/v1/lock/<name>.lock
std::filesystem::path lock_path(const std::filesystem::path& root, std::string_view name);

}  // namespace kiln
