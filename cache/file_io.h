// File primitives shared by the binary store and the tuning database (internal to cache/):
// whole-file reads that remember which file they read, moving a bad entry aside, and a
// publish that turns any write failure into `false` plus one warning per reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/error.h"

namespace kiln::detail {

// A failed file operation: `stage` says which step ("create folder", "write", "rename", ...),
// `code` is the errno, so callers can group repeats of the same failure.
class FileError : public Error {
 public:
  FileError(const std::filesystem::path& path, std::string stage, int code);
  const std::string& stage() const { return stage_; }
  int code() const { return code_; }

 private:
  std::string stage_;
  int code_;
};

enum class ReadStatus { ok, missing, unreadable };

struct FileRead {
  ReadStatus status = ReadStatus::missing;
  int code = 0;  // errno when unreadable
  std::vector<char> bytes;
  // Which file was read, so a bad entry is only moved aside if no writer replaced it since.
  std::uint64_t device = 0, inode = 0;
};

FileRead read_whole_file(const std::filesystem::path& path);

// Renames a bad entry to `<path>.corrupt.<pid>.<n>` in the same folder (removes it if the
// rename fails), unless the file at `path` is no longer the one `read` came from.
void move_aside(const std::filesystem::path& path, const FileRead& read, std::string_view reason);

// write_file_atomic that reports failure instead of throwing: on failure it logs once per
// (root, stage, errno) and returns false. `what` names the store in the message.
bool try_publish(std::string_view what, const std::filesystem::path& root,
                 const std::filesystem::path& target, std::span<const char> bytes);

// write_file_atomic with a choice of durability: durable writes fsync the file and its folder
// (entries); the others only rely on rename's atomicity (statistics, stamps).
void write_file_atomic(const std::filesystem::path& target, std::span<const char> bytes,
                       bool durable);
// Non-durable, silent: false on any failure (for advisory files such as statistics).
bool write_file_atomic_quiet(const std::filesystem::path& target, std::span<const char> bytes);

}  // namespace kiln::detail
