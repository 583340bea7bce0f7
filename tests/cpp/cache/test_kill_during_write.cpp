// Fault test: a writer killed with SIGKILL at random moments while it publishes large entries
// must never leave anything a reader accepts as valid but wrong.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/binary_store.h"
#include "cache/cache_admin.h"
#include "cache/entry_format.h"
#include "cache/hash.h"
#include "temp_folder.h"

using kiln::BinaryStore;
using kiln::CacheMode;
using kiln::test::TempFolder;

namespace {

constexpr int kKeys = 4;

// Payload `version` of key `k`: its first 8 bytes say which, the rest follows from them, so a
// reader can check that what it loaded is exactly some version the writer meant.
std::vector<char> payload(int k, std::uint32_t version) {
  std::vector<char> bytes((1 << 20) + (version % 7) * 65536);
  std::uint32_t state = version * 2654435761u + static_cast<std::uint32_t>(k);
  std::memcpy(bytes.data(), &k, 4);
  std::memcpy(bytes.data() + 4, &version, 4);
  for (std::size_t i = 8; i < bytes.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    bytes[i] = static_cast<char>(state >> 24);
  }
  return bytes;
}

bool is_intact(int k, const std::vector<char>& bytes) {
  if (bytes.size() < 8) return false;
  int stored_k = 0;
  std::uint32_t version = 0;
  std::memcpy(&stored_k, bytes.data(), 4);
  std::memcpy(&version, bytes.data() + 4, 4);
  return stored_k == k && bytes == payload(k, version);
}

}  // namespace

TEST_CASE("kill -9 during publishes: readers never load a bad entry") {
  TempFolder temp;
  std::vector<std::string> keys;
  for (int k = 0; k < kKeys; ++k)
    keys.push_back(kiln::content_key({"kill test", std::to_string(k)}));

  std::mt19937 random(12345);
  constexpr int kKills = 200;
  int killed_mid_run = 0;
  std::uint64_t loads = 0, valid_loads = 0, files_checked = 0, bad_files = 0;
  for (int round = 0; round < kKills; ++round) {
    const pid_t writer = ::fork();
    if (writer == 0) {
      BinaryStore store(temp.path(), CacheMode::rw, 0);
      for (std::uint32_t version = round * 1000u;; ++version) {
        const int k = static_cast<int>(version % kKeys);
        store.store(keys[k], payload(k, version));
      }
    }
    // Die anywhere from before the first write to a few publishes in.
    ::usleep(std::uniform_int_distribution<int>(0, 30000)(random));
    ::kill(writer, SIGKILL);
    int status = 0;
    ::waitpid(writer, &status, 0);
    killed_mid_run += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;

    // A reader through the store: a hit is always exactly a payload the writer meant.
    BinaryStore reader(temp.path(), CacheMode::ro, 0);
    for (int k = 0; k < kKeys; ++k) {
      ++loads;
      if (auto loaded = reader.load(keys[k])) {
        ++valid_loads;
        CHECK(is_intact(k, *loaded));
      }
    }
    // And every file under an entry's name validates on its own (temp files never do, but
    // they are never under an entry's name).
    for (int k = 0; k < kKeys; ++k) {
      const auto bytes = kiln::test::read_bytes(reader.path_for(keys[k]));
      if (bytes.empty()) continue;
      ++files_checked;
      bad_files += !kiln::detail::check_entry(bytes, keys[k]).ok();
    }
  }
  CHECK(killed_mid_run == kKills);
  CHECK(bad_files == 0);
  CHECK(BinaryStore(temp.path(), CacheMode::ro, 0).stats().corrupt == 0);
  const auto leftovers = kiln::test::files_containing(temp.path(), ".tmp.");
  // Killed writers leave temp files; they are never read, and trim removes them once stale.
  std::printf(
      "kill -9 fault test: %d kills of a writer mid-publish, %llu loads (%llu hits), %llu entry "
      "files checked, %llu bad, %zu temp files left by killed writers\n",
      killed_mid_run, static_cast<unsigned long long>(loads),
      static_cast<unsigned long long>(valid_loads), static_cast<unsigned long long>(files_checked),
      static_cast<unsigned long long>(bad_files), leftovers.size());
  CHECK(valid_loads > 0);
}

TEST_CASE("a file-size limit fails the store without killing the process (SIGXFSZ)") {
  TempFolder temp;
  const auto key = kiln::content_key({"fsize"});
  const pid_t child = ::fork();
  if (child == 0) {
    // Default SIGXFSZ action (terminate), a 64 KiB limit, a 1 MiB entry.
    std::signal(SIGXFSZ, SIG_DFL);
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 64 * 1024;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    BinaryStore store(temp.path(), CacheMode::rw, 0);
    const bool stored = store.store(key, payload(0, 1));
    const bool small = store.store(kiln::content_key({"small"}), std::vector<char>(100, 'x'));
    ::_exit(!stored && small ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE_FALSE(WIFSIGNALED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(kiln::test::files_containing(temp.path(), ".tmp.").empty());
}
