"""Side-by-side GPU benchmark: flashattn (ctypes) vs torch SDPA FLASH_ATTENTION (FA2) and CUDNN_ATTENTION.

Same process, same inputs; CUDA events, warm-up, median of runs timed round-robin across the
contenders of a cell (time_interleaved). TFLOP/s by flash-attn's convention:
fwd = 4*B*H*N^2*D (halved when causal), fwd+bwd = 3.5x fwd. Shapes: bf16 and fp16, D = 64, 128, 256,
N = 1k, 4k, 16k with B = 16384/N and H = 2048/D, causal and not. Also: deterministic-mode backward
speed, peak extra memory of one fwd+bwd at B=1,H=16,D=128,N=131072 causal bf16, a causal fwd+bwd at
N=262144 checked on sampled rows (2x rule), and the bf16 8192^3 matmul rate.

usage: python3 bench/gpu/bench_gpu.py --out DIR [--quick]
       python3 bench/gpu/bench_gpu.py --out DIR --fwd-only   (forward: default path, forced sm80, FA2, cuDNN)
       python3 bench/gpu/bench_gpu.py --out DIR --fwd-only --sm90-persistent-ab [--dtypes bf16] [--lengths 1024,4096]
           (adds columns "tile" and "persistent": the sm90 forward with FLASHATTN_SM90_PERSISTENT=0 and =1,
            timed in the same process on the same inputs)
"""
import argparse
import ctypes
import json
import math
import os
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fa_ctypes import FlashAttn  # noqa: E402

MIB = 1 << 20


def one_call_ms(fn):
    """One call of fn between two CUDA events, in ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    return statistics.median(one_call_ms(fn) for _ in range(reps))


def time_interleaved(fns, rounds=5, reps=3, warmup=2):
    """Median ms of each callable in `fns` (name -> fn), timed round-robin: every round times each one
    `reps` times in turn. Timed one after another, the runner timed first gained: in session 6's first
    run our forward measured up to 13 % faster when timed first in its cell than the same kernel timed
    after torch's (hdim 128, 16k), most likely the GPU clock settling under load. Interleaving gives
    every runner the same mix of states.
    Each round takes the runners in a fresh random order (seeded), so that no runner always follows the same
    one (until session 8 the deterministic fwd+bwd always ran right after the default one). Rotating a fixed
    order is not enough: each runner keeps its predecessor, and in the decode benchmark ours, after SDPA flash in
    most rounds, read up to 6 % slower than the same build in another column (H200, session 37).
    A runner that raises gets None (a backend that refuses the shape)."""
    alive, times, errors = {}, {name: [] for name in fns}, {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            alive[name] = fn
        except Exception as error:
            errors[name] = error
    order, shuffle = list(alive.items()), random.Random(0)
    for _ in range(rounds):
        for name, fn in shuffle.sample(order, len(order)):
            times[name] += [one_call_ms(fn) for _ in range(reps)]
    return {name: statistics.median(times[name]) if name in alive else None for name in fns}, errors


def with_env(fn, name, value):
    """fn run with an environment variable set (the library reads its switches per call)."""
    def run():
        with scoped_env(name, value):
            return fn()
    return run


def flops(B, H, N, D, causal, mode):
    f = 4.0 * B * H * N * N * D / (2 if causal else 1)
    return f * (3.5 if mode == "fwdbwd" else 1.0)


class Ours:
    """fa_fwd / fa_bwd on (B, N, H, D) storage with workspaces allocated once (through torch)."""

    def __init__(self, fa, q, k, v, dout, causal, deterministic=False, options=None):
        """options: more fa_ctypes arguments of both calls (softcap, dropout_p, seed, rng_state)."""
        self.fa = fa
        B, N, H, D = q.shape
        self.out = torch.empty_like(q)
        self.lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        options = options or {}
        self.fwd_args = fa.fwd_args(q, k, v, self.out, self.lse, causal=causal, **options)
        self.bwd_args = fa.bwd_args(dout, q, k, v, self.out, self.lse, self.dq, self.dk, self.dv, causal=causal,
                                    deterministic=deterministic, **options)
        self.fwd_ws = torch.empty(fa.fwd_workspace_size(self.fwd_args), dtype=torch.uint8, device=q.device)
        self.bwd_ws = torch.empty(fa.bwd_workspace_size(self.bwd_args), dtype=torch.uint8, device=q.device)

    def fwd(self):
        self.fa.fwd(self.fwd_args, self.fwd_ws)

    def fwdbwd(self):
        self.fa.fwd(self.fwd_args, self.fwd_ws)
        self.fa.bwd(self.bwd_args, self.bwd_ws)


def torch_runner(backend, q, k, v, dout, causal):
    # SDPA takes (B, H, N, D): the same storage, transposed views.
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dt = dout.transpose(1, 2)

    def fwd():
        with sdpa_kernel(backend), torch.no_grad():
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def fwdbwd():
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        o.backward(dt)

    return fwd, fwdbwd


class scoped_env:
    """Sets an environment variable for a block (the library reads its switches per call)."""

    def __init__(self, name, value):
        self.name, self.value = name, value

    def __enter__(self):
        self.saved = os.environ.get(self.name)
        os.environ[self.name] = self.value

    def __exit__(self, *exc):
        if self.saved is None:
            del os.environ[self.name]
        else:
            os.environ[self.name] = self.saved


def bench_grid(fa, dtypes, dims, lengths, results, log, ours_only=False, reference=None):
    """reference: a second FlashAttn (another build of this library), timed in the same rounds as "ref"."""
    for dtype in dtypes:
        for D in dims:
            for N in lengths:
                B, H = 16384 // N, 2048 // D
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
                for causal in (False, True):
                    ours = Ours(fa, q, k, v, dout, causal)
                    runners = {"ours": (ours.fwd, ours.fwdbwd)}
                    if reference is not None:
                        ref = Ours(reference, q, k, v, dout, causal)
                        runners["ref"] = (ref.fwd, ref.fwdbwd)
                    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        if not ours_only:
                            runners[name] = torch_runner(backend, q, k, v, dout, causal)
                    # Sanity: our O against torch's FA2 O on the same inputs.
                    ours.fwd()
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                        ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=causal).transpose(1, 2)
                    max_diff = (ours.out.float() - ref.float()).abs().max().item()
                    # ... and our dQ, dK against FA2's (autograd) on the same dout.
                    ours.fwdbwd()
                    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).backward(dout.transpose(1, 2))
                    max_grad_diff = max((ours.dq.float() - qt.grad.transpose(1, 2).float()).abs().max().item(),
                                        (ours.dk.float() - kt.grad.transpose(1, 2).float()).abs().max().item())
                    del qt, kt, vt
                    for mode_index, mode in enumerate(("fwd", "fwdbwd")):
                        row = {"dtype": str(dtype).split(".")[-1], "D": D, "N": N, "B": B, "H": H,
                               "causal": causal, "mode": mode, "max_diff_vs_fa2": max_diff,
                               "max_grad_diff_vs_fa2": max_grad_diff}
                        group = {name: fns[mode_index] for name, fns in runners.items()}
                        det = None
                        if mode == "fwd" and not ours_only:
                            # The sm90 forward both ways (one tile per CTA, persistent), same rounds.
                            row["fwd_path"] = kernel_path(fa, ours.fwd_args)
                            if row["fwd_path"].startswith("cuda-sm90"):
                                for name, value in (("tile", "0"), ("persistent", "1")):
                                    group["ours_fwd_" + name] = with_env(ours.fwd, "FLASHATTN_SM90_PERSISTENT", value)
                        if mode == "fwdbwd" and not ours_only:
                            det = Ours(fa, q, k, v, dout, causal, deterministic=True)
                            group["ours_det"] = det.fwdbwd
                            if reference is not None:
                                ref_det = Ours(reference, q, k, v, dout, causal, deterministic=True)
                                group["ref_det"] = ref_det.fwdbwd
                            row["bwd_path"] = kernel_path(fa, ours.bwd_args, "fa_bwd_kernel_path")
                            # The same call on the sm80 backward where sm90 serves the shape.
                            if row["bwd_path"] == "cuda-sm90":
                                group["ours_bwd_sm80"] = with_env(ours.fwdbwd, "FLASHATTN_CUDA_BWD", "sm80")
                        medians, errors = time_interleaved(group)
                        for name, error in errors.items():
                            log.write(f"{name} {row}: {error}\n")
                        for name, ms in medians.items():
                            row[name] = None if ms is None else flops(B, H, N, D, causal, mode) / ms / 1e9
                        det = ref_det = None
                        results.append(row)
                        log.write(json.dumps(row) + "\n")
                        log.flush()
                    del ours, runners
                    ref = None
                del q, k, v, dout
                torch.cuda.empty_cache()


def kernel_path(fa, args, function="fa_fwd_kernel_path"):
    fn = getattr(fa.lib, function)
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_void_p]
    path = fn(ctypes.addressof(args))
    return path.decode() if path else "invalid"


# Our forward variants in the benchmark: the default dispatch, other consumer
# schedules of the sm90 kernel (FA_BENCH_SCHEDULES, e.g. "v1 v2 v3"; needs a build
# with -DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON), and with FA_BENCH_SM80=1 our FA2
# (sm80) kernels on the same GPU.
VARIANTS = {"ours": {}}
for _schedule in os.environ.get("FA_BENCH_SCHEDULES", "").split():
    VARIANTS["ours_" + _schedule] = {"FLASHATTN_SM90_SCHEDULE": _schedule}
if os.environ.get("FA_BENCH_SM80", "0") == "1":
    VARIANTS["ours_sm80"] = {"FLASHATTN_CUDA_FWD": "sm80"}
# FA_BENCH_ENV_VARIANTS="c3:FLASHATTN_SM90_FWD_CONSUMERS=3 c3p:FLASHATTN_SM90_FWD_CONSUMERS=3,FLASHATTN_SM90_PERSISTENT=1":
# more variants, each a label and its switches (comma-separated).
for _variant in os.environ.get("FA_BENCH_ENV_VARIANTS", "").split():
    _label, _settings = _variant.split(":", 1)
    VARIANTS["ours_" + _label] = dict(_setting.split("=", 1) for _setting in _settings.split(","))


def bench_forward(fa, dtypes, dims, lengths, results, log, reference=None):
    """Forward only: our VARIANTS, torch FA2, cuDNN; max |O - O_FA2| of each variant (NaN-poisoned output first).
    reference: a second FlashAttn (another build of this library), its default forward timed as "ref"."""
    for dtype in dtypes:
        for D in dims:
            for N in lengths:
                B, H = 16384 // N, 2048 // D
                torch.manual_seed(0)
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for causal in (False, True):
                    ours = Ours(fa, q, k, v, q, causal)
                    row = {"dtype": str(dtype).split(".")[-1], "D": D, "N": N, "B": B, "H": H, "causal": causal,
                           "mode": "fwd", "path": kernel_path(fa, ours.fwd_args)}
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
                    f = flops(B, H, N, D, causal, "fwd")
                    group = {}
                    for name, env in VARIANTS.items():  # our variants, chosen per call by environment variables
                        os.environ.update(env)
                        row["path" + name[4:]] = kernel_path(fa, ours.fwd_args)  # which kernel the variant ran
                        ours.out.fill_(float("nan"))
                        ours.fwd()
                        row["max_diff_vs_fa2" + name[4:]] = (ours.out.float() - ref.float()).abs().max().item()
                        for key in env:
                            del os.environ[key]
                        run = ours.fwd
                        for key, value in env.items():
                            run = with_env(run, key, value)
                        group[name] = run
                    ref_ours = None
                    if reference is not None:
                        ref_ours = Ours(reference, q, k, v, q, causal)
                        group["ref"] = ref_ours.fwd
                    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        def run(backend=backend):
                            with sdpa_kernel(backend), torch.no_grad():
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        group[name] = run
                    medians, errors = time_interleaved(group)
                    for name, error in errors.items():
                        log.write(f"{name} {row}: {error}\n")
                    for name, ms in medians.items():
                        row[name] = None if ms is None else f / ms / 1e9
                    results.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    del ours, ref_ours
                del q, k, v, qt, kt, vt
                torch.cuda.empty_cache()


def print_forward(summary, results):
    mm = summary["matmul_bf16_8192_tflops"]
    print(f"GPU {summary['gpu']}, torch {summary['torch']}, cuDNN {summary['cudnn']}; "
          f"bf16 8192^3 matmul {mm:.0f} TFLOP/s")
    print("forward TFLOP/s (16k tokens, H*D = 2048): ours = default dispatch (path), sm80 = ours forced to FA2 path")
    names = list(VARIANTS)
    print("dtype D N causal | path | " + " ".join(n[5:] or "ours" for n in names) + " fa2 cudnn | "
          "best/cudnn best/fa2 best/matmul | maxdiff O vs FA2 per variant")
    for r in results:
        best = max(r[n] for n in names if n != "ours_sm80")

        def ratio(other):
            return f"{best / r[other]:.2f}" if r.get(other) else "-"
        diffs = " ".join(f"{r['max_diff_vs_fa2' + n[4:]]:.1e}" for n in names)
        ref = f" | ref {fmt(r['ref'])} ours/ref {r['ours'] / r['ref']:.2f}" if r.get("ref") and r.get("ours") else ""
        print(f"{r['dtype']} {r['D']} {r['N']} {'C' if r['causal'] else '-'} | {r['path']} | "
              + " ".join(fmt(r[n]) for n in names) + f" {fmt(r['fa2'])} {fmt(r['cudnn'])} | {ratio('cudnn')} "
              f"{ratio('fa2')} {best / mm:.2f} | {diffs}{ref}")


def peak_memory(fa, N=131072, H=16, D=128):
    torch.cuda.empty_cache()
    q, k, v, dout = (torch.randn(1, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ours = Ours(fa, q, k, v, dout, causal=True)
    ours.fwdbwd()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / MIB
    workspace = (ours.fwd_ws.numel() + ours.bwd_ws.numel()) / MIB
    del ours, q, k, v, dout
    torch.cuda.empty_cache()
    return {"N": N, "H": H, "D": D, "peak_extra_mib": extra, "workspace_mib": workspace}


def long_sequence_check(fa, N=262144, H=4, D=128, rows=8):
    """Causal fwd+bwd at N; O, LSE and dQ of sampled rows against fp64, bound 2x the bf16 naive error."""
    torch.manual_seed(1)
    dt = torch.bfloat16
    q, k, v, dout = (torch.randn(1, N, H, D, device="cuda", dtype=dt) for _ in range(4))
    ours = Ours(fa, q, k, v, dout, causal=True)
    start = time.time()
    ours.fwdbwd()
    torch.cuda.synchronize()
    elapsed = time.time() - start
    scale = 1.0 / math.sqrt(D)
    sample = torch.randint(0, N, (rows,)).tolist() + [N - 1]
    report = {"N": N, "H": H, "D": D, "seconds": elapsed, "rows": sample, "checks": {}}
    worst = {"O": [0.0, 0.0], "LSE": [0.0, 0.0], "dQ": [0.0, 0.0]}
    for h in range(H):
        for i in sample:
            kk, vv = k[0, : i + 1, h].double(), v[0, : i + 1, h].double()
            qi, doi = q[0, i, h].double(), dout[0, i, h].double()
            s = (kk @ qi) * scale
            lse = torch.logsumexp(s, 0)
            p = torch.exp(s - lse)
            o = p @ vv
            dp = vv @ doi
            o_ours = ours.out[0, i, h].double()
            d_i = (doi * o_ours).sum()  # FA2's D from the stored O, as the kernel does
            dq = ((p * (dp - (doi * o).sum())) @ kk) * scale
            # same-precision naive: bf16 scores, fp32 softmax rounded to bf16, bf16 products
            s16 = (k[0, : i + 1, h] @ q[0, i, h]).to(dt) * scale
            p16 = torch.softmax(s16.float(), 0).to(dt)
            o16 = (p16 @ v[0, : i + 1, h]).double()
            lse16 = torch.logsumexp(s16.float(), 0).double()
            dp16 = (v[0, : i + 1, h] @ dout[0, i, h]).float()
            ds16 = (p16.float() * (dp16 - (dout[0, i, h].float() * o16.float()).sum())).to(dt)
            dq16 = ((ds16 @ k[0, : i + 1, h]).float() * scale).double()
            del d_i
            pairs = {"O": (o_ours, o, o16), "LSE": (ours.lse[0, h, i].double(), lse, lse16),
                     "dQ": (ours.dq[0, i, h].double(), dq, dq16)}
            for name, (mine, ref, naive) in pairs.items():
                worst[name][0] = max(worst[name][0], (mine - ref).abs().max().item())
                worst[name][1] = max(worst[name][1], (naive - ref).abs().max().item())
            report.setdefault("lse_rows", []).append(
                {"h": h, "i": i, "ours_minus_ref": (ours.lse[0, h, i].double() - lse).item(),
                 "naive_minus_ref": (lse16 - lse).item()})
    for name, (mine, naive) in worst.items():
        report["checks"][name] = {"ours": mine, "naive": naive, "pass": mine <= 2 * naive + 1e-6}
    del ours, q, k, v, dout
    torch.cuda.empty_cache()
    return report


def matmul_rate():
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = time_ms(lambda: a @ b, warmup=3, reps=10)
    return 2 * 8192**3 / ms / 1e9


def fmt(x):
    return "-" if x is None else f"{x:.0f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--quick", action="store_true", help="bf16 only, D=128, N=4096")
    parser.add_argument("--skip-extra", action="store_true")
    parser.add_argument("--ours-only", action="store_true", help="time only this library (A/B tuning builds)")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--label", default="ours", help="name of this library in the table")
    parser.add_argument("--fwd-only", action="store_true",
                        help="forward table only, N = 1k, 4k, 8k, 16k: ours (and forced sm80) vs FA2 vs cuDNN")
    parser.add_argument("--lengths", default="1024,4096,8192,16384", help="sequence lengths of --fwd-only")
    parser.add_argument("--reference-lib", default=None,
                        help="another build of libflashattn.so (e.g. the previous commit), timed in the same rounds: "
                             "columns ref and ref_det")
    parser.add_argument("--sm90-persistent-ab", action="store_true",
                        help="--fwd-only: also time our forward with FLASHATTN_SM90_PERSISTENT=0 (one tile per CTA) "
                             "and =1 (persistent), columns 'tile' and 'persistent'")
    args = parser.parse_args()
    if args.sm90_persistent_ab:
        VARIANTS["ours_tile"] = {"FLASHATTN_SM90_PERSISTENT": "0"}
        VARIANTS["ours_persistent"] = {"FLASHATTN_SM90_PERSISTENT": "1"}
    fa = FlashAttn()
    assert fa.lib.fa_has_cuda() == 1, "libflashattn.so was built without CUDA"
    results = []
    log = open(os.path.join(args.out, "bench_gpu.log"), "w")
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version()}
    summary["matmul_bf16_8192_tflops"] = matmul_rate()
    dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in args.dtypes.split(",")]
    dims = [int(d) for d in args.dims.split(",")]
    if args.fwd_only:
        reference = FlashAttn(args.reference_lib) if args.reference_lib else None
        bench_forward(fa, dtypes, dims, [int(n) for n in args.lengths.split(",")], results, log, reference)
        summary["results"] = results
        with open(os.path.join(args.out, "bench_gpu_fwd.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print_forward(summary, results)
        return
    if args.quick:
        bench_grid(fa, [torch.bfloat16], [128], [4096], results, log)
    else:
        reference = FlashAttn(args.reference_lib) if args.reference_lib else None
        bench_grid(fa, dtypes, dims, [1024, 4096, 16384], results, log, ours_only=args.ours_only,
                   reference=reference)
    if not args.skip_extra:
        summary["memory"] = peak_memory(fa)
        summary["long_sequence"] = long_sequence_check(fa)
    summary["results"] = results
    with open(os.path.join(args.out, "bench_gpu.json"), "w") as f:
        json.dump(summary, f, indent=1)

    print(f"GPU {summary['gpu']}, torch {summary['torch']}, cuDNN {summary['cudnn']}; "
          f"bf16 8192^3 matmul {summary['matmul_bf16_8192_tflops']:.0f} TFLOP/s")
    if "memory" in summary:
        m = summary["memory"]
        print(f"peak extra memory fwd+bwd B=1 H=16 D=128 N=131072 causal bf16: {m['peak_extra_mib']:.0f} MiB "
              f"(workspace {m['workspace_mib']:.0f} MiB; target <= 3088)")
        ls = summary["long_sequence"]
        print(f"N=262144 causal fwd+bwd ({ls['seconds']:.2f} s): " + ", ".join(
            f"{k} {v['ours']:.2e} vs naive {v['naive']:.2e} {'PASS' if v['pass'] else 'FAIL'}"
            for k, v in ls["checks"].items()))
        print("LSE error per sampled row (h, i: ours - ref, naive - ref): " + "; ".join(
            f"{r['h']},{r['i']}: {r['ours_minus_ref']:+.1e} {r['naive_minus_ref']:+.1e}" for r in ls["lse_rows"]))
    if args.ours_only:
        print(f"TFLOP/s of {args.label} only")
        for r in results:
            print(f"{args.label} {r['dtype']} {r['D']} {r['N']} {'C' if r['causal'] else '-'} {r['mode']} | "
                  f"{fmt(r['ours'])} | {r['max_diff_vs_fa2']:.1e} {r['max_grad_diff_vs_fa2']:.1e}")
        return
    print("TFLOP/s: ours / torch FA2 / cuDNN (ratio ours/FA2); det = deterministic fwd+bwd; "
          "path: the forward's (fwd rows, with the sm90 forward timed one tile per CTA and persistent) or the "
          "backward's (fwd+bwd rows, with the other backward family forced)")
    print("dtype D N causal mode | ours fa2 cudnn | ours/fa2 | det det/ours | path | maxdiff O, dQ/dK vs FA2")
    for r in results:
        ratio = r["ours"] / r["fa2"] if r.get("ours") and r.get("fa2") else float("nan")  # noqa: E501
        det = ""
        if "ours_det" in r and r["ours"]:
            det = f"{r['ours_det']:.0f} {r['ours_det'] / r['ours']:.2f}"
        bwd = r.get("bwd_path", r.get("fwd_path", ""))[5:]
        for other in ("sm80", "sm90"):
            if "ours_bwd_" + other in r:
                bwd += f" ({other} {r['ours_bwd_' + other]:.0f})"
        if "ours_fwd_tile" in r:
            bwd += f" (tile {r['ours_fwd_tile']:.0f}, persistent {r['ours_fwd_persistent']:.0f})"
        for name in VARIANTS:  # FA_BENCH_SCHEDULES / FA_BENCH_ENV_VARIANTS: TFLOP/s and ratio to the default
            if name != "ours" and isinstance(r.get(name), float) and r.get("ours"):
                bwd += f" ({name[5:]} {r[name]:.0f} {r[name] / r['ours']:.2f}x)"
        print(f"{r['dtype']} {r['D']} {r['N']} {'C' if r['causal'] else '-'} {r['mode']} | {fmt(r['ours'])} "
              f"{fmt(r['fa2'])} {fmt(r['cudnn'])} | {ratio:.2f} | {det} | {bwd} | {r['max_diff_vs_fa2']:.1e} "
              f"{r['max_grad_diff_vs_fa2']:.1e}")
    if args.reference_lib:
        print(f"Against the reference build {args.reference_lib} (same rounds): "
              "dtype D N causal mode | ours ref ours/ref | det ref_det det/ref_det")
        for r in results:
            det = ""
            if r.get("ours_det") and r.get("ref_det"):
                det = f"{r['ours_det']:.0f} {r['ref_det']:.0f} {r['ours_det'] / r['ref_det']:.2f}"
            ratio = r["ours"] / r["ref"] if r.get("ours") and r.get("ref") else float("nan")
            print(f"{r['dtype']} {r['D']} {r['N']} {'C' if r['causal'] else '-'} {r['mode']} | {fmt(r['ours'])} "
                  f"{fmt(r.get('ref'))} {ratio:.2f} | {det}")


if __name__ == "__main__":
    main()
