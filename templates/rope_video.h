// LTX-Video's rotary grid parameters (RopeVideoGrid), as diffusers' LTXVideoRotaryPosEmbed
// defines them, for the kernels that compute angles from video coordinates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "templates/kiln/rope_params.cuh"

namespace kiln {

struct VideoRopeSettings {
  int frames = 7;  // the latent grid: 49 frames at 512x768 by default
  int height = 16;
  int width = 24;
  // Multiplies each axis' coordinate (frame, row, column) before the base sizes divide it;
  // absent, the raw coordinates are used, undivided, as diffusers does.
  std::optional<std::array<double, 3>> interpolation_scale = std::array<double, 3>{0.32, 32, 32};
  std::array<int, 3> base_sizes = {20, 2048, 2048};  // base_num_frames, base_height, base_width
  int patch_size_t = 1;
  int patch_size = 1;
  double theta = 10000.0;
};

// Throws ArgumentError (naming `op`) for a dim < 6 or odd, non-positive grid sizes or bases.
RopeVideoGrid make_video_grid(const char* op, std::int64_t dim, const VideoRopeSettings& settings);

}  // namespace kiln
