#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "jit/host_float.h"
#include "jit/verify.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::contains;

TEST_CASE("random values: deterministic, in [-1, 1), spread out, per dtype") {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const std::vector<char> a = random_values(dtype, 4096, 7);
    CHECK(a.size() == 4096 * dtype_size(dtype));
    CHECK(a == random_values(dtype, 4096, 7));
    CHECK(a != random_values(dtype, 4096, 8));
    double sum = 0;
    int negative = 0;
    for (std::int64_t i = 0; i < 4096; ++i) {
      const float value = element(dtype, a, i);
      REQUIRE(value >= -1.0f);
      // Rounding to a 16-bit type may carry a value just below 1 up to 1.
      REQUIRE(value <= 1.0f);
      sum += value;
      negative += value < 0;
    }
    CHECK(std::fabs(sum / 4096) < 0.05);
    CHECK(negative > 1800);
    CHECK(negative < 2300);
  }
}

TEST_CASE("compare: agrees within the dtype's tolerance, names the first bad element") {
  std::vector<float> reference = {1.0f, -2.0f, 0.5f, 100.0f};
  std::vector<float> got = reference;
  const auto bytes = [](const std::vector<float>& values) {
    std::vector<char> out(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  };
  CHECK_FALSE(compare_outputs(DType::f32, bytes(got), bytes(reference)));

  got[3] = 100.0f * (1 + 5e-6f);  // relative to |ref| when |ref| > 1
  CHECK_FALSE(compare_outputs(DType::f32, bytes(got), bytes(reference)));
  got[2] = 0.5f + 2e-5f;  // absolute 1e-5 when |ref| <= 1: too far
  const auto why = compare_outputs(DType::f32, bytes(got), bytes(reference));
  REQUIRE(why);
  CHECK(contains(*why, "element 2"));
  CHECK(contains(*why, "1 of 4"));

  got = reference;
  got[0] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(compare_outputs(DType::f32, bytes(got), bytes(reference)));
  CHECK(contains(*compare_outputs(DType::f32, bytes(got), bytes(reference)), "element 0"));
}

TEST_CASE("compare: a sum of many terms is allowed the rounding of reordering them") {
  const auto bytes = [](const std::vector<float>& values) {
    std::vector<char> out(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  };
  // Near zero, a sum of 1024 terms may differ by 1e-5 * sqrt(1024) = 3.2e-4; above 32 the
  // allowance is relative again.
  const std::vector<float> reference = {0.25f, -3.0f, 1000.0f};
  const std::vector<float> reordered = {0.25f + 3e-4f, -3.0f - 3e-4f, 1000.0f * (1 + 9e-6f)};
  CHECK(compare_outputs(DType::f32, bytes(reordered), bytes(reference)));
  CHECK_FALSE(compare_outputs(DType::f32, bytes(reordered), bytes(reference), 1024));
  // A lost term (of about unit size) is still far outside it.
  const std::vector<float> lost = {0.25f, -3.0f + 0.5f, 1000.0f};
  const auto why = compare_outputs(DType::f32, bytes(lost), bytes(reference), 1024);
  REQUIRE(why);
  CHECK(contains(*why, "element 1: got -2.5, expected -3 (allowed difference 0.00032"));
  CHECK(contains(*why, "1 of 3 elements differ"));
  // The last element alone, and a NaN there: the first bad one is found, not run past.
  std::vector<float> last = reference;
  last.back() = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(*compare_outputs(DType::f32, bytes(last), bytes(reference), 4), "element 2"));
  CHECK_THROWS(compare_outputs(DType::f32, bytes(reference), bytes(reference), 0));
}

TEST_CASE("compare: 16-bit tolerances and the poison pattern") {
  const auto halves = [](DType dtype, const std::vector<float>& values) {
    std::vector<char> out(values.size() * 2);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint16_t bits =
          dtype == DType::f16 ? float_to_f16_bits(values[i]) : float_to_bf16_bits(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
    return out;
  };
  // One bf16 ulp at 1.0 is 2^-7 = 0.0078: within 1.6e-2; three ulps are not.
  CHECK_FALSE(
      compare_outputs(DType::bf16, halves(DType::bf16, {1.0078125f}), halves(DType::bf16, {1.0f})));
  CHECK(
      compare_outputs(DType::bf16, halves(DType::bf16, {1.0234375f}), halves(DType::bf16, {1.0f})));
  // fp16: 1 ulp at 1.0 is 2^-10 ~ 0.001 passes 2e-3; 3 ulps do not.
  CHECK_FALSE(
      compare_outputs(DType::f16, halves(DType::f16, {1.0009765625f}), halves(DType::f16, {1.0f})));
  CHECK(
      compare_outputs(DType::f16, halves(DType::f16, {1.0029296875f}), halves(DType::f16, {1.0f})));
  // An output the kernel never wrote keeps the 0xFF poison: NaN in every dtype.
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const std::vector<char> poison(dtype_size(dtype), static_cast<char>(0xFF));
    std::vector<char> zero(dtype_size(dtype), 0);
    CHECK(compare_outputs(dtype, poison, zero));
  }
  CHECK_THROWS(compare_outputs(DType::f32, std::vector<char>(8), std::vector<char>(4)));
}

TEST_CASE("compare: long outputs count every bad element, NaN and infinity on either side") {
  // Long enough for the vectorized loop's body and its tail both to see bad elements.
  constexpr std::int64_t kCount = 1003;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(static_cast<int>(dtype));
    const std::vector<char> reference = random_values(dtype, kCount, 7);
    CHECK_FALSE(compare_outputs(dtype, reference, reference));
    const auto set = [&](std::vector<char>& bytes, std::int64_t index, float value) {
      const std::size_t size = dtype_size(dtype);
      if (dtype == DType::f32) {
        std::memcpy(bytes.data() + index * size, &value, 4);
      } else {
        const std::uint16_t bits =
            dtype == DType::f16 ? float_to_f16_bits(value) : float_to_bf16_bits(value);
        std::memcpy(bytes.data() + index * size, &bits, 2);
      }
    };
    std::vector<char> got = reference;
    std::vector<char> expected = reference;
    set(got, 17, std::numeric_limits<float>::quiet_NaN());
    set(expected, 500, std::numeric_limits<float>::quiet_NaN());
    set(got, 640, std::numeric_limits<float>::infinity());
    set(got, kCount - 1, element(dtype, reference, kCount - 1) + 0.5f);
    const auto why = compare_outputs(dtype, got, expected);
    REQUIRE(why);
    CHECK(contains(*why, "element 17:"));
    CHECK(contains(*why, "4 of 1003 elements differ"));
  }
}

TEST_CASE("timing summary: median and interquartile range") {
  const TimingSummary odd = summarize({5, 1, 4, 2, 3});
  CHECK(odd.median_us == doctest::Approx(3));
  CHECK(odd.spread_us == doctest::Approx(2));  // q75 = 4, q25 = 2
  const TimingSummary even = summarize({10, 20, 30, 40});
  CHECK(even.median_us == doctest::Approx(25));
  CHECK(even.spread_us == doctest::Approx(15));  // 32.5 - 17.5
  const TimingSummary one = summarize({7});
  CHECK(one.median_us == doctest::Approx(7));
  CHECK(one.spread_us == doctest::Approx(0));
  CHECK(summarize({}).median_us == 0);
}

}  // namespace kiln::jit
