#include "cache/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <thread>

#include "cache/settings.h"

namespace kiln {

std::filesystem::path lock_path(const std::filesystem::path& root, std::string_view name) {
  return root / kCacheLayout / "lock" / (std::string(name) + ".lock");
}

KeyLock::KeyLock(const std::filesystem::path& lock_file, std::chrono::duration<double> timeout) {
  std::error_code ec;
  std::filesystem::create_directories(lock_file.parent_path(), ec);
  do {
    fd_ = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) return;  // unavailable

  const auto start = std::chrono::steady_clock::now();
  // Polling with LOCK_NB rather than a blocking flock keeps the timeout exact without signals;
  // the back-off starts short because most compiles take well under a second.
  auto pause = std::chrono::milliseconds(2);
  bool waited = false;
  while (true) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      outcome_ = waited ? Outcome::acquired_after_wait : Outcome::acquired_at_once;
      break;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      ::close(fd_);
      fd_ = -1;
      outcome_ = Outcome::unavailable;
      break;
    }
    waited = true;
    if (std::chrono::steady_clock::now() - start >= timeout) {
      ::close(fd_);
      fd_ = -1;
      outcome_ = Outcome::timed_out;
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  waited_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

KeyLock::~KeyLock() {
  // Closing the descriptor releases the flock.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
