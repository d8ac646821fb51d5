/* SHA-256 (FIPS 180-4), our own: the package's checksums and its pin; whole blocks on
 * the CPU's SHA instructions where it has them (sha256_blocks.c). */
#ifndef EDGECV_SHA256_H
#define EDGECV_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t state[8];
  uint64_t length; /* bytes hashed so far */
  unsigned char block[64];
  size_t filled;
} sha256_context;

void sha256_init(sha256_context *context);
void sha256_update(sha256_context *context, const void *data, size_t size);
/* The digest as 64 lower-case hex digits and a NUL, into `hex`. */
void sha256_hex(sha256_context *context, char hex[65]);
void sha256_of(const void *data, size_t size, char hex[65]);

#endif
