#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "cache/file_lock.h"
#include "temp_folder.h"

using kiln::KeyLock;
using kiln::test::TempFolder;

TEST_CASE("a key lock excludes a second holder until released, then lets it in") {
  TempFolder temp;
  const auto file = kiln::lock_path(temp.path(), "abc");
  CHECK(file == temp.path() / "v1" / "lock" / "abc.lock");
  {
    KeyLock first(file, std::chrono::seconds(1));
    REQUIRE(first.held());
    CHECK(first.outcome() == KeyLock::Outcome::acquired_at_once);
    KeyLock second(file, std::chrono::milliseconds(60));
    CHECK_FALSE(second.held());
    CHECK(second.outcome() == KeyLock::Outcome::timed_out);
    CHECK(second.waited());
    CHECK(second.waited_seconds() >= 0.05);
  }
  KeyLock third(file, std::chrono::milliseconds(60));
  CHECK(third.outcome() == KeyLock::Outcome::acquired_at_once);
}

TEST_CASE("a waiter gets the lock when another process releases it") {
  TempFolder temp;
  const auto file = kiln::lock_path(temp.path(), "k");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    KeyLock held(file, std::chrono::seconds(5));
    char byte = held.held() ? 1 : 0;
    (void)!::write(ready[1], &byte, 1);
    ::usleep(150 * 1000);
    ::_exit(0);
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  REQUIRE(byte == 1);
  KeyLock waiter(file, std::chrono::seconds(5));
  CHECK(waiter.held());
  CHECK(waiter.outcome() == KeyLock::Outcome::acquired_after_wait);
  CHECK(waiter.waited_seconds() > 0.05);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("a lock that cannot be created is reported unavailable, not thrown") {
  TempFolder temp;
  kiln::test::write_bytes(temp.path() / "file", kiln::test::bytes_of("x"));
  KeyLock lock(kiln::lock_path(temp.path() / "file", "k"), std::chrono::seconds(1));
  CHECK_FALSE(lock.held());
  CHECK(lock.outcome() == KeyLock::Outcome::unavailable);
}
