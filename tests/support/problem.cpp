#include "support/problem.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

namespace fatest {
namespace {

Geometry make_geometry(const Case& c) {
  Geometry g;
  g.B = c.B;
  g.H = c.H;
  g.Hkv = c.Hkv;
  g.D = c.D;
  g.Dv = c.Dv;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t sq = c.varlen() ? c.seqlens_q[b] : c.Sq;
    const int64_t sk = c.varlen() ? c.seqlens_k[b] : c.Sk;
    g.start_q.push_back(g.total_q);
    g.start_k.push_back(g.total_k);
    g.seqlen_q.push_back(sq);
    g.seqlen_k.push_back(sk);
    g.total_q += sq;
    g.total_k += sk;
  }
  return g;
}

std::vector<int64_t> rows_shape(const Case& c, int64_t total, int64_t seqlen, int64_t heads, int64_t dim) {
  if (c.varlen()) return {total, heads, dim};
  return {c.B, seqlen, heads, dim};
}

}  // namespace

Problem make_problem(const Case& c) { return make_problem(c, case_seed(c)); }

Problem make_problem(const Case& c, uint64_t seed) {
  Problem p;
  p.c = c;
  p.g = make_geometry(c);
  const Geometry& g = p.g;
  std::mt19937_64 rng(seed);

  p.q = HostTensor(c.dtype, rows_shape(c, g.total_q, c.Sq, c.H, c.D), c.layout);
  p.k = HostTensor(c.dtype, rows_shape(c, g.total_k, c.Sk, c.Hkv, c.D), c.layout);
  p.v = HostTensor(c.dtype, rows_shape(c, g.total_k, c.Sk, c.Hkv, c.Dv), c.layout);
  p.dout = HostTensor(c.dtype, rows_shape(c, g.total_q, c.Sq, c.H, c.Dv), c.layout);
  p.out = HostTensor(c.dtype, rows_shape(c, g.total_q, c.Sq, c.H, c.Dv), c.layout);
  p.dq = HostTensor(c.dtype, rows_shape(c, g.total_q, c.Sq, c.H, c.D), c.layout);
  p.dk = HostTensor(c.dtype, rows_shape(c, g.total_k, c.Sk, c.Hkv, c.D), c.layout);
  p.dv = HostTensor(c.dtype, rows_shape(c, g.total_k, c.Sk, c.Hkv, c.Dv), c.layout);
  p.lse = c.varlen() ? HostTensor(FA_DTYPE_FP32, {c.H, g.total_q}) : HostTensor(FA_DTYPE_FP32, {c.B, c.H, c.Sq});
  p.q.fill_random(rng);
  p.k.fill_random(rng);
  p.v.fill_random(rng);
  p.dout.fill_random(rng);

  if (c.varlen()) {
    p.cu_q = HostTensor(FA_DTYPE_INT32, {c.B + 1});
    p.cu_k = HostTensor(FA_DTYPE_INT32, {c.B + 1});
    for (int64_t b = 0; b <= c.B; ++b) {
      p.cu_q.set(b, b < c.B ? g.start_q[b] : g.total_q);
      p.cu_k.set(b, b < c.B ? g.start_k[b] : g.total_k);
    }
  }

  Semantics& s = p.sem;
  s.scale = c.scale > 0.0f ? c.scale : static_cast<double>(1.0f / std::sqrt(static_cast<float>(c.D)));
  s.softcap = c.softcap;
  s.causal = c.causal;
  s.bottom_right = c.align == FA_ALIGN_BOTTOM_RIGHT;
  s.window_left = c.window_left;
  s.window_right = c.window_right;
  s.dropout_p = c.dropout;
  s.seed = seed * 0x9E3779B97F4A7C15ull;
  s.offset = (seed >> 11) | (uint64_t{1} << 40);  // high word non-zero: exercises key1 ^= offset >> 32
  if (c.alibi != Alibi::kNone) {
    p.alibi = c.alibi == Alibi::kPerHead ? HostTensor(FA_DTYPE_FP32, {c.H}) : HostTensor(FA_DTYPE_FP32, {c.B, c.H});
    // Slopes 2^(-8(h+1)/H) as in the ALiBi paper, varied per batch for (B,H).
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        const float slope = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(c.H)) *
                            (c.alibi == Alibi::kPerBatchHead ? 1.0f + 0.25f * static_cast<float>(b) : 1.0f);
        if (c.alibi == Alibi::kPerBatchHead || b == 0) p.alibi.set(c.alibi == Alibi::kPerHead ? h : b * c.H + h, slope);
        s.slopes.push_back(p.alibi.get(c.alibi == Alibi::kPerHead ? h : b * c.H + h));
      }
  }
  return p;
}

fa_fwd_args Problem::fwd_args() const {
  fa_fwd_args a;
  fa_fwd_args_init(&a);
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  if (c.varlen()) {
    a.cu_seqlens_q = cu_q.view();
    a.cu_seqlens_k = cu_k.view();
    a.max_seqlen_q = static_cast<int32_t>(c.Sq);
    a.max_seqlen_k = static_cast<int32_t>(c.Sk);
  }
  if (c.alibi != Alibi::kNone) a.alibi_slopes = alibi.view();
  a.opts.softmax_scale = c.scale;
  a.opts.causal = c.causal ? 1 : 0;
  a.opts.alignment = c.align;
  a.opts.window_left = c.window_left;
  a.opts.window_right = c.window_right;
  a.opts.softcap = c.softcap;
  a.opts.dropout_p = c.dropout;
  a.opts.dropout_seed = sem.seed;
  a.opts.dropout_offset = sem.offset;
  a.opts.num_threads = test_threads();
  return a;
}

fa_bwd_args Problem::bwd_args() const {
  const fa_fwd_args f = fwd_args();
  fa_bwd_args a;
  fa_bwd_args_init(&a);
  a.dout = dout.view();
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = f.lse;
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  a.cu_seqlens_q = f.cu_seqlens_q;
  a.cu_seqlens_k = f.cu_seqlens_k;
  a.max_seqlen_q = f.max_seqlen_q;
  a.max_seqlen_k = f.max_seqlen_k;
  a.alibi_slopes = f.alibi_slopes;
  a.opts = f.opts;
  a.opts.deterministic = 1;
  return a;
}

void Problem::poison_outputs() {
  out.poison();
  lse.poison();
  dq.poison();
  dk.poison();
  dv.poison();
}

std::vector<double> Problem::lse_rows() const {
  std::vector<double> rows(static_cast<size_t>(g.total_q * g.H));
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i = 0; i < g.seqlen_q[b]; ++i) {
        const int64_t r = g.start_q[b] + i;
        const int64_t at = c.varlen() ? h * g.total_q + r : (b * g.H + h) * c.Sq + i;
        rows[r * g.H + h] = lse.get(at);
      }
  return rows;
}

std::vector<bool> Problem::empty_rows() const {
  std::vector<bool> empty(static_cast<size_t>(g.total_q * g.H), true);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.seqlen_q[b]; ++i) {
      bool any = false;
      for (int64_t j = 0; j < g.seqlen_k[b] && !any; ++j) any = visible(g, sem, b, i, j);
      for (int64_t h = 0; h < g.H; ++h) empty[(g.start_q[b] + i) * g.H + h] = !any;
    }
  return empty;
}

std::vector<bool> Problem::unseen_keys() const {
  std::vector<bool> unseen(static_cast<size_t>(g.total_k * g.Hkv), true);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t j = 0; j < g.seqlen_k[b]; ++j) {
      bool any = false;
      for (int64_t i = 0; i < g.seqlen_q[b] && !any; ++i) any = visible(g, sem, b, i, j);
      for (int64_t h = 0; h < g.Hkv; ++h) unseen[(g.start_k[b] + j) * g.Hkv + h] = !any;
    }
  return unseen;
}

std::string ErrorReport::describe(const char* what) const {
  std::ostringstream text;
  text.precision(4);
  text << what << ": max|ours-ref| = " << ours << " at " << worst << ", bound = " << bound
       << " (2 x naive " << naive << " + floor " << floor << "), max|ref| = " << ref_max
       << ", non-finite = " << nonfinite << ", inf mismatches = " << inf_mismatch;
  return text.str();
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

ErrorReport compare(const std::vector<double>& ours, const std::vector<double>& ref,
                    const std::vector<double>& naive, double scale) {
  ErrorReport r;
  for (size_t e = 0; e < ref.size(); ++e) {
    if (std::isinf(ref[e])) {
      r.inf_mismatch += ours[e] == ref[e] ? 0 : 1;
      continue;
    }
    if (std::isinf(ours[e]) && !std::isnan(ref[e])) ++r.inf_mismatch;
    if (!std::isfinite(ours[e])) {
      ++r.nonfinite;
      continue;
    }
    r.ref_max = std::max(r.ref_max, std::fabs(ref[e]));
    const double err = std::fabs(ours[e] - ref[e]);
    if (err > r.ours || r.worst < 0) {
      r.ours = std::max(r.ours, err);
      r.worst = static_cast<int64_t>(e);
    }
    if (std::isfinite(naive[e])) r.naive = std::max(r.naive, std::fabs(naive[e] - ref[e]));
  }
  r.floor = 1e-6 * std::max(r.ref_max, scale);
  r.bound = 2.0 * r.naive + r.floor;
  return r;
}

::testing::AssertionResult within_tolerance(const char* what, const std::vector<double>& ours,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            double scale) {
  if (ours.size() != ref.size() || naive.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size mismatch";
  const ErrorReport r = compare(ours, ref, naive, scale);
  // FLASHATTN_TEST_VERBOSE=1 prints the margins of passing checks too.
  static const bool verbose = std::getenv("FLASHATTN_TEST_VERBOSE") != nullptr;
  if (verbose) std::printf("  %s\n", r.describe(what).c_str());
  if (r.pass()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.describe(what);
}

::testing::AssertionResult fully_written(const char* what, const HostTensor& t) {
  const int64_t poisoned = t.count_poisoned();
  const int64_t touched = t.count_padding_touched();
  if (poisoned == 0 && touched == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << poisoned << " of " << t.numel()
                                       << " elements never written (still poison), " << touched
                                       << " padding elements written";
}

namespace {
CountingAllocator* g_counter = nullptr;

void* counting_alloc(size_t bytes, fa_device_type, int32_t, void* user) {
  auto* c = static_cast<CountingAllocator*>(user);
  ++c->calls;
  c->total_bytes += bytes;
  c->last_bytes = bytes;
  ++c->live;
  // Exactly `bytes` (not rounded up): under AddressSanitizer an overrun of the queried size is caught.
  return std::malloc(bytes == 0 ? 1 : bytes);
}

void counting_free(void* ptr, fa_device_type, int32_t, void* user) {
  auto* c = static_cast<CountingAllocator*>(user);
  ++c->frees;
  --c->live;
  std::free(ptr);
}
}  // namespace

CountingAllocator::CountingAllocator() {
  g_counter = this;
  fa_set_allocator(counting_alloc, counting_free, this);
}

CountingAllocator::~CountingAllocator() {
  fa_set_allocator(nullptr, nullptr, nullptr);
  g_counter = nullptr;
}

int test_threads() {
  const char* env = std::getenv("FLASHATTN_TEST_THREADS");
  const int n = env != nullptr ? std::atoi(env) : 0;
  return n > 0 ? n : 2;
}

}  // namespace fatest
