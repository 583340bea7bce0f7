// Owning handles for what the evaluator creates on a GPU: memory, a stream, events. Each
// frees its resource on every path. Create and destroy them with the device's context
// current (inside a ScopedContext).
#pragma once

#include <cstddef>

#include "jit/cuda_api.h"

namespace kiln::jit {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;

  CUdeviceptr address() const { return address_; }
  std::size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr address_ = 0;
  std::size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();  // non-blocking: never waits for (or stalls) the legacy default stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }
  void synchronize(const char* context) const;

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  CUevent get() const { return event_; }
  void synchronize(const char* context) const;  // waits for the work recorded before it

 private:
  CUevent event_ = nullptr;
};

}  // namespace kiln::jit
