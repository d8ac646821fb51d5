/* run_package: load an edgecv package with libedgecv_runtime, run it on an input file,
 * print its outputs (top-5 classes, or detections).
 *
 *   run_package PACKAGE [INPUT.npy|INPUT.raw ...] [--save OUT.bin] [--repeat N]
 *
 * INPUT is a .npy array (C order, of the input's dtype and size) or the input's raw
 * bytes, one per model input; without, every input is zeros. --save writes every
 * output's bytes, one after the other; --repeat times N runs (median per call). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edgecv.h"

static int fail(edgecv_error *error) {
  fprintf(stderr, "run_package: error: %s\n", edgecv_error_message(error));
  int code = (int)edgecv_error_code(error);
  edgecv_error_free(error);
  return code;
}

/* The bytes of `path` for an input of `nbytes`: a .npy's data, or the raw file. */
static void *read_input(const char *path, size_t nbytes) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    perror(path);
    return NULL;
  }
  unsigned char header[12] = {0};
  size_t skip = 0, got = fread(header, 1, sizeof header, file);
  if (got >= 10 && memcmp(header, "\x93NUMPY", 6) == 0) {
    skip = header[6] == 1 ? 10u + (header[8] | header[9] << 8)
                          : 12u + (header[8] | header[9] << 8 | (size_t)header[10] << 16);
  }
  fseek(file, 0, SEEK_END);
  long size = ftell(file);
  void *data = malloc(nbytes ? nbytes : 1);
  if (size < 0 || (size_t)size != skip + nbytes || data == NULL) {
    fprintf(stderr, "run_package: %s holds %ld bytes, the input takes %zu (after a .npy header of "
            "%zu): give an array of the input's shape and dtype\n", path, size, nbytes, skip);
    free(data);
    fclose(file);
    return NULL;
  }
  fseek(file, (long)skip, SEEK_SET);
  int ok = fread(data, 1, nbytes, file) == nbytes;
  fclose(file);
  if (!ok) {
    free(data);
    return NULL;
  }
  return data;
}

static void print_info(const char *what, const edgecv_tensor_info *info) {
  printf("%s %s: %s (", what, info->name, info->dtype);
  for (int32_t d = 0; d < info->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)info->shape[d]);
  printf(")\n");
}

static void print_top5(const edgecv_model *model, const float *scores, size_t count) {
  int taken[5] = {-1, -1, -1, -1, -1};
  for (int k = 0; k < 5 && (size_t)k < count; k++) {
    int best = -1;
    for (size_t i = 0; i < count; i++) {
      int used = 0;
      for (int j = 0; j < k; j++) used |= taken[j] == (int)i;
      if (!used && (best < 0 || scores[i] > scores[best])) best = (int)i;
    }
    taken[k] = best;
    const char *label = edgecv_class_name(model, (size_t)best);
    printf("top%d: class %d%s%s%s score %.6g\n", k + 1, best, label ? " (" : "", label ? label : "",
           label ? ")" : "", scores[best]);
  }
}

/* GluonCV's detections: rows of (class id, score, x1, y1, x2, y2); -1 ids are padding. */
static void print_detections(const edgecv_model *model, const float *rows, size_t count) {
  size_t shown = 0;
  for (size_t i = 0; i < count; i++) {
    const float *r = rows + 6 * i;
    if (r[0] < 0 || r[1] < 0.5f) continue;
    const char *label = edgecv_class_name(model, (size_t)r[0]);
    printf("detection: class %d%s%s%s score %.4f box %.2f %.2f %.2f %.2f\n", (int)r[0],
           label ? " (" : "", label ? label : "", label ? ")" : "", r[1], r[2], r[3], r[4], r[5]);
    shown++;
  }
  printf("%zu detection(s) with score >= 0.5\n", shown);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *package = NULL, *save = NULL, *files[16];
  int file_count = 0, repeat = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (package == NULL) package = argv[i];
    else if (file_count < 16) files[file_count++] = argv[i];
  }
  if (package == NULL) {
    fprintf(stderr, "usage: run_package PACKAGE [INPUT.npy|INPUT.raw ...] [--save OUT.bin] [--repeat N]\n");
    return 2;
  }
  edgecv_model *model = NULL;
  edgecv_error *error = NULL;
  double start = now();
  if (edgecv_load(package, "cpu", &model, &error) != EDGECV_OK) return fail(error);
  printf("loaded %s (%s) in %.1f ms, sha256 %s\n", edgecv_model_name(model),
         edgecv_model_task(model), 1e3 * (now() - start), edgecv_model_sha256(model));
  size_t inputs = edgecv_num_inputs(model), outputs = edgecv_num_outputs(model);
  if (file_count != 0 && (size_t)file_count != inputs) {
    fprintf(stderr, "run_package: the model takes %zu input(s), %d file(s) given\n", inputs, file_count);
    edgecv_free(model);
    return 2;
  }
  void *in[16] = {0}, *out[16] = {0};
  size_t in_bytes[16], out_bytes[16];
  int status = 0;
  for (size_t i = 0; i < inputs && i < 16; i++) {
    const edgecv_tensor_info *info = edgecv_input_info(model, i);
    print_info("input", info);
    in_bytes[i] = info->nbytes;
    in[i] = file_count ? read_input(files[i], info->nbytes) : calloc(1, info->nbytes ? info->nbytes : 1);
    if (in[i] == NULL) status = 2;
  }
  for (size_t i = 0; i < outputs && i < 16; i++) {
    const edgecv_tensor_info *info = edgecv_output_info(model, i);
    out_bytes[i] = info->nbytes;
    out[i] = malloc(info->nbytes ? info->nbytes : 1);
    if (out[i] == NULL) status = 2;
  }
  start = now();
  if (status == 0 && edgecv_run(model, (const void *const *)in, in_bytes, out, out_bytes, &error) != EDGECV_OK) {
    status = fail(error);
  }
  if (status == 0) printf("first run in %.1f ms\n", 1e3 * (now() - start));
  for (size_t i = 0; status == 0 && i < outputs; i++) {
    const edgecv_tensor_info *info = edgecv_output_info(model, i);
    print_info("output", info);
    size_t n = info->nbytes / sizeof(float);
    int is_float = !strcmp(info->dtype, "float32");
    if (is_float && info->ndim == 2 && info->shape[0] == 1) print_top5(model, out[i], n);
    if (is_float && info->ndim == 3 && info->shape[2] == 6) print_detections(model, out[i], n / 6);
  }
  if (status == 0 && save != NULL) {
    FILE *file = fopen(save, "wb");
    for (size_t i = 0; file != NULL && i < outputs; i++) fwrite(out[i], 1, out_bytes[i], file);
    if (file == NULL || fclose(file) != 0) {
      perror(save);
      status = 2;
    }
  }
  if (status == 0 && repeat > 0) {
    double *times = malloc(sizeof(double) * (size_t)repeat);
    for (int r = 0; times != NULL && r < repeat && status == 0; r++) {
      double t = now();
      if (edgecv_run(model, (const void *const *)in, in_bytes, out, out_bytes, &error) != EDGECV_OK) {
        status = fail(error);
      }
      times[r] = now() - t;
    }
    if (times != NULL && status == 0) {
      qsort(times, (size_t)repeat, sizeof *times, compare);
      printf("run: median %.1f us over %d calls\n", 1e6 * times[repeat / 2], repeat);
    }
    free(times);
  }
  for (size_t i = 0; i < 16; i++) {
    free(in[i]);
    free(out[i]);
  }
  edgecv_free(model);
  return status;
}
