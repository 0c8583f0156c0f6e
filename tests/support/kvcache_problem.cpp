#include "support/kvcache_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "support/problem.hpp"

namespace fatest {
namespace {

uint64_t name_seed(const std::string& name) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a, as case_seed
  for (unsigned char ch : name) hash = (hash ^ ch) * 1099511628211ull;
  return hash;
}

KvCase make(std::string name, fa_dtype dtype, int64_t B, int64_t H, int64_t Hkv, int64_t Sq, int64_t D,
            std::vector<int32_t> seqlens, int64_t S_new, int64_t page_size) {
  KvCase c;
  c.name = std::move(name);
  c.dtype = dtype;
  c.B = B, c.H = H, c.Hkv = Hkv, c.Sq = Sq, c.D = D, c.Dv = D;
  c.seqlens = std::move(seqlens);
  c.S_new = S_new;
  c.page_size = page_size;
  return c;
}

// The fixed cases' options drawn together from a fixed seed (names random<N>_...):
// page sizes 1-256 and none, GQA up to 8, Sq 1-16, append or not, rotary
// (whole or half), batch indirection, left pads, masks, softcap, ALiBi and
// forced splits, on head dims of every class.
void add_random_cases(std::vector<KvCase>& cases, int count) {
  std::mt19937 rng(5122026);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto chance = [&](int percent) { return pick(1, 100) <= percent; };
  const fa_dtype dtypes[3] = {FA_DTYPE_FP32, FA_DTYPE_BF16, FA_DTYPE_FP16};
  const int dims[6] = {32, 64, 80, 96, 128, 256};
  const int queries[5] = {1, 1, 2, 7, 16};
  const int pages[7] = {0, 0, 1, 7, 16, 64, 256};
  for (int i = 0; i < count; ++i) {
    // One draw per statement: the order of a call's arguments is unspecified.
    const int batch = pick(1, 3);
    const int hkv = pick(1, 4);
    const int group = 1 << pick(0, 3);
    const int sq = queries[pick(0, 4)];
    const int d = dims[pick(0, 5)];
    std::vector<int32_t> seqlens;
    for (int b = 0; b < batch; ++b) seqlens.push_back(chance(15) ? pick(0, 1) : chance(50) ? pick(1, 100) : pick(1, 800));
    const int s_new = chance(50) ? sq : 0;
    const int page = pages[pick(0, 6)];
    KvCase c = make("random" + std::to_string(i) + "_" + dtype_name(dtypes[i % 3]), dtypes[i % 3], batch,
                    hkv * group, hkv, sq, d, seqlens, s_new, page);
    c.causal = chance(50);
    if (s_new > 0 && chance(50)) {
      c.rotary = chance(50) ? Rotary::kInterleaved : Rotary::kNeox;
      c.rotary_dim = chance(50) ? 0 : d / 2;
    }
    c.batch_idx = page == 0 && chance(30);
    if (chance(25))
      for (int32_t filled : seqlens) c.leftpad.push_back(pick(0, filled));
    if (chance(30)) {
      c.window_left = chance(30) ? -1 : pick(0, 40);
      c.window_right = chance(30) ? -1 : pick(0, 8);
    }
    if (chance(25)) c.softcap = chance(50) ? 5.0f : 30.0f;
    c.alibi = chance(25);
    if (chance(30)) c.num_splits = pick(1, 8);
    cases.push_back(c);
  }
}

std::vector<KvCase> build_cases() {
  std::vector<KvCase> cases;
  const fa_dtype f32 = FA_DTYPE_FP32, f16 = FA_DTYPE_FP16, b16 = FA_DTYPE_BF16;
  // Contiguous cache, decode and a 7-token chunk, append or not.
  cases.push_back(make("contig_fp32_decode_append", f32, 2, 4, 2, 1, 64, {5, 17}, 1, 0));
  cases.push_back(make("contig_bf16_decode_noappend", b16, 3, 8, 2, 1, 64, {1, 33, 70}, 0, 0));
  {
    KvCase c = make("contig_bf16_chunk7_causal_rotary_interleaved", b16, 2, 4, 1, 7, 64, {9, 40}, 7, 0);
    c.causal = true, c.rotary = Rotary::kInterleaved;
    cases.push_back(c);
  }
  {
    KvCase c = make("contig_fp16_chunk7_causal_rotary_neox_half", f16, 2, 4, 2, 7, 128, {3, 65}, 7, 0);
    c.causal = true, c.rotary = Rotary::kNeox, c.rotary_dim = 64;
    cases.push_back(c);
  }
  {
    KvCase c = make("contig_fp32_chunk7_noncausal_rotary_neox", f32, 2, 2, 2, 7, 64, {11, 30}, 7, 0);
    c.rotary = Rotary::kNeox;
    cases.push_back(c);
  }
  {  // flash-attn's decode step: rotary at cache_seqlens, q and one new key
    KvCase c = make("contig_bf16_decode_rotary_interleaved", b16, 2, 8, 2, 1, 128, {0, 50}, 1, 0);
    c.causal = true, c.rotary = Rotary::kInterleaved;
    cases.push_back(c);
  }
  // Paged caches of every page size the issue names.
  cases.push_back(make("paged1_bf16_decode_append", b16, 3, 4, 2, 1, 64, {0, 3, 40}, 1, 1));
  cases.push_back(make("paged16_fp16_gqa8_decode_append", f16, 2, 16, 2, 1, 64, {31, 100}, 1, 16));
  cases.push_back(make("paged64_bf16_noappend", b16, 2, 4, 4, 1, 64, {100, 1}, 0, 64));
  {
    KvCase c = make("paged256_fp32_chunk7_causal_rotary_neox", f32, 2, 4, 2, 7, 64, {300, 5}, 7, 256);
    c.causal = true, c.rotary = Rotary::kNeox;
    cases.push_back(c);
  }
  cases.push_back(make("paged1000_bf16_decode_append", b16, 2, 4, 1, 1, 64, {1500, 20}, 1, 1000));
  {
    KvCase c = make("paged16_bf16_chunk7_window_softcap_alibi", b16, 2, 4, 2, 7, 64, {60, 9}, 7, 16);
    c.causal = true, c.window_left = 20, c.softcap = 15.0f, c.alibi = true;
    cases.push_back(c);
  }
  {
    KvCase c = make("paged16_fp16_leftpad_rotary_interleaved", f16, 2, 4, 2, 1, 64, {40, 12}, 1, 16);
    c.leftpad = {7, 12}, c.causal = true, c.rotary = Rotary::kInterleaved;
    cases.push_back(c);
  }
  // Batch indirection and left padding.
  {
    KvCase c = make("contig_bf16_batchidx_leftpad_rotary_causal", b16, 3, 4, 2, 7, 64, {20, 8, 35}, 7, 0);
    c.batch_idx = true, c.leftpad = {4, 0, 35}, c.causal = true, c.rotary = Rotary::kInterleaved;
    cases.push_back(c);
  }
  {
    KvCase c = make("contig_fp32_batchidx_noappend", f32, 2, 2, 1, 1, 64, {13, 29}, 0, 0);
    c.batch_idx = true;
    cases.push_back(c);
  }
  // GQA up to 16 (and MQA), cache lengths 0 and 1, long caches.
  {
    KvCase c = make("contig_fp16_gqa16_chunk7_causal", f16, 1, 16, 1, 7, 64, {700}, 0, 0);
    c.causal = true;
    cases.push_back(c);
  }
  cases.push_back(make("contig_fp32_empty_cache", f32, 2, 4, 2, 1, 64, {0, 0}, 0, 0));
  {
    KvCase c = make("contig_bf16_empty_cache_append7_causal", b16, 2, 4, 2, 7, 64, {0, 0}, 7, 0);
    c.causal = true;
    cases.push_back(c);
  }
  cases.push_back(make("paged16_fp32_length1_decode", f32, 2, 4, 2, 1, 64, {1, 0}, 0, 16));
  {
    KvCase c = make("contig_fp32_full_cache_no_seqlens", f32, 2, 4, 2, 7, 64, {}, 0, 0);
    c.slack = 50, c.causal = true, c.with_lse = false;
    cases.push_back(c);
  }
  {
    KvCase c = make("contig_bf16_d64_dv128_window_right", b16, 2, 4, 2, 7, 64, {30, 2}, 0, 0);
    c.Dv = 128, c.window_left = 3, c.window_right = 2;
    cases.push_back(c);
  }
  {
    KvCase c = make("paged16_bf16_long_decode_gqa4", b16, 1, 32, 8, 1, 128, {4000}, 1, 16);
    c.causal = true, c.rotary = Rotary::kNeox;
    cases.push_back(c);
  }
  {  // D = 96 in head-dim class 128: the chunks past D are absent (zero-filled), not read
    KvCase c = make("paged16_bf16_d96_chunk5_causal_gqa3", b16, 2, 6, 2, 5, 96, {70, 300}, 5, 16);
    c.causal = true;
    cases.push_back(c);
  }
  {  // D = Dv = 80: dim pairs and O's 32-dim slices that end part way (the CPU's VDPBF16PS build masks
     // both); 18 rows per kv head (4-row steps with 2 padding rows); odd key counts (a lone last key)
    KvCase c = make("contig_bf16_d80_gqa6_chunk3_odd_lengths", b16, 2, 12, 2, 3, 80, {37, 201}, 0, 0);
    c.causal = true;
    cases.push_back(c);
  }
  {  // head-dim class 256 (the warp kernel under the default mma build)
    KvCase c = make("contig_bf16_d256_decode_gqa4_rotary", b16, 2, 8, 2, 1, 256, {90, 600}, 1, 0);
    c.rotary = Rotary::kNeox;
    cases.push_back(c);
  }
  {
    KvCase c = make("contig_fp32_long_split5", f32, 1, 4, 2, 1, 64, {2000}, 1, 0);
    c.num_splits = 5;
    cases.push_back(c);
  }
  {
    KvCase c = make("paged256_bf16_long_chunk16_causal_gqa4", b16, 2, 16, 4, 16, 128, {5000, 3000}, 16, 256);
    c.causal = true, c.rotary = Rotary::kInterleaved, c.slow = true;
    cases.push_back(c);
  }
  add_random_cases(cases, 16);
  return cases;
}

// A permutation of [0, n) drawn from rng.
std::vector<int32_t> permutation(int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// x' = x0 cos - x1 sin, y' = x0 sin + x1 cos; fp32 math for half types (exact
// products), fp64 for fp32, then one rounding to the dtype.
double rotate_value(fa_dtype dtype, double x0, double x1, double c, double s, bool first) {
  if (dtype == FA_DTYPE_FP32) {
    const double r = first ? x0 * c - x1 * s : x0 * s + x1 * c;
    return static_cast<float>(r);
  }
  const float a = static_cast<float>(x0), b = static_cast<float>(x1);
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  const float pa = first ? a * cf : a * sf;
  const float pb = first ? b * sf : b * cf;
  return round_to_f(dtype, first ? pa - pb : pa + pb);
}

// Dims of one head vector rotated at `position`; rotary_dim 0 leaves it.
std::vector<double> rotated(const KvProblem& p, std::vector<double> x, int64_t position) {
  if (p.c.rotary == Rotary::kNone) return x;
  const int64_t rd = p.c.rotary_dim > 0 ? p.c.rotary_dim : p.c.D, half = rd / 2;
  std::vector<double> y = x;
  for (int64_t k = 0; k < half; ++k) {
    const int64_t i0 = p.c.rotary == Rotary::kInterleaved ? 2 * k : k;
    const int64_t i1 = p.c.rotary == Rotary::kInterleaved ? 2 * k + 1 : k + half;
    const double c = p.rotary_cos.get(position * half + k), s = p.rotary_sin.get(position * half + k);
    y[i0] = rotate_value(p.c.dtype, x[i0], x[i1], c, s, true);
    y[i1] = rotate_value(p.c.dtype, x[i0], x[i1], c, s, false);
  }
  return y;
}

std::vector<double> head_vector(const HostTensor& t, int64_t b, int64_t row, int64_t h) {
  const auto& s = t.shape();
  std::vector<double> x(static_cast<size_t>(s[3]));
  for (int64_t d = 0; d < s[3]; ++d) x[d] = t.get(((b * s[1] + row) * s[2] + h) * s[3] + d);
  return x;
}

void set_head_vector(HostTensor& t, int64_t b, int64_t row, int64_t h, const std::vector<double>& x) {
  const auto& s = t.shape();
  for (int64_t d = 0; d < s[3]; ++d) t.set(((b * s[1] + row) * s[2] + h) * s[3] + d, x[d]);
}

}  // namespace

void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

const std::vector<KvCase>& kvcache_cases() {
  static const std::vector<KvCase> cases = build_cases();
  return cases;
}

KvCase kvcache_case(const std::string& name) {
  for (const KvCase& c : kvcache_cases())
    if (c.name == name) return c;
  return KvCase{};
}

std::vector<KvCase> kvcache_fast_cases() {
  std::vector<KvCase> out;
  for (const KvCase& c : kvcache_cases())
    if (!c.slow) out.push_back(c);
  return out;
}

std::vector<KvCase> kvcache_slow_cases() {
  std::vector<KvCase> out;
  for (const KvCase& c : kvcache_cases())
    if (c.slow) out.push_back(c);
  return out;
}

KvProblem make_kv_problem(const KvCase& c) {
  KvProblem p;
  p.c = c;
  std::mt19937_64 rng(name_seed(c.name));
  const bool full = c.seqlens.empty();
  int64_t longest = 0;
  for (int32_t len : c.seqlens) longest = std::max<int64_t>(longest, len + c.S_new);
  const int64_t wanted = longest + c.slack;
  // Cache positions (absolute, leftpad included) of each (b, pos).
  int64_t cache_rows = c.B, page_rows = wanted, max_blocks = 0;
  if (c.page_size > 0) {
    max_blocks = (wanted + c.page_size - 1) / c.page_size;
    page_rows = c.page_size;
    cache_rows = c.B * max_blocks + 2;  // spare pages that no row maps
    p.capacity = max_blocks * c.page_size;
  } else {
    if (c.batch_idx) cache_rows = c.B + 2;
    p.capacity = wanted;
  }
  p.q = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D});
  p.k_cache = HostTensor(c.dtype, {cache_rows, page_rows, c.Hkv, c.D});
  p.v_cache = HostTensor(c.dtype, {cache_rows, page_rows, c.Hkv, c.Dv});
  p.out = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.Dv});
  p.lse = HostTensor(FA_DTYPE_FP32, {c.B, c.H, c.Sq});
  p.q.fill_random(rng);
  p.k_cache.fill_random(rng);  // every position, also those no row may read
  p.v_cache.fill_random(rng);
  if (c.S_new > 0) {
    p.k_new = HostTensor(c.dtype, {c.B, c.S_new, c.Hkv, c.D});
    p.v_new = HostTensor(c.dtype, {c.B, c.S_new, c.Hkv, c.Dv});
    p.k_new.fill_random(rng);
    p.v_new.fill_random(rng);
  }
  std::vector<int64_t> filled(static_cast<size_t>(c.B)), leftpad(static_cast<size_t>(c.B), 0);
  if (!full) {
    p.cache_seqlens = HostTensor(FA_DTYPE_INT32, {c.B});
    for (int64_t b = 0; b < c.B; ++b) p.cache_seqlens.set(b, c.seqlens[b]);
  }
  for (int64_t b = 0; b < c.B; ++b) filled[b] = full ? p.capacity : c.seqlens[b];
  if (!c.leftpad.empty()) {
    p.cache_leftpad = HostTensor(FA_DTYPE_INT32, {c.B});
    for (int64_t b = 0; b < c.B; ++b) p.cache_leftpad.set(b, leftpad[b] = c.leftpad[b]);
  }
  std::vector<int32_t> row_of(static_cast<size_t>(c.B));
  std::iota(row_of.begin(), row_of.end(), 0);
  if (c.batch_idx) {
    const std::vector<int32_t> order = permutation(cache_rows, rng);
    p.cache_batch_idx = HostTensor(FA_DTYPE_INT32, {c.B});
    for (int64_t b = 0; b < c.B; ++b) p.cache_batch_idx.set(b, row_of[b] = order[b]);
  }
  std::vector<int32_t> pages;
  if (c.page_size > 0) {
    pages = permutation(cache_rows, rng);  // scattered pages, two never used
    p.block_table = HostTensor(FA_DTYPE_INT32, {c.B, max_blocks});
    for (int64_t i = 0; i < c.B * max_blocks; ++i) p.block_table.set(i, pages[i]);
  }
  auto locate = [&](int64_t b, int64_t position, int64_t* row, int64_t* slot) {
    if (c.page_size > 0) {
      *row = pages[b * max_blocks + position / c.page_size];
      *slot = position % c.page_size;
    } else {
      *row = row_of[b];
      *slot = position;
    }
  };
  if (c.rotary != Rotary::kNone) {
    const int64_t rd = c.rotary_dim > 0 ? c.rotary_dim : c.D, half = rd / 2;
    p.rotary_cos = HostTensor(c.dtype, {p.capacity, half});
    p.rotary_sin = HostTensor(c.dtype, {p.capacity, half});
    for (int64_t pos = 0; pos < p.capacity; ++pos)
      for (int64_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * k / rd);
        p.rotary_cos.set(pos * half + k, std::cos(angle));
        p.rotary_sin.set(pos * half + k, std::sin(angle));
      }
  }
  if (c.alibi) {
    p.alibi = HostTensor(FA_DTYPE_FP32, {c.B, c.H});
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        p.alibi.set(b * c.H + h, std::exp2(-8.0 * (h + 1) / c.H) * (1.0 + 0.25 * b));
        p.sem.slopes.push_back(p.alibi.get(b * c.H + h));
      }
  }

  // The expected caches: the append written independently of src/.
  p.expected_k_cache = p.k_cache;
  p.expected_v_cache = p.v_cache;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.S_new; ++t)
      for (int64_t h = 0; h < c.Hkv; ++h) {
        int64_t row, slot;
        locate(b, filled[b] + t, &row, &slot);
        set_head_vector(p.expected_k_cache, row, slot, h, rotated(p, head_vector(p.k_new, b, t, h), filled[b] + t));
        set_head_vector(p.expected_v_cache, row, slot, h, head_vector(p.v_new, b, t, h));
      }

  // The reference problem: queries rotated as flash-attn does, keys gathered from the expected cache.
  Geometry& g = p.g;
  g.B = c.B, g.H = c.H, g.Hkv = c.Hkv, g.D = c.D, g.Dv = c.Dv;
  const bool ordered = c.causal || c.window_left >= 0 || c.window_right >= 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t keys = filled[b] - leftpad[b] + c.S_new;
    g.start_q.push_back(g.total_q);
    g.start_k.push_back(g.total_k);
    g.seqlen_q.push_back(c.Sq);
    g.seqlen_k.push_back(keys);
    g.total_q += c.Sq;
    g.total_k += keys;
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t h = 0; h < c.H; ++h) {
        const std::vector<double> x = rotated(p, head_vector(p.q, b, i, h), filled[b] + (ordered ? i : 0));
        p.q_rows.insert(p.q_rows.end(), x.begin(), x.end());
      }
    for (int64_t j = 0; j < keys; ++j) {
      int64_t row, slot;
      locate(b, leftpad[b] + j, &row, &slot);
      for (int64_t h = 0; h < c.Hkv; ++h) {
        const std::vector<double> k = head_vector(p.expected_k_cache, row, slot, h);
        const std::vector<double> v = head_vector(p.expected_v_cache, row, slot, h);
        p.k_rows.insert(p.k_rows.end(), k.begin(), k.end());
        p.v_rows.insert(p.v_rows.end(), v.begin(), v.end());
      }
    }
  }
  Semantics& s = p.sem;
  s.scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(c.D)));
  s.softcap = c.softcap;
  s.causal = c.causal;
  s.bottom_right = true;
  s.window_left = c.window_left;
  s.window_right = c.causal ? 0 : c.window_right;
  return p;
}

fa_kvcache_args KvProblem::args() const {
  fa_kvcache_args a;
  fa_kvcache_args_init(&a);
  a.q = q.view();
  a.k_cache = k_cache.view();
  a.v_cache = v_cache.view();
  a.out = out.view();
  if (c.with_lse) a.lse = lse.view();
  if (c.S_new > 0) a.k_new = k_new.view(), a.v_new = v_new.view();
  if (!c.seqlens.empty()) a.cache_seqlens = cache_seqlens.view();
  if (c.batch_idx) a.cache_batch_idx = cache_batch_idx.view();
  if (!c.leftpad.empty()) a.cache_leftpad = cache_leftpad.view();
  if (c.page_size > 0) a.block_table = block_table.view();
  if (c.rotary != Rotary::kNone) {
    a.rotary_cos = rotary_cos.view();
    a.rotary_sin = rotary_sin.view();
    a.rotary_interleaved = c.rotary == Rotary::kInterleaved ? 1 : 0;
  }
  if (c.alibi) a.alibi_slopes = alibi.view();
  a.opts.causal = c.causal ? 1 : 0;
  a.opts.window_left = c.window_left;
  a.opts.window_right = c.window_right;
  a.opts.softcap = c.softcap;
  a.opts.num_threads = test_threads();
  a.num_splits = c.num_splits;
  return a;
}

void KvProblem::poison_outputs() {
  out.poison();
  lse.poison();
}

KvReference kv_reference(const KvProblem& p) {
  return {reference_forward(p.g, p.sem, p.q_rows, p.k_rows, p.v_rows),
          attention_forward(p.g, p.sem, p.q_rows, p.k_rows, p.v_rows, p.c.dtype, false)};
}

void expect_kvcache_matches(const KvProblem& p, const KvReference& r) {
  EXPECT_TRUE(p.k_cache.bytes() == p.expected_k_cache.bytes()) << "k_cache differs from the expected append";
  EXPECT_TRUE(p.v_cache.bytes() == p.expected_v_cache.bytes()) << "v_cache differs from the expected append";
  const FwdOut& ref = r.ref;
  const FwdOut& naive = r.naive;
  EXPECT_TRUE(within_tolerance("O", p.out.to_vector(), ref.o, naive.o));
  if (!p.c.with_lse) return;
  std::vector<double> lse(static_cast<size_t>(p.g.total_q * p.g.H));
  for (int64_t b = 0; b < p.c.B; ++b)
    for (int64_t h = 0; h < p.c.H; ++h)
      for (int64_t i = 0; i < p.c.Sq; ++i) lse[(b * p.c.Sq + i) * p.c.H + h] = p.lse.get((b * p.c.H + h) * p.c.Sq + i);
  EXPECT_TRUE(within_tolerance("LSE", lse, ref.lse, naive.lse));
  // Rows that see no key: O exactly 0 (LSE +inf is checked by the comparison above).
  const std::vector<double> o = p.out.to_vector();
  int64_t bad = 0;
  for (size_t r = 0; r < lse.size(); ++r) {
    if (!std::isinf(ref.lse[r])) continue;
    for (int64_t d = 0; d < p.c.Dv; ++d) bad += o[r * p.c.Dv + d] == 0.0 ? 0 : 1;
  }
  EXPECT_EQ(bad, 0) << "rows that see no key must give O = 0";
}

void expect_split_counts_agree(const std::string& name, std::initializer_list<int32_t> counts,
                               const std::function<void(KvProblem&)>& run) {
  KvCase c = kvcache_case(name);
  ASSERT_EQ(c.name, name);
  c.S_new = 0;
  c.rotary = Rotary::kNone;
  KvProblem p = make_kv_problem(c);
  const KvReference reference = kv_reference(p);
  std::vector<double> no_split;
  for (int32_t splits : counts) {
    SCOPED_TRACE(name + " num_splits " + std::to_string(splits));
    p.c.num_splits = splits;
    p.poison_outputs();
    run(p);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(fully_written("out", p.out));
    expect_kvcache_matches(p, reference);
    const std::vector<double> o = p.out.to_vector();
    if (splits == 1) {
      no_split = o;
      continue;
    }
    double worst = 0.0;
    for (size_t e = 0; e < o.size(); ++e) worst = std::max(worst, std::fabs(o[e] - no_split[e]));
    EXPECT_LE(worst, 0.02) << "split output departs from the unsplit one";
  }
}

}  // namespace fatest
