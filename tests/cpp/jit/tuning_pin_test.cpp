// Pinning: which results it selects, choosing a measured candidate by hand, staleness by
// version, and imports that leave pinned results alone. Files only, no GPU.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "cache/temp_folder.h"
#include "cache/tuning_db.h"
#include "jit/tuning_bundle.h"
#include "jit/tuning_pin.h"
#include "jit/tuning_record.h"
#include "jit_test_support.h"
#include "tuner/report_fixture.h"

namespace kiln::jit {
namespace {

using nlohmann::json;

DeviceInfo h200() {
  DeviceInfo d;
  d.name = "NVIDIA H200";
  d.cc_major = 9;
  d.sm_count = 132;
  d.memory_bytes = 141LL << 30;
  d.driver_version = 13000;
  return d;
}

void fill(const std::filesystem::path& root) {
  TuningDb db(root, CacheMode::rw);
  for (const TuneResult& result : {testing::rms_norm_result(), testing::swiglu_result()}) {
    REQUIRE(db.store(h200().fingerprint(), result.problem.key(), result.bucket_rows,
                     tuning_document(result, h200(), "13.0")));
  }
}

json load(const std::filesystem::path& root, const TuneResult& result) {
  TuningDb db(root, CacheMode::rw);
  auto document = db.load(h200().fingerprint(), result.problem.key(), result.bucket_rows);
  REQUIRE(document);
  return *document;
}

TEST_CASE("tune pin: selects by op, pins and unpins, and says what was already so") {
  kiln::test::TempFolder root;
  fill(root.path());
  PinRequest request;
  request.op = "rms_norm";
  PinOutcome outcome = set_pinned(root.path(), request);
  CHECK(outcome.changed.size() == 1);
  CHECK(test::contains(outcome.changed[0], "rms_norm."));
  CHECK(is_pinned(load(root.path(), testing::rms_norm_result())));
  CHECK_FALSE(is_pinned(load(root.path(), testing::swiglu_result())));
  // The winner is untouched when no config is asked for.
  CHECK(load(root.path(), testing::rms_norm_result()).at("winner").get<Config>() ==
        testing::rms_norm_result().winner);

  outcome = set_pinned(root.path(), request);
  CHECK(outcome.changed.empty());
  CHECK(outcome.unchanged.size() == 1);

  request.pin = false;
  request.op.clear();
  outcome = set_pinned(root.path(), request);
  CHECK(outcome.changed.size() == 1);
  CHECK(outcome.unchanged.size() == 1);
  CHECK_FALSE(is_pinned(load(root.path(), testing::rms_norm_result())));
}

TEST_CASE("tune pin: a measured candidate can be made the winner; others are refused") {
  kiln::test::TempFolder root;
  fill(root.path());
  const TuneResult result = testing::rms_norm_result();
  PinRequest request;
  request.problem = result.problem.key();
  request.config = result.heuristic.key();
  set_pinned(root.path(), request);
  const json document = load(root.path(), result);
  CHECK(document.at("winner").get<Config>() == result.heuristic);
  CHECK(test::contains(document.at("reason").get<std::string>(), "pinned by hand"));
  CHECK(is_pinned(document));

  request.config = Config{16, 1024, 1024, {}}.key();  // measured, but a resource error
  CHECK_THROWS_WITH_AS(set_pinned(root.path(), request), doctest::Contains("did not measure ok"),
                       Error);
  request.config = "v2.t1.c32";
  CHECK_THROWS_WITH_AS(set_pinned(root.path(), request), doctest::Contains("not a candidate"),
                       Error);
  request.problem.clear();  // two results match
  request.config = result.heuristic.key();
  CHECK_THROWS_WITH_AS(set_pinned(root.path(), request), doctest::Contains("2 results match"),
                       Error);
}

TEST_CASE("tune pin: an empty selection and an unknown op are errors naming the option") {
  kiln::test::TempFolder root;
  fill(root.path());
  PinRequest request;
  request.device = "A100";
  CHECK_THROWS_WITH_AS(set_pinned(root.path(), request), doctest::Contains("no tuning result"),
                       Error);
  request.device.clear();
  request.op = "rms_nrom";
  CHECK_THROWS_WITH_AS(set_pinned(root.path(), request), doctest::Contains("--op"), Error);
  request.op.clear();
  request.bucket = 7;
  CHECK_THROWS_AS(set_pinned(root.path(), request), Error);
}

TEST_CASE("stale: another kiln or NVRTC version makes an unpinned result stale") {
  json document = tuning_document(testing::rms_norm_result(), h200(), "13.0");
  const std::string kiln = document.at("versions").at("kiln").get<std::string>();
  CHECK(stale_reason(document, kiln, "13.0").empty());
  CHECK(test::contains(stale_reason(document, kiln, "13.1"), "nvrtc 13.0, now 13.1"));
  CHECK(test::contains(stale_reason(document, "9.9.9", "13.0"), "kiln " + kiln + ", now 9.9.9"));
  document["pinned"] = true;
  CHECK(stale_reason(document, "9.9.9", "13.1").empty());
  document.erase("pinned");
  document.erase("versions");
  CHECK(stale_reason(document, kiln, "13.0") == "it records no versions");
}

TEST_CASE("tune import: never replaces a pinned result; --pin pins what it brings") {
  kiln::test::TempFolder source, target, files;
  fill(source.path());
  fill(target.path());
  const auto bundle = files.path() / "tune.json";
  REQUIRE(export_tuning(source.path(), bundle).written == 2);

  PinRequest request;
  request.op = "swiglu";
  set_pinned(target.path(), request);
  const TuneTransfer imported = import_tuning(target.path(), bundle, /*pin=*/true);
  CHECK(imported.written == 1);
  CHECK(imported.kept_pinned == 1);
  REQUIRE(imported.problems.size() == 1);
  CHECK(test::contains(imported.problems[0], "pinned here"));
  CHECK(is_pinned(load(target.path(), testing::rms_norm_result())));
}

}  // namespace
}  // namespace kiln::jit
