#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "jit/tuning_record.h"
#include "jit_test_support.h"
#include "templates/rms_norm_family.h"

namespace kiln::jit {

using test::contains;

namespace {

Problem bf16_problem(std::int64_t hidden, std::uint32_t align) {
  Problem problem;
  problem.op = Op::rms_norm;
  problem.dtype = DType::bf16;
  problem.hidden = hidden;
  problem.flags = kRmsNormHasWeight;
  problem.align = align;
  return problem;
}

}  // namespace

TEST_CASE("driver versions read as major.minor") {
  CHECK(driver_version_string(13000) == "13.0");
  CHECK(driver_version_string(12080) == "12.8");
  CHECK(driver_version_string(12020) == "12.2");
}

TEST_CASE("the tuning document is the tune result plus versions and device") {
  const Family& fam = family(Op::rms_norm);
  const Problem problem = bf16_problem(4096, 16);
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  TuneResult result;
  result.problem = problem;
  result.bucket_rows = 1024;
  result.mode = TuneMode::fast;
  result.heuristic = fam.heuristic(problem, traits);
  result.winner = fam.space(problem, traits).back();
  result.reason = "test";

  DeviceInfo device;
  device.name = "NVIDIA H100 80GB HBM3";
  device.cc_major = 9;
  device.sm_count = 132;
  device.memory_bytes = 85520809984;
  device.driver_version = 12080;
  const nlohmann::json doc = tuning_document(result, device, "13.0");
  CHECK(doc.at("versions").at("nvrtc") == "13.0");
  CHECK(doc.at("versions").at("driver") == "12.8");
  CHECK_FALSE(doc.at("versions").at("kiln").get<std::string>().empty());
  CHECK(doc.at("device").at("fingerprint") == device.fingerprint());
  CHECK(doc.at("device").at("sm") == 90);
  CHECK(doc.at("device").at("sm_count") == 132);
  CHECK(doc.at("device").at("name") == device.name);
  // Still a TuneResult to its readers.
  const TuneResult back = doc.get<TuneResult>();
  CHECK(back.winner == result.winner);
  CHECK(back.problem == problem);

  std::string why;
  const auto winner = usable_winner(doc, fam, problem, traits, why);
  REQUIRE(winner);
  CHECK(*winner == result.winner);
}

TEST_CASE("a stored winner the family no longer accepts, or cannot read, is not used") {
  const Family& fam = family(Op::rms_norm);
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  Config wide;
  wide.vec_bytes = 16;
  wide.threads_per_row = 128;
  wide.cta_threads = 256;
  nlohmann::json doc = {{"winner", wide}};
  std::string why;
  // Valid for 16-byte aligned rows...
  CHECK(usable_winner(doc, fam, bf16_problem(4096, 16), traits, why));
  // ...but not for a problem whose data is only 2-byte aligned.
  CHECK_FALSE(usable_winner(doc, fam, bf16_problem(4545, 2), traits, why));
  CHECK(contains(why, "no longer valid"));
  CHECK(contains(why, wide.key()));

  CHECK_FALSE(
      usable_winner(nlohmann::json{{"trials", 3}}, fam, bf16_problem(4096, 16), traits, why));
  CHECK(contains(why, "no readable winner"));
  CHECK_FALSE(
      usable_winner(nlohmann::json{{"winner", "v16"}}, fam, bf16_problem(4096, 16), traits, why));
}

}  // namespace kiln::jit
