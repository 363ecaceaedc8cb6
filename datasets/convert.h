/* Converting a source to shardrec's binary record format: what `shardrec
 * convert` runs once its flags are parsed. */
#ifndef SHARDREC_DATASETS_CONVERT_H
#define SHARDREC_DATASETS_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/binfmt.h"
#include "datasets/source.h"

/* Write every sample of s (opened with o, borrowed, over the whole input:
 * split DS_SPLIT_ALL, counts exact) to the binary file out (binfmt.h: the
 * splits, dictionaries and table sizes of s; the train part shuffled with
 * seed when shuffle is set), reading to the end of s. info (may be NULL)
 * gets the header written; stats (may be NULL) the source's counts. 0, or
 * SR_E* with the reason in err (a half-written out is removed by the
 * writer); an input without one valid sample (empty, or every line
 * malformed) is SR_EFORMAT "IN: no samples (...)", nothing written. */
int ds_convert_to_bin(ds_source *s, const ds_source_opts *o, const char *out, int shuffle,
                      uint64_t seed, ds_bin_info *info, ds_source_stats *stats, char *err,
                      size_t errlen);

#endif
