// write_file_atomic: readers never see a partial file because the bytes are written and
// flushed under a unique temp name in the target's folder and then renamed over the target
// (rename within one filesystem is atomic on POSIX).
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <random>
#include <string>
#include <system_error>

#include "cache/binary_store.h"
#include "cache/file_io.h"

namespace kiln {
namespace {

using detail::FileError;
namespace fs = std::filesystem;

// Unique among processes (pid), threads and calls (counter), and across a pid reused after a
// crash left a temp file behind (random salt).
std::string temp_suffix() {
  static const std::uint32_t salt = std::random_device{}();
  static std::atomic<std::uint64_t> counter{0};
  char text[64];
  std::snprintf(text, sizeof(text), ".tmp.%ld.%08x%llu", static_cast<long>(::getpid()), salt,
                static_cast<unsigned long long>(counter++));
  return text;
}

// Owns the temp file until it is renamed: any exit before that closes and unlinks it.
class TempFile {
 public:
  explicit TempFile(const fs::path& target) {
    auto folder = target.parent_path();
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::string name = ".";
      name += target.filename().native();
      name += temp_suffix();
      path_ = folder / name;
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ >= 0) return;
      if (errno == EINTR || errno == EEXIST) continue;
      throw FileError(target, "create temp file in " + folder.string(), errno);
    }
    throw FileError(target, "create temp file in " + folder.string(), EEXIST);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  // Close errors matter: some filesystems (NFS) report a failed write only at close.
  int close() {
    int result = ::close(fd_);
    fd_ = -1;
    return result;
  }
  void mark_renamed() { renamed_ = true; }

 private:
  fs::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

// A file-size limit (RLIMIT_FSIZE) makes an oversized write raise SIGXFSZ, whose default action
// kills the process. While the writing thread has it blocked, the kernel still fails the write
// with EFBIG, which kiln turns into "could not store" like any other full disk; the signal it
// left pending on this thread is taken off again before the mask is restored, so neither the
// process nor any handler the application installed ever sees it. No process-wide state
// changes.
class SigxfszBlocked {
 public:
  SigxfszBlocked() {
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, SIGXFSZ);
    active_ = ::pthread_sigmask(SIG_BLOCK, &only, &saved_) == 0;
    if (!active_) return;
    sigset_t pending;
    already_pending_ = ::sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
  }
  SigxfszBlocked(const SigxfszBlocked&) = delete;
  SigxfszBlocked& operator=(const SigxfszBlocked&) = delete;
  ~SigxfszBlocked() {
    if (!active_) return;
    if (!already_pending_ && sigismember(&saved_, SIGXFSZ) != 1) {
      sigset_t only;
      sigemptyset(&only);
      sigaddset(&only, SIGXFSZ);
      const timespec now{0, 0};
      while (::sigtimedwait(&only, nullptr, &now) == SIGXFSZ) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }

 private:
  sigset_t saved_{};
  bool active_ = false;
  bool already_pending_ = false;
};

void write_all(const fs::path& target, int fd, std::span<const char> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError(target, "write", errno);
    if (n == 0) throw FileError(target, "write", ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

void fsync_retrying(const fs::path& target, int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) throw FileError(target, "fsync", errno);
  }
}

// A rename over NFS can be carried out yet reported as failed (the reply was lost and the
// retry finds the source gone). If the target now holds exactly our bytes, it did its job.
bool target_holds(const fs::path& target, std::span<const char> bytes) {
  auto read = detail::read_whole_file(target);
  return read.status == detail::ReadStatus::ok &&
         std::equal(read.bytes.begin(), read.bytes.end(), bytes.begin(), bytes.end());
}

// Makes the rename itself durable; not every filesystem allows fsync on a folder, so failure
// is ignored.
void fsync_folder(const fs::path& folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomic(const fs::path& target, std::span<const char> bytes) {
  detail::write_file_atomic(target, bytes, /*durable=*/true);
}

namespace detail {

bool write_file_atomic_quiet(const fs::path& target, std::span<const char> bytes) {
  try {
    write_file_atomic(target, bytes, /*durable=*/false);
    return true;
  } catch (...) {
    return false;
  }
}

void write_file_atomic(const fs::path& target, std::span<const char> bytes, bool durable) {
  SigxfszBlocked no_sigxfsz;
  if (target.filename().empty()) {
    throw Error("kiln cache: write_file_atomic: expected a file path, got '" + target.string() +
                "'");
  }
  auto folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw FileError(target, "create folder " + folder.string(), ec.value());

  TempFile temp(folder / target.filename());
  write_all(target, temp.fd(), bytes);
  if (durable) fsync_retrying(target, temp.fd());
  if (temp.close() != 0) throw FileError(target, "close", errno);
  if (::rename(temp.path().c_str(), target.c_str()) == 0) {
    temp.mark_renamed();
  } else {
    // Success by content leaves the temp name to the destructor, which unlinks it if the
    // rename did not in fact happen.
    int code = errno;
    if (!target_holds(target, bytes)) throw FileError(target, "rename", code);
  }
  if (durable) fsync_folder(folder);
}

}  // namespace detail
}  // namespace kiln
