// The checks run() makes on each rank's tensors before anything is enqueued
// (src/world/rank_tensors.cpp), with no GPU: the pointers are never read, so
// aligned stand-in addresses do. Here the fp8 layer's: its weights' scales
// must be given (at any alignment), a bf16 layer's must not, and an fp8 pass
// has no training mode.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "world/rank_tensors.hpp"

namespace {

// A distinct, 256-byte-aligned stand-in address per field.
const void* fake(uintptr_t slot) { return reinterpret_cast<const void*>(0x10000 + slot * 256); }

mok::RankTensors complete_bf16_tensors() {
  mok::RankTensors t;
  t.x = fake(1);
  t.expert_ids = static_cast<const int32_t*>(fake(2));
  t.weights = static_cast<const float*>(fake(3));
  t.out = const_cast<void*>(fake(4));
  t.w13 = fake(5);
  t.w2 = fake(6);
  t.shared_w13 = fake(7);
  t.shared_w2 = fake(8);
  return t;
}

mok::RankTensors complete_fp8_tensors() {
  mok::RankTensors t = complete_bf16_tensors();
  t.w13_scales = fake(9);
  t.w2_scales = fake(10);
  return t;
}

void expect_refused(const mok::LayerConfig& config, const mok::RankTensors& t, const std::vector<std::string>& says) {
  try {
    mok::world::check_rank_tensors(config, t, 1);
    ADD_FAILURE() << "accepted; expected an error saying " << says.front();
  } catch (const mok::Error& e) {
    for (const std::string& s : says) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

const mok::LayerConfig kBf16 = mok::make_config(mok::find_shape("small"), 2, 64);
const mok::LayerConfig kFp8 = mok::make_config(mok::find_shape("small"), 2, 64, mok::DType::kFP8E4M3);

TEST(RankTensors, Fp8WeightsNeedTheirScalesAtAnyAlignment) {
  EXPECT_NO_THROW(mok::world::check_rank_tensors(kFp8, complete_fp8_tensors(), 1));
  mok::RankTensors t = complete_fp8_tensors();
  t.w13_scales = nullptr;
  expect_refused(kFp8, t, {"rank 1: w13_scales is null", "e4m3"});
  t = complete_fp8_tensors();
  t.w2_scales = nullptr;
  expect_refused(kFp8, t, {"rank 1: w2_scales is null"});
  // Scales are read a byte at a time: an odd address is fine.
  t = complete_fp8_tensors();
  t.w13_scales = static_cast<const uint8_t*>(fake(9)) + 1;
  t.w2_scales = static_cast<const uint8_t*>(fake(10)) + 3;
  EXPECT_NO_THROW(mok::world::check_rank_tensors(kFp8, t, 1));
  // The e4m3 weights themselves are TMA bases: 16-byte aligned, as in bf16.
  t = complete_fp8_tensors();
  t.w2 = static_cast<const uint8_t*>(fake(6)) + 8;
  expect_refused(kFp8, t, {"rank 1: w2 = ", "16-byte aligned"});
}

TEST(RankTensors, ABf16LayerRefusesWeightScales) {
  EXPECT_NO_THROW(mok::world::check_rank_tensors(kBf16, complete_bf16_tensors(), 1));
  mok::RankTensors t = complete_bf16_tensors();
  t.w2_scales = fake(10);
  expect_refused(kBf16, t, {"rank 1: w2_scales is given", "dtype is bf16"});
}

TEST(RankTensors, TheFp8ForwardHasNoTrainingMode) {
  mok::RankTensors t = complete_fp8_tensors();
  t.pass_state = const_cast<void*>(fake(11));
  EXPECT_NO_THROW(mok::world::check_rank_tensors(kFp8, t, 1));  // a caller's pass state is fine
  t.preact = const_cast<void*>(fake(12));
  expect_refused(kFp8, t, {"rank 1: preact is given", "no training mode"});
  t.preact = nullptr;
  t.shared_preact = const_cast<void*>(fake(13));
  expect_refused(kFp8, t, {"rank 1: shared_preact is given", "no training mode"});
  // The same buffers in bf16 are the training mode.
  t = complete_bf16_tensors();
  t.pass_state = const_cast<void*>(fake(11));
  t.preact = const_cast<void*>(fake(12));
  EXPECT_NO_THROW(mok::world::check_rank_tensors(kBf16, t, 1));
}

}  // namespace
