#include <fogo/newton_schulz.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
TEST(NewtonSchulz, Builds) { EXPECT_EQ(fogo::newton_schulz(torch::randn({4, 6})).sizes(), torch::IntArrayRef({4, 6})); }
