/* Can this machine execute the package's CPU code? Its instruction set and the CPU
 * features LLVM was allowed to use (the manifest's build.host), checked as the Python
 * loader does (edgecv/board/runtime/host.py): another ISA fails in the dynamic loader
 * with an opaque message, a missing feature dies with SIGILL mid-inference. */
#ifndef EDGECV_HOST_H
#define EDGECV_HOST_H

#include "error.h"
#include "json.h"

/* `host` is build.host (NULL or empty: a package from before it was recorded). */
edgecv_status ec_check_host(const json_value *host, const char *package, edgecv_error **error);

#endif
