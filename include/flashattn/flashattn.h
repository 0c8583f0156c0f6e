/*
 * flashattn — exact attention, FlashAttention-2 algorithm, C API.
 *
 * Every entry point returns an fa_status; on failure fa_last_error() returns
 * a message for the calling thread that names the argument, what was expected
 * and what was received. On failure no output byte is written.
 *
 * Tensors are described by fa_tensor views (no ownership). Strides are in
 * elements; the last dimension must be contiguous (stride 1), any other
 * strides are allowed, so (B,S,H,D) and (B,H,S,D) storage both work: describe
 * the tensor with shape (B,S,H,D) and the strides of the storage you have.
 *
 * Shapes
 *   dense   Q (B,Sq,H,D)   K (B,Sk,Hkv,D)  V (B,Sk,Hkv,Dv)  O (B,Sq,H,Dv)  LSE (B,H,Sq) fp32
 *   varlen  Q (Tq,H,D)     K (Tk,Hkv,D)    V (Tk,Hkv,Dv)    O (Tq,H,Dv)    LSE (H,Tq)   fp32
 *           with cu_seqlens_q / cu_seqlens_k int32 of length B+1 (cumulative offsets from 0).
 *   H must be a multiple of Hkv (GQA; Hkv = 1 is MQA). D and Dv: multiples of 8, at most 256.
 *
 * Masking (see README "Conventions"): with shift = Sk - Sq (bottom-right
 * alignment, flash-attn's) or shift = 0 (top-left, torch SDPA's), query row i
 * sees key j iff
 *     (window_left  < 0 || j >= i + shift - window_left) &&
 *     (window_right < 0 || j <= i + shift + window_right)
 * and causal means window_right = 0. A row that sees no key gives O = 0 and
 * LSE = +inf.
 *
 * Scores: s = softcap > 0 ? softcap * tanh(scale * q.k / softcap) : scale * q.k,
 * then s -= alibi_slope[h] * |i + shift - j| when ALiBi slopes are given.
 * LSE = log(sum_j exp(s_ij)) in natural log.
 *
 * Dropout: Philox4x32-10; the keep decision of element (b, h, i, j) depends
 * only on (seed, offset, b, h, i, j). Mapping (i, j within the sequence,
 * h the query head, H the number of query heads):
 *     key     = { (uint32)seed, (uint32)(seed >> 32) ^ (uint32)(offset >> 32) }
 *     counter = { j / 4, i, b * H + h, (uint32)offset }
 *     r       = philox4x32_10(counter, key)[j % 4]
 *     keep    = r < threshold,  threshold = floor((1 - p) * 2^32) clamped to 2^32 - 1,
 *               with 1 - p evaluated in fp32
 * Kept probabilities are scaled by 1 / (1 - p) (fp32). seed and offset are
 * fa_options' values, or the two words at fa_options.dropout_rng_state.
 *
 * Non-finite inputs are computed, not rejected: a NaN in a Q row or in a key
 * that a row sees reaches that row's O and LSE. As in flash-attn and in a
 * naive P·V, an Inf or NaN in a K/V row may also reach rows of the same tile
 * that do not see that key (0 · Inf).
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(FLASHATTN_BUILDING)
#    define FA_API __declspec(dllexport)
#  else
#    define FA_API
#  endif
#else
#  define FA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_MAX_RANK 4
#define FA_MAX_HEAD_DIM 256

typedef enum fa_status {
  FA_OK = 0,
  FA_ERROR_INVALID_ARGUMENT = 1,  /* shape, stride, value or pointer is wrong */
  FA_ERROR_UNSUPPORTED = 2,       /* valid request this build/backend cannot serve */
  FA_ERROR_WORKSPACE_TOO_SMALL = 3,
  FA_ERROR_OUT_OF_MEMORY = 4,
  FA_ERROR_BACKEND = 5,           /* a CUDA call failed */
  FA_ERROR_INTERNAL = 6
} fa_status;

typedef enum fa_dtype {
  FA_DTYPE_FP32 = 0,
  FA_DTYPE_FP16 = 1,
  FA_DTYPE_BF16 = 2,
  FA_DTYPE_INT32 = 3  /* only for cu_seqlens */
} fa_dtype;

typedef enum fa_device_type { FA_DEVICE_CPU = 0, FA_DEVICE_CUDA = 1 } fa_device_type;

/* A strided view of memory. data == NULL marks an optional tensor as absent. */
typedef struct fa_tensor {
  void* data;
  fa_dtype dtype;
  fa_device_type device;
  int32_t device_index;
  int32_t rank;
  int64_t shape[FA_MAX_RANK];
  int64_t strides[FA_MAX_RANK]; /* in elements */
} fa_tensor;

typedef enum fa_alignment {
  FA_ALIGN_BOTTOM_RIGHT = 0, /* flash-attn: query i aligned with key i + Sk - Sq */
  FA_ALIGN_TOP_LEFT = 1      /* torch SDPA: query i aligned with key i */
} fa_alignment;

typedef struct fa_options {
  float softmax_scale;       /* 0 means 1/sqrt(D); NaN, Inf and negative values are rejected */
  int32_t causal;            /* nonzero: window_right = 0 */
  fa_alignment alignment;    /* applies to causal, window and ALiBi distances */
  int32_t window_left;       /* -1: unbounded */
  int32_t window_right;      /* -1: unbounded */
  float softcap;             /* 0: off */
  float dropout_p;           /* in [0, 1) */
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  int32_t deterministic;     /* backward: bitwise reproducible results */
  int32_t num_threads;       /* CPU backend: 0 means the library default */
  void* stream;              /* CUDA backend: cudaStream_t, NULL = default stream */
  /* Optional {seed, offset}, read when the call runs instead of dropout_seed and
   * dropout_offset: host memory for CPU tensors, memory the GPU reads (device,
   * managed) for CUDA tensors, 8-byte aligned. A CUDA graph that captured the
   * call then takes a new mask on each replay from what was written there.
   * Last in the struct, so that builds before it read the fields before it. */
  const uint64_t* dropout_rng_state;
} fa_options;

typedef struct fa_fwd_args {
  fa_tensor q, k, v;
  fa_tensor out;
  fa_tensor lse;             /* optional output */
  fa_tensor cu_seqlens_q;    /* present: varlen */
  fa_tensor cu_seqlens_k;
  int32_t max_seqlen_q;      /* varlen only */
  int32_t max_seqlen_k;
  fa_tensor alibi_slopes;    /* optional, fp32, (H) or (B,H) */
  fa_options opts;
} fa_fwd_args;

typedef struct fa_bwd_args {
  fa_tensor dout;            /* like out */
  fa_tensor q, k, v, out;
  fa_tensor lse;             /* required: from the forward */
  fa_tensor dq, dk, dv;      /* outputs, like q, k, v */
  fa_tensor cu_seqlens_q;
  fa_tensor cu_seqlens_k;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  fa_tensor alibi_slopes;
  fa_options opts;           /* same options as the forward */
} fa_bwd_args;

typedef void* (*fa_alloc_fn)(size_t bytes, fa_device_type device, int32_t device_index, void* user);
typedef void (*fa_free_fn)(void* ptr, fa_device_type device, int32_t device_index, void* user);

/* Defaults: scale 0 (=1/sqrt(D)), no causal, bottom-right, windows -1, no softcap, no dropout. */
FA_API void fa_options_init(fa_options* opts);
FA_API void fa_fwd_args_init(fa_fwd_args* args);
FA_API void fa_bwd_args_init(fa_bwd_args* args);

/* Builds a view with contiguous (row-major) strides. */
FA_API fa_tensor fa_tensor_contiguous(void* data, fa_dtype dtype, fa_device_type device, int32_t rank,
                                      const int64_t* shape);

/* Exact number of workspace bytes the call needs (validates the arguments first). */
FA_API fa_status fa_fwd_workspace_size(const fa_fwd_args* args, size_t* bytes);
FA_API fa_status fa_bwd_workspace_size(const fa_bwd_args* args, size_t* bytes);

/* workspace == NULL: the library allocates what it needs through the allocator
 * (fa_set_allocator) and frees it before returning. Otherwise workspace_bytes
 * must be at least the queried size. */
FA_API fa_status fa_fwd(const fa_fwd_args* args, void* workspace, size_t workspace_bytes);
FA_API fa_status fa_bwd(const fa_bwd_args* args, void* workspace, size_t workspace_bytes);

/* NULL functions restore the default (malloc/free, cudaMalloc/cudaFree). */
FA_API void fa_set_allocator(fa_alloc_fn alloc, fa_free_fn free_fn, void* user);

/* Thread count of the CPU backend when fa_options.num_threads is 0 (0 = hardware). */
FA_API void fa_set_default_num_threads(int32_t n);

/* Message of the last failed call on this thread ("" if none). */
FA_API const char* fa_last_error(void);
FA_API const char* fa_status_string(fa_status status);

/* 1 when the library was built with the CUDA backend. */
FA_API int32_t fa_has_cuda(void);
FA_API const char* fa_version(void);

/* The forward kernel family fa_fwd would run for these arguments: "cpu",
 * "cuda-sm80" (FlashAttention-2, mma.sync), "cuda-sm90" (Hopper: TMA, wgmma,
 * warp specialization; compute capability 9.0, everything but dropout) or
 * "cuda-sm90-persistent" (the same kernel with one CTA per SM looping over
 * tiles; without softcap and ALiBi, chosen by FLASHATTN_SM90_PERSISTENT=1).
 * NULL when the arguments are invalid (fa_last_error() says why). Setting the
 * environment variable FLASHATTN_CUDA_FWD=sm80 forces the sm80 family. */
FA_API const char* fa_fwd_kernel_path(const fa_fwd_args* args);

/* The backward kernel family fa_bwd would run: "cpu", "cuda-sm80" or
 * "cuda-sm90" (compute capability 9.0, head dims in (64, 128], no softcap,
 * ALiBi or dropout). NULL when the arguments are invalid.
 * FLASHATTN_CUDA_BWD=sm80 forces the sm80 family; =sm90 also takes head dims
 * up to 64 to sm90. */
FA_API const char* fa_bwd_kernel_path(const fa_bwd_args* args);

/* Philox keep decision of the documented dropout mapping (for tests and
 * other implementations): 1 keep, 0 drop. */
FA_API int32_t fa_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t num_heads,
                               int64_t i, int64_t j, float p);


/* ------------------------------------------------------------------------
 * Attention against a KV cache (decode and chunked prefill), flash-attn's
 * flash_attn_with_kvcache.
 *
 * Shapes (B = batch of q)
 *   q          (B, Sq, H, D)
 *   k_cache    (B_cache, S_cache, Hkv, D)   v_cache (B_cache, S_cache, Hkv, Dv)      contiguous cache
 *              (num_blocks, page_size, Hkv, D) / (num_blocks, page_size, Hkv, Dv)    paged cache
 *   block_table  int32 (B, max_blocks): page of cache position p of row b is
 *              block_table[b][p / page_size], row p % page_size of that page; any page_size >= 1.
 *   k_new, v_new optional (B, S_new, Hkv, D|Dv), dtype of q: written into the
 *              cache in place at positions cache_seqlens[b] .. + S_new - 1 before attending.
 *   cache_seqlens int32 (B): filled length of each cache row (absolute position,
 *              leftpad included); NULL means the whole capacity is filled
 *              (required with k_new). Capacity = S_cache, or max_blocks * page_size.
 *   cache_batch_idx int32 (B): cache row of batch row b (contiguous cache only; NULL = b).
 *   cache_leftpad int32 (B): the cache of row b starts at this position (NULL = 0).
 *   rotary_cos, rotary_sin (S_ro, rotary_dim / 2), dtype of q, S_ro >= capacity,
 *              rotary_dim even and <= D; needs k_new. k_new row t is rotated at position
 *              cache_seqlens[b] + t; q row i at cache_seqlens[b] + i when causal or a
 *              window is set, else at cache_seqlens[b] (flash-attn's convention).
 *              Interleaved: pairs (2i, 2i+1); otherwise (NeoX) pairs (i, i + rotary_dim/2).
 *              x' = x0 cos - x1 sin, y' = x0 sin + x1 cos in fp32 (fp64 for fp32 tensors),
 *              rounded to the dtype; dims >= rotary_dim are copied.
 *   out        (B, Sq, H, Dv)     lse optional fp32 (B, H, Sq)
 * Row b attends to keys j = 0 .. N_b - 1, N_b = cache_seqlens[b] - leftpad[b] + S_new,
 * key j stored at cache position leftpad[b] + j. The mask of fa_options applies with
 * Sk = N_b (bottom-right: the last query sees the last key). No dropout.
 * CPU tensors: cache_seqlens, cache_batch_idx, cache_leftpad and block_table are
 * checked against the cache bounds. CUDA tensors are read by the kernels: rows and
 * pages outside the cache are skipped there, not reported.
 * num_splits: split-KV partitions per (row, kv head); 0 lets the backend choose.
 * On failure neither out, lse nor the cache is written.
 */
typedef struct fa_kvcache_args {
  fa_tensor q;
  fa_tensor k_cache, v_cache;
  fa_tensor k_new, v_new;      /* optional */
  fa_tensor cache_seqlens;     /* optional int32 (B) */
  fa_tensor cache_batch_idx;   /* optional int32 (B) */
  fa_tensor cache_leftpad;     /* optional int32 (B) */
  fa_tensor block_table;       /* optional int32 (B, max_blocks): paged cache */
  fa_tensor rotary_cos, rotary_sin; /* optional */
  int32_t rotary_interleaved;  /* nonzero: GPT-J pairs (2i, 2i+1); 0: NeoX halves */
  fa_tensor alibi_slopes;      /* optional fp32 (H) or (B, H) */
  fa_tensor out;
  fa_tensor lse;               /* optional output */
  int32_t num_splits;          /* 0: heuristic */
  fa_options opts;             /* dropout_p must be 0 */
} fa_kvcache_args;

/* Defaults: all optional tensors absent, rotary_interleaved = 1, num_splits = 0, fa_options_init. */
FA_API void fa_kvcache_args_init(fa_kvcache_args* args);
FA_API fa_status fa_fwd_kvcache_workspace_size(const fa_kvcache_args* args, size_t* bytes);
FA_API fa_status fa_fwd_kvcache(const fa_kvcache_args* args, void* workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
