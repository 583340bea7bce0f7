// Manifests: files of one JSON object per line, appended by any number of processes at once
// (KILN_RECORD) and replayed by `kiln prewarm --manifest`. Each record is one write(2) of one
// whole line to a file opened with O_APPEND, so records of concurrent processes never
// interleave (the kernel positions and writes each append as a unit on a local filesystem).
// A reader skips lines that do not parse (a line cut short by a full disk or a crash), so one
// bad record never hides the others.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln {

// Appends `record` as one line. Returns false (logging once per file) when it could not.
bool append_manifest_record(const std::filesystem::path& file, const nlohmann::json& record);

struct ManifestRead {
  std::vector<nlohmann::json> records;  // objects only, in file order
  std::size_t bad_lines = 0;            // lines that were not a JSON object
};

// Throws kiln::Error when the file cannot be read.
ManifestRead read_manifest(const std::filesystem::path& file);

}  // namespace kiln
