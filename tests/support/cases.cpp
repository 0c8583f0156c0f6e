#include "support/cases.hpp"

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>

namespace fatest {
namespace {

constexpr fa_dtype F32 = FA_DTYPE_FP32, F16 = FA_DTYPE_FP16, B16 = FA_DTYPE_BF16;

// Fluent description of one case: C(dtype, B, H, Hkv, Sq, Sk, D, Dv).causal()...
struct C {
  Case c;
  C(fa_dtype dtype, int64_t B, int64_t H, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv) {
    c.dtype = dtype;
    c.B = B;
    c.H = H;
    c.Hkv = Hkv;
    c.Sq = Sq;
    c.Sk = Sk;
    c.D = D;
    c.Dv = Dv;
  }
  C& causal(fa_alignment align = FA_ALIGN_BOTTOM_RIGHT) {
    c.causal = true;
    c.align = align;
    return *this;
  }
  C& top_left() {
    c.align = FA_ALIGN_TOP_LEFT;
    return *this;
  }
  C& window(int32_t left, int32_t right) {
    c.window_left = left;
    c.window_right = right;
    return *this;
  }
  C& softcap(float cap, float scale = 0.0f) {
    c.softcap = cap;
    c.scale = scale;
    return *this;
  }
  C& scale(float s) {
    c.scale = s;
    return *this;
  }
  C& alibi(Alibi a) {
    c.alibi = a;
    return *this;
  }
  C& dropout(float p) {
    c.dropout = p;
    return *this;
  }
  C& varlen(std::vector<int32_t> q, std::vector<int32_t> k) {
    c.seqlens_q = std::move(q);
    c.seqlens_k = std::move(k);
    c.B = static_cast<int64_t>(c.seqlens_q.size());
    c.Sq = 0;
    c.Sk = 0;
    for (int32_t s : c.seqlens_q) c.Sq = std::max<int64_t>(c.Sq, s);
    for (int32_t s : c.seqlens_k) c.Sk = std::max<int64_t>(c.Sk, s);
    return *this;
  }
  C& layout(Layout l) {
    c.layout = l;
    return *this;
  }
  C& slow() {
    c.slow = true;
    return *this;
  }
};

std::string number(int64_t v) { return v < 0 ? "m" + std::to_string(-v) : std::to_string(v); }

std::string float_tag(float v) {
  std::string text = std::to_string(v);
  while (!text.empty() && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  for (char& ch : text) ch = ch == '.' ? 'p' : ch;
  return text;
}

std::string make_name(const Case& c) {
  std::string n = dtype_name(c.dtype);
  n += "_b" + number(c.B) + "h" + number(c.H) + "kv" + number(c.Hkv);
  if (c.varlen()) {
    n += "_varlen";
    for (size_t b = 0; b < c.seqlens_q.size(); ++b) n += "_" + number(c.seqlens_q[b]) + "x" + number(c.seqlens_k[b]);
  } else {
    n += "_q" + number(c.Sq) + "k" + number(c.Sk);
  }
  n += "_d" + number(c.D);
  if (c.Dv != c.D) n += "v" + number(c.Dv);
  if (c.causal) n += c.align == FA_ALIGN_BOTTOM_RIGHT ? "_causalBR" : "_causalTL";
  if (c.window_left != -1 || c.window_right != -1) {
    n += "_win" + number(c.window_left) + "_" + number(c.window_right);
    n += c.align == FA_ALIGN_BOTTOM_RIGHT ? "BR" : "TL";
  }
  if (c.softcap > 0.0f) n += "_cap" + float_tag(c.softcap);
  if (c.scale > 0.0f) n += "_scale" + float_tag(c.scale);
  if (c.alibi == Alibi::kPerHead) n += "_alibiH";
  if (c.alibi == Alibi::kPerBatchHead) n += "_alibiBH";
  if (c.dropout > 0.0f) n += "_drop" + float_tag(c.dropout);
  if (c.layout != Layout::kContiguous) n += std::string("_") + layout_name(c.layout);
  return n;
}

// Random combinations of every option at once, from a fixed seed: the
// fixed list above takes each option with a few others, these test how they
// meet (a fuzz of such combinations found session 20's P-packing bug, which
// no fixed case had hit). Sizes stay small; the names end in _rN.
std::vector<C> random_combinations(int count) {
  std::mt19937 rng(20261205);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto chance = [&](int percent) { return pick(1, 100) <= percent; };
  const fa_dtype dtypes[3] = {F32, F16, B16};
  const int lengths[4] = {1, 3, 17, 0};  // 0: drawn from 1-200
  std::vector<C> list;
  for (int i = 0; i < count; ++i) {
    const int hkv = pick(1, 3);
    const int group = 1 << pick(0, 2);
    const auto length = [&] {
      const int l = lengths[pick(0, 3)];
      return l == 0 ? pick(1, 200) : l;
    };
    // One draw per statement: the order of a call's arguments is unspecified.
    const int batch = pick(1, 2);
    const int sq = length();
    const int sk = length();
    const int d = 8 * pick(1, 24);
    const int dv = chance(60) ? d : 8 * pick(1, 24);
    C item(dtypes[i % 3], batch, hkv * group, hkv, sq, sk, d, dv);
    if (chance(40)) item.causal(chance(50) ? FA_ALIGN_BOTTOM_RIGHT : FA_ALIGN_TOP_LEFT);
    else if (chance(30)) item.top_left();
    if (chance(40)) {
      const int left = chance(30) ? -1 : pick(0, 64);
      const int right = chance(30) ? -1 : pick(0, 64);
      item.window(left, right);
    }
    if (chance(25)) {
      const float cap = chance(50) ? 5.0f : 30.0f;
      item.softcap(cap, chance(50) ? 0.0f : 0.5f);
    }
    else if (chance(20)) item.scale(chance(50) ? 0.3f : 2.0f);
    if (chance(30)) item.alibi(chance(50) ? Alibi::kPerHead : Alibi::kPerBatchHead);
    // Dropout only where rows see several keys: with a single visible key the
    // exact dS is 0 (so is the naive error), but FA2's D = dO . O takes the
    // rounding of O = v / (1 - p) to fp16/bf16 (flash-attn's D does too).
    const bool wide_window = item.c.window_left < 0 || item.c.window_right < 0 ||
                             item.c.window_left + item.c.window_right >= 8;
    if (chance(20) && sk >= 8 && wide_window && !(item.c.causal && sq > sk)) item.dropout(0.2f);
    if (chance(25)) item.layout(chance(50) ? Layout::kHeadMajor : Layout::kPadded);
    list.push_back(item);
  }
  return list;
}

std::vector<Case> build() {
  const fa_alignment TL = FA_ALIGN_TOP_LEFT;
  const Layout HM = Layout::kHeadMajor, PAD = Layout::kPadded;
  const Alibi AH = Alibi::kPerHead, ABH = Alibi::kPerBatchHead;
  std::vector<C> list = {
      // Head dimension sweep: every supported class, every dtype, plain attention.
      C(F32, 1, 2, 2, 17, 17, 8, 8),
      C(F16, 2, 2, 1, 128, 128, 8, 8).causal(),
      C(B16, 2, 2, 2, 3, 17, 8, 8),
      C(F32, 2, 4, 2, 128, 128, 32, 32),
      C(F16, 1, 4, 4, 17, 128, 32, 32).causal(TL),
      C(B16, 1, 2, 2, 128, 17, 32, 32).causal(),
      C(F32, 1, 2, 1, 33, 65, 40, 40),
      C(F16, 2, 2, 2, 128, 128, 40, 40),
      C(B16, 1, 3, 3, 17, 17, 40, 40).causal(TL),
      C(F32, 2, 2, 2, 128, 128, 64, 64).causal(),
      C(F16, 1, 4, 2, 128, 128, 64, 64),
      C(B16, 2, 4, 1, 128, 128, 64, 64).causal(),
      C(F32, 1, 2, 2, 65, 17, 80, 80),
      C(F16, 1, 2, 2, 128, 128, 80, 80).causal(),
      C(B16, 2, 2, 1, 17, 128, 80, 80),
      C(F32, 1, 2, 2, 128, 128, 96, 96).causal(TL),
      C(F16, 2, 2, 2, 3, 128, 96, 96),
      C(B16, 1, 2, 2, 128, 65, 96, 96).causal(),
      C(F32, 1, 2, 2, 128, 128, 128, 128),
      C(F16, 1, 4, 2, 128, 128, 128, 128).causal(),
      C(B16, 2, 2, 2, 128, 128, 128, 128),
      C(F32, 1, 2, 1, 17, 65, 160, 160).causal(),
      C(F16, 1, 2, 2, 128, 128, 160, 160),
      C(B16, 1, 2, 2, 65, 65, 160, 160).causal(TL),
      C(F32, 1, 2, 2, 65, 128, 192, 192),
      C(F16, 1, 2, 2, 128, 128, 192, 192).causal(),
      C(B16, 1, 2, 1, 17, 17, 192, 192),
      C(F32, 1, 2, 2, 128, 65, 256, 256).causal(),
      C(F16, 1, 2, 2, 128, 128, 256, 256),
      C(B16, 1, 2, 2, 65, 128, 256, 256).causal(TL),
      // Dv != D, both ways.
      C(F32, 1, 2, 2, 65, 65, 128, 64).causal(),
      C(F16, 1, 2, 1, 65, 128, 64, 128),
      C(B16, 1, 2, 2, 128, 128, 192, 128).causal(),
      C(F32, 1, 2, 2, 17, 33, 8, 32),
      C(F16, 1, 2, 2, 33, 33, 256, 8),
      // Whole 128-key tiles seen by every query of a Q tile whose size is a
      // multiple of 16: the AMX forward's pipelined path (isa_amx.cpp,
      // fwd_plain_tile) for head dims off the 32 grid, Dv != D, GQA, strides.
      C(B16, 1, 2, 2, 256, 256, 8, 8),
      C(F32, 1, 2, 2, 160, 256, 40, 40),
      C(B16, 1, 2, 2, 256, 384, 80, 80),
      C(F32, 1, 4, 2, 256, 256, 96, 160),
      C(B16, 1, 4, 1, 272, 256, 160, 96).layout(HM),
      C(F32, 1, 2, 2, 256, 256, 256, 256),
      C(B16, 1, 2, 2, 384, 384, 192, 192).causal(),
      C(B16, 0, 2, 2, 0, 0, 64, 64).varlen({256, 48, 0}, {384, 128, 0}),
      // Sequence lengths 1, 3, 17, 1000, 4096 and Sq != Sk both ways, both alignments.
      C(F32, 2, 2, 2, 1, 1, 64, 64),
      C(F16, 3, 2, 2, 1, 1000, 64, 64).causal(),
      C(B16, 1, 2, 1, 1, 4096, 64, 64),
      C(F32, 1, 1, 1, 4096, 17, 32, 32).causal(TL),
      C(F16, 1, 1, 1, 4096, 17, 32, 32).causal(),
      C(F32, 1, 2, 2, 3, 3, 32, 32).causal(),
      C(F32, 1, 2, 2, 3, 1000, 32, 32).causal(TL),
      C(B16, 1, 2, 2, 1000, 3, 64, 64).causal(),
      C(F16, 1, 2, 2, 1000, 1000, 64, 64).causal(),
      C(B16, 1, 2, 1, 1000, 1000, 64, 64),
      C(F32, 1, 1, 1, 1000, 128, 64, 64).causal(TL),
      C(F32, 2, 2, 1, 0, 17, 64, 64),             // no queries: dK = dV = 0
      C(B16, 1, 2, 2, 17, 0, 32, 32).causal(),   // no keys: O = 0, LSE = +inf
      C(F32, 1, 1, 1, 4096, 4096, 32, 32).causal(),
      C(B16, 1, 1, 1, 4096, 4096, 64, 64).causal(TL),
      // Sliding windows (0,0), (16,0), (-1,8), both alignments.
      C(F32, 1, 2, 2, 128, 128, 64, 64).window(0, 0),
      C(F16, 1, 2, 2, 128, 200, 64, 64).window(0, 0).top_left(),
      C(B16, 2, 2, 2, 128, 128, 32, 32).window(16, 0),
      C(F32, 1, 2, 1, 200, 128, 64, 64).window(16, 0),
      C(F16, 1, 2, 2, 128, 64, 128, 128).window(16, 0).top_left(),
      C(F32, 1, 2, 2, 128, 128, 64, 64).window(-1, 8),
      C(B16, 1, 2, 2, 65, 128, 96, 96).window(-1, 8).top_left(),
      C(F16, 1, 2, 2, 128, 33, 64, 64).window(-1, 8),
      C(F32, 1, 2, 2, 1000, 1000, 32, 32).window(16, 0),
      C(F16, 1, 2, 2, 1000, 1000, 32, 32).window(64, 8).top_left(),
      // Softcap (with explicit scales so tanh saturates) and ALiBi (H) and (B,H).
      C(F32, 1, 2, 2, 128, 128, 64, 64).softcap(2.0f, 0.5f),
      C(F16, 2, 2, 1, 128, 128, 64, 64).softcap(5.0f).causal(),
      C(B16, 1, 4, 2, 65, 128, 128, 128).softcap(1.0f, 1.0f).causal(TL),
      C(F32, 1, 2, 2, 17, 17, 256, 256).softcap(30.0f),
      C(F32, 1, 4, 4, 128, 128, 64, 64).alibi(AH),
      C(F16, 2, 4, 2, 128, 65, 64, 64).alibi(ABH).causal(),
      C(B16, 2, 2, 2, 65, 128, 32, 32).alibi(AH).causal(TL),
      C(F32, 2, 2, 1, 128, 128, 40, 40).alibi(ABH).window(16, 0),
      C(F16, 1, 2, 2, 128, 128, 64, 64).alibi(AH).softcap(4.0f),
      C(F32, 1, 2, 2, 65, 65, 64, 64).scale(0.3f),
      // Peaked rows: scores hundreds below the row maximum, so that many
      // probabilities fall under 2^-110 (their last bf16 piece is subnormal).
      C(F32, 1, 2, 2, 128, 256, 64, 64).scale(8.0f),
      C(F16, 1, 2, 1, 65, 256, 64, 64).scale(8.0f).causal(),
      C(B16, 1, 2, 2, 128, 128, 64, 64).scale(8.0f),
      // GQA ratios 1, 2, 8 and MQA.
      C(F32, 1, 8, 1, 65, 65, 64, 64),
      C(F16, 1, 8, 1, 128, 128, 64, 64).causal(),
      C(B16, 2, 16, 2, 33, 65, 32, 32),
      C(F32, 1, 16, 2, 65, 33, 32, 32).causal(),
      C(F16, 1, 16, 8, 33, 33, 32, 32).causal(TL),
      C(B16, 1, 4, 4, 65, 65, 32, 32).causal(),
      // Dropout.
      C(F32, 2, 2, 2, 128, 128, 64, 64).dropout(0.17f),
      C(F16, 1, 4, 2, 65, 128, 32, 32).dropout(0.5f).causal(),
      C(B16, 1, 2, 2, 128, 65, 64, 64).dropout(0.1f).causal(TL),
      C(F32, 1, 4, 1, 65, 65, 40, 40).dropout(0.3f).alibi(AH).softcap(3.0f),
      C(F32, 1, 2, 2, 200, 200, 32, 32).dropout(0.25f).window(16, 0),
      // Varlen: empty sequences on either side, Sk < Sq (fully masked rows), lengths 1, 3, 17, 1000.
      C(F32, 0, 2, 2, 0, 0, 64, 64).varlen({17, 0, 3, 128}, {17, 5, 0, 100}).causal(),
      C(F16, 0, 4, 2, 0, 0, 64, 64).varlen({1, 3, 17, 64}, {1, 3, 17, 64}).causal(TL),
      C(B16, 0, 2, 1, 0, 0, 32, 32).varlen({0, 33, 65}, {10, 17, 128}),
      C(F32, 0, 2, 2, 0, 0, 128, 128).varlen({128, 17, 1}, {64, 3, 0}).causal(),
      C(F16, 0, 2, 2, 0, 0, 32, 64).varlen({1000, 3}, {1000, 17}).causal(),
      C(F32, 0, 4, 1, 0, 0, 32, 32).varlen({65, 0, 20}, {33, 0, 40}).window(16, 0).alibi(ABH),
      C(B16, 0, 2, 2, 0, 0, 64, 64).varlen({65, 40}, {65, 100}).window(-1, 8).top_left(),
      C(F32, 0, 2, 2, 0, 0, 64, 64).varlen({50, 17, 3}, {60, 9, 30}).dropout(0.2f).causal(),
      C(F16, 0, 2, 2, 0, 0, 64, 64).varlen({33, 64}, {64, 33}).softcap(5.0f).causal(TL),
      // Strided storage: (B,H,S,D) permuted strides and padded rows.
      C(F32, 2, 4, 2, 65, 128, 64, 64).layout(HM).causal(),
      C(F16, 1, 2, 2, 128, 128, 96, 96).layout(HM),
      C(B16, 2, 2, 1, 33, 65, 32, 64).layout(PAD).causal(TL),
      C(F32, 1, 4, 4, 17, 65, 40, 40).layout(PAD).alibi(AH),
      C(F16, 0, 2, 2, 0, 0, 64, 64).varlen({17, 0, 40}, {40, 9, 17}).layout(HM).causal(),
      C(F32, 0, 4, 2, 0, 0, 32, 32).varlen({30, 33}, {33, 10}).layout(PAD).dropout(0.1f),
  };
  const std::vector<C> random = random_combinations(24);
  const size_t fixed = list.size();
  list.insert(list.end(), random.begin(), random.end());
  std::vector<Case> cases;
  std::set<std::string> names;
  for (size_t index = 0; index < list.size(); ++index) {
    C& item = list[index];
    item.c.name = make_name(item.c);
    if (index >= fixed) item.c.name += "_r" + std::to_string(index - fixed);
    if (!names.insert(item.c.name).second) throw std::logic_error("duplicate case name " + item.c.name);
    cases.push_back(item.c);
  }
  return cases;
}

}  // namespace

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = build();
  return cases;
}

std::vector<Case> fast_cases() {
  std::vector<Case> out;
  for (const Case& c : all_cases())
    if (!c.slow) out.push_back(c);
  return out;
}

std::vector<Case> slow_cases() {
  std::vector<Case> out;
  for (const Case& c : all_cases())
    if (c.slow) out.push_back(c);
  return out;
}

std::vector<Case> determinism_cases() {
  // The first fast case of each kind; together they cover GQA, varlen, dropout, windows, softcap, ALiBi.
  auto first = [](auto predicate) {
    for (const Case& c : all_cases())
      if (!c.slow && predicate(c)) return c;
    throw std::logic_error("determinism_cases: no case matches");
  };
  return {
      first([](const Case& c) { return c.dtype == F32 && c.H / c.Hkv == 8 && c.causal; }),
      first([](const Case& c) { return c.dtype == F16 && c.varlen() && c.causal; }),
      first([](const Case& c) { return c.dtype == B16 && c.dropout > 0.0f; }),
      first([](const Case& c) { return c.dropout > 0.0f && c.softcap > 0.0f && c.alibi != Alibi::kNone; }),
      first([](const Case& c) { return c.varlen() && c.window_left >= 0 && c.alibi != Alibi::kNone; }),
      first([](const Case& c) { return c.dtype == F32 && c.Sq >= 1000 && !c.varlen(); }),
  };
}

uint64_t case_seed(const Case& c) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : c.name) hash = (hash ^ ch) * 1099511628211ull;
  return hash;
}

}  // namespace fatest
