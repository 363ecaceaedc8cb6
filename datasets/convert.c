#include "datasets/convert.h"

#include <stdio.h>

#include "common/progress.h"
#include "common/status.h"

int ds_convert_to_bin(ds_source *s, const ds_source_opts *o, const char *out, int shuffle,
                      uint64_t seed, ds_bin_info *info_out, ds_source_stats *stats_out,
                      char *err, size_t errlen) {
  ds_source_stats st;
  ds_source_stats_get(s, &st);
  ds_bin_info info = {0};
  info.n_samples = ds_source_split_count(s, DS_SPLIT_ALL);
  info.n_train = ds_source_split_count(s, DS_SPLIT_TRAIN);
  info.n_test = ds_source_split_count(s, DS_SPLIT_TEST);
  info.n_val = ds_source_split_count(s, DS_SPLIT_VAL);
  info.total_ids = st.scan_ids;
  const ds_transform *xf = ds_source_transform(s);
  info.id_mode = (uint32_t)ds_source_id_mode(s);
  info.flags = (st.scan_max_bag > 1 ? DS_BIN_MULTI : 0) | (info.id_mode == DS_IDS_HASH ? DS_BIN_ID64 : 0) |
               (o->no_label ? DS_BIN_NO_LABEL : 0);
  info.freq_threshold = xf ? xf->frequency_threshold : 0;
  info.max_ind_range = xf ? xf->max_ind_range : 0;
  ds_source_table_sizes(s, info.table_sizes);
  if (info_out) *info_out = info;
  if (stats_out) *stats_out = st;
  if (info.n_samples == 0) {
    sr_fmt(err, errlen, "%s: no samples (%llu lines, %llu malformed)", o->path,
           (unsigned long long)st.scan_lines, (unsigned long long)st.scan_malformed);
    return SR_EFORMAT;
  }
  ds_bin_writer *w = ds_bin_writer_create(out, &info, ds_source_dict(s), shuffle, seed, err, errlen);
  if (!w) return SR_EIO;
  ds_batch b;
  int rc = ds_batch_init(&b, 4096), n = 0;
  sr_progress pg;
  char what[128];
  snprintf(what, sizeof what, "%s: writing", o->progress ? o->progress : "");
  sr_progress_begin(&pg, o->progress != NULL, what, "samples", info.n_samples);
  uint64_t done = 0;
  while (!rc && (n = ds_source_next(s, &b, 4096)) > 0) {
    rc = ds_bin_writer_add(w, &b);
    sr_progress_set(&pg, done += (uint64_t)n, 0);
  }
  if (n < 0) rc = n;
  if (!rc) sr_progress_end(&pg);
  else if (pg.on && done) fprintf(stderr, "\n");
  if (!rc) rc = ds_bin_writer_finish(w);
  if (rc)
    sr_fmt(err, errlen, "%s", n < 0 ? ds_source_errmsg(s)
                              : rc == SR_ENOMEM ? "out of memory" : ds_bin_writer_errmsg(w));
  ds_bin_writer_destroy(w);
  ds_batch_free(&b);
  return rc;
}
