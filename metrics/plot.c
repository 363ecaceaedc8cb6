/* shardrec plot's engine (metrics/plot.h): the metrics files into gnuplot
 * datablocks, one script on gnuplot's standard input, the PNG written under
 * a temporary name (common/outfile.h) and renamed into place once whole. */
#include "metrics/plot.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/outfile.h"
#include "common/status.h"

#define PLOT_PHASES 9
static const char *const phase_key[PLOT_PHASES] = {"dedup", "lookup", "pool", "forward",
                                                   "backward", "scatter", "push", "allreduce",
                                                   "dense_opt"};

#define PLOT_KEEP_TABLES 64 /* bounded tables drawn per run; more are left out */
#define PLOT_KEEP_EVENTS 4
static const char *const keep_event[PLOT_KEEP_EVENTS] = {"admitted", "refused", "expired",
                                                         "evicted"};

typedef struct {
  char label[64];
  size_t n_train, n_test, n_keep;
  int keep_tables;                          /* bounded tables of the first "keep" line */
  char keep_name[PLOT_KEEP_TABLES][24];     /* their names, in that line's order */
  double split[PLOT_PHASES]; /* mean ms per step, weighted by the steps between lines */
  double split_steps;
  int last_step;
} run_info;

/* The run's label: the file's name without folders and ".jsonl", with
 * characters gnuplot would read as markup or quotes made '_'. */
static void run_label(const char *path, char *out, size_t n) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  size_t len = strlen(b);
  if (len > 6 && !strcmp(b + len - 6, ".jsonl")) len -= 6;
  snprintf(out, n, "%.*s", (int)len, b);
  for (char *p = out; *p; p++)
    if (*p == '"' || *p == '\\' || *p == '\'' || (unsigned char)*p < 32) *p = '_';
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0.0 / 0.0;
}

/* A train line's "keep" (per bounded table rows and cumulative event
 * counts) into the datablock kp: step, each table's rows (the tables of the
 * run's first such line, by name), then each event summed over the tables. */
static void take_keep(const cJSON *keep, double step, FILE *kp, run_info *r) {
  if (!r->n_keep)
    for (const cJSON *t = keep->child; t && r->keep_tables < PLOT_KEEP_TABLES; t = t->next) {
      char *nm = r->keep_name[r->keep_tables++];
      snprintf(nm, sizeof r->keep_name[0], "%s", t->string);
      for (char *p = nm; *p; p++) /* as run_label: nothing gnuplot reads as a quote */
        if (*p == '"' || *p == '\\' || *p == '\'' || (unsigned char)*p < 32) *p = '_';
    }
  fprintf(kp, "%.0f", step);
  for (int i = 0; i < r->keep_tables; i++) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(keep, r->keep_name[i]); /* a name made _ reads NaN */
    fprintf(kp, " %.17g", cJSON_IsObject(t) ? num(t, "rows") : 0.0 / 0.0);
  }
  for (int e = 0; e < PLOT_KEEP_EVENTS; e++) {
    double sum = 0;
    for (const cJSON *t = keep->child; t; t = t->next) {
      double v = num(t, keep_event[e]);
      sum += v == v ? v : 0;
    }
    fprintf(kp, " %.17g", sum);
  }
  fprintf(kp, "\n");
  r->n_keep++;
}

/* One line of a metrics file into the datablocks tr, te and kp. 0 or -1. */
static int take_line(const char *line, FILE *tr, FILE *te, FILE *kp, run_info *r) {
  cJSON *o = cJSON_Parse(line);
  const cJSON *kind = cJSON_GetObjectItem(o, "kind");
  if (!cJSON_IsObject(o) || !cJSON_IsString(kind)) {
    cJSON_Delete(o);
    return -1;
  }
  double step = num(o, "step");
  if (!strcmp(kind->valuestring, "train")) {
    fprintf(tr, "%.0f %.9g %.9g\n", step, num(o, "loss"), num(o, "samples_per_s"));
    const cJSON *ms = cJSON_GetObjectItem(o, "step_ms");
    double w = step - r->last_step;
    if (cJSON_IsObject(ms) && w > 0) {
      for (int p = 0; p < PLOT_PHASES; p++) {
        double v = num(ms, phase_key[p]);
        r->split[p] += (v == v ? v : 0) * w;
      }
      r->split_steps += w;
    }
    r->last_step = (int)step;
    r->n_train++;
    const cJSON *keep = cJSON_GetObjectItem(o, "keep");
    if (cJSON_IsObject(keep) && keep->child) take_keep(keep, step, kp, r);
  } else if (!strcmp(kind->valuestring, "test")) {
    fprintf(te, "%.0f %.9g %.9g\n", step, num(o, "auc"), num(o, "logloss"));
    r->n_test++;
  }
  cJSON_Delete(o);
  return 0;
}

/* File k's datablocks $train<k>, $test<k> and $keep<k> into s; its figures
 * into *r. */
static int read_run(const char *path, int k, FILE *s, run_info *r, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) return sr_fmt(err, errlen, "%s: cannot open", path), SR_EIO;
  char *tb = NULL, *eb = NULL, *kb = NULL, line[65536];
  size_t tl = 0, el = 0, kl = 0;
  FILE *tr = open_memstream(&tb, &tl), *te = open_memstream(&eb, &el),
       *kp = open_memstream(&kb, &kl);
  int rc = tr && te && kp ? 0 : SR_ENOMEM, lineno = 0;
  run_label(path, r->label, sizeof r->label);
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[strspn(line, " \t\r\n")] && take_line(line, tr, te, kp, r)) {
      sr_fmt(err, errlen, "%s:%d: not a metrics line (a JSON object with a \"kind\")", path, lineno);
      rc = SR_EFORMAT;
    }
  }
  fclose(f);
  if (tr) fclose(tr);
  if (te) fclose(te);
  if (kp) fclose(kp);
  if (!rc && !r->n_train)
    sr_fmt(err, errlen, "%s: no training lines (\"kind\":\"train\"): is it train --metrics-out's?", path),
        rc = SR_EFORMAT;
  if (!rc) fprintf(s, "$train%d << EOD\n%sEOD\n$test%d << EOD\n%sEOD\n", k, tb, k, eb ? eb : "");
  if (!rc && r->n_keep) fprintf(s, "$keep%d << EOD\n%sEOD\n", k, kb);
  free(tb);
  free(eb);
  free(kb);
  return rc;
}

/* The bounded tables' two panels (runs with "keep" lines): rows per table
 * against step, and the ids admitted, refused, expired and evicted so far
 * (summed over the tables; a dash type per event, a colour per run). */
static void keep_panels(FILE *s, const run_info *r, int n) {
  int lines = 0;
  for (int k = 0; k < n; k++) lines += r[k].n_keep ? r[k].keep_tables : 0;
  fprintf(s, "set title 'rows per bounded table'\nset xlabel 'step'\nset ylabel 'rows'\n"
             "set grid xtics ytics\nset style data lines\nset autoscale\nset key inside\n%s\nplot ",
          lines > 12 ? "set key off" : "set key top left");
  for (int k = 0, first = 1; k < n; k++)
    for (int i = 0; r[k].n_keep && i < r[k].keep_tables; i++, first = 0)
      fprintf(s, "%s$keep%d using 1:%d with lines lc %d title \"%s %s\"", first ? "" : ", ", k,
              i + 2, k + 1, r[k].label, r[k].keep_name[i]);
  fprintf(s, "\nset key top left\nset title 'bounded tables: ids so far (all tables)'\n"
             "set ylabel 'ids'\nplot ");
  for (int k = 0, first = 1; k < n; k++)
    for (int e = 0; r[k].n_keep && e < PLOT_KEEP_EVENTS; e++, first = 0)
      fprintf(s, "%s$keep%d using 1:%d with lines lw 2 lc %d dt %d title \"%s %s\"",
              first ? "" : ", ", k, r[k].keep_tables + 2 + e, k + 1, e + 1, r[k].label,
              keep_event[e]);
  fprintf(s, "\n");
}

/* The four panels' commands for n runs. */
static void panels(FILE *s, const run_info *r, int n) {
  fprintf(s, "set xlabel 'step'\nset grid\nset key top right\n"
             "set title 'training loss'\nset ylabel 'loss'\nplot ");
  for (int k = 0; k < n; k++)
    fprintf(s, "%s$train%d using 1:2 with lines lw 2 lc %d title \"%s\"", k ? ", " : "", k, k + 1, r[k].label);
  fprintf(s, "\nset title 'test AUC (solid) and log loss (dashed, right axis)'\n"
             "set ylabel 'AUC'\nset y2label 'log loss'\nset ytics nomirror\nset y2tics\n");
  int tests = 0;
  for (int k = 0; k < n; k++) tests += r[k].n_test > 0;
  if (!tests) fprintf(s, "set label 1 'no test passes in these files' at graph 0.5,0.5 center\n"
                         "set xrange [0:1]\nset yrange [0:1]\nplot -1 notitle\nunset label 1\n"
                         "set autoscale\n");
  else {
    fprintf(s, "plot ");
    for (int k = 0, first = 1; k < n; k++) {
      if (!r[k].n_test) continue;
      fprintf(s, "%s$test%d using 1:2 with linespoints lw 2 lc %d title \"%s AUC\", "
                 "$test%d using 1:3 axes x1y2 with linespoints dt 2 lc %d title \"%s log loss\"",
              first ? "" : ", ", k, k + 1, r[k].label, k, k + 1, r[k].label);
      first = 0;
    }
    fprintf(s, "\n");
  }
  fprintf(s, "unset y2tics\nunset y2label\nset ytics mirror\n"
             "set title 'samples per second'\nset ylabel 'samples/s'\nplot ");
  for (int k = 0; k < n; k++)
    fprintf(s, "%s$train%d using 1:3 with lines lw 2 lc %d title \"%s\"", k ? ", " : "", k, k + 1, r[k].label);
  fprintf(s, "\n$split << EOD\nrun");
  for (int p = 0; p < PLOT_PHASES; p++) fprintf(s, " %s", phase_key[p]);
  for (int k = 0; k < n; k++) {
    fprintf(s, "\n\"%s\"", r[k].label);
    for (int p = 0; p < PLOT_PHASES; p++)
      fprintf(s, " %.6f", r[k].split_steps > 0 ? r[k].split[p] / r[k].split_steps : 0);
  }
  fprintf(s, "\nEOD\nset title 'time per step by phase (mean)'\nset xlabel ''\n"
             "set ylabel 'ms per step'\nset grid noxtics\nset style data histograms\n"
             "set style histogram rowstacked\nset style fill solid 0.8 border -1\n"
             "set boxwidth 0.6\nset key outside right\n"
             "plot for [i=2:%d] $split using i:xtic(1) title columnheader(i)\n",
          PLOT_PHASES + 1);
}

/* Runs the script text through gnuplot, its messages into log (shown only
 * when it fails: an empty range is a warning, not worth a line); 0 or
 * SR_EBACKEND (err). */
static int run_gnuplot(const plot_config *c, const char *script, size_t len, const char *log,
                       char *err, size_t errlen) {
  const char *prog = c->gnuplot ? c->gnuplot : "gnuplot";
  char cmd[SR_PATH_MAX + 700];
  snprintf(cmd, sizeof cmd, "exec '%s' 2>'%s'", prog, log);
  FILE *p = popen(cmd, "w");
  if (!p) return sr_fmt(err, errlen, "cannot run %s", prog), SR_EBACKEND;
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  fwrite(script, 1, len, p);
  int st = pclose(p);
  signal(SIGPIPE, old);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
    return sr_fmt(err, errlen, "%s not found (Debian's gnuplot-nox; tools/setup installs it)", prog),
           SR_EBACKEND;
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    char msg[600] = "";
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(msg, 1, sizeof msg - 1, f) : 0;
    msg[n] = 0;
    if (f) fclose(f);
    return sr_fmt(err, errlen, "%s failed: %s", prog, msg), SR_EBACKEND;
  }
  return 0;
}

/* Whether the file at path ends as a whole PNG does, with the IEND chunk
 * (a picture cut short by a full disk does not). */
static int png_whole(const char *path) {
  static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  unsigned char tail[12];
  FILE *f = fopen(path, "rb");
  int ok = f && fseek(f, -12, SEEK_END) == 0 && fread(tail, 1, 12, f) == 12 &&
           !memcmp(tail, iend, 12);
  if (f) fclose(f);
  return ok;
}

int plot_write(plot_config *c, char *err, size_t errlen) {
  if (strchr(c->out, '\'')) return sr_fmt(err, errlen, "%s: a name with ' is not supported (it is quoted for the shell and gnuplot)", c->out), SR_EINVAL;
  sr_outfile *o;
  char log[SR_PATH_MAX];
  int rc = sr_out_open(c->out, &o, err, errlen); /* gnuplot writes its temporary */
  if (rc) return rc;
  const char *tmp = sr_out_tmp(o);
  if ((rc = sr_path_err(log, sizeof log, err, errlen, "%s.log", tmp))) {
    sr_out_abort(o);
    return rc;
  }
  run_info *r = calloc((size_t)c->n_files, sizeof *r);
  char *script = NULL;
  size_t len = 0;
  FILE *s = open_memstream(&script, &len);
  rc = r && s ? 0 : SR_ENOMEM;
  if (!rc) {
    fprintf(s, "set terminal pngcairo size %d,%d noenhanced font 'sans,%d'\nset output '%s'\n",
            c->width, c->height, c->width >= 1000 ? 10 : 8, tmp);
  }
  for (int k = 0; !rc && k < c->n_files; k++) rc = read_run(c->files[k], k, s, &r[k], err, errlen);
  int kept = 0;
  for (int k = 0; !rc && k < c->n_files; k++) kept += r[k].n_keep > 0;
  c->kept = kept;
  if (!rc) fprintf(s, "set multiplot layout %d,2 title 'shardrec: %d run(s)'\n", kept ? 3 : 2,
                   c->n_files);
  if (!rc) {
    panels(s, r, c->n_files); /* after the runs' datablocks: a layout of 3 rows with bounded tables */
    if (kept) keep_panels(s, r, c->n_files);
    fprintf(s, "unset multiplot\nset output\n");
  }
  if (s) fclose(s);
  if (!rc) rc = run_gnuplot(c, script, len, log, err, errlen);
  unlink(log);
  if (!rc && !png_whole(tmp))
    rc = SR_EIO, sr_fmt(err, errlen, "%s: gnuplot wrote no whole picture (a full disk?)", c->out);
  if (!rc) rc = sr_out_commit(o, err, errlen);
  else sr_out_abort(o);
  free(script);
  free(r);
  return rc;
}
