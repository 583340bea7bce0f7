#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "cache/binary_store.h"
#include "cache/error.h"
#include "temp_folder.h"

using kiln::test::bytes_of;
using kiln::test::files_containing;
using kiln::test::read_bytes;
using kiln::test::TempFolder;

TEST_CASE("write_file_atomic writes exactly the bytes, creating folders") {
  TempFolder temp;
  auto target = temp.path() / "a" / "b" / "entry.bin";
  std::vector<char> bytes = {'x', '\0', '\n', static_cast<char>(0xFF), 'y'};
  kiln::write_file_atomic(target, bytes);
  CHECK(read_bytes(target) == bytes);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("write_file_atomic overwrites, including with fewer or no bytes") {
  TempFolder temp;
  auto target = temp.path() / "entry";
  kiln::write_file_atomic(target, bytes_of("a long first version"));
  kiln::write_file_atomic(target, bytes_of("short"));
  CHECK(read_bytes(target) == bytes_of("short"));
  kiln::write_file_atomic(target, std::vector<char>{});
  CHECK(std::filesystem::exists(target));
  CHECK(std::filesystem::file_size(target) == 0);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("write_file_atomic failure throws naming the path and leaves no temp file") {
  TempFolder temp;
  SUBCASE("folder cannot be created: a parent is a regular file") {
    kiln::test::write_bytes(temp.path() / "blocker", bytes_of("file"));
    auto target = temp.path() / "blocker" / "sub" / "entry";
    std::string message;
    try {
      kiln::write_file_atomic(target, bytes_of("payload"));
    } catch (const kiln::Error& error) {
      message = error.what();
    }
    CHECK(message.find(target.string()) != std::string::npos);
  }
  SUBCASE("rename fails: the target is a folder") {
    auto target = temp.path() / "occupied";
    std::filesystem::create_directories(target / "child");
    std::string message;
    try {
      kiln::write_file_atomic(target, bytes_of("payload"));
    } catch (const kiln::Error& error) {
      message = error.what();
    }
    CHECK(message.find(target.string()) != std::string::npos);
    CHECK(message.find("rename") != std::string::npos);
    CHECK(std::filesystem::is_directory(target / "child"));
  }
  SUBCASE("write fails: file-size limit") {
    auto target = temp.path() / "entry";
    kiln::write_file_atomic(target, bytes_of("old contents"));
    std::string message;
    {
      kiln::test::FileSizeLimit limit(1024);
      try {
        kiln::write_file_atomic(target, std::vector<char>(64 * 1024, 'z'));
      } catch (const kiln::Error& error) {
        message = error.what();
      }
    }
    CHECK(message.find(target.string()) != std::string::npos);
    CHECK(read_bytes(target) == bytes_of("old contents"));
  }
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("concurrent writers of one target leave one whole version and no temp files") {
  TempFolder temp;
  auto target = temp.path() / "shared";
  std::vector<std::vector<char>> versions;
  for (int i = 0; i < 8; ++i) versions.emplace_back(20000 + i, static_cast<char>('a' + i));
  std::vector<std::thread> writers;
  for (const auto& version : versions) {
    writers.emplace_back([&target, &version] {
      for (int round = 0; round < 20; ++round) kiln::write_file_atomic(target, version);
    });
  }
  bool always_whole = true;
  for (int i = 0; i < 200; ++i) {
    auto seen = read_bytes(target);
    if (seen.empty()) continue;  // not written yet
    bool whole = false;
    for (const auto& version : versions) whole = whole || seen == version;
    always_whole = always_whole && whole;
  }
  for (auto& writer : writers) writer.join();
  CHECK(always_whole);
  auto final_bytes = read_bytes(target);
  bool final_whole = false;
  for (const auto& version : versions) final_whole = final_whole || final_bytes == version;
  CHECK(final_whole);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}
