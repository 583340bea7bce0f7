#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cache/binary_store.h"
#include "cache/error.h"
#include "cache/hash.h"
#include "temp_folder.h"

using kiln::BinaryStore;
using kiln::CacheMode;
using kiln::test::bytes_of;
using kiln::test::files_containing;
using kiln::test::read_bytes;
using kiln::test::TempFolder;
using kiln::test::write_bytes;

namespace {

std::vector<char> sample_payload(std::size_t size, int seed) {
  std::vector<char> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed) & 0xFF);
  return bytes;
}

std::uint64_t read_le(const std::vector<char>& bytes, std::size_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = 0; i < width; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

}  // namespace

TEST_CASE("binary store entries live at <root>/v1/bin/<first two>/<key>.bin") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"layout"});
  CHECK(store.path_for(key) == temp.path() / "v1" / "bin" / key.substr(0, 2) / (key + ".bin"));
  CHECK_THROWS_AS(store.path_for("../escape"), kiln::Error);
  CHECK_THROWS_AS(store.path_for(""), kiln::Error);
}

TEST_CASE("binary store entry header follows the documented layout") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"header"});
  auto payload = sample_payload(300, 5);
  REQUIRE(store.store(key, payload));
  auto file = read_bytes(store.path_for(key));
  REQUIRE(file.size() == 8 + 4 + 4 + key.size() + 8 + 8 + payload.size());
  CHECK(std::string(file.data(), 8) == std::string("KILNBIN\0", 8));
  CHECK(read_le(file, 8, 4) == BinaryStore::kFormatVersion);
  CHECK(read_le(file, 12, 4) == key.size());
  CHECK(std::string(file.data() + 16, key.size()) == key);
  std::size_t at = 16 + key.size();
  CHECK(read_le(file, at, 8) == payload.size());
  CHECK(read_le(file, at + 8, 8) == kiln::checksum64(payload));
  CHECK(std::vector<char>(file.begin() + at + 16, file.end()) == payload);
}

TEST_CASE("binary store round trip and stats") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"round trip"});
  auto other = kiln::content_key({"never stored"});
  auto payload = sample_payload(10000, 1);

  CHECK_FALSE(store.load(key).has_value());
  REQUIRE(store.store(key, payload));
  auto loaded = store.load(key);
  REQUIRE(loaded.has_value());
  CHECK(*loaded == payload);
  CHECK_FALSE(store.load(other).has_value());
  REQUIRE(store.store(other, std::vector<char>{}));
  auto empty = store.load(other);
  REQUIRE(empty.has_value());
  CHECK(empty->empty());

  auto stats = store.stats();
  CHECK(stats.hits == 2);
  CHECK(stats.misses == 2);
  CHECK(stats.stores == 2);
  CHECK(stats.corrupt == 0);
  CHECK(stats.store_failures == 0);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("a bad entry is a miss, counted, moved aside, then rebuilt") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"victim"});
  auto payload = sample_payload(4096, 9);
  auto path = store.path_for(key);
  REQUIRE(store.store(key, payload));
  auto good = read_bytes(path);

  std::function<void()> damage;
  SUBCASE("truncated payload") {
    damage = [&] { write_bytes(path, std::vector<char>(good.begin(), good.end() - 100)); };
  }
  SUBCASE("truncated header") {
    damage = [&] { write_bytes(path, std::vector<char>(good.begin(), good.begin() + 10)); };
  }
  SUBCASE("one bit flipped in the payload") {
    damage = [&] {
      auto bad = good;
      bad[bad.size() - 1000] ^= 0x10;
      write_bytes(path, bad);
    };
  }
  SUBCASE("zero-length file") {
    damage = [&] { write_bytes(path, {}); };
  }
  SUBCASE("bad magic") {
    damage = [&] {
      auto bad = good;
      bad[0] = 'X';
      write_bytes(path, bad);
    };
  }
  SUBCASE("other format version") {
    damage = [&] {
      auto bad = good;
      bad[8] = static_cast<char>(BinaryStore::kFormatVersion + 1);
      write_bytes(path, bad);
    };
  }
  SUBCASE("trailing bytes after the payload") {
    damage = [&] {
      auto bad = good;
      bad.push_back('!');
      write_bytes(path, bad);
    };
  }
  SUBCASE("another key's entry under this key's name") {
    damage = [&] {
      auto donor = kiln::content_key({"donor"});
      REQUIRE(store.store(donor, payload));
      std::filesystem::copy_file(store.path_for(donor), path,
                                 std::filesystem::copy_options::overwrite_existing);
    };
  }
  REQUIRE(damage);
  damage();
  auto before = store.stats();

  CHECK_FALSE(store.load(key).has_value());
  auto after = store.stats();
  CHECK(after.corrupt == before.corrupt + 1);
  CHECK(after.misses == before.misses + 1);
  CHECK(after.hits == before.hits);
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(files_containing(path.parent_path(), ".corrupt.").size() == 1);

  REQUIRE(store.store(key, payload));
  auto rebuilt = store.load(key);
  REQUIRE(rebuilt.has_value());
  CHECK(*rebuilt == payload);
  CHECK(store.stats().corrupt == after.corrupt);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("read-only modes read existing entries and write nothing") {
  TempFolder temp;
  auto key = kiln::content_key({"existing"});
  auto fresh = kiln::content_key({"fresh"});
  auto payload = sample_payload(512, 3);
  REQUIRE(BinaryStore(temp.path(), CacheMode::rw).store(key, payload));

  for (auto mode : {CacheMode::ro, CacheMode::strict}) {
    CAPTURE(kiln::cache_mode_name(mode));
    BinaryStore store(temp.path(), mode);
    auto loaded = store.load(key);
    REQUIRE(loaded.has_value());
    CHECK(*loaded == payload);
    CHECK_FALSE(store.store(fresh, payload));
    CHECK_FALSE(store.store(key, sample_payload(512, 4)));
    CHECK_FALSE(std::filesystem::exists(store.path_for(fresh)));
    CHECK_FALSE(std::filesystem::exists(store.path_for(fresh).parent_path()));
    CHECK(*store.load(key) == payload);
    CHECK(store.stats().stores == 0);
  }
}

TEST_CASE("mode off neither reads nor writes") {
  TempFolder temp;
  auto key = kiln::content_key({"present"});
  auto payload = sample_payload(64, 2);
  REQUIRE(BinaryStore(temp.path(), CacheMode::rw).store(key, payload));
  auto original = read_bytes(BinaryStore(temp.path(), CacheMode::rw).path_for(key));

  BinaryStore store(temp.path(), CacheMode::off);
  CHECK_FALSE(store.load(key).has_value());
  CHECK_FALSE(store.store(key, sample_payload(64, 7)));
  CHECK(read_bytes(store.path_for(key)) == original);
  CHECK(store.stats().hits == 0);
}

TEST_CASE("an unwritable root makes store return false without throwing") {
  TempFolder temp;
  auto key = kiln::content_key({"unwritable"});
  auto payload = sample_payload(128, 1);

  // Works for every user, root included: a folder cannot be created under a regular file.
  write_bytes(temp.path() / "not-a-folder", bytes_of("plain file"));
  BinaryStore under_file(temp.path() / "not-a-folder" / "cache", CacheMode::rw);
  bool stored = true;
  CHECK_NOTHROW(stored = under_file.store(key, payload));
  CHECK_FALSE(stored);
  CHECK(under_file.stats().store_failures == 1);
  CHECK(under_file.stats().stores == 0);
  CHECK_FALSE(under_file.load(key).has_value());

  // Root ignores permission bits, so the read-only folder case only means something otherwise.
  if (::geteuid() != 0) {
    auto locked = temp.path() / "locked";
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(
        locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                    std::filesystem::perms::group_read | std::filesystem::perms::group_exec |
                    std::filesystem::perms::others_read | std::filesystem::perms::others_exec);
    BinaryStore read_only(locked / "cache", CacheMode::rw);
    CHECK_NOTHROW(stored = read_only.store(key, payload));
    CHECK_FALSE(stored);
    CHECK(read_only.stats().store_failures == 1);
    CHECK(std::filesystem::is_empty(locked));
  }
}

TEST_CASE("a write that hits the file-size limit fails cleanly and keeps the old entry") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"limited"});
  auto small = sample_payload(100, 1);
  REQUIRE(store.store(key, small));

  bool stored = true;
  {
    kiln::test::FileSizeLimit limit(4096);
    CHECK_NOTHROW(stored = store.store(key, sample_payload(64 * 1024, 2)));
  }
  CHECK_FALSE(stored);
  CHECK(store.stats().store_failures == 1);
  auto loaded = store.load(key);
  REQUIRE(loaded.has_value());
  CHECK(*loaded == small);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("concurrent stores and loads of one key never see a partial entry") {
  TempFolder temp;
  BinaryStore store(temp.path(), CacheMode::rw);
  auto key = kiln::content_key({"contended"});
  auto payload = sample_payload(200000, 4);
  std::atomic<bool> stop{false};
  std::atomic<int> bad_loads{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) store.store(key, payload);
    });
  }
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      while (!stop) {
        auto loaded = store.load(key);
        if (loaded && *loaded != payload) ++bad_loads;
      }
    });
  }
  for (int i = 0; i < 3; ++i) threads[i].join();
  stop = true;
  for (std::size_t i = 3; i < threads.size(); ++i) threads[i].join();
  CHECK(bad_loads == 0);
  CHECK(store.stats().corrupt == 0);
  CHECK(store.stats().stores == 60);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}
