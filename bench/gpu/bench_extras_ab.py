"""A/B of the kernels' extras variant (softcap, dropout) between this build and a reference build (e.g. the
previous commit): same inputs, timed in the same rounds (bench_gpu.time_interleaved).

Each cell first checks that both builds give the same bytes (O, LSE, and dQ, dK, dV of a deterministic
backward): a change that only moves registers must not move results. Dropout is timed twice for this build:
seed by value ("ours") and read from device memory when the kernels run ("ours_rngptr",
fa_options.dropout_rng_state), the path a captured CUDA graph takes. With --ref-rngptr (a reference build that
has dropout_rng_state) the reference's seed-in-memory kernels are timed too ("ref_rngptr").

usage: FLASHATTN_LIB=build/libflashattn.so python3 bench/gpu/bench_extras_ab.py --out DIR \
           --reference-lib build-ref/libflashattn.so [--dims 64,128,256] [--lengths 4096] [--ref-rngptr]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_gpu import Ours, flops, time_interleaved  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402

SEED = 0x5DEECE66D  # offset 0: fa_ctypes passes no offset by value
VARIANTS = {"softcap": dict(softcap=30.0), "dropout": dict(dropout_p=0.1, seed=SEED)}


class Call(Ours):
    """bench_gpu's runner of one library with the variant's options; results() for the byte comparison."""

    def __init__(self, fa, q, k, v, dout, causal, options, deterministic=False):
        super().__init__(fa, q, k, v, dout, causal, deterministic=deterministic, options=options)

    def results(self):
        return (self.out, self.lse, self.dq, self.dk, self.dv)


def same_bytes(fa, reference, q, k, v, dout, causal, options, rng_state, ref_rngptr):
    """Names of the outputs that differ between the builds (and the rng_state paths), deterministic backward."""
    calls = {"ref": Call(reference, q, k, v, dout, causal, options, deterministic=True),
             "ours": Call(fa, q, k, v, dout, causal, options, deterministic=True)}
    if rng_state is not None:
        in_memory = dict(options, seed=0, rng_state=rng_state)
        calls["ours_rngptr"] = Call(fa, q, k, v, dout, causal, in_memory, deterministic=True)
        if ref_rngptr:
            calls["ref_rngptr"] = Call(reference, q, k, v, dout, causal, in_memory, deterministic=True)
    for call in calls.values():
        call.fwdbwd()
    torch.cuda.synchronize()
    differ = []
    for name, call in calls.items():
        for what, got, want in zip(("out", "lse", "dq", "dk", "dv"), call.results(), calls["ref"].results()):
            if not torch.equal(got, want):
                differ.append(f"{name}.{what}")
    return differ


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--reference-lib", required=True)
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--lengths", default="4096")
    parser.add_argument("--ref-rngptr", action="store_true",
                        help="also time the reference build with the seed in device memory")
    args = parser.parse_args()
    fa, reference = FlashAttn(), FlashAttn(args.reference_lib)
    rng_state = torch.tensor([SEED, 0], dtype=torch.int64, device="cuda")
    results = []
    for D in (int(d) for d in args.dims.split(",")):
        for N in (int(n) for n in args.lengths.split(",")):
            B, H = 16384 // N, 2048 // D
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for variant, options in VARIANTS.items():
                pointer = rng_state if "dropout_p" in options else None
                for causal in (False, True):
                    differ = same_bytes(fa, reference, q, k, v, dout, causal, options, pointer, args.ref_rngptr)
                    runners = {"ours": Call(fa, q, k, v, dout, causal, options),
                               "ref": Call(reference, q, k, v, dout, causal, options)}
                    if pointer is not None:
                        in_memory = dict(options, seed=0, rng_state=pointer)
                        runners["ours_rngptr"] = Call(fa, q, k, v, dout, causal, in_memory)
                        if args.ref_rngptr:
                            runners["ref_rngptr"] = Call(reference, q, k, v, dout, causal, in_memory)
                    for mode in ("fwd", "fwdbwd"):
                        medians, errors = time_interleaved({name: getattr(call, mode)
                                                            for name, call in runners.items()})
                        row = {"variant": variant, "D": D, "N": N, "B": B, "H": H, "causal": causal, "mode": mode,
                               "differ": differ, "errors": {name: str(e) for name, e in errors.items()}}
                        for name, ms in medians.items():
                            row[name] = None if ms is None else flops(B, H, N, D, causal, mode) / ms / 1e9
                        results.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
    with open(os.path.join(args.out, "bench_extras_ab.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "reference": args.reference_lib, "results": results}, f,
                  indent=1)
    print(f"GPU {torch.cuda.get_device_name()}; bf16; TFLOP/s of this build, the reference build and (dropout) this "
          "build reading the seed from device memory; same bytes = O, LSE, dQ, dK, dV equal to the reference's")
    print("variant D N causal mode | ours ref ours/ref | rngptr rngptr/ours | ref_rngptr rngptr/ref_rngptr | "
          "same bytes")
    for r in results:
        def tf(x):
            return "-" if x is None else f"{x:.0f}"
        ratio = r["ours"] / r["ref"] if r.get("ours") and r.get("ref") else float("nan")
        rng = ""
        if r.get("ours_rngptr") and r.get("ours"):
            rng = f"{tf(r['ours_rngptr'])} {r['ours_rngptr'] / r['ours']:.3f}"
        ref_rng = ""
        if r.get("ref_rngptr") and r.get("ours_rngptr"):
            ref_rng = f"{tf(r['ref_rngptr'])} {r['ours_rngptr'] / r['ref_rngptr']:.3f}"
        same = "yes" if not r["differ"] else "NO: " + ",".join(r["differ"])
        print(f"{r['variant']} {r['D']} {r['N']} {'C' if r['causal'] else '-'} {r['mode']} | {tf(r.get('ours'))} "
              f"{tf(r.get('ref'))} {ratio:.3f} | {rng} | {ref_rng} | {same}")


if __name__ == "__main__":
    main()
