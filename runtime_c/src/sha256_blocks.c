/* SHA-256 blocks on the CPU's own SHA instructions (x86's SHA extensions, ARMv8's SHA2),
 * where it has them: 5-10 times the portable code (sha256.c), which decides at run time
 * which one runs. The message schedule and rounds are FIPS 180-4's, four rounds a step. */
#include <stddef.h>
#include <stdint.h>

#include "sha256.h"

extern const uint32_t ec_sha256_k[64];

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

int ec_sha256_accelerated(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 29 & 1); /* CPUID.7.0:EBX.SHA */
}

__attribute__((target("sha,sse4.1,ssse3"))) void ec_sha256_blocks(uint32_t state[8],
                                                                   const unsigned char *data,
                                                                   size_t blocks) {
  const __m128i swap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
  /* the instructions hold the state as (F, E, B, A) and (H, G, D, C), lane 0 first */
  __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)state), 0xB1);
  __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(state + 4)), 0x1B);
  __m128i abef = _mm_alignr_epi8(dcba, hgfe, 8);
  __m128i cdgh = _mm_blend_epi16(hgfe, dcba, 0xF0);
  for (; blocks > 0; blocks--, data += 64) {
    __m128i saved_abef = abef, saved_cdgh = cdgh, m[4];
    for (int g = 0; g < 16; g++) {
      __m128i *w = &m[g % 4];
      if (g < 4) {
        *w = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * g)), swap);
      } else { /* W[t] from W[t-16], W[t-15], W[t-7] and W[t-2] */
        __m128i next = m[(g + 1) % 4], older = m[(g + 2) % 4], newest = m[(g + 3) % 4];
        __m128i sum = _mm_add_epi32(_mm_sha256msg1_epu32(*w, next), _mm_alignr_epi8(newest, older, 4));
        *w = _mm_sha256msg2_epu32(sum, newest);
      }
      __m128i wk = _mm_add_epi32(*w, _mm_loadu_si128((const __m128i *)(ec_sha256_k + 4 * g)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      /* here cdgh holds the new (A, B, E, F) and abef, two rounds old, the new (C, D, G, H) */
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
    }
    abef = _mm_add_epi32(abef, saved_abef);
    cdgh = _mm_add_epi32(cdgh, saved_cdgh);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)state, _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)(state + 4), _mm_alignr_epi8(dchg, feba, 8));
}

#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

int ec_sha256_accelerated(void) { return (int)(getauxval(16 /* AT_HWCAP */) >> 6 & 1); /* SHA2 */ }

__attribute__((target("+sha2"))) void ec_sha256_blocks(uint32_t state[8], const unsigned char *data,
                                                       size_t blocks) {
  uint32x4_t abcd = vld1q_u32(state), efgh = vld1q_u32(state + 4);
  for (; blocks > 0; blocks--, data += 64) {
    uint32x4_t saved_abcd = abcd, saved_efgh = efgh, m[4];
    for (int g = 0; g < 16; g++) {
      uint32x4_t *w = &m[g % 4];
      if (g < 4) {
        *w = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(data + 16 * g)));
      } else {
        *w = vsha256su1q_u32(vsha256su0q_u32(*w, m[(g + 1) % 4]), m[(g + 2) % 4], m[(g + 3) % 4]);
      }
      uint32x4_t wk = vaddq_u32(*w, vld1q_u32(ec_sha256_k + 4 * g)), before = abcd;
      abcd = vsha256hq_u32(abcd, efgh, wk);
      efgh = vsha256h2q_u32(efgh, before, wk);
    }
    abcd = vaddq_u32(abcd, saved_abcd);
    efgh = vaddq_u32(efgh, saved_efgh);
  }
  vst1q_u32(state, abcd);
  vst1q_u32(state + 4, efgh);
}

#else
int ec_sha256_accelerated(void) { return 0; }
void ec_sha256_blocks(uint32_t state[8], const unsigned char *data, size_t blocks) {
  (void)state;
  (void)data;
  (void)blocks;
}
#endif
