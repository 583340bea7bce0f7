#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cache/binary_store.h"
#include "cache/cache_admin.h"
#include "cache/cache_stats.h"
#include "cache/hash.h"
#include "cache/settings.h"
#include "temp_folder.h"

using kiln::BinaryStore;
using kiln::CacheMode;
using kiln::test::TempFolder;

namespace {

void set_mtime(const std::filesystem::path& path, std::int64_t seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

std::string key_of(int i) {
  return kiln::content_key({"admin", std::to_string(i)});
}

}  // namespace

TEST_CASE("sizes parse and print in binary units") {
  CHECK(kiln::parse_size("2G") == (std::uint64_t{2} << 30));
  CHECK(kiln::parse_size("1.5GiB") == (std::uint64_t{3} << 29));
  CHECK(kiln::parse_size("300M") == 300ull << 20);
  CHECK(kiln::parse_size("4096") == 4096u);
  CHECK(kiln::parse_size("0") == 0u);
  CHECK_FALSE(kiln::parse_size("2X").has_value());
  CHECK_FALSE(kiln::parse_size("-1G").has_value());
  CHECK_FALSE(kiln::parse_size("").has_value());
  CHECK(kiln::format_size(1536) == "1.5 KiB");
}

TEST_CASE("trim removes the least recently used entries, by their used stamps") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw, 0);
  const std::vector<char> payload(10000, 'p');
  for (int i = 0; i < 6; ++i) {
    REQUIRE(store.store(key_of(i), payload));
    set_mtime(store.path_for(key_of(i)), 1'000'000 + i);  // created in order 0..5
  }
  // 0 and 1 were created first but used last: they are the ones to keep.
  for (int i : {0, 1}) {
    REQUIRE(store.load(key_of(i)));
    REQUIRE(std::filesystem::exists(kiln::used_stamp_path(store.path_for(key_of(i)))));
    set_mtime(kiln::used_stamp_path(store.path_for(key_of(i))), 2'000'000 + i);
  }
  const auto listed = kiln::list_binary_entries(temp.path());
  REQUIRE(listed.size() == 6);
  CHECK(listed.front().key == key_of(2));
  CHECK(listed.back().key == key_of(1));
  const std::uint64_t entry_bytes = listed.front().bytes;

  const auto result = kiln::trim_cache(temp.path(), 2 * entry_bytes, 2 * entry_bytes);
  CHECK(result.removed == 4);
  CHECK(result.kept == 2);
  CHECK(result.kept_bytes == 2 * entry_bytes);
  CHECK(store.load(key_of(0)).has_value());
  CHECK(store.load(key_of(1)).has_value());
  for (int i = 2; i < 6; ++i) {
    CHECK_FALSE(std::filesystem::exists(store.path_for(key_of(i))));
  }
  CHECK(kiln::persisted_cache_counters(temp.path()).evicted == 4);
}

TEST_CASE("the store keeps itself under its size bound") {
  TempFolder temp;
  const std::vector<char> payload(50000, 'q');
  // Bound of ~3 entries; the first store of a process checks the bound, and then every 32nd.
  BinaryStore store(temp.path(), CacheMode::rw, 3 * 50200);
  for (int i = 0; i < 40; ++i) REQUIRE(store.store(key_of(100 + i), payload));
  const auto entries = kiln::list_binary_entries(temp.path());
  CHECK(entries.size() < 40);
  CHECK(entries.size() >= 2);
}

TEST_CASE("trim clears stale temp files and entries moved aside a day ago, not fresh ones") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw, 0);
  REQUIRE(store.store(key_of(1), std::vector<char>(10, 'x')));
  const auto folder = store.path_for(key_of(1)).parent_path();
  kiln::test::write_bytes(folder / ".stale.bin.tmp.1.abc", kiln::test::bytes_of("half"));
  set_mtime(folder / ".stale.bin.tmp.1.abc", 1000);
  kiln::test::write_bytes(folder / ".fresh.bin.tmp.1.abc", kiln::test::bytes_of("writing"));
  kiln::test::write_bytes(folder / "x.bin.corrupt.1.0", kiln::test::bytes_of("bad"));
  set_mtime(folder / "x.bin.corrupt.1.0", 1000);
  kiln::test::write_bytes(folder / "y.bin.corrupt.1.1", kiln::test::bytes_of("bad, just now"));
  const auto result = kiln::trim_cache(temp.path(), 1 << 30, 1 << 30);
  CHECK(result.debris_removed == 2);
  CHECK_FALSE(std::filesystem::exists(folder / "x.bin.corrupt.1.0"));
  CHECK(std::filesystem::exists(folder / "y.bin.corrupt.1.1"));
  CHECK(std::filesystem::exists(folder / ".fresh.bin.tmp.1.abc"));
  CHECK(result.kept == 1);
}

TEST_CASE("an entry moved aside is dated by the move, so a trim right after keeps it") {
  TempFolder temp;
  // Trims at its first store, as a process's first store does.
  BinaryStore store(temp.path(), CacheMode::rw, 1 << 30);
  REQUIRE(store.store(key_of(1), std::vector<char>(100, 'x')));
  const auto path = store.path_for(key_of(1));
  auto bytes = kiln::test::read_bytes(path);
  bytes.resize(bytes.size() / 2);
  kiln::test::write_bytes(path, bytes);
  set_mtime(path, 1000);  // damaged long ago
  CHECK_FALSE(store.load(key_of(1)).has_value());
  const auto folder = path.parent_path();
  const auto aside_count = [&] {
    int count = 0;
    for (const auto& file : std::filesystem::directory_iterator(folder)) {
      count += file.path().filename().string().find(".corrupt.") != std::string::npos ? 1 : 0;
    }
    return count;
  };
  REQUIRE(aside_count() == 1);
  CHECK(kiln::trim_cache(temp.path(), 1 << 30, 1 << 30).debris_removed == 0);
  CHECK(aside_count() == 1);
}

TEST_CASE("verify moves bad entries aside; export and import copy only valid ones") {
  TempFolder temp, bundle, other;
  BinaryStore store(temp.path(), CacheMode::rw, 0);
  for (int i = 0; i < 3; ++i) REQUIRE(store.store(key_of(i), std::vector<char>(1000, 'a' + i)));
  auto bytes = kiln::test::read_bytes(store.path_for(key_of(2)));
  bytes[bytes.size() - 5] ^= 0x10;  // bit flip in the payload
  kiln::test::write_bytes(store.path_for(key_of(2)), bytes);

  const auto exported = kiln::export_cache(temp.path(), bundle.path());
  CHECK(exported.copied == 2);
  CHECK(exported.bad == 1);
  const auto imported = kiln::import_cache(other.path(), bundle.path());
  CHECK(imported.copied == 2);
  BinaryStore copy(other.path(), CacheMode::ro, 0);
  CHECK(copy.load(key_of(0)) == std::vector<char>(1000, 'a'));
  CHECK_FALSE(copy.load(key_of(2)).has_value());
  CHECK(kiln::import_cache(other.path(), bundle.path()).present == 2);

  const auto verified = kiln::verify_cache(temp.path());
  CHECK(verified.binaries == 3);
  CHECK(verified.bad_binaries == 1);
  CHECK(kiln::test::files_containing(temp.path(), ".corrupt.").size() == 1);
  CHECK(kiln::verify_cache(temp.path()).bad_binaries == 0);
  CHECK(kiln::persisted_cache_counters(temp.path()).corrupt == 1);

  CHECK(kiln::clear_cache(temp.path()) > 0);
  CHECK(kiln::list_binary_entries(temp.path()).empty());
}

TEST_CASE("statistics add up over concurrent processes") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw, 0);
  REQUIRE(store.store(key_of(0), std::vector<char>(10, 'x')));  // creates the cache folder
  kiln::flush_cache_counters();  // a store is written lazily (within a second, or at exit)
  const auto before = kiln::persisted_cache_counters(temp.path());
  constexpr int kProcesses = 6, kEvents = 40;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t child = ::fork();
    if (child == 0) {
      for (int e = 0; e < kEvents; ++e) {
        kiln::CacheCounters delta;
        delta.compiles = 1;
        delta.compile_ms = 0.5;
        kiln::count_cache_event(temp.path(), CacheMode::rw, delta);
      }
      ::_exit(0);
    }
    children.push_back(child);
  }
  for (pid_t child : children) ::waitpid(child, nullptr, 0);
  const auto after = kiln::persisted_cache_counters(temp.path());
  CHECK(after.compiles - before.compiles == kProcesses * kEvents);
  CHECK(after.compile_ms - before.compile_ms == doctest::Approx(kProcesses * kEvents * 0.5));
  CHECK(after.stores == 1);
  // ro never writes its counts to the cache.
  kiln::CacheCounters delta;
  delta.binary_hits = 5;
  kiln::count_cache_event(temp.path(), CacheMode::ro, delta);
  CHECK(kiln::persisted_cache_counters(temp.path()).binary_hits == after.binary_hits);
}
