// flashattn._C: nanobind binding of the C API over DLPack tensors.
//
// Any producer of DLPack (torch CPU/CUDA, NumPy, CuPy, JAX) is accepted
// without a copy: shape, strides (in elements), dtype and device are read from
// the DLPack header and put into fa_tensor views. Nothing here links libtorch,
// so one build works with every torch version. Failures of the C API become
// Python exceptions by kind (TypeError, ValueError, NotImplementedError,
// MemoryError, RuntimeError) carrying the C message, which names the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "flashattn/flashattn.h"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::ro>;  // accepts read-only producers; outputs are allocated by the Python layer
using OptArray = std::optional<Array>;

// Raises the Python exception that matches the kind of failure.
[[noreturn]] void raise(fa_status status, const std::string& message) {
  PyObject* type = PyExc_RuntimeError;
  switch (status) {
    case FA_ERROR_INVALID_ARGUMENT:
      // A dtype mismatch is a type error; shapes, strides and values are value errors.
      type = message.find("expected dtype") != std::string::npos ? PyExc_TypeError : PyExc_ValueError;
      break;
    case FA_ERROR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    case FA_ERROR_OUT_OF_MEMORY: type = PyExc_MemoryError; break;
    case FA_ERROR_WORKSPACE_TOO_SMALL: type = PyExc_ValueError; break;
    default: break;
  }
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void check(fa_status status) {
  if (status != FA_OK) raise(status, fa_last_error());
}

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* kind = "?";
  switch (dt.code) {
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Int): kind = "int"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::UInt): kind = "uint"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Float): kind = "float"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat): kind = "bfloat"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Complex): kind = "complex"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bool): kind = "bool"; break;
    default: break;
  }
  return std::string(kind) + std::to_string(dt.bits);
}

bool to_fa_dtype(nb::dlpack::dtype dt, fa_dtype* out) {
  if (dt.lanes != 1) return false;
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) *out = FA_DTYPE_FP32;
  else if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) *out = FA_DTYPE_FP16;
  else if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) *out = FA_DTYPE_BF16;
  else if (code == nb::dlpack::dtype_code::Int && dt.bits == 32) *out = FA_DTYPE_INT32;
  else return false;
  return true;
}

// A view of a DLPack tensor; an absent optional gives the "absent" view (data NULL).
fa_tensor view(const char* name, const OptArray& array) {
  fa_tensor t;
  std::memset(&t, 0, sizeof(t));
  if (!array) return t;
  const Array& a = *array;
  if (a.ndim() > FA_MAX_RANK)
    raise(FA_ERROR_INVALID_ARGUMENT,
          std::string(name) + ": expected at most " + std::to_string(FA_MAX_RANK) + " dimensions, got " +
              std::to_string(a.ndim()));
  if (!to_fa_dtype(a.dtype(), &t.dtype))
    raise(FA_ERROR_INVALID_ARGUMENT, std::string(name) + ": expected dtype fp32, fp16, bf16 (or int32 for cu_seqlens), got " +
                                         dlpack_dtype_name(a.dtype()));
  const int device = a.device_type();
  if (device == nb::device::cpu::value) t.device = FA_DEVICE_CPU;
  else if (device == nb::device::cuda::value || device == nb::device::cuda_managed::value) t.device = FA_DEVICE_CUDA;
  else
    raise(FA_ERROR_INVALID_ARGUMENT,
          std::string(name) + ": expected a cpu or cuda tensor, got DLPack device type " + std::to_string(device));
  t.device_index = a.device_id();
  t.data = const_cast<void*>(a.data());
  // An empty tensor may export a null pointer; the C API reads no element of it.
  if (t.data == nullptr) t.data = reinterpret_cast<void*>(uintptr_t{64});
  t.rank = static_cast<int32_t>(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    t.shape[d] = static_cast<int64_t>(a.shape(d));
    t.strides[d] = a.stride(d);
  }
  return t;
}

// {seed, offset} of a dropout call as an int64 tensor of two elements on q's device: the
// library reads it when the call runs (so a captured CUDA graph replays with new seeds).
const uint64_t* rng_state_pointer(const OptArray& rng_state, const Array& q) {
  if (!rng_state) return nullptr;
  const Array& a = *rng_state;
  const nb::dlpack::dtype dt = a.dtype();
  const bool int64 = dt.lanes == 1 && dt.bits == 64 &&
                     (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int) ||
                      dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt));
  if (!int64)
    raise(FA_ERROR_INVALID_ARGUMENT, "rng_state: expected dtype int64, got " + dlpack_dtype_name(dt));
  if (a.ndim() != 1 || a.shape(0) != 2 || a.stride(0) != 1)
    raise(FA_ERROR_INVALID_ARGUMENT, "rng_state: expected 2 contiguous elements {seed, offset}, got " +
                                         std::to_string(a.size()) + " in " + std::to_string(a.ndim()) + " dimensions");
  if (a.device_type() != q.device_type() || a.device_id() != q.device_id())
    raise(FA_ERROR_INVALID_ARGUMENT, "rng_state: expected the device of q (DLPack " + std::to_string(q.device_type()) +
                                         ":" + std::to_string(q.device_id()) + "), got " +
                                         std::to_string(a.device_type()) + ":" + std::to_string(a.device_id()));
  return static_cast<const uint64_t*>(a.data());
}

fa_options make_options(float softmax_scale, bool causal, bool top_left, int window_left, int window_right,
                        float softcap, float dropout_p, uint64_t seed, uint64_t offset,
                        const uint64_t* rng_state, bool deterministic, int num_threads, uintptr_t stream) {
  fa_options o;
  fa_options_init(&o);
  o.softmax_scale = softmax_scale;
  o.causal = causal ? 1 : 0;
  o.alignment = top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.dropout_p = dropout_p;
  o.dropout_seed = seed;
  o.dropout_offset = offset;
  o.dropout_rng_state = rng_state;
  o.deterministic = deterministic ? 1 : 0;
  o.num_threads = num_threads;
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

// Runs the call into workspace (a uint8 tensor), or into one that allocate(nbytes)
// returns (so a call needs no separate size query: one crossing, half the DLPack
// exports), or, when query is true, returns the exact workspace size and runs nothing.
size_t run_workspace(const OptArray& workspace, const nb::object& allocate, size_t needed, bool query,
                     fa_status (*call)(const void*, void*, size_t), const void* args) {
  if (query) return needed;
  void* ptr = nullptr;
  size_t bytes = 0;
  nb::object allocated;  // keeps allocate's tensor alive through the call
  std::optional<Array> owned;
  if (workspace) {
    ptr = const_cast<void*>(workspace->data());
    bytes = workspace->nbytes();
  } else if (!allocate.is_none()) {
    allocated = allocate(needed);  // None: no workspace (needed == 0)
    if (!allocated.is_none()) {
      owned = nb::cast<Array>(allocated);
      ptr = const_cast<void*>(owned->data());
      bytes = owned->nbytes();
    }
  }
  fa_status status;
  {
    nb::gil_scoped_release release;  // the kernels run without the GIL
    status = call(args, ptr, bytes);
  }
  check(status);
  return needed;
}

size_t fwd(Array q, Array k, Array v, Array out, OptArray lse, OptArray cu_seqlens_q, OptArray cu_seqlens_k,
           int max_seqlen_q, int max_seqlen_k, OptArray alibi_slopes, float softmax_scale, bool causal, bool top_left,
           int window_left, int window_right, float softcap, float dropout_p, uint64_t seed, uint64_t offset,
           bool deterministic, int num_threads, uintptr_t stream, OptArray workspace, nb::object allocate, bool query,
           OptArray rng_state) {
  fa_fwd_args args;
  fa_fwd_args_init(&args);
  args.q = view("q", q);
  args.k = view("k", k);
  args.v = view("v", v);
  args.out = view("out", out);
  args.lse = view("lse", lse);
  args.cu_seqlens_q = view("cu_seqlens_q", cu_seqlens_q);
  args.cu_seqlens_k = view("cu_seqlens_k", cu_seqlens_k);
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  args.alibi_slopes = view("alibi_slopes", alibi_slopes);
  args.opts = make_options(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
                           rng_state_pointer(rng_state, q), deterministic, num_threads, stream);
  size_t needed = 0;
  check(fa_fwd_workspace_size(&args, &needed));
  return run_workspace(
      workspace, allocate, needed, query,
      [](const void* a, void* w, size_t n) { return fa_fwd(static_cast<const fa_fwd_args*>(a), w, n); }, &args);
}

size_t bwd(Array dout, Array q, Array k, Array v, Array out, Array lse, Array dq, Array dk, Array dv,
           OptArray cu_seqlens_q, OptArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, OptArray alibi_slopes,
           float softmax_scale, bool causal, bool top_left, int window_left, int window_right, float softcap,
           float dropout_p, uint64_t seed, uint64_t offset, bool deterministic, int num_threads, uintptr_t stream,
           OptArray workspace, nb::object allocate, bool query, OptArray rng_state) {
  fa_bwd_args args;
  fa_bwd_args_init(&args);
  args.dout = view("dout", dout);
  args.q = view("q", q);
  args.k = view("k", k);
  args.v = view("v", v);
  args.out = view("out", out);
  args.lse = view("lse", lse);
  args.dq = view("dq", dq);
  args.dk = view("dk", dk);
  args.dv = view("dv", dv);
  args.cu_seqlens_q = view("cu_seqlens_q", cu_seqlens_q);
  args.cu_seqlens_k = view("cu_seqlens_k", cu_seqlens_k);
  args.max_seqlen_q = max_seqlen_q;
  args.max_seqlen_k = max_seqlen_k;
  args.alibi_slopes = view("alibi_slopes", alibi_slopes);
  args.opts = make_options(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
                           rng_state_pointer(rng_state, q), deterministic, num_threads, stream);
  size_t needed = 0;
  check(fa_bwd_workspace_size(&args, &needed));
  return run_workspace(
      workspace, allocate, needed, query,
      [](const void* a, void* w, size_t n) { return fa_bwd(static_cast<const fa_bwd_args*>(a), w, n); }, &args);
}

// Attention against a KV cache; k_cache and v_cache are written in place when k_new is given.
size_t fwd_kvcache(Array q, Array k_cache, Array v_cache, OptArray k_new, OptArray v_new, OptArray cache_seqlens,
                   OptArray cache_batch_idx, OptArray cache_leftpad, OptArray block_table, OptArray rotary_cos,
                   OptArray rotary_sin, bool rotary_interleaved, OptArray alibi_slopes, Array out, OptArray lse,
                   float softmax_scale, bool causal, int window_left, int window_right, float softcap,
                   int num_splits, int num_threads, uintptr_t stream, OptArray workspace, nb::object allocate, bool query) {
  fa_kvcache_args args;
  fa_kvcache_args_init(&args);
  args.q = view("q", q);
  args.k_cache = view("k_cache", k_cache);
  args.v_cache = view("v_cache", v_cache);
  args.k_new = view("k", k_new);
  args.v_new = view("v", v_new);
  args.cache_seqlens = view("cache_seqlens", cache_seqlens);
  args.cache_batch_idx = view("cache_batch_idx", cache_batch_idx);
  args.cache_leftpad = view("cache_leftpad", cache_leftpad);
  args.block_table = view("block_table", block_table);
  args.rotary_cos = view("rotary_cos", rotary_cos);
  args.rotary_sin = view("rotary_sin", rotary_sin);
  args.rotary_interleaved = rotary_interleaved ? 1 : 0;
  args.alibi_slopes = view("alibi_slopes", alibi_slopes);
  args.out = view("out", out);
  args.lse = view("lse", lse);
  args.num_splits = num_splits;
  args.opts = make_options(softmax_scale, causal, false, window_left, window_right, softcap, 0.0f, 0, 0, nullptr, false,
                           num_threads, stream);
  size_t needed = 0;
  check(fa_fwd_kvcache_workspace_size(&args, &needed));
  return run_workspace(
      workspace, allocate, needed, query,
      [](const void* a, void* w, size_t n) { return fa_fwd_kvcache(static_cast<const fa_kvcache_args*>(a), w, n); },
      &args);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn C API over DLPack tensors (no libtorch)";
  m.def("fwd", &fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("alibi_slopes").none(), nb::arg("softmax_scale"), nb::arg("causal"),
        nb::arg("top_left"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
        nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"), nb::arg("deterministic"), nb::arg("num_threads"),
        nb::arg("stream"), nb::arg("workspace").none(), nb::arg("allocate").none() = nb::none(), nb::arg("query") = false,
        nb::arg("rng_state").none() = nb::none(),
        "Forward pass (query=True: only return the exact workspace bytes).");
  m.def("bwd", &bwd, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("alibi_slopes").none(), nb::arg("softmax_scale"),
        nb::arg("causal"), nb::arg("top_left"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
        nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"), nb::arg("deterministic"), nb::arg("num_threads"),
        nb::arg("stream"), nb::arg("workspace").none(), nb::arg("allocate").none() = nb::none(), nb::arg("query") = false,
        nb::arg("rng_state").none() = nb::none(),
        "Backward pass (query=True: only return the exact workspace bytes).");
  m.def("fwd_kvcache", &fwd_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("cache_seqlens").none(), nb::arg("cache_batch_idx").none(),
        nb::arg("cache_leftpad").none(), nb::arg("block_table").none(), nb::arg("rotary_cos").none(),
        nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved"), nb::arg("alibi_slopes").none(), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("num_splits"), nb::arg("num_threads"),
        nb::arg("stream"), nb::arg("workspace").none(), nb::arg("allocate").none() = nb::none(), nb::arg("query") = false,
        "Attention against a KV cache, appending k/v in place first (query=True: only the workspace bytes).");
  m.def("dropout_keep", &fa_dropout_keep, nb::arg("seed"), nb::arg("offset"), nb::arg("b"), nb::arg("h"),
        nb::arg("num_heads"), nb::arg("i"), nb::arg("j"), nb::arg("p"),
        "Philox keep decision of the documented dropout mapping: 1 keep, 0 drop.");
  m.def("has_cuda", []() { return fa_has_cuda() != 0; });
  m.def("version", []() { return std::string(fa_version()); });
  m.def("set_default_num_threads", &fa_set_default_num_threads, nb::arg("n"));
}
