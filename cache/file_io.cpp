#include "cache/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>

#include "cache/binary_store.h"
#include "cache/log.h"

namespace kiln::detail {
namespace {

// Closes on scope exit; the read path has nothing useful to do with a close error.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

FileError::FileError(const std::filesystem::path& path, std::string stage, int code)
    : Error("kiln cache: " + path.string() + ": " + stage + " failed: " + std::strerror(code)),
      stage_(std::move(stage)),
      code_(code) {}

FileRead read_whole_file(const std::filesystem::path& path) {
  FileRead read;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    // ENOTDIR: a path component is a file, so the entry cannot exist either.
    read.status =
        errno == ENOENT || errno == ENOTDIR ? ReadStatus::missing : ReadStatus::unreadable;
    read.code = errno;
    return read;
  }
  FdCloser closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    read.status = ReadStatus::unreadable;
    read.code = errno;
    return read;
  }
  if (!S_ISREG(info.st_mode)) {
    read.status = ReadStatus::unreadable;
    read.code = EISDIR;
    return read;
  }
  read.device = static_cast<std::uint64_t>(info.st_dev);
  read.inode = static_cast<std::uint64_t>(info.st_ino);
  // The size is a hint only: read to end of file, so a file that changes size is still read
  // whole (and then fails validation if it was being rewritten in place by someone else).
  read.bytes.resize(static_cast<std::size_t>(info.st_size) + 1);
  std::size_t used = 0;
  while (true) {
    if (used == read.bytes.size()) read.bytes.resize(read.bytes.size() * 2 + 4096);
    ssize_t n = ::read(fd, read.bytes.data() + used, read.bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      read.status = ReadStatus::unreadable;
      read.code = errno;
      read.bytes.clear();
      return read;
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  read.bytes.resize(used);
  read.status = ReadStatus::ok;
  return read;
}

void move_aside(const std::filesystem::path& path, const FileRead& read, std::string_view reason) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;  // already gone: someone else moved it
  if (static_cast<std::uint64_t>(info.st_dev) != read.device ||
      static_cast<std::uint64_t>(info.st_ino) != read.inode) {
    return;  // a writer published a fresh entry after we read the bad one
  }
  static std::atomic<std::uint64_t> counter{0};
  auto aside = path;
  aside += ".corrupt." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  if (::rename(path.c_str(), aside.c_str()) == 0) {
    // Dated by the move, not the bad write, so trims keep it its day (kAsideKeptSeconds).
    ::utimensat(AT_FDCWD, aside.c_str(), nullptr, 0);
    log::warn("kiln cache: invalid entry " + path.string() + " (" + std::string(reason) +
              "); moved aside to " + aside.filename().string());
    return;
  }
  ::unlink(path.c_str());
  log::warn("kiln cache: invalid entry " + path.string() + " (" + std::string(reason) +
            "); removed");
}

bool try_publish(std::string_view what, const std::filesystem::path& root,
                 const std::filesystem::path& target, std::span<const char> bytes) {
  try {
    std::string reason_key, message;
    try {
      kiln::write_file_atomic(target, bytes);
      return true;
    } catch (const FileError& error) {
      // Grouped by the kind of step, not its folder: an unwritable cache fails in each of its
      // entry folders, and that is one condition to report, once.
      const auto& stage = error.stage();
      reason_key = stage.substr(0, stage.find(" /")) + ":" + std::to_string(error.code());
      message = error.stage() + ": " + std::strerror(error.code());
    } catch (const std::exception& error) {
      reason_key = message = error.what();
    }
    log::warn_once(std::string(what) + ":" + root.string() + ":" + reason_key,
                   "kiln cache: cannot store into the " + std::string(what) + " at " +
                       root.string() + " (" + message + "); continuing without storing");
  } catch (...) {
    // Even out of memory while reporting, a failed store is `false`, never an exception.
  }
  return false;
}

}  // namespace kiln::detail
