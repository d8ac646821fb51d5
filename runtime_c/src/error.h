/* Errors: a status code and one line of text, handed to the caller (edgecv.h). */
#ifndef EDGECV_ERROR_H
#define EDGECV_ERROR_H

#include "edgecv.h"

#if defined(__GNUC__)
#define EC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define EC_PRINTF(a, b)
#endif

/* Store a new error with `code` and the formatted message in *out (when out is not
 * NULL and holds no error yet: the first failure is the one reported); returns code. */
edgecv_status ec_fail(edgecv_error **out, edgecv_status code, const char *format, ...)
    EC_PRINTF(3, 4);

/* A value for a message: `text` of `length` bytes on one line, control characters
 * escaped, cut at `limit` bytes with "..." (into `buffer` of `size` bytes). */
const char *ec_shown(char *buffer, size_t size, const char *text, size_t length, size_t limit);

#endif
