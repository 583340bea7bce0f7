// The single by-value parameter of kiln::rms_norm. Included by the kernel template and by
// host code that fills it, so it holds plain data only and includes nothing.
#pragma once

namespace kiln {

struct RmsNormParams {
  void* out;
  const void* x;
  const void* weight;  // null when the kernel is specialised without a weight
  long long rows;
  long long x_row_stride;    // in elements
  long long out_row_stride;  // in elements
  float eps;
};

}  // namespace kiln
