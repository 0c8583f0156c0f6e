"""List-scheduling model of the sm90 backward's launch order under a causal mask.

One CTA per (head, key tile) runs on one of `sms` SMs for as many items (query
tiles) as its key tile sees; CTAs start in launch order as SMs free up. Prints
the makespan of each order against the ideal (total items / SMs). The
deterministic mode must launch the CTAs of a head's last key tiles first
(every wait on a CTA launched earlier, src/cuda/sm90/bwd_items.hpp), so the
longest CTAs start last; the default launches them first. Split into groups
of key tiles (one dQ copy each), the groups launch longest first.

    python3 dev/det_launch_sim.py
"""
import heapq


def makespan(order, lengths, sms):
    free = [0.0] * sms
    end = 0.0
    for job in order:
        start = heapq.heappop(free)
        finish = start + lengths[job]
        end = max(end, finish)
        heapq.heappush(free, finish)
    return end


def grouped_order(heads, key_tiles, groups):
    """BwdItems' causal order (deterministic_launch_slot): groups of key tiles in turn, the
    first (longest CTAs) first; in each the heads in turn, each's key tiles descending."""
    size = -(-key_tiles // groups)
    return [(h, n) for first in range(0, key_tiles, size) for h in range(heads)
            for n in reversed(range(first, min(first + size, key_tiles)))]


def report(label, heads, key_tiles, query_tiles, tiles_per_key_tile, sms=132):
    lengths = {(h, n): max(0, query_tiles - tiles_per_key_tile * n) for h in range(heads) for n in range(key_tiles)}
    ideal = sum(lengths.values()) / sms
    orders = {
        "default: heads in turn, key tiles ascending": [(h, n) for h in range(heads) for n in range(key_tiles)],
        "deterministic: heads in turn, key tiles descending": [
            (h, n) for h in range(heads) for n in reversed(range(key_tiles))],
        "deterministic, heads interleaved": [(h, n) for n in reversed(range(key_tiles)) for h in range(heads)],
        "deterministic, 2 key-tile groups (the kernel's)": grouped_order(heads, key_tiles, 2),
        "deterministic, 4 key-tile groups": grouped_order(heads, key_tiles, 4),
    }
    print(f"{label}: ideal {ideal:.0f} items per SM")
    for name, order in orders.items():
        span = makespan(order, lengths, sms)
        print(f"  {name:52s} {span:7.0f}  tail {span / ideal - 1:6.1%}")


if __name__ == "__main__":
    # 16k tokens, H * D = 2048, the benchmark's causal shapes (kBlockM, kBlockN of each class).
    report("hdim 128, N = 16384 (16 heads, 128 key tiles of 128, 256 query tiles of 64)", 16, 128, 256, 2)
    report("hdim 64, N = 16384 (32 heads, 128 key tiles of 128, 128 query tiles of 128)", 32, 128, 128, 1)
    report("hdim 256, N = 16384 (8 heads, 256 key tiles of 64, 256 query tiles of 64)", 8, 256, 256, 1)
