/* Training curves as a picture: `shardrec plot`. Reads `train
 * --metrics-out` JSON Lines files (one run each) and has gnuplot (Debian's
 * gnuplot-nox, pngcairo terminal) draw one PNG of four panels: training
 * loss against step and test AUC and log loss against step (the runs
 * overlaid), samples/s against step, and the split of a step's time over
 * its phases (one stacked bar per run, the mean milliseconds per step of
 * the file's step_ms figures). Runs whose train lines carry "keep" (bounded
 * tables) add a row of two panels: rows per bounded table against step
 * (the first 64 tables of a run), and the ids admitted, refused, expired
 * and evicted so far, summed over the run's tables. */
#ifndef SHARDREC_METRICS_PLOT_H
#define SHARDREC_METRICS_PLOT_H

#include <stddef.h>

typedef struct plot_config {
  const char *const *files; /* [n_files] metrics files (borrowed) */
  int n_files;
  const char *out;          /* the PNG to write (through a temporary, renamed) */
  int width, height;        /* pixels */
  const char *gnuplot;      /* the program (NULL: "gnuplot" from PATH) */
  int kept;                 /* out: runs whose bounded tables were drawn */
} plot_config;

/* Draws c's picture. 0, or SR_EIO / SR_EFORMAT / SR_ENOMEM / SR_EINVAL (a ' in
 * c->out) / SR_ERANGE (c->out too long) / SR_EBACKEND
 * (gnuplot missing or failing) with the reason in err naming the file (and
 * line) at fault; SR_EEXISTS for a folder at c->out (left as it is); on
 * failure c->out is left as it was and no temporary remains. */
int plot_write(plot_config *c, char *err, size_t errlen);

#endif
