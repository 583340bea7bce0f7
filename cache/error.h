// kiln's one exception type. Every layer throws it, so a message that reaches a
// user always names where it came from (the op, the argument, the stage) and
// carries any log that explains it (an NVRTC log, a driver error name).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, std::string log = {})
      : std::runtime_error(log.empty() ? message : message + "\n" + log),
        message_(std::move(message)),
        log_(std::move(log)) {}

  // The one-line summary, without the attached log.
  const std::string& message() const { return message_; }
  // The full tool output (compiler log, ...) when there is one.
  const std::string& log() const { return log_; }

 private:
  std::string message_;
  std::string log_;
};

// Errors about a caller's argument: "kiln.rms_norm: weight: expected dtype bf16 (as x), got fp32".
// Kept as a distinct type so the Python layer can raise ValueError/TypeError for them.
class ArgumentError : public Error {
 public:
  ArgumentError(const std::string& op, const std::string& arg, const std::string& expected,
                const std::string& given)
      : Error("kiln." + op + ": " + arg + ": expected " + expected + ", got " + given) {}
};

}  // namespace kiln
