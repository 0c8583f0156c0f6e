"""Busy fraction of the CPU forward's team under its step schedule (src/cpu/fwd_impl.hpp, run_fwd).

Model: a step stages fwd_heads_per_step kv heads and hands out their (query head, Q tile) items with
omp schedule(dynamic, 1), last Q tiles first; the next step starts after a barrier that waits for the
step's last item. An item costs its visible key tiles (causal: bottom-right, Sq = Sk); staging and the
barrier itself are free. Prints busy = work / (threads * time) for the heads-per-step rule before and
after session 20 (scratch.hpp).

    python3 dev/cpu_step_sim.py
"""
import heapq

BLOCK_M, BLOCK_N = 256, 128
STAGE_BUDGET, ITEMS_PER_THREAD, BUDGET_PER_THREAD = 4 << 20, 4, 2 << 20


def heads_per_step(b, h, n, d, threads, widen):
    head_bytes = n * 2 * d * 4
    per_step = STAGE_BUDGET // head_bytes
    if widen:
        items_per_head = -(-n // BLOCK_M)
        per_step = max(per_step, min(-(-ITEMS_PER_THREAD * threads // items_per_head),
                                     threads * BUDGET_PER_THREAD // head_bytes))
    return max(1, min(per_step, h))


def busy(b, h, n, d, causal, threads, widen):
    per_step = heads_per_step(b, h, n, d, threads, widen)
    q_tiles = -(-n // BLOCK_M)
    cost = lambda t: -(-min(n, (t + 1) * BLOCK_M) // BLOCK_N) if causal else -(-n // BLOCK_N)  # noqa: E731
    total_time = total_work = 0
    for _ in range(b):
        for h0 in range(0, h, per_step):
            heads = min(per_step, h - h0)
            items = [cost(q_tiles - 1 - i // heads) for i in range(heads * q_tiles)]
            free = [0] * min(threads, len(items))
            for c in items:  # dynamic: the next item goes to the first thread that is free
                heapq.heapreplace(free, free[0] + c)
            total_time += max(free)
            total_work += sum(items)
    return total_work / (threads * total_time), per_step


for threads in (2, 16):
    for shape in ((1, 16, 4096, 128), (4, 8, 1024, 64)):
        for causal in (False, True):
            before, steps_before = busy(*shape, causal, threads, False)
            after, steps_after = busy(*shape, causal, threads, True)
            print(f"{threads:2d} threads {','.join(map(str, shape)):14s} causal={causal!s:5s} "
                  f"heads/step {steps_before} -> {steps_after}, busy {before:.0%} -> {after:.0%}")
