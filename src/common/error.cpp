#include "common/error.hpp"

#include <cstdarg>
#include <cstdio>

namespace flashattn {
namespace {
thread_local char g_last_error[1024] = "";
}

fa_status fail(fa_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(g_last_error, sizeof(g_last_error), format, args);
  va_end(args);
  return status;
}

void clear_error() { g_last_error[0] = '\0'; }

}  // namespace flashattn

extern "C" const char* fa_last_error(void) { return flashattn::g_last_error; }
