#include <doctest/doctest.h>

#include <string>

#include "jit/device.h"

namespace kiln::jit {

namespace {

// The figures an H200 reports through the driver.
DeviceInfo h200() {
  DeviceInfo info;
  info.name = "NVIDIA H200";
  info.cc_major = 9;
  info.cc_minor = 0;
  info.sm_count = 132;
  info.l2_bytes = 52428800;
  info.smem_per_block = 49152;
  info.smem_per_block_optin = 232448;
  info.smem_per_sm = 233472;
  info.max_threads_per_block = 1024;
  info.max_threads_per_sm = 2048;
  info.regs_per_block = 65536;
  info.regs_per_sm = 65536;
  info.memory_bytes = 150754820096;  // 143771 MiB
  info.memory_bus_bits = 6144;
  info.memory_clock_khz = 3201000;
  info.driver_version = 13000;
  return info;
}

}  // namespace

TEST_CASE("fingerprint: name, compute capability, SMs and memory, safe as a folder name") {
  const DeviceInfo info = h200();
  CHECK(info.sm() == 90);
  CHECK(info.fingerprint() == "NVIDIA_H200.sm90.132sm.140GiB");

  DeviceInfo odd = info;
  odd.name = "NVIDIA A100-SXM4-80GB / MIG 1g.10gb";
  odd.cc_major = 8;
  odd.memory_bytes = 85031714816;  // 81092 MiB: 79.2 GiB rounds to 79
  odd.sm_count = 108;
  const std::string fp = odd.fingerprint();
  CHECK(fp == "NVIDIA_A100-SXM4-80GB___MIG_1g.10gb.sm80.108sm.79GiB");
  CHECK(fp.find('/') == std::string::npos);
  CHECK(fp.find(' ') == std::string::npos);
}

TEST_CASE("fingerprint: ignores the driver, separates anything that changes the tuning") {
  const DeviceInfo base = h200();
  DeviceInfo newer_driver = base;
  newer_driver.driver_version = 13010;
  CHECK(newer_driver.fingerprint() == base.fingerprint());
  DeviceInfo fewer_sms = base;
  fewer_sms.sm_count = 114;
  CHECK(fewer_sms.fingerprint() != base.fingerprint());
  DeviceInfo other_cc = base;
  other_cc.cc_minor = 1;
  CHECK(other_cc.fingerprint() != base.fingerprint());
  DeviceInfo less_memory = base;
  less_memory.memory_bytes = 85520809984;
  CHECK(less_memory.fingerprint() != base.fingerprint());
  // A few MiB less (ECC, driver reservations) stays the same GPU.
  DeviceInfo ecc = base;
  ecc.memory_bytes -= 300LL * 1024 * 1024;
  CHECK(ecc.fingerprint() == base.fingerprint());
}

TEST_CASE("datasheet bandwidth: bus width x memory clock x 2") {
  // 6144 bits / 8 * 3.201 GHz * 2 = 4917 GB/s (the H200's 4.8 TB/s datasheet figure).
  CHECK(h200().datasheet_bandwidth_gbs() == doctest::Approx(4917.0).epsilon(0.001));
  DeviceInfo t4;
  t4.memory_bus_bits = 256;
  t4.memory_clock_khz = 5001000;
  CHECK(t4.datasheet_bandwidth_gbs() == doctest::Approx(320.0).epsilon(0.001));
}

TEST_CASE("traits carry the probed limits") {
  const DeviceTraits traits = h200().traits();
  CHECK(traits.sm == 90);
  CHECK(traits.sm_count == 132);
  CHECK(traits.max_threads_per_block == 1024);
  CHECK(traits.max_threads_per_sm == 2048);
  CHECK(traits.regs_per_block == 65536);
  CHECK(traits.regs_per_sm == 65536);
  CHECK(traits.smem_per_block == 49152);
  CHECK(traits.smem_per_block_optin == 232448);
  CHECK(traits.smem_per_sm == 233472);
  CHECK(traits.l2_bytes == 52428800);
}

}  // namespace kiln::jit
