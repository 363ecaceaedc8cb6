/* Plain decimal numbers, as flags, environment variables and text files
 * give them. An integer is an optional '-' and one or more digits 0-9; a
 * real number is an optional '-', digits with an optional '.' and fraction
 * (at least one digit in all), and an optional exponent ('e' or 'E', an
 * optional sign, digits). Nothing else is a number: no space before or
 * after, no '+' in front, no hexadecimal, no "inf" or "nan". Each call
 * returns 0, SR_EINVAL when the text is not such a number, or SR_ERANGE
 * when it is one beyond the type; *out is written on success only. None
 * prints. */
#ifndef SHARDREC_COMMON_NUM_H
#define SHARDREC_COMMON_NUM_H

#include <stddef.h>
#include <stdint.h>

/* The n bytes at s (borrowed; a token of a longer string is fine) as an
 * integer of long long. */
int sr_num_int(const char *s, size_t n, long long *out);

/* The n bytes at s as an integer of uint64_t: a negative one (other than
 * -0) is SR_ERANGE too. */
int sr_num_u64(const char *s, size_t n, uint64_t *out);

/* The string s (NUL-terminated, borrowed) as a real number: SR_ERANGE when
 * its magnitude rounds to infinity; one too small for a double rounds
 * toward 0 as strtod rounds it. */
int sr_num_double(const char *s, double *out);

/* v as a JSON number (printf's %.*g with prec digits) into out, or "null"
 * when v is not finite: JSON has no NaN or infinity, and a reader of a
 * line holding one refuses the whole line. Returns out. */
#define SR_JNUM_MAX 32
const char *sr_jnum(char out[SR_JNUM_MAX], double v, int prec);

#endif
