// C API entry points: validate, size the workspace, dispatch to a backend.
// No exception crosses this file's functions.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "backend.hpp"
#include "common/error.hpp"
#include "validate.hpp"

namespace flashattn {
namespace {

struct Allocator {
  fa_alloc_fn alloc = nullptr;
  fa_free_fn free_fn = nullptr;
  void* user = nullptr;
};

Allocator g_allocator;
int32_t g_default_threads = 0;

constexpr size_t kHostAlignment = 64;

void* allocate(size_t bytes, fa_device_type device, int32_t device_index) {
  if (g_allocator.alloc != nullptr) return g_allocator.alloc(bytes, device, device_index, g_allocator.user);
  if (device == FA_DEVICE_CPU) {
    const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    return std::aligned_alloc(kHostAlignment, rounded);
  }
#if defined(FLASHATTN_WITH_CUDA)
  return cuda::device_alloc(bytes, device_index);
#else
  return nullptr;
#endif
}

void release(void* ptr, fa_device_type device, int32_t device_index) {
  if (ptr == nullptr) return;
  if (g_allocator.free_fn != nullptr) {
    g_allocator.free_fn(ptr, device, device_index, g_allocator.user);
    return;
  }
  if (device == FA_DEVICE_CPU) {
    std::free(ptr);
    return;
  }
#if defined(FLASHATTN_WITH_CUDA)
  cuda::device_free(ptr, device_index);
#endif
}

int32_t resolve_threads(int32_t requested) {
  if (requested > 0) return requested;
  if (g_default_threads > 0) return g_default_threads;
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int32_t>(hardware) : 1;
}

fa_status check_backend(fa_device_type device, const AttnParams& params) {
  if (device == FA_DEVICE_CPU) return FA_OK;
#if defined(FLASHATTN_WITH_CUDA)
  return cuda::check_supported(params);
#else
  (void)params;
  return fail(FA_ERROR_UNSUPPORTED,
              "q: expected a CPU tensor (this flashattn was built without CUDA), got a CUDA tensor; rebuild with "
              "-DFLASHATTN_CUDA=ON");
#endif
}

fa_status check_backend(fa_device_type device, const KvCacheParams& params) {
  if (device == FA_DEVICE_CPU) return FA_OK;
#if defined(FLASHATTN_WITH_CUDA)
  return cuda::check_kvcache_supported(params);
#else
  (void)params;
  return fail(FA_ERROR_UNSUPPORTED,
              "q: expected a CPU tensor (this flashattn was built without CUDA), got a CUDA tensor; rebuild with "
              "-DFLASHATTN_CUDA=ON");
#endif
}

template <typename Params>
size_t workspace_bytes(fa_device_type device, const Params& params);

template <>
size_t workspace_bytes(fa_device_type device, const KvCacheParams& params) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::fwd_kvcache_workspace_bytes(params);
#endif
  (void)device;
  return cpu::fwd_kvcache_workspace_bytes(params);
}

fa_status run_backend(fa_device_type device, const KvCacheParams& params, void* workspace) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::fwd_kvcache(params, workspace);
#endif
  (void)device;
  return cpu::fwd_kvcache(params, workspace);
}

template <>
size_t workspace_bytes(fa_device_type device, const FwdParams& params) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::fwd_workspace_bytes(params);
#endif
  (void)device;
  return cpu::fwd_workspace_bytes(params);
}

template <>
size_t workspace_bytes(fa_device_type device, const BwdParams& params) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::bwd_workspace_bytes(params);
#endif
  (void)device;
  return cpu::bwd_workspace_bytes(params);
}

fa_status run_backend(fa_device_type device, const FwdParams& params, void* workspace) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::fwd(params, workspace);
#endif
  (void)device;
  return cpu::fwd(params, workspace);
}

fa_status run_backend(fa_device_type device, const BwdParams& params, void* workspace) {
#if defined(FLASHATTN_WITH_CUDA)
  if (device == FA_DEVICE_CUDA) return cuda::bwd(params, workspace);
#endif
  (void)device;
  return cpu::bwd(params, workspace);
}

template <typename Args, typename Params>
fa_status prepare(const Args* args, Params& params, fa_status (*validate)(const Args*, Params&)) {
  FA_TRY(validate(args, params));
  params.num_threads = resolve_threads(args->opts.num_threads);
  return check_backend(args->q.device, params);
}

template <typename Args, typename Params>
fa_status query(const Args* args, size_t* bytes, fa_status (*validate)(const Args*, Params&)) {
  if (bytes == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "bytes: expected a non-null pointer, got NULL");
  Params params;
  FA_TRY(prepare(args, params, validate));
  *bytes = workspace_bytes(args->q.device, params);
  return FA_OK;
}

template <typename Args, typename Params>
fa_status run(const Args* args, void* workspace, size_t workspace_bytes_given,
              fa_status (*validate)(const Args*, Params&)) {
  Params params;
  FA_TRY(prepare(args, params, validate));
  const fa_device_type device = args->q.device;
  const size_t needed = workspace_bytes(device, params);
  void* owned = nullptr;
  if (workspace != nullptr) {
    if (workspace_bytes_given < needed)
      return fail(FA_ERROR_WORKSPACE_TOO_SMALL, "workspace_bytes: expected at least %zu bytes, got %zu", needed,
                  workspace_bytes_given);
  } else if (needed > 0) {
    owned = allocate(needed, device, args->q.device_index);
    if (owned == nullptr)
      return fail(FA_ERROR_OUT_OF_MEMORY, "workspace: expected an allocation of %zu bytes, the allocator returned NULL",
                  needed);
    workspace = owned;
  }
  const fa_status status = run_backend(device, params, workspace);
  release(owned, device, args->q.device_index);
  return status;
}

template <typename Fn>
fa_status guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail(FA_ERROR_OUT_OF_MEMORY, "host memory: expected an allocation to succeed, got std::bad_alloc");
  } catch (const std::exception& error) {
    return fail(FA_ERROR_INTERNAL, "internal error: %s", error.what());
  } catch (...) {
    return fail(FA_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace
}  // namespace flashattn

using namespace flashattn;

extern "C" {

void fa_options_init(fa_options* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->alignment = FA_ALIGN_BOTTOM_RIGHT;
  opts->window_left = -1;
  opts->window_right = -1;
}

void fa_fwd_args_init(fa_fwd_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  fa_options_init(&args->opts);
}

void fa_bwd_args_init(fa_bwd_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  fa_options_init(&args->opts);
}

void fa_kvcache_args_init(fa_kvcache_args* args) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  args->rotary_interleaved = 1;
  fa_options_init(&args->opts);
}

fa_tensor fa_tensor_contiguous(void* data, fa_dtype dtype, fa_device_type device, int32_t rank, const int64_t* shape) {
  fa_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = rank;
  if (rank < 0 || rank > FA_MAX_RANK || shape == nullptr) return t;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d] > 0 ? shape[d] : 1;
  }
  return t;
}

fa_status fa_fwd_workspace_size(const fa_fwd_args* args, size_t* bytes) {
  return guarded([&] { return query<fa_fwd_args, FwdParams>(args, bytes, validate_fwd); });
}

fa_status fa_bwd_workspace_size(const fa_bwd_args* args, size_t* bytes) {
  return guarded([&] { return query<fa_bwd_args, BwdParams>(args, bytes, validate_bwd); });
}

fa_status fa_fwd(const fa_fwd_args* args, void* workspace, size_t workspace_bytes) {
  return guarded([&] { return run<fa_fwd_args, FwdParams>(args, workspace, workspace_bytes, validate_fwd); });
}

fa_status fa_bwd(const fa_bwd_args* args, void* workspace, size_t workspace_bytes) {
  return guarded([&] { return run<fa_bwd_args, BwdParams>(args, workspace, workspace_bytes, validate_bwd); });
}

fa_status fa_fwd_kvcache_workspace_size(const fa_kvcache_args* args, size_t* bytes) {
  return guarded([&] { return query<fa_kvcache_args, KvCacheParams>(args, bytes, validate_kvcache); });
}

fa_status fa_fwd_kvcache(const fa_kvcache_args* args, void* workspace, size_t workspace_bytes) {
  return guarded(
      [&] { return run<fa_kvcache_args, KvCacheParams>(args, workspace, workspace_bytes, validate_kvcache); });
}

void fa_set_allocator(fa_alloc_fn alloc, fa_free_fn free_fn, void* user) {
  g_allocator = (alloc != nullptr && free_fn != nullptr) ? Allocator{alloc, free_fn, user} : Allocator{};
}

void fa_set_default_num_threads(int32_t n) { g_default_threads = n > 0 ? n : 0; }

const char* fa_status_string(fa_status status) {
  switch (status) {
    case FA_OK: return "ok";
    case FA_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERROR_UNSUPPORTED: return "unsupported";
    case FA_ERROR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERROR_BACKEND: return "backend error";
    case FA_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

int32_t fa_has_cuda(void) {
#if defined(FLASHATTN_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

const char* fa_version(void) { return "0.1.0"; }

const char* fa_fwd_kernel_path(const fa_fwd_args* args) {
  const char* path = nullptr;
  const fa_status status = guarded([&] {
    FwdParams params;
    FA_TRY(prepare(args, params, validate_fwd));
#if defined(FLASHATTN_WITH_CUDA)
    if (args->q.device == FA_DEVICE_CUDA) {
      path = cuda::fwd_kernel_path(params);
      return FA_OK;
    }
#endif
    path = "cpu";
    return FA_OK;
  });
  return status == FA_OK ? path : nullptr;
}

const char* fa_bwd_kernel_path(const fa_bwd_args* args) {
  const char* path = nullptr;
  const fa_status status = guarded([&] {
    BwdParams params;
    FA_TRY(prepare(args, params, validate_bwd));
#if defined(FLASHATTN_WITH_CUDA)
    if (args->q.device == FA_DEVICE_CUDA) {
      path = cuda::bwd_kernel_path(params);
      return FA_OK;
    }
#endif
    path = "cpu";
    return FA_OK;
  });
  return status == FA_OK ? path : nullptr;
}

int32_t fa_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t num_heads, int64_t i, int64_t j,
                        float p) {
  if (!(p > 0.0f)) return 1;
  const DropoutConfig config = make_dropout_config(p, seed, offset);
  return dropout_keep(config, static_cast<uint32_t>(b * num_heads + h), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(j))
             ? 1
             : 0;
}

}  // extern "C"
