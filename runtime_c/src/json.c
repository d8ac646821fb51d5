/* The JSON reader (see json.h): recursive descent over UTF-8 text. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Python's json gives up near a thousand levels; packages nest five. */
#define MAX_DEPTH 256

typedef struct {
  const char *text;
  size_t length, at;
  char *why;
  size_t why_size;
  int failed;
} parser;

static void fail(parser *p, const char *what) {
  if (p->failed) return;
  p->failed = 1;
  size_t line = 1, column = 1;
  for (size_t i = 0; i < p->at && i < p->length; i++) {
    if (p->text[i] == '\n') {
      line++;
      column = 1;
    } else {
      column++;
    }
  }
  snprintf(p->why, p->why_size, "%s: line %zu column %zu (char %zu)", what, line, column, p->at);
}

static int valid_utf8(const unsigned char *s, size_t n, size_t *bad) {
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    size_t extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2
                 : (c & 0xF8) == 0xF0 ? 3 : 4;
    for (size_t k = 1; k <= extra; k++) {
      if (extra == 4 || i + k >= n || (s[i + k] & 0xC0) != 0x80) {
        *bad = i;
        return 0;
      }
    }
    i += extra + 1;
  }
  return 1;
}

static void skip_space(parser *p) {
  while (p->at < p->length) {
    char c = p->text[p->at];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->at++;
  }
}

static json_value *new_value(parser *p, json_kind kind) {
  json_value *v = calloc(1, sizeof *v);
  if (v == NULL) fail(p, "out of memory");
  else v->kind = kind;
  return v;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->length - p->at >= n && memcmp(p->text + p->at, word, n) == 0) {
    p->at += n;
    return 1;
  }
  return 0;
}

static int hex4(parser *p, unsigned *out) {
  if (p->length - p->at < 4) return 0;
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->text[p->at + i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  p->at += 4;
  *out = v;
  return 1;
}

static size_t put_utf8(char *out, unsigned code) {
  if (code < 0x80) {
    out[0] = (char)code;
    return 1;
  }
  if (code < 0x800) {
    out[0] = (char)(0xC0 | (code >> 6));
    out[1] = (char)(0x80 | (code & 0x3F));
    return 2;
  }
  if (code < 0x10000) {
    out[0] = (char)(0xE0 | (code >> 12));
    out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[2] = (char)(0x80 | (code & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (code >> 18));
  out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
  out[3] = (char)(0x80 | (code & 0x3F));
  return 4;
}

/* A string starting after its opening quote; its text in *out (malloc'd). */
static int parse_string(parser *p, char **out, size_t *out_length) {
  size_t start = p->at, capacity = 0;
  while (p->at < p->length && p->text[p->at] != '"') p->at += p->text[p->at] == '\\' ? 2 : 1;
  capacity = p->at - start + 1; /* escapes only shrink the text */
  p->at = start;
  char *text = malloc(capacity);
  if (text == NULL) {
    fail(p, "out of memory");
    return 0;
  }
  size_t n = 0;
  for (;;) {
    if (p->at >= p->length) {
      fail(p, "Unterminated string starting at");
      break;
    }
    unsigned char c = (unsigned char)p->text[p->at++];
    if (c == '"') {
      text[n] = '\0';
      *out = text;
      *out_length = n;
      return 1;
    }
    if (c < 0x20) {
      p->at--;
      fail(p, "Invalid control character at");
      break;
    }
    if (c != '\\') {
      text[n++] = (char)c;
      continue;
    }
    if (p->at >= p->length) continue;
    char e = p->text[p->at++];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (simple != NULL && e != '\0') {
      static const char decoded[] = "\"\\/\b\f\n\r\t";
      text[n++] = decoded[simple - "\"\\/bfnrt"];
      continue;
    }
    unsigned code;
    if (e != 'u' || !hex4(p, &code)) {
      p->at--;
      fail(p, "Invalid \\escape");
      break;
    }
    if (code >= 0xD800 && code < 0xDC00 && p->length - p->at >= 6 && p->text[p->at] == '\\' &&
        p->text[p->at + 1] == 'u') {
      size_t back = p->at;
      unsigned low;
      p->at += 2;
      if (hex4(p, &low) && low >= 0xDC00 && low < 0xE000) {
        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
      } else {
        p->at = back;
      }
    }
    n += put_utf8(text + n, code);
  }
  free(text);
  return 0;
}

static json_value *parse_value(parser *p, int depth);

static json_value *parse_number(parser *p) {
  size_t start = p->at;
  int fraction = 0;
  if (p->at < p->length && p->text[p->at] == '-') p->at++;
  if (p->at < p->length && p->text[p->at] == '0') {
    p->at++;
  } else if (p->at < p->length && p->text[p->at] >= '1' && p->text[p->at] <= '9') {
    while (p->at < p->length && p->text[p->at] >= '0' && p->text[p->at] <= '9') p->at++;
  } else {
    p->at = start;
    fail(p, "Expecting value");
    return NULL;
  }
  if (p->at + 1 < p->length && p->text[p->at] == '.' && p->text[p->at + 1] >= '0' &&
      p->text[p->at + 1] <= '9') {
    fraction = 1;
    p->at++;
    while (p->at < p->length && p->text[p->at] >= '0' && p->text[p->at] <= '9') p->at++;
  }
  if (p->at < p->length && (p->text[p->at] == 'e' || p->text[p->at] == 'E')) {
    size_t e = p->at + 1;
    if (e < p->length && (p->text[e] == '+' || p->text[e] == '-')) e++;
    if (e < p->length && p->text[e] >= '0' && p->text[e] <= '9') {
      fraction = 1;
      p->at = e;
      while (p->at < p->length && p->text[p->at] >= '0' && p->text[p->at] <= '9') p->at++;
    }
  }
  char digits[64];
  size_t n = p->at - start;
  char *copy = n < sizeof digits ? digits : malloc(n + 1);
  if (copy == NULL) {
    fail(p, "out of memory");
    return NULL;
  }
  memcpy(copy, p->text + start, n);
  copy[n] = '\0';
  json_value *v = new_value(p, JSON_INT);
  if (v != NULL) {
    char *end;
    long long whole = 0;
    int exact = 0;
    if (!fraction) {
      errno = 0;
      whole = strtoll(copy, &end, 10);
      /* beyond int64: kept as a float (no package field holds such a number) */
      exact = errno != ERANGE;
    }
    if (exact) {
      v->as.integer = whole;
    } else {
      v->kind = JSON_FLOAT;
      v->as.number = strtod(copy, &end);
    }
  }
  if (copy != digits) free(copy);
  return v;
}

static json_value *parse_array(parser *p, int depth) {
  json_value *v = new_value(p, JSON_ARRAY);
  size_t capacity = 0;
  if (v == NULL) return NULL;
  skip_space(p);
  if (p->at < p->length && p->text[p->at] == ']') {
    p->at++;
    return v;
  }
  for (;;) {
    json_value *item = parse_value(p, depth + 1);
    if (item == NULL) break;
    if (v->as.array.count == capacity) {
      capacity = capacity ? capacity * 2 : 4;
      json_value **grown = realloc(v->as.array.items, capacity * sizeof *grown);
      if (grown == NULL) {
        json_free(item);
        fail(p, "out of memory");
        break;
      }
      v->as.array.items = grown;
    }
    v->as.array.items[v->as.array.count++] = item;
    skip_space(p);
    if (p->at < p->length && p->text[p->at] == ',') {
      p->at++;
      continue;
    }
    if (p->at < p->length && p->text[p->at] == ']') {
      p->at++;
      return v;
    }
    fail(p, "Expecting ',' delimiter");
    break;
  }
  json_free(v);
  return NULL;
}

static json_value *parse_object(parser *p, int depth) {
  json_value *v = new_value(p, JSON_OBJECT);
  size_t capacity = 0;
  if (v == NULL) return NULL;
  skip_space(p);
  if (p->at < p->length && p->text[p->at] == '}') {
    p->at++;
    return v;
  }
  for (;;) {
    skip_space(p);
    if (p->at >= p->length || p->text[p->at] != '"') {
      fail(p, "Expecting property name enclosed in double quotes");
      break;
    }
    p->at++;
    json_member member = {0};
    if (!parse_string(p, &member.key, &member.key_length)) break;
    skip_space(p);
    if (p->at >= p->length || p->text[p->at] != ':') {
      free(member.key);
      fail(p, "Expecting ':' delimiter");
      break;
    }
    p->at++;
    member.value = parse_value(p, depth + 1);
    if (member.value == NULL) {
      free(member.key);
      break;
    }
    if (v->as.object.count == capacity) {
      capacity = capacity ? capacity * 2 : 8;
      json_member *grown = realloc(v->as.object.members, capacity * sizeof *grown);
      if (grown == NULL) {
        free(member.key);
        json_free(member.value);
        fail(p, "out of memory");
        break;
      }
      v->as.object.members = grown;
    }
    v->as.object.members[v->as.object.count++] = member;
    skip_space(p);
    if (p->at < p->length && p->text[p->at] == ',') {
      p->at++;
      continue;
    }
    if (p->at < p->length && p->text[p->at] == '}') {
      p->at++;
      return v;
    }
    fail(p, "Expecting ',' delimiter");
    break;
  }
  json_free(v);
  return NULL;
}

static json_value *parse_value(parser *p, int depth) {
  if (depth > MAX_DEPTH) {
    fail(p, "JSON nested too deep");
    return NULL;
  }
  skip_space(p);
  if (p->at >= p->length) {
    fail(p, "Expecting value");
    return NULL;
  }
  char c = p->text[p->at];
  json_value *v;
  switch (c) {
    case '{':
      p->at++;
      return parse_object(p, depth);
    case '[':
      p->at++;
      return parse_array(p, depth);
    case '"':
      p->at++;
      v = new_value(p, JSON_STRING);
      if (v != NULL && !parse_string(p, &v->as.string.text, &v->as.string.length)) {
        free(v);
        v = NULL;
      }
      return v;
    default:
      break;
  }
  if (literal(p, "true") || literal(p, "false")) {
    v = new_value(p, JSON_BOOL);
    if (v != NULL) v->as.boolean = c == 't';
    return v;
  }
  if (literal(p, "null")) return new_value(p, JSON_NULL);
  /* Python's json reads (and writes) these three */
  double special = literal(p, "NaN") ? NAN : literal(p, "Infinity") ? INFINITY
                 : literal(p, "-Infinity") ? -INFINITY : 0.0;
  if (special != 0.0) {
    v = new_value(p, JSON_FLOAT);
    if (v != NULL) v->as.number = special;
    return v;
  }
  return parse_number(p);
}

json_value *json_parse(const char *text, size_t length, char *why, size_t why_size) {
  parser p = {text, length, 0, why, why_size, 0};
  size_t bad = 0;
  if (!valid_utf8((const unsigned char *)text, length, &bad)) {
    snprintf(why, why_size, "not UTF-8 text (byte %zu)", bad);
    return NULL;
  }
  json_value *v = parse_value(&p, 0);
  if (v == NULL) return NULL;
  skip_space(&p);
  if (p.at != p.length) {
    fail(&p, "Extra data");
    json_free(v);
    return NULL;
  }
  return v;
}

void json_free(json_value *value) {
  if (value == NULL) return;
  if (value->kind == JSON_STRING) free(value->as.string.text);
  if (value->kind == JSON_ARRAY) {
    for (size_t i = 0; i < value->as.array.count; i++) json_free(value->as.array.items[i]);
    free(value->as.array.items);
  }
  if (value->kind == JSON_OBJECT) {
    for (size_t i = 0; i < value->as.object.count; i++) {
      free(value->as.object.members[i].key);
      json_free(value->as.object.members[i].value);
    }
    free(value->as.object.members);
  }
  free(value);
}
