// The polynomials of the CPU backend's exp2, shared by every kernel set:
// 2^x = 2^n * p(f), n = round(x), f in [-1/2, 1/2], coefficients highest
// degree first (Horner). Degree 6: the Taylor polynomial of 2^f (relative
// error ~1.2e-7, fp32's level). Degree 4: a minimax fit with p(0) = 1
// (relative error 2.9e-6), for bf16 tensors whose P is rounded to bf16,
// 2^-9, before its products.
//
// Exp2UnitPoly: 2^f on f in [0, 1) (exp2_unmasked_ps, where f = x - floor(x)),
// least-squares fits in the relative error with p(0) = 1. Degree 5:
// relative error 8.4e-8, fp32's level. Degree 3: 8.7e-5, 2^-13, for P
// rounded to bf16 (2^-9) before its products.
#pragma once

namespace flashattn {
namespace cpu {

template <int kDegree>
struct Exp2Poly;
template <>
struct Exp2Poly<6> {
  static constexpr float kCoefficients[7] = {1.5403530393381606e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                                             5.5504108664821580e-2f, 2.4022650695910071e-1f, 6.9314718055994531e-1f,
                                             1.0f};
};
template <>
struct Exp2Poly<4> {
  static constexpr float kCoefficients[5] = {9.5828517127e-03f, 5.5906426650e-02f, 2.4024098652e-01f,
                                             6.9312419305e-01f, 1.0f};
};

template <int kDegree>
struct Exp2UnitPoly;
template <>
struct Exp2UnitPoly<5> {
  static constexpr float kCoefficients[6] = {1.8671827856e-03f, 9.0166879818e-03f, 5.5800445378e-02f,
                                             2.4016416073e-01f, 6.9315135479e-01f, 1.0f};
};
template <>
struct Exp2UnitPoly<3> {
  static constexpr float kCoefficients[4] = {7.7058047056e-02f, 2.2764557600e-01f, 6.9512289762e-01f, 1.0f};
};

}  // namespace cpu
}  // namespace flashattn
