#include "common/num.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"

/* s[n] is '-'? digits, at least one: the digits' start, or NULL. */
static const char *int_digits(const char *s, size_t n) {
  if (!s || !n) return NULL;
  size_t i = s[0] == '-';
  if (i == n) return NULL;
  for (size_t k = i; k < n; k++)
    if (s[k] < '0' || s[k] > '9') return NULL;
  return s + i;
}

/* The digits d[n] (checked) as a magnitude into *v: 0, or SR_ERANGE past
 * UINT64_MAX. */
static int magnitude(const char *d, size_t n, uint64_t *v) {
  uint64_t x = 0;
  for (size_t k = 0; k < n; k++) {
    const unsigned dig = (unsigned)(d[k] - '0');
    if (x > (UINT64_MAX - dig) / 10) return SR_ERANGE;
    x = x * 10 + dig;
  }
  *v = x;
  return 0;
}

int sr_num_int(const char *s, size_t n, long long *out) {
  const char *d = int_digits(s, n);
  if (!d) return SR_EINVAL;
  uint64_t m;
  const int neg = d != s;
  if (magnitude(d, n - (size_t)(d - s), &m) ||
      m > (neg ? (uint64_t)1 << 63 : (uint64_t)INT64_MAX))
    return SR_ERANGE;
  *out = !neg ? (long long)m : m == (uint64_t)1 << 63 ? LLONG_MIN : -(long long)m;
  return 0;
}

int sr_num_u64(const char *s, size_t n, uint64_t *out) {
  const char *d = int_digits(s, n);
  if (!d) return SR_EINVAL;
  uint64_t m;
  if (magnitude(d, n - (size_t)(d - s), &m) || (d != s && m)) return SR_ERANGE;
  *out = m;
  return 0;
}

/* Digits at *p, *p past them: how many. */
static size_t digits(const char **p) {
  const char *q = *p;
  while (*q >= '0' && *q <= '9') q++;
  size_t n = (size_t)(q - *p);
  *p = q;
  return n;
}

int sr_num_double(const char *s, double *out) {
  if (!s) return SR_EINVAL;
  const char *p = s + (*s == '-');
  size_t mant = digits(&p);
  if (*p == '.') {
    p++;
    mant += digits(&p);
  }
  if (!mant) return SR_EINVAL;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!digits(&p)) return SR_EINVAL;
  }
  if (*p) return SR_EINVAL;
  /* What is left is decimal text strtod reads whole, in the C locale's
   * '.' (shardrec never sets another LC_NUMERIC). */
  char *end = NULL;
  const double v = strtod(s, &end);
  if (*end) return SR_EINVAL;
  if (isinf(v)) return SR_ERANGE;
  *out = v;
  return 0;
}

const char *sr_jnum(char out[SR_JNUM_MAX], double v, int prec) {
  if (isfinite(v)) snprintf(out, SR_JNUM_MAX, "%.*g", prec, v);
  else snprintf(out, SR_JNUM_MAX, "null");
  return out;
}
