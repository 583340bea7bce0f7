#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "jit/evaluator.h"
#include "templates/norm_family.h"

namespace kiln::jit {

namespace {

DeviceInfo with_sms(int sm_count) {
  DeviceInfo device;
  device.cc_major = 9;
  device.sm_count = sm_count;
  return device;
}

}  // namespace

TEST_CASE("rows checked: about 2^21 outputs, at least two rows per SM, at most 1031") {
  const Problem rms{Op::rms_norm, DType::bf16, 4096, kNormWeight, 16};
  const Problem gated{Op::gated_adaln, DType::bf16, 14848, kNormWeight, 16};
  const Family& rms_family = family(Op::rms_norm);
  const Family& gated_family = family(Op::gated_adaln);
  constexpr std::int64_t kDefault = std::int64_t{1} << 21;
  const DeviceInfo h200 = with_sms(132);

  // One output of 4096 a row: 512 rows make 2^21 outputs.
  CHECK(rows_to_check(h200, rms_family, rms, 32768, kDefault) == 512);
  CHECK(rows_to_check(h200, rms_family, rms, 300, kDefault) == 300);  // never more than asked
  CHECK(rows_to_check(h200, rms_family, rms, 1, kDefault) == 1);
  // Two outputs of 14848 a row would allow 70 rows; two rows per SM (and one) is the floor.
  CHECK(rows_to_check(h200, gated_family, gated, 32768, kDefault) == 265);
  CHECK(rows_to_check(with_sms(40), gated_family, gated, 32768, kDefault) == 81);
  // Narrow rows and many SMs stop at 1031 rows.
  const Problem narrow{Op::rms_norm, DType::bf16, 128, kNormWeight, 16};
  CHECK(rows_to_check(h200, rms_family, narrow, 32768, kDefault) == 1031);
  CHECK(rows_to_check(with_sms(1000), gated_family, gated, 32768, kDefault) == 1031);
  // An unbounded element budget checks up to 1031 rows.
  CHECK(rows_to_check(h200, gated_family, gated, 32768, std::numeric_limits<std::int64_t>::max()) ==
        1031);
}

}  // namespace kiln::jit
