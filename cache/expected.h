// A value or an Error, for staged pipelines (source -> program -> binary -> module) where
// each stage either hands on its product or a failure with the full log, and the caller
// decides whether to throw, fall back or record it (the tuner records, the op call throws).
#pragma once

#include <utility>
#include <variant>

#include "cache/error.h"

namespace kiln {

template <typename T>
class Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Expected(Error error) : state_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  const Error& error() const { return std::get<1>(state_); }

  // The value, or throws the stored error.
  T& value() & {
    if (!ok()) throw error();
    return std::get<0>(state_);
  }
  const T& value() const& {
    if (!ok()) throw error();
    return std::get<0>(state_);
  }
  T&& value() && {
    if (!ok()) throw error();
    return std::get<0>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> state_;
};

}  // namespace kiln
