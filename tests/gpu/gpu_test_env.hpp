// GPU suites call MOK_REQUIRE_HOPPER() first: without a Hopper GPU the test is
// reported as skipped (never as passed).
#pragma once

#include <gtest/gtest.h>

#include "common/cuda_check.hpp"

#define MOK_REQUIRE_HOPPER()                                                  \
  do {                                                                        \
    if (::mok::detail::hopper_device_count() == 0) {                          \
      GTEST_SKIP() << "no Hopper (sm_90) GPU on this machine";                \
    }                                                                         \
  } while (0)
