/* SHA-256 as FIPS 180-4 section 6.2 gives it; whole blocks go to the CPU's SHA
 * instructions where it has them (sha256_blocks.c). */
#include "sha256.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int ec_sha256_accelerated(void);
void ec_sha256_blocks(uint32_t state[8], const unsigned char *data, size_t blocks);

const uint32_t ec_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const unsigned char block[64]) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++) {
    w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
           (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
  }
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + ec_sha256_k[t] + w[t];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

static pthread_once_t chosen = PTHREAD_ONCE_INIT;
static int accelerated = 0;

static void choose(void) {
  /* EDGECV_PORTABLE_SHA256=1 keeps the portable code (the tests compare the two) */
  const char *portable = getenv("EDGECV_PORTABLE_SHA256");
  accelerated = !(portable && portable[0] == '1') && ec_sha256_accelerated();
}

static void blocks(uint32_t state[8], const unsigned char *data, size_t count) {
  pthread_once(&chosen, choose);
  if (accelerated) {
    ec_sha256_blocks(state, data, count);
    return;
  }
  for (; count > 0; count--, data += 64) compress(state, data);
}

void sha256_init(sha256_context *context) {
  static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(context->state, initial, sizeof initial);
  context->length = 0;
  context->filled = 0;
}

void sha256_update(sha256_context *context, const void *data, size_t size) {
  const unsigned char *bytes = data;
  context->length += size;
  if (context->filled > 0) {
    size_t take = 64 - context->filled < size ? 64 - context->filled : size;
    memcpy(context->block + context->filled, bytes, take);
    context->filled += take;
    bytes += take;
    size -= take;
    if (context->filled < 64) return;
    blocks(context->state, context->block, 1);
    context->filled = 0;
  }
  blocks(context->state, bytes, size / 64);
  bytes += size / 64 * 64;
  size %= 64;
  memcpy(context->block, bytes, size);
  context->filled = size;
}

void sha256_hex(sha256_context *context, char hex[65]) {
  uint64_t bits = context->length * 8;
  unsigned char pad[72] = {0x80};
  size_t n = context->filled < 56 ? 56 - context->filled : 120 - context->filled;
  for (int i = 0; i < 8; i++) pad[n + i] = (unsigned char)(bits >> (56 - 8 * i));
  sha256_update(context, pad, n + 8);
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 4; j++) {
      unsigned char byte = (unsigned char)(context->state[i] >> (24 - 8 * j));
      hex[8 * i + 2 * j] = "0123456789abcdef"[byte >> 4];
      hex[8 * i + 2 * j + 1] = "0123456789abcdef"[byte & 15];
    }
  }
  hex[64] = '\0';
}

void sha256_of(const void *data, size_t size, char hex[65]) {
  sha256_context context;
  sha256_init(&context);
  sha256_update(&context, data, size);
  sha256_hex(&context, hex);
}
