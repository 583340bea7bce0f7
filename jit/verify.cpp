#include "jit/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cache/error.h"
#include "jit/host_float.h"

namespace kiln::jit {
namespace {

// splitmix64: tiny, fast and identical everywhere (std:: distributions are not).
std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(position));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = position - static_cast<double>(below);
  return sorted[below] * (1.0 - weight) + sorted[above] * weight;
}

}  // namespace

std::vector<char> random_values(DType dtype, std::int64_t elements, std::uint64_t seed) {
  const std::size_t size = dtype_size(dtype);
  std::vector<char> bytes(static_cast<std::size_t>(elements) * size);
  std::uint64_t state = seed;
  for (std::int64_t i = 0; i < elements; ++i) {
    // 24 random bits -> a float exactly representable in fp32, uniform in [-1, 1).
    const float value =
        static_cast<float>(static_cast<double>(next(state) >> 40) / 8388608.0 - 1.0);
    char* out = bytes.data() + static_cast<std::size_t>(i) * size;
    if (dtype == DType::f32) {
      std::memcpy(out, &value, 4);
    } else {
      const std::uint16_t bits =
          dtype == DType::f16 ? float_to_f16_bits(value) : float_to_bf16_bits(value);
      std::memcpy(out, &bits, 2);
    }
  }
  return bytes;
}

float element(DType dtype, std::span<const char> bytes, std::int64_t index) {
  const char* at = bytes.data() + static_cast<std::size_t>(index) * dtype_size(dtype);
  if (dtype == DType::f32) {
    float value;
    std::memcpy(&value, at, 4);
    return value;
  }
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return dtype == DType::f16 ? f16_bits_to_float(bits) : bf16_bits_to_float(bits);
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    case DType::bf16:
      return 1.6e-2;
  }
  return 0;
}

namespace {

// Every element's value as a float, for one dtype; inlined, so the compare loop vectorizes.
template <DType kDType>
float value_at(const char* data, std::int64_t index) {
  if constexpr (kDType == DType::f32) {
    float value;
    std::memcpy(&value, data + index * 4, 4);
    return value;
  } else {
    std::uint16_t bits;
    std::memcpy(&bits, data + index * 2, 2);
    return kDType == DType::bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
  }
}

template <DType kDType>
std::optional<std::string> compare_as(std::span<const char> got, std::span<const char> expected,
                                      float floor) {
  const auto count = static_cast<std::int64_t>(got.size() / dtype_size(kDType));
  const float tol = static_cast<float>(tolerance(kDType));
  // NaN on either side fails: the comparison is false for it.
  const auto close = [&](std::int64_t i) {
    const float g = value_at<kDType>(got.data(), i);
    const float e = value_at<kDType>(expected.data(), i);
    return std::fabs(g - e) <= tol * std::max(floor, std::fabs(e));
  };
  // Counted without a branch, so the loop vectorizes: a tune compares every candidate's
  // output, millions of elements.
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    bad += close(i) ? 0 : 1;
  }
  if (bad == 0) {
    return std::nullopt;
  }
  std::int64_t first_bad = 0;
  while (first_bad < count - 1 && close(first_bad)) {
    ++first_bad;
  }
  const double e = value_at<kDType>(expected.data(), first_bad);
  // snprintf, not a stream: an ostringstream formatting this index crashed the op extension on
  // the H200 machine, whose build linked a copy of libstdc++'s locale into the module beside
  // the process's (tests/python/test_extension_sources.py).
  char text[256];
  std::snprintf(text, sizeof text,
                "element %lld: got %.9g, expected %.9g (allowed difference %.9g); %lld of %lld "
                "elements differ",
                static_cast<long long>(first_bad),
                static_cast<double>(value_at<kDType>(got.data(), first_bad)), e,
                tolerance(kDType) * std::max(static_cast<double>(floor), std::fabs(e)),
                static_cast<long long>(bad), static_cast<long long>(count));
  return std::string(text);
}

}  // namespace

std::optional<std::string> compare_outputs(DType dtype, std::span<const char> got,
                                           std::span<const char> expected,
                                           std::int64_t summed_terms) {
  if (got.size() != expected.size()) {
    throw Error("kiln: compare_outputs: expected buffers of equal size, got " +
                std::to_string(got.size()) + " and " + std::to_string(expected.size()) + " bytes");
  }
  if (summed_terms < 1) {
    throw Error("kiln: compare_outputs: expected summed_terms >= 1, got " +
                std::to_string(summed_terms));
  }
  const auto floor = static_cast<float>(std::sqrt(static_cast<double>(summed_terms)));
  switch (dtype) {
    case DType::f32:
      return compare_as<DType::f32>(got, expected, floor);
    case DType::f16:
      return compare_as<DType::f16>(got, expected, floor);
    case DType::bf16:
      return compare_as<DType::bf16>(got, expected, floor);
  }
  throw Error("kiln: compare_outputs: unknown dtype");
}

TimingSummary summarize(std::vector<double> samples_us) {
  if (samples_us.empty()) {
    return {};
  }
  std::sort(samples_us.begin(), samples_us.end());
  return {quantile(samples_us, 0.5), quantile(samples_us, 0.75) - quantile(samples_us, 0.25)};
}

}  // namespace kiln::jit
