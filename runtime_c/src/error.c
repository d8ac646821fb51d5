/* Errors as the caller sees them: a code and a message, allocated here. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct edgecv_error {
  edgecv_status code;
  char *message;
};

/* Where no memory is left for an error, this one is handed out (never freed). */
static struct edgecv_error out_of_memory = {EDGECV_E_MEMORY, "out of memory"};

edgecv_status ec_fail(edgecv_error **out, edgecv_status code, const char *format, ...) {
  if (out == NULL || *out != NULL) return code;
  va_list args;
  va_start(args, format);
  int length = vsnprintf(NULL, 0, format, args);
  va_end(args);
  struct edgecv_error *error = malloc(sizeof *error);
  char *message = length >= 0 ? malloc((size_t)length + 1) : NULL;
  if (error == NULL || message == NULL) {
    free(error);
    free(message);
    *out = &out_of_memory;
    return code;
  }
  va_start(args, format);
  vsnprintf(message, (size_t)length + 1, format, args);
  va_end(args);
  error->code = code;
  error->message = message;
  *out = error;
  return code;
}

const char *ec_shown(char *buffer, size_t size, const char *text, size_t length, size_t limit) {
  size_t at = 0;
  for (size_t i = 0; i < length && at + 8 < size; i++) {
    if (at >= limit) {
      memcpy(buffer + at, "...", 3);
      at += 3;
      break;
    }
    unsigned char c = (unsigned char)text[i];
    if (c < 0x20 || c == 0x7f) {
      at += (size_t)snprintf(buffer + at, size - at, "\\x%02x", c);
    } else {
      buffer[at++] = (char)c;
    }
  }
  buffer[at < size ? at : size - 1] = '\0';
  return buffer;
}

edgecv_status edgecv_error_code(const edgecv_error *error) {
  return error == NULL ? EDGECV_OK : error->code;
}

const char *edgecv_error_message(const edgecv_error *error) {
  return error == NULL ? "" : error->message;
}

void edgecv_error_free(edgecv_error *error) {
  if (error == NULL || error == &out_of_memory) return;
  free(error->message);
  free(error);
}
