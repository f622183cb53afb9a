// Routing validation: every rejection names the rank, token and slot.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "mok/routing.hpp"
#include "mok/schedule.hpp"

namespace {

struct TwoRanks {
  mok::LayerConfig config = mok::make_config(mok::find_shape("small"), std::vector<int>{2, 3});
  // small: E = 8, top_k = 2
  std::vector<int32_t> ids0 = {0, 1, 2, 3};
  std::vector<float> w0 = {0.5f, 0.5f, 0.25f, 0.75f};
  std::vector<int32_t> ids1 = {4, 5, 6, 7, 0, 7};
  std::vector<float> w1 = {1.f, -1.f, 0.f, 2.f, 0.1f, 0.9f};

  std::vector<mok::RankRouting> views() {
    return {{ids0.data(), w0.data(), 2}, {ids1.data(), w1.data(), 3}};
  }
};

void expect_rejected(TwoRanks& routing, std::initializer_list<const char*> fragments) {
  const auto views = routing.views();
  try {
    mok::validate_routing(routing.config, views);
    FAIL() << "routing was accepted";
  } catch (const mok::Error& e) {
    const std::string message = e.what();
    for (const char* fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
  }
}

TEST(RoutingValidation, AcceptsValidRouting) {
  TwoRanks routing;
  const auto views = routing.views();
  EXPECT_NO_THROW(mok::validate_routing(routing.config, views));
}

TEST(RoutingValidation, RejectsExpertIdOutOfRange) {
  TwoRanks routing;
  routing.ids1[3] = 8;  // rank 1, token 1, slot 1
  expect_rejected(routing, {"rank 1, token 1, slot 1", "expert id 8", "[0, 8)"});
  routing = TwoRanks{};
  routing.ids0[0] = -1;
  expect_rejected(routing, {"rank 0, token 0, slot 0", "expert id -1"});
}

TEST(RoutingValidation, RejectsTheSameExpertTwiceInOneToken) {
  TwoRanks routing;
  routing.ids1[5] = 0;  // rank 1, token 2: {0, 0}
  expect_rejected(routing, {"rank 1, token 2, slot 1", "expert 0", "slot 0"});
}

TEST(RoutingValidation, RejectsNonFiniteWeights) {
  TwoRanks routing;
  routing.w0[3] = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(routing, {"rank 0, token 1, slot 1", "not finite"});
  routing = TwoRanks{};
  routing.w1[0] = std::numeric_limits<float>::infinity();
  expect_rejected(routing, {"rank 1, token 0, slot 0", "not finite"});
}

TEST(RoutingValidation, RejectsShapeMismatches) {
  TwoRanks routing;
  auto views = routing.views();
  views[1].tokens = 2;
  try {
    mok::validate_routing(routing.config, views);
    FAIL();
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: routing has 2 tokens; tokens_per_rank[1] is 3"),
              std::string::npos) << e.what();
  }
  views = routing.views();
  views.pop_back();
  EXPECT_THROW(mok::validate_routing(routing.config, views), mok::Error);
  views = routing.views();
  views[0].expert_ids = nullptr;
  EXPECT_THROW(mok::validate_routing(routing.config, views), mok::Error);
  views = routing.views();
  views[0].weights = nullptr;
  EXPECT_THROW(mok::validate_routing(routing.config, views), mok::Error);
  // The schedule reads ids only, so it does not need weights...
  EXPECT_NO_THROW(mok::build_schedule(routing.config, views));
  // ...but it still validates the ids.
  routing.ids0[1] = 99;
  views = routing.views();
  EXPECT_THROW(mok::build_schedule(routing.config, views), mok::Error);
}

}  // namespace
