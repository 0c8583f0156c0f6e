// CPU benchmark: flashattn forward and forward+backward side by side with
// materialized (naive) attention. Median time, GFLOP/s by flash-attn's
// convention, peak extra memory; a table on stdout and JSON on request.
//
//   bench_attention [--threads N] [--reps R] [--naive-reps R] [--no-naive]
//                   [--shapes B,H,N,D;B,H,N,D] [--dtypes fp32,bf16] [--causal 0,1] [--json FILE]
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "naive_attention.hpp"

namespace {

struct Config {
  int threads = 2;
  int reps = 5;
  int naive_reps = 1;
  bool naive = true;
  std::vector<std::array<int64_t, 4>> shapes = {{1, 16, 4096, 128}, {4, 8, 1024, 64}};
  std::vector<fa_dtype> dtypes = {FA_DTYPE_FP32, FA_DTYPE_BF16};
  std::vector<bool> causal = {false, true};
  std::string json_path;
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

Config parse(int argc, char** argv) {
  Config config;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto next = [&]() -> std::string {
      if (a + 1 >= argc) {
        std::fprintf(stderr, "%s: expected a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++a];
    };
    if (arg == "--threads") {
      config.threads = std::stoi(next());
    } else if (arg == "--reps") {
      config.reps = std::stoi(next());
    } else if (arg == "--naive-reps") {
      config.naive_reps = std::stoi(next());
    } else if (arg == "--no-naive") {
      config.naive = false;
    } else if (arg == "--json") {
      config.json_path = next();
    } else if (arg == "--shapes") {
      config.shapes.clear();
      for (const std::string& shape : split(next(), ';')) {
        const std::vector<std::string> dims = split(shape, ',');
        if (dims.size() != 4) {
          std::fprintf(stderr, "--shapes: expected B,H,N,D, got %s\n", shape.c_str());
          std::exit(2);
        }
        config.shapes.push_back({std::stoll(dims[0]), std::stoll(dims[1]), std::stoll(dims[2]), std::stoll(dims[3])});
      }
    } else if (arg == "--dtypes") {
      config.dtypes.clear();
      for (const std::string& name : split(next(), ','))
        config.dtypes.push_back(name == "bf16" ? FA_DTYPE_BF16 : FA_DTYPE_FP32);
    } else if (arg == "--causal") {
      config.causal.clear();
      for (const std::string& flag : split(next(), ',')) config.causal.push_back(flag == "1");
    } else {
      std::fprintf(stderr, "unknown argument %s (see the header of bench/bench_attention.cpp)\n", arg.c_str());
      std::exit(2);
    }
  }
  return config;
}

struct Row {
  int64_t b, h, n, d;
  const char* dtype;
  bool causal;
  double fwd_s, fwdbwd_s, fwd_gflops, fwdbwd_gflops;
  double naive_fwd_s = 0, naive_fwdbwd_s = 0, naive_fwd_gflops = 0, naive_fwdbwd_gflops = 0;
  double peak_extra_mib, naive_extra_mib;
};

Row run_case(const Config& config, const std::array<int64_t, 4>& shape, fa_dtype dtype, bool causal) {
  const int64_t b = shape[0], h = shape[1], n = shape[2], d = shape[3];
  std::mt19937_64 rng(1234);
  bench::HostTensor q(dtype, {b, n, h, d}), k(dtype, {b, n, h, d}), v(dtype, {b, n, h, d});
  bench::HostTensor o(dtype, {b, n, h, d}), dout(dtype, {b, n, h, d});
  bench::HostTensor dq(dtype, {b, n, h, d}), dk(dtype, {b, n, h, d}), dv(dtype, {b, n, h, d});
  bench::HostTensor lse(FA_DTYPE_FP32, {b, h, n});
  q.fill_random(rng);
  k.fill_random(rng);
  v.fill_random(rng);
  dout.fill_random(rng);

  flashattn::FwdArgs fwd;
  fwd.q = q.view();
  fwd.k = k.view();
  fwd.v = v.view();
  fwd.out = o.view();
  fwd.lse = lse.view();
  fwd.opts.causal = causal;
  fwd.opts.num_threads = config.threads;

  const flashattn::BwdArgs bwd = bench::backward_args(fwd, dout.view(), dq.view(), dk.view(), dv.view());

  Row row{b, h, n, d, dtype == FA_DTYPE_BF16 ? "bf16" : "fp32", causal, 0, 0, 0, 0};
  flashattn::fwd(fwd);  // warm-up
  bench::CountingAllocator::reset_peak();
  row.fwd_s = bench::median_seconds(config.reps, [&] { flashattn::fwd(fwd); });
  row.fwdbwd_s = bench::median_seconds(config.reps, [&] {
    flashattn::fwd(fwd);
    flashattn::bwd(bwd);
  });
  // Extra memory over inputs and outputs: the workspace (all library scratch) and the LSE.
  row.peak_extra_mib = (bench::CountingAllocator::peak() + lse.bytes.size()) / 1048576.0;
  const double flops = bench::attention_fwd_flops(b, h, n, n, d, causal);
  row.fwd_gflops = flops / row.fwd_s / 1e9;
  row.fwdbwd_gflops = 3.5 * flops / row.fwdbwd_s / 1e9;

  const bench::NaiveShape naive_shape{b, h, n, d, causal};
  // The naive path holds the probabilities and their gradient: two (B, H, N, N) fp32 matrices.
  row.naive_extra_mib = 2.0 * naive_shape.score_elements() * 4 / 1048576.0;
  if (config.naive) {
    const int64_t count = q.numel();
    std::vector<float> qf(count), kf(count), vf(count), of(count), df(count), dqf(count), dkf(count), dvf(count);
    for (int64_t i = 0; i < count; ++i) {
      qf[i] = q.get(i);
      kf[i] = k.get(i);
      vf[i] = v.get(i);
      df[i] = dout.get(i);
    }
    std::vector<float> probs, dscores;
    row.naive_fwd_s = bench::median_seconds(config.naive_reps, [&] {
      bench::naive_forward(naive_shape, qf.data(), kf.data(), vf.data(), of.data(), probs, config.threads);
    });
    row.naive_fwdbwd_s = bench::median_seconds(config.naive_reps, [&] {
      bench::naive_forward(naive_shape, qf.data(), kf.data(), vf.data(), of.data(), probs, config.threads);
      bench::naive_backward(naive_shape, qf.data(), kf.data(), vf.data(), of.data(), df.data(), probs, dscores,
                            dqf.data(), dkf.data(), dvf.data(), config.threads);
    });
    row.naive_fwd_gflops = flops / row.naive_fwd_s / 1e9;
    row.naive_fwdbwd_gflops = 3.5 * flops / row.naive_fwdbwd_s / 1e9;
  }
  return row;
}

void write_json(const std::string& path, const Config& config, const std::vector<Row>& rows) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "--json: cannot open %s for writing\n", path.c_str());
    return;
  }
  std::fprintf(file, "{\"threads\": %d, \"reps\": %d, \"results\": [\n", config.threads, config.reps);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& x = rows[r];
    std::fprintf(file,
                 "  {\"B\": %lld, \"H\": %lld, \"N\": %lld, \"D\": %lld, \"dtype\": \"%s\", \"causal\": %s, "
                 "\"fwd_ms\": %.4f, \"fwdbwd_ms\": %.4f, \"fwd_gflops\": %.2f, \"fwdbwd_gflops\": %.2f, "
                 "\"naive_fwd_ms\": %.4f, \"naive_fwdbwd_ms\": %.4f, \"naive_fwd_gflops\": %.2f, "
                 "\"naive_fwdbwd_gflops\": %.2f, \"peak_extra_mib\": %.3f, \"naive_extra_mib\": %.3f}%s\n",
                 static_cast<long long>(x.b), static_cast<long long>(x.h), static_cast<long long>(x.n),
                 static_cast<long long>(x.d), x.dtype, x.causal ? "true" : "false", x.fwd_s * 1e3, x.fwdbwd_s * 1e3,
                 x.fwd_gflops, x.fwdbwd_gflops, x.naive_fwd_s * 1e3, x.naive_fwdbwd_s * 1e3, x.naive_fwd_gflops,
                 x.naive_fwdbwd_gflops, x.peak_extra_mib, x.naive_extra_mib, r + 1 < rows.size() ? "," : "");
  }
  std::fprintf(file, "]}\n");
  std::fclose(file);
}

}  // namespace

int main(int argc, char** argv) {
  const Config config = parse(argc, argv);
  bench::CountingAllocator::install();
  std::vector<Row> rows;
  std::printf("flashattn CPU benchmark, %d threads, median of %d (naive: %d)\n", config.threads, config.reps,
              config.naive_reps);
  std::printf("%-16s %-5s %-6s | %10s %10s | %10s %10s | %10s %10s\n", "B,H,N,D", "dtype", "causal", "fwd GF/s",
              "f+b GF/s", "naive fwd", "naive f+b", "extra MiB", "naive MiB");
  try {
    for (const auto& shape : config.shapes) {
      for (fa_dtype dtype : config.dtypes) {
        for (bool causal : config.causal) {
          const Row row = run_case(config, shape, dtype, causal);
          char name[64];
          std::snprintf(name, sizeof(name), "%lld,%lld,%lld,%lld", static_cast<long long>(row.b),
                        static_cast<long long>(row.h), static_cast<long long>(row.n), static_cast<long long>(row.d));
          std::printf("%-16s %-5s %-6s | %10.1f %10.1f | %10.1f %10.1f | %10.1f %10.1f\n", name, row.dtype,
                      row.causal ? "yes" : "no", row.fwd_gflops, row.fwdbwd_gflops, row.naive_fwd_gflops,
                      row.naive_fwdbwd_gflops, row.peak_extra_mib, row.naive_extra_mib);
          std::fflush(stdout);
          rows.push_back(row);
        }
      }
    }
  } catch (const flashattn::Error& error) {
    std::fprintf(stderr, "flashattn error: %s\n", error.what());
    return 1;
  }
  if (!config.json_path.empty()) write_json(config.json_path, config, rows);
  return 0;
}
