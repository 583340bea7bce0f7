#include "templates/rope_video.h"

#include <cmath>
#include <string>

#include "cache/error.h"

namespace kiln {

RopeVideoGrid make_video_grid(const char* op, std::int64_t dim, const VideoRopeSettings& s) {
  if (dim < 6 || dim % 2 != 0) {
    throw ArgumentError(op, "dim", "an even rotated width >= 6 (dim // 6 frequencies per axis)",
                        std::to_string(dim));
  }
  if (s.frames < 1 || s.height < 1 || s.width < 1) {
    throw ArgumentError(op, "grid", "frames, height and width >= 1",
                        std::to_string(s.frames) + " x " + std::to_string(s.height) + " x " +
                            std::to_string(s.width));
  }
  for (int base : s.base_sizes) {
    if (base < 1) throw ArgumentError(op, "base sizes", "values >= 1", std::to_string(base));
  }
  if (s.patch_size < 1 || s.patch_size_t < 1) {
    throw ArgumentError(op, "patch sizes", "values >= 1",
                        std::to_string(s.patch_size_t) + ", " + std::to_string(s.patch_size));
  }
  if (!(s.theta > 1.0)) throw ArgumentError(op, "theta", "a value > 1", std::to_string(s.theta));
  RopeVideoGrid grid{};
  grid.frames = s.frames;
  grid.height = s.height;
  grid.width = s.width;
  grid.width_divisor = make_divisor(static_cast<unsigned long long>(s.width));
  grid.height_divisor = make_divisor(static_cast<unsigned long long>(s.height));
  grid.pad_pairs = static_cast<int>((dim % 6) / 2);
  const double patches[3] = {static_cast<double>(s.patch_size_t), static_cast<double>(s.patch_size),
                             static_cast<double>(s.patch_size)};
  for (int a = 0; a < 3; ++a) {
    grid.scale[a] =
        s.interpolation_scale
            ? static_cast<float>((*s.interpolation_scale)[a] * patches[a] / s.base_sizes[a])
            : 1.0f;
  }
  const std::int64_t frequencies = dim / 6;
  grid.log2_freq_step =
      frequencies > 1 ? static_cast<float>(std::log2(s.theta) / double(frequencies - 1)) : 0.0f;
  return grid;
}

}  // namespace kiln
