// gtest entry point of every test binary: the library's default thread count
// comes from FLASHATTN_TEST_THREADS (default 2, the CI machine's cores).
#include <gtest/gtest.h>

#include "flashattn/flashattn.h"
#include "support/problem.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fa_set_default_num_threads(fatest::test_threads());
  return RUN_ALL_TESTS();
}
