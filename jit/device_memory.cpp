#include "jit/device_memory.h"

#include <string>
#include <utility>

#include "jit/driver.h"

namespace kiln::jit {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  // A zero-byte request still gets a distinct, valid address.
  check(driver().cuMemAlloc(&address_, bytes == 0 ? 1 : bytes), "cuMemAlloc",
        std::to_string(bytes) + " bytes of scratch for tuning");
}

DeviceBuffer::~DeviceBuffer() {
  if (address_) {
    driver().cuMemFree(address_);
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : address_(std::exchange(other.address_, 0)), bytes_(other.bytes_) {}

Stream::Stream() {
  check(driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
        "tuning stream");
}

Stream::~Stream() {
  if (stream_) {
    driver().cuStreamDestroy(stream_);
  }
}

void Stream::synchronize(const char* context) const {
  check(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize", context);
}

Event::Event() {
  check(driver().cuEventCreate(&event_, CU_EVENT_DEFAULT), "cuEventCreate", "timing");
}

Event::~Event() {
  if (event_) {
    driver().cuEventDestroy(event_);
  }
}

void Event::synchronize(const char* context) const {
  check(driver().cuEventSynchronize(event_), "cuEventSynchronize", context);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

}  // namespace kiln::jit
