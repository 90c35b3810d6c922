#include "core/bf16_terms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"

namespace glms {
namespace {

double sum_of_terms(const uint16_t (&terms)[3]) {
  return static_cast<double>(bf16_to_f32(terms[0])) + bf16_to_f32(terms[1]) + bf16_to_f32(terms[2]);
}

// Random fp32 bit patterns over magnitudes 2^-100 .. 2^100 and both signs: the three terms sum
// to x exactly, and each term is at most half a bf16 step of the one before.
TEST(Bf16Terms, SumExactlyToTheValue) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1), exponent(27, 227), sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t word = sign(rng) << 31 | exponent(rng) << 23 | mantissa(rng);
    float x;
    std::memcpy(&x, &word, sizeof(x));
    uint16_t terms[3];
    bf16_terms(x, terms);
    ASSERT_EQ(sum_of_terms(terms), static_cast<double>(x)) << "x bits " << std::hex << word;
    ASSERT_LE(std::fabs(bf16_to_f32(terms[1])), std::ldexp(std::fabs(bf16_to_f32(terms[0])), -8));
    ASSERT_LE(std::fabs(bf16_to_f32(terms[2])), std::ldexp(std::fabs(bf16_to_f32(terms[1])), -8));
  }
}

// A bf16 value is its own first term; the others are zero. Zero splits into zeros.
TEST(Bf16Terms, Bf16ValuesAreOneTerm) {
  for (const float x : {0.0f, 1.0f, -0.5f, 3.0f, 1.0e-3f, -7.5e4f}) {
    const float rounded = bf16_to_f32(f32_to_bf16(x));
    uint16_t terms[3];
    bf16_terms(rounded, terms);
    EXPECT_EQ(bf16_to_f32(terms[0]), rounded);
    EXPECT_EQ(bf16_to_f32(terms[1]), 0.0f);
    EXPECT_EQ(bf16_to_f32(terms[2]), 0.0f);
  }
}

}  // namespace
}  // namespace glms
