#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "cache/error.h"
#include "cache/manifest.h"
#include "temp_folder.h"

using kiln::test::TempFolder;

TEST_CASE("manifest records appended by many processes at once never interleave") {
  TempFolder temp;
  const auto file = temp.path() / "manifest.jsonl";
  constexpr int kProcesses = 8, kRecords = 200;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t child = ::fork();
    if (child == 0) {
      bool ok = true;
      for (int r = 0; r < kRecords; ++r) {
        // Long padding makes each line a few hundred bytes, so torn writes would show.
        ok = kiln::append_manifest_record(
                 file, {{"process", p}, {"record", r}, {"pad", std::string(300, 'a' + p)}}) &&
             ok;
      }
      ::_exit(ok ? 0 : 1);
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const auto read = kiln::read_manifest(file);
  CHECK(read.bad_lines == 0);
  REQUIRE(read.records.size() == kProcesses * kRecords);
  std::set<std::pair<int, int>> seen;
  for (const auto& record : read.records) {
    const int p = record.at("process").get<int>();
    CHECK(record.at("pad").get<std::string>() == std::string(300, 'a' + p));
    seen.emplace(p, record.at("record").get<int>());
  }
  CHECK(seen.size() == kProcesses * kRecords);
}

TEST_CASE("a manifest reader skips a torn line and keeps the others") {
  TempFolder temp;
  const auto file = temp.path() / "m.jsonl";
  kiln::test::write_bytes(file, kiln::test::bytes_of("{\"a\":1}\n{\"b\":\n[1]\n\n{\"c\":3}\n"));
  const auto read = kiln::read_manifest(file);
  CHECK(read.records.size() == 2);
  CHECK(read.bad_lines == 2);
  CHECK_THROWS_AS(kiln::read_manifest(temp.path() / "missing"), kiln::Error);
}

TEST_CASE("appending to a manifest that cannot be written returns false") {
  TempFolder temp;
  kiln::test::write_bytes(temp.path() / "file", kiln::test::bytes_of("x"));
  CHECK_FALSE(kiln::append_manifest_record(temp.path() / "file" / "m.jsonl", {{"a", 1}}));
}
