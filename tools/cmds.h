/* The shardrec subcommands. Each lives in its own tools/cmd_*.c (benchmarks in
 * tools/bench/bench_*.c): it parses its flags into a config and calls the
 * library, and returns the process exit status: 0 success, 1 failure, 2 bad
 * usage. Mains print errors; libraries return them. */
#ifndef SHARDREC_TOOLS_CMDS_H
#define SHARDREC_TOOLS_CMDS_H

int cmd_datagen(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_reshard(int argc, char **argv);
int cmd_fold(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_plot(int argc, char **argv);

int bench_data(int argc, char **argv);
int bench_train(int argc, char **argv);
/* bench train --store shard (bench_train_store.c): in memory vs the shard store. */
int bench_train_store(int argc, char **argv);
int bench_rpc(int argc, char **argv);
int bench_store(int argc, char **argv);
int bench_dp(int argc, char **argv);
int bench_reshard(int argc, char **argv);
int bench_metrics(int argc, char **argv);
int bench_allreduce(int argc, char **argv);
/* bench ckpt (bench_ckpt.c): full beside incremental checkpoints. */
int bench_ckpt(int argc, char **argv);
/* bench half (bench_half.c): fp32 beside fp16 and bf16 weights. */
int bench_half(int argc, char **argv);

#endif
