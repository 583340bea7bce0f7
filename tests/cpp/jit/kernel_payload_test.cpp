#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "jit/kernel_payload.h"

namespace kiln::jit {

namespace {

KernelPayload sample() {
  KernelPayload payload;
  payload.format = BinaryFormat::ptx;
  payload.name_expression = "kiln::rms_norm<kiln::bf16, 4096, 16, 32, 128, true>";
  payload.lowered_name =
      "_ZN4kiln8rms_normINS_4bf16ELi4096ELi16ELi32ELi128ELb1EEEvNS_13RmsNormParamsE";
  const std::string binary = ".version 9.0\n.target sm_90\n";
  payload.binary.assign(binary.begin(), binary.end());
  payload.binary.push_back('\0');  // binary bytes may hold NULs
  payload.binary.push_back('x');
  return payload;
}

}  // namespace

TEST_CASE("a kernel payload round-trips") {
  const KernelPayload payload = sample();
  const std::vector<char> bytes = encode_payload(payload);
  const auto decoded = decode_payload(bytes);
  REQUIRE(decoded);
  CHECK(decoded->format == payload.format);
  CHECK(decoded->name_expression == payload.name_expression);
  CHECK(decoded->lowered_name == payload.lowered_name);
  CHECK(decoded->binary == payload.binary);

  KernelPayload cubin = payload;
  cubin.format = BinaryFormat::cubin;
  CHECK(decode_payload(encode_payload(cubin))->format == BinaryFormat::cubin);
}

TEST_CASE("bytes that are not a payload are refused, never misread") {
  const std::vector<char> bytes = encode_payload(sample());
  CHECK_FALSE(decode_payload(std::vector<char>{}));
  CHECK_FALSE(decode_payload(std::vector<char>(bytes.begin(), bytes.begin() + 10)));
  // Truncated inside the names.
  CHECK_FALSE(decode_payload(std::vector<char>(bytes.begin(), bytes.begin() + 40)));
  std::vector<char> bad_magic = bytes;
  bad_magic[0] = 'X';
  CHECK_FALSE(decode_payload(bad_magic));
  std::vector<char> bad_version = bytes;
  bad_version[4] = 9;
  CHECK_FALSE(decode_payload(bad_version));
  std::vector<char> bad_format = bytes;
  bad_format[8] = 7;
  CHECK_FALSE(decode_payload(bad_format));
  std::vector<char> huge_name = bytes;
  huge_name[17] = 0x7F;  // lowered-name length far past the end
  CHECK_FALSE(decode_payload(huge_name));
  KernelPayload empty = sample();
  empty.binary.clear();
  CHECK_FALSE(decode_payload(encode_payload(empty)));
}

}  // namespace kiln::jit
