/* libFuzzer target: the Criteo TSV line parser, in both label modes. The input
 * is copied to an exact-size heap buffer so ASan sees any read past its end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/criteo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ds_criteo_sample s;
  char err[256];
  char *line = malloc(size ? size : 1);
  if (!line) return 0;
  if (size) memcpy(line, data, size);
  for (int nl = 0; nl < 2; nl++) {
    ds_criteo_parse_opts o = {.no_label = nl};
    int rc = ds_criteo_parse_line(line, size, &o, &s, err, sizeof err);
    if (rc == 0) {
      /* invariants of a good line */
      if (s.label != 0 && s.label != 1) abort();
      if (s.off[0] != 0 || s.off[DS_NUM_SPARSE] > DS_CRITEO_MAX_VALUES) abort();
      for (int c = 0; c < DS_NUM_SPARSE; c++)
        if (s.off[c + 1] <= s.off[c]) abort(); /* every bag holds at least one value */
      for (int d = 0; d < DS_NUM_DENSE; d++)
        if (!(s.dense[d] >= 0.0f) || s.dense[d] > 44.0f) abort(); /* log1p(2^63) < 44 */
    } else {
      if (s.bad <= DS_BAD_NONE || s.bad >= DS_BAD_COUNT || !err[0]) abort();
    }
  }
  free(line);
  return 0;
}
