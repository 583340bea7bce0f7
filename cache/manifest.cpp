#include "cache/manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cache/error.h"
#include "cache/file_io.h"
#include "cache/log.h"

namespace kiln {

bool append_manifest_record(const std::filesystem::path& file, const nlohmann::json& record) {
  std::string line;
  try {
    line = record.dump() + "\n";  // dump() without indent never contains a newline
  } catch (const std::exception& error) {
    log::warn_once("manifest dump",
                   std::string("kiln: cannot record a specialisation: ") + error.what());
    return false;
  }
  int fd;
  do {
    fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  int code = fd < 0 ? errno : 0;
  if (fd >= 0) {
    ssize_t written;
    do {
      written = ::write(fd, line.data(), line.size());
    } while (written < 0 && errno == EINTR);
    // A short append (disk full) leaves a partial line that readers skip; it is not retried,
    // since a second write could be interleaved with another process's record.
    if (written != static_cast<ssize_t>(line.size())) code = written < 0 ? errno : ENOSPC;
    ::close(fd);
  }
  if (code == 0) return true;
  log::warn_once("manifest:" + file.string() + ":" + std::to_string(code),
                 "kiln: cannot append to the KILN_RECORD manifest " + file.string() + " (" +
                     std::strerror(code) + "); not recording");
  return false;
}

ManifestRead read_manifest(const std::filesystem::path& file) {
  const auto read = detail::read_whole_file(file);
  if (read.status != detail::ReadStatus::ok) {
    throw Error("kiln: manifest " + file.string() + ": cannot read it (" +
                std::strerror(read.code ? read.code : ENOENT) + ")");
  }
  ManifestRead result;
  std::size_t start = 0;
  const std::size_t size = read.bytes.size();
  while (start < size) {
    std::size_t end = start;
    while (end < size && read.bytes[end] != '\n') ++end;
    const std::string_view line(read.bytes.data() + start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_object()) {
        result.records.push_back(std::move(record));
      } else {
        ++result.bad_lines;
      }
    }
    start = end + 1;
  }
  return result;
}

}  // namespace kiln
