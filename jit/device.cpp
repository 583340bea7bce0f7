#include "jit/device.h"

#include <cmath>

#include "jit/device_probe.h"
#include "jit/driver.h"

#include "cache/error.h"

namespace kiln::jit {
namespace {

std::string path_safe(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.';
    out.push_back(keep ? c : '_');
  }
  return out.empty() ? std::string("unknown") : out;
}

}  // namespace

double DeviceInfo::datasheet_bandwidth_gbs() const {
  return static_cast<double>(memory_bus_bits) / 8.0 * static_cast<double>(memory_clock_khz) * 1e3 *
         2.0 / 1e9;
}

// Memory is rounded to the nearest GiB: the exact byte count moves a little with the driver
// and with ECC, and must not split identical GPUs into different tuning keys.
std::string DeviceInfo::fingerprint() const {
  const double gib = static_cast<double>(memory_bytes) / (1024.0 * 1024.0 * 1024.0);
  return path_safe(name) + ".sm" + std::to_string(sm()) + "." + std::to_string(sm_count) + "sm." +
         std::to_string(static_cast<long long>(std::llround(gib))) + "GiB";
}

DeviceTraits DeviceInfo::traits() const {
  DeviceTraits t;
  t.sm = sm();
  t.sm_count = sm_count;
  t.max_threads_per_block = max_threads_per_block;
  t.max_threads_per_sm = max_threads_per_sm;
  t.regs_per_sm = regs_per_sm;
  t.regs_per_block = regs_per_block;
  t.smem_per_block = smem_per_block;
  t.smem_per_block_optin = smem_per_block_optin;
  t.smem_per_sm = smem_per_sm;
  t.l2_bytes = l2_bytes;
  return t;
}

int device_count() {
  Driver& d = driver();
  int count = 0;
  check(d.cuDeviceGetCount(&count), "cuDeviceGetCount", "counting devices");
  if (count <= 0) throw Error("kiln: no CUDA device: the driver " + d.path + " reports none");
  return count;
}

DeviceInfo probe_device(int ordinal) {
  Driver& d = driver();
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw Error("kiln: no CUDA device " + std::to_string(ordinal) +
                ": expected an ordinal in [0, " + std::to_string(count) + ")");
  }
  const std::string where = "device " + std::to_string(ordinal);
  CUdevice device = 0;
  check(d.cuDeviceGet(&device, ordinal), "cuDeviceGet", where);

  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  check(d.cuDeviceGetName(name, sizeof(name) - 1, device), "cuDeviceGetName", where);
  info.name = name;
  const auto attribute = [&](CUdevice_attribute which, const char* what) {
    int value = 0;
    check(d.cuDeviceGetAttribute(&value, which, device), "cuDeviceGetAttribute",
          where + ", " + what);
    return value;
  };
  info.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc major");
  info.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc minor");
  info.sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count");
  info.l2_bytes = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 size");
  info.smem_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, "smem/block");
  info.smem_per_block_optin =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "opt-in smem/block");
  info.smem_per_sm = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "smem/SM");
  info.max_threads_per_block =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "threads/block");
  info.max_threads_per_sm =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, "threads/SM");
  info.regs_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, "registers/block");
  info.regs_per_sm =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, "registers/SM");
  info.memory_bus_bits = attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, "bus width");
  info.memory_clock_khz = attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, "memory clock");
  std::size_t total = 0;
  check(d.cuDeviceTotalMem(&total, device), "cuDeviceTotalMem", where);
  info.memory_bytes = static_cast<std::int64_t>(total);
  info.driver_version = d.version;
  return info;
}

}  // namespace kiln::jit
