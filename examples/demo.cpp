// The project's main job: attention forward and backward at a long sequence
// on the default device (the GPU when the library has CUDA and a GPU is
// present, else the CPU). Checks sampled rows of O, LSE, dQ and dV against an
// fp64 reference and prints time, throughput and peak memory next to what
// materialized attention would need.
//
//   demo [--seqlen N] [--heads H] [--head-dim D] [--threads T] [--cpu]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "demo_device.hpp"

namespace {

struct DemoConfig {
  int64_t seqlen = 16384, heads = 8, head_dim = 64;
  int threads = 0;
  bool force_cpu = false;
};

DemoConfig parse(int argc, char** argv) {
  DemoConfig config;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_value = a + 1 < argc;
    if (arg == "--seqlen" && has_value) {
      config.seqlen = std::stoll(argv[++a]);
    } else if (arg == "--heads" && has_value) {
      config.heads = std::stoll(argv[++a]);
    } else if (arg == "--head-dim" && has_value) {
      config.head_dim = std::stoll(argv[++a]);
    } else if (arg == "--threads" && has_value) {
      config.threads = std::stoi(argv[++a]);
    } else if (arg == "--cpu") {
      config.force_cpu = true;
    } else {
      std::fprintf(stderr, "usage: demo [--seqlen N] [--heads H] [--head-dim D] [--threads T] [--cpu]\n");
      std::exit(2);
    }
  }
  return config;
}

// fp64 causal attention of one query row, and the dQ of that row. Layout (1, N, H, D).
struct RowReference {
  std::vector<double> out, dq;
  double lse;
};

RowReference reference_row(const bench::HostTensor& q, const bench::HostTensor& k, const bench::HostTensor& v,
                           const bench::HostTensor& dout, int64_t h, int64_t i, int64_t heads, int64_t d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto at = [&](const bench::HostTensor& t, int64_t row, int64_t col) { return t.get((row * heads + h) * d + col); };
  std::vector<double> scores(i + 1);
  double row_max = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (int64_t t = 0; t < d; ++t) dot += static_cast<double>(at(q, i, t)) * at(k, j, t);
    scores[j] = dot * scale;
    row_max = std::max(row_max, scores[j]);
  }
  double sum = 0;
  for (double& s : scores) sum += (s = std::exp(s - row_max));
  RowReference ref{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0), row_max + std::log(sum)};
  for (int64_t j = 0; j <= i; ++j) {
    scores[j] /= sum;
    for (int64_t t = 0; t < d; ++t) ref.out[t] += scores[j] * at(v, j, t);
  }
  double delta = 0;
  for (int64_t t = 0; t < d; ++t) delta += ref.out[t] * at(dout, i, t);
  for (int64_t j = 0; j <= i; ++j) {
    double dp = 0;
    for (int64_t t = 0; t < d; ++t) dp += static_cast<double>(at(dout, i, t)) * at(v, j, t);
    const double ds = scores[j] * (dp - delta) * scale;
    for (int64_t t = 0; t < d; ++t) ref.dq[t] += ds * at(k, j, t);
  }
  return ref;
}

// dV of key row j: sum over the query rows that see it of P_ij dO_i, with P from
// our LSE (itself checked against fp64 on the sampled rows) to keep this O(N·D).
std::vector<double> reference_dv_row(const bench::HostTensor& q, const bench::HostTensor& k,
                                     const bench::HostTensor& dout, const bench::HostTensor& lse, int64_t h,
                                     int64_t j, int64_t n, int64_t heads, int64_t d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> dv(d, 0.0);
  for (int64_t i = j; i < n; ++i) {
    double dot = 0;
    for (int64_t t = 0; t < d; ++t)
      dot += static_cast<double>(q.get((i * heads + h) * d + t)) * k.get((j * heads + h) * d + t);
    const double p = std::exp(dot * scale - lse.get(h * n + i));
    for (int64_t t = 0; t < d; ++t) dv[t] += p * dout.get((i * heads + h) * d + t);
  }
  return dv;
}

}  // namespace

int main(int argc, char** argv) {
  const DemoConfig config = parse(argc, argv);
  const int64_t n = config.seqlen, h = config.heads, d = config.head_dim;
  const bool on_gpu = !config.force_cpu && demo::gpu_available();
  const fa_dtype dtype = FA_DTYPE_BF16;
  std::printf("flashattn %s demo: causal attention, bf16, B=1 H=%lld N=%lld D=%lld on the %s\n", fa_version(),
              static_cast<long long>(h), static_cast<long long>(n), static_cast<long long>(d),
              on_gpu ? "GPU" : "CPU");

  std::mt19937_64 rng(7);
  bench::HostTensor q(dtype, {1, n, h, d}), k(dtype, {1, n, h, d}), v(dtype, {1, n, h, d}), dout(dtype, {1, n, h, d});
  bench::HostTensor o(dtype, {1, n, h, d}), dq(dtype, {1, n, h, d}), dk(dtype, {1, n, h, d}), dv(dtype, {1, n, h, d});
  bench::HostTensor lse(FA_DTYPE_FP32, {1, h, n});
  for (bench::HostTensor* t : {&q, &k, &v, &dout}) t->fill_random(rng);

  demo::Device device(on_gpu);
  bench::CountingAllocator::install();
  flashattn::FwdArgs fwd;
  fwd.q = device.upload(q);
  fwd.k = device.upload(k);
  fwd.v = device.upload(v);
  fwd.out = device.upload(o);
  fwd.lse = device.upload(lse);
  fwd.opts.causal = 1;
  fwd.opts.num_threads = config.threads;
  const fa_tensor dout_view = device.upload(dout), dq_view = device.upload(dq), dk_view = device.upload(dk),
                  dv_view = device.upload(dv);
  const flashattn::BwdArgs bwd = bench::backward_args(fwd, dout_view, dq_view, dk_view, dv_view);

  try {
    flashattn::fwd(fwd);  // warm-up (and, on the GPU, module load)
    device.synchronize();
    bench::CountingAllocator::reset_peak();
    auto start = std::chrono::steady_clock::now();
    flashattn::fwd(fwd);
    device.synchronize();
    const double fwd_s = bench::seconds_since(start);
    start = std::chrono::steady_clock::now();
    flashattn::bwd(bwd);
    device.synchronize();
    const double bwd_s = bench::seconds_since(start);

    device.download(fwd.out, o);
    device.download(fwd.lse, lse);
    device.download(bwd.dq, dq);
    device.download(bwd.dv, dv);

    const double flops = bench::attention_fwd_flops(1, h, n, n, d, true);
    std::printf("forward   %9.3f ms  %8.1f GFLOP/s\n", fwd_s * 1e3, flops / fwd_s / 1e9);
    std::printf("backward  %9.3f ms  %8.1f GFLOP/s\n", bwd_s * 1e3, 2.5 * flops / bwd_s / 1e9);
    const double io_mib = 9.0 * q.bytes.size() / 1048576.0;
    const double extra_mib = (bench::CountingAllocator::peak() + lse.bytes.size()) / 1048576.0;
    const double naive_mib = 2.0 * h * n * n * 4 / 1048576.0;
    std::printf("memory    inputs+outputs %.1f MiB; flashattn extra %.1f MiB (workspace + LSE); "
                "materialized attention would need %.1f MiB more (P and dP, fp32)\n",
                io_mib, extra_mib, naive_mib);

    // Sampled rows against fp64. Gradient errors are relative to the largest
    // reference gradient of the samples (row 0 has dQ = 0 exactly: one key).
    // bf16 outputs: allow a few bf16 ulps of that scale.
    double worst_o = 0, worst_lse = 0, err_dq = 0, err_dv = 0, max_dq = 1e-30, max_dv = 1e-30;
    const int64_t samples[] = {0, 1, n / 3, n / 2 + 5, n - 1};
    for (int64_t head : {int64_t{0}, h - 1}) {
      for (int64_t i : samples) {
        const RowReference ref = reference_row(q, k, v, dout, head, i, h, d);
        const std::vector<double> ref_dv = reference_dv_row(q, k, dout, lse, head, i, n, h, d);
        for (int64_t t = 0; t < d; ++t) {
          const int64_t at = (i * h + head) * d + t;
          worst_o = std::max(worst_o, std::abs(o.get(at) - ref.out[t]));
          err_dq = std::max(err_dq, std::abs(dq.get(at) - ref.dq[t]));
          err_dv = std::max(err_dv, std::abs(dv.get(at) - ref_dv[t]));
          max_dq = std::max(max_dq, std::abs(ref.dq[t]));
          max_dv = std::max(max_dv, std::abs(ref_dv[t]));
        }
        worst_lse = std::max(worst_lse, std::abs(lse.get(head * n + i) - ref.lse));
      }
    }
    const double worst_dq = err_dq / max_dq, worst_dv = err_dv / max_dv;
    const bool ok = worst_o < 2e-2 && worst_lse < 1e-3 && worst_dq < 3e-2 && worst_dv < 3e-2;
    std::printf("check     sampled rows vs fp64: max error O %.2e, LSE %.2e, dQ %.2e (rel), dV %.2e (rel) -> %s\n",
                worst_o, worst_lse, worst_dq, worst_dv, ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const flashattn::Error& error) {
    std::fprintf(stderr, "flashattn error: %s\n", error.what());
    return 1;
  }
}
