/* The progress line (common/progress.h). */
#include "common/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "common/sys.h"

int sr_progress_tty(void) { return isatty(2); }

void sr_progress_begin(sr_progress *p, int on, const char *what, const char *unit,
                       uint64_t total) {
  *p = (sr_progress){.on = on, .what = what, .unit = unit, .total = total};
  p->t0 = sr_now();
}

static void fmt_count(char *b, size_t n, double v) {
  if (v >= 1e6) snprintf(b, n, "%.2fM", v / 1e6);
  else if (v >= 1e4) snprintf(b, n, "%.1fk", v / 1e3);
  else snprintf(b, n, "%.0f", v);
}

static void draw(sr_progress *p, int final) {
  double now = sr_now();
  p->last = now;
  double el = now - p->t0, rate = el > 0 ? (double)p->done / el : 0;
  char d[32], t[32], rs[32], mb[48] = "", tail[64];
  fmt_count(d, sizeof d, (double)p->done);
  fmt_count(rs, sizeof rs, rate);
  if (p->show_bytes) snprintf(mb, sizeof mb, ", %.1f MB", (double)p->bytes / 1e6);
  if (p->total) {
    fmt_count(t, sizeof t, (double)(p->total > p->done ? p->total : p->done));
    int pct = (int)(100.0 * (double)p->done / (double)p->total);
    double left = rate > 0 && p->total > p->done ? (double)(p->total - p->done) / rate : 0;
    snprintf(tail, sizeof tail, " (%3d%%)", pct > 100 ? 100 : pct);
    fprintf(stderr, "\r%s: %s/%s %s%s%s, %s %s/s, ETA %.0f s   ", p->what, d, t, p->unit, tail,
            mb, rs, p->unit, final ? 0.0 : left);
  } else {
    fprintf(stderr, "\r%s: %s %s%s, %s %s/s   ", p->what, d, p->unit, mb, rs, p->unit);
  }
  if (final) fprintf(stderr, "\n");
  fflush(stderr);
}

void sr_progress_set(sr_progress *p, uint64_t done, uint64_t bytes) {
  if (!p->on) return;
  p->done = done;
  p->bytes = bytes;
  if (sr_now() - p->last >= 0.25) draw(p, 0);
}

void sr_progress_end(sr_progress *p) {
  if (p->on) draw(p, 1);
}

void sr_progress_clear(sr_progress *p) {
  if (!p->on || p->last == 0) return;
  fprintf(stderr, "\r%*s\r", 100, "");
  fflush(stderr);
  p->last = 0;
}
