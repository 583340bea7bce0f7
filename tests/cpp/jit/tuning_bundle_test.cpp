#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "cache/temp_folder.h"
#include "cache/tuning_db.h"
#include "jit/tuning_bundle.h"
#include "jit/tuning_record.h"
#include "jit_test_support.h"
#include "tuner/report_fixture.h"

namespace kiln::jit {
namespace {

using nlohmann::json;

DeviceInfo h100() {
  DeviceInfo d;
  d.name = "NVIDIA H100 80GB HBM3";
  d.cc_major = 9;
  d.sm_count = 132;
  d.memory_bytes = 80LL << 30;
  d.memory_bus_bits = 5120;
  d.memory_clock_khz = 2619000;
  d.driver_version = 13000;
  return d;
}

// A database holding what the runtime writes for two tuned problems.
void fill(const std::filesystem::path& root) {
  TuningDb db(root, CacheMode::rw);
  for (const TuneResult& result : {testing::rms_norm_result(), testing::swiglu_result()}) {
    REQUIRE(db.store(h100().fingerprint(), result.problem.key(), result.bucket_rows,
                     tuning_document(result, h100(), "12.8")));
  }
}

json entry_for(const TuneResult& result) {
  return {{"device", path_component(h100().fingerprint())},
          {"problem", result.problem.key()},
          {"bucket", result.bucket_rows},
          {"document", tuning_document(result, h100(), "12.8")}};
}

TEST_CASE("tune bundle: entries the runtime wrote are valid; mismatches are named") {
  json entry = entry_for(testing::rms_norm_result());
  CHECK(invalid_entry_reason(entry) == "");
  json wrong = entry;
  wrong["problem"] = "rms_norm.bf16.h2048.f1.a16";
  CHECK(test::contains(invalid_entry_reason(wrong), "problem key"));
  wrong = entry;
  wrong["bucket"] = 1;
  CHECK(test::contains(invalid_entry_reason(wrong), "bucket"));
  wrong = entry;
  wrong["device"] = "other";
  CHECK(test::contains(invalid_entry_reason(wrong), "measured on"));
  wrong = entry;
  wrong["document"]["trials"][0].erase("median_us");
  CHECK(test::contains(invalid_entry_reason(wrong), "median_us"));
  wrong = entry;
  wrong["document"]["problem"]["hidden"] = 0;
  wrong["problem"] = "rms_norm.bf16.h0.f1.a16";
  CHECK(invalid_entry_reason(wrong) != "");
  CHECK(test::contains(invalid_entry_reason(json::array()), "expected an object"));
}

TEST_CASE("tune bundle: export then import reproduces the database") {
  kiln::test::TempFolder source, target, files;
  fill(source.path());
  const auto bundle = files.path() / "tune.json";
  const TuneTransfer exported = export_tuning(source.path(), bundle);
  CHECK(exported.written == 2);
  CHECK(exported.skipped_invalid == 0);
  const TuneTransfer imported = import_tuning(target.path(), bundle);
  CHECK(imported.written == 2);
  CHECK(imported.skipped_invalid == 0);
  const auto before = read_tuning_documents(source.path());
  const auto after = read_tuning_documents(target.path());
  REQUIRE(after.size() == 2);
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i].document == before[i].document);
  CHECK(tuning_report(target.path(), {}, report::Format::json) ==
        tuning_report(source.path(), {}, report::Format::json));
  CHECK(export_tuning(source.path(), bundle, "A100").written == 0);
}

TEST_CASE("tune bundle: a file that is not a bundle is an error and writes nothing") {
  kiln::test::TempFolder target, files;
  const auto bundle = files.path() / "bad.json";
  std::ofstream(bundle) << R"({"format": "kiln.tune-bundle", "version": 7, "entries": []})";
  CHECK_THROWS_AS(import_tuning(target.path(), bundle), Error);
  CHECK_THROWS_AS(import_tuning(target.path(), files.path() / "missing.json"), Error);
  CHECK(read_tuning_documents(target.path()).empty());
}

}  // namespace
}  // namespace kiln::jit
