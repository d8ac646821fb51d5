/* The host check (see host.h): the feature tables are those of host.py. */
#define _POSIX_C_SOURCE 200809L
#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#define THIS_ARCH "aarch64"
#elif defined(__x86_64__)
#define THIS_ARCH "x86_64"
#else
#define THIS_ARCH "unknown"
#endif

/* LLVM feature -> the flag /proc/cpuinfo shows for it on x86-64. */
static const char *const X86[][2] = {
    {"sse3", "pni"},           {"ssse3", "ssse3"},         {"sse4.1", "sse4_1"},
    {"sse4.2", "sse4_2"},      {"popcnt", "popcnt"},       {"movbe", "movbe"},
    {"lzcnt", "abm"},          {"bmi", "bmi1"},            {"bmi2", "bmi2"},
    {"avx", "avx"},            {"avx2", "avx2"},           {"fma", "fma"},
    {"f16c", "f16c"},          {"avxvnni", "avx_vnni"},    {"avx512f", "avx512f"},
    {"avx512cd", "avx512cd"},  {"avx512bw", "avx512bw"},   {"avx512dq", "avx512dq"},
    {"avx512vl", "avx512vl"},  {"avx512vnni", "avx512_vnni"}, {"avx512bf16", "avx512_bf16"},
    {"avx512fp16", "avx512_fp16"}, {"avx512ifma", "avx512ifma"}, {"avx512vbmi", "avx512vbmi"},
    {"avx512vbmi2", "avx512_vbmi2"}, {"avx512bitalg", "avx512_bitalg"},
    {"avx512vpopcntdq", "avx512_vpopcntdq"}, {"gfni", "gfni"}, {"vaes", "vaes"},
    {"vpclmulqdq", "vpclmulqdq"}, {"amx-tile", "amx_tile"}, {"amx-int8", "amx_int8"},
    {"amx-bf16", "amx_bf16"},
};

/* LLVM feature -> (AT_HWCAP 16 or AT_HWCAP2 26, bit) of the Linux arm64 ABI. */
static const struct {
  const char *name;
  int word, bit;
} AARCH64[] = {
    {"fp-armv8", 16, 0}, {"neon", 16, 1}, {"fullfp16", 16, 10}, {"rdm", 16, 12},
    {"dotprod", 16, 20}, {"sve", 16, 22}, {"sve2", 26, 1},      {"i8mm", 26, 13},
    {"bf16", 26, 14},
};

static int same_arch(const char *triple, char *arch, size_t size) {
  size_t n = strcspn(triple, "-");
  snprintf(arch, size, "%.*s", (int)n, triple);
  for (char *c = arch; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
  if (!strcmp(arch, "amd64")) snprintf(arch, size, "x86_64");
  if (!strcmp(arch, "arm64")) snprintf(arch, size, "aarch64");
  return strcmp(arch, THIS_ARCH) == 0;
}

/* -1: this machine cannot tell; 0: lacks it; 1: has it (an unchecked feature counts). */
static int has_feature(const char *feature, const char *flags) {
#if defined(__x86_64__)
  for (size_t i = 0; i < sizeof X86 / sizeof X86[0]; i++) {
    if (strcmp(X86[i][0], feature) != 0) continue;
    if (flags == NULL) return -1;
    size_t n = strlen(X86[i][1]);
    for (const char *at = flags; (at = strstr(at, X86[i][1])) != NULL; at += n) {
      if ((at == flags || at[-1] == ' ' || at[-1] == '\t' || at[-1] == ':') &&
          (at[n] == ' ' || at[n] == '\n' || at[n] == '\0')) {
        return 1;
      }
    }
    return 0;
  }
#elif defined(__aarch64__)
  (void)flags;
  for (size_t i = 0; i < sizeof AARCH64 / sizeof AARCH64[0]; i++) {
    if (strcmp(AARCH64[i].name, feature) != 0) continue;
    return (int)(getauxval((unsigned long)AARCH64[i].word) >> AARCH64[i].bit & 1);
  }
#else
  (void)feature;
  (void)flags;
#endif
  (void)X86;
  (void)AARCH64;
  return 1;
}

#if defined(__x86_64__)
/* The "flags" line of /proc/cpuinfo (malloc'd), NULL where unreadable. */
static char *cpu_flags(void) {
  FILE *file = fopen("/proc/cpuinfo", "r");
  if (file == NULL) return NULL;
  char *line = NULL, *found = NULL;
  size_t capacity = 0;
  while (getline(&line, &capacity, file) > 0) {
    if (strncmp(line, "flags", 5) == 0) {
      found = line;
      break;
    }
  }
  if (found == NULL) free(line);
  fclose(file);
  return found;
}
#endif

edgecv_status ec_check_host(const json_value *host, const char *package, edgecv_error **error) {
  if (host == NULL || host->kind != JSON_OBJECT || host->as.object.count == 0) return EDGECV_OK;
  const char *triple = json_get(host, "triple")->as.string.text;
  const json_value *cpu = json_get(host, "cpu");
  const char *cpu_name = cpu && cpu->kind == JSON_STRING && cpu->as.string.length ? cpu->as.string.text : "its CPU";
  char arch[64];
  if (!same_arch(triple, arch, sizeof arch)) {
    return ec_fail(error, EDGECV_E_HOST,
                   "%s holds CPU code for %s (%s, %s) and this machine is %s: run it on such a "
                   "board, or redeploy with --host native to run it here",
                   package, arch, triple, cpu_name, THIS_ARCH);
  }
  const json_value *features = json_get(host, "features");
  if (features == NULL || features->kind != JSON_ARRAY) return EDGECV_OK;
#if defined(__x86_64__)
  char *flags = cpu_flags();
  if (flags == NULL) return EDGECV_OK; /* cannot be told */
#else
  char *flags = NULL;
#endif
  char missing[1024] = "";
  size_t at = 0;
  for (size_t i = 0; i < features->as.array.count; i++) {
    const char *feature = features->as.array.items[i]->as.string.text;
    if (has_feature(feature, flags) == 0) {
      at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%s", at ? ", " : "", feature);
      if (at >= sizeof missing) at = sizeof missing - 1;
    }
  }
  free(flags);
  if (at == 0) return EDGECV_OK;
  return ec_fail(error, EDGECV_E_HOST,
                 "%s holds CPU code built for %s that uses %s, which this machine's CPU lacks (it "
                 "would stop with SIGILL): redeploy the model on this machine, or for a profile "
                 "whose host CPU it has",
                 package, cpu_name, missing);
}
