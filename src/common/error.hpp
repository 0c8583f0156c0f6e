// Thread-local last-error message behind fa_last_error().
#pragma once

#include "flashattn/flashattn.h"

// Returns early with the status of a failed check.
#define FA_TRY(expr)                                  \
  do {                                                \
    const fa_status fa_try_status = (expr);           \
    if (fa_try_status != FA_OK) return fa_try_status; \
  } while (0)

namespace flashattn {

// Records the message for this thread and returns status, so call sites read
// `return fail(FA_ERROR_INVALID_ARGUMENT, "q: ...", ...);`.
fa_status fail(fa_status status, const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void clear_error();

}  // namespace flashattn
