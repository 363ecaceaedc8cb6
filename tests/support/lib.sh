# Shell helpers of the end-to-end scripts (tests/train/test_train_chain.sh,
# tests/train/test_train_days.sh), sourced by them:
#   . "${BASH_SOURCE%/*}/../support/lib.sh"
# Each script keeps its own cleanup trap; these only read their arguments.

# fail MSG...: the test fails, MSG on stderr.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# wait_for SECS CMD...: until CMD succeeds (1 when SECS pass first).
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.05
  done
}

# run NAME CMD...: CMD's stdout and stderr into NAME.log; fails the test when
# CMD does.
run() {
  local name=$1
  shift
  "$@" >"$name.log" 2>&1 || fail "$name: $* failed: $(tail -5 "$name.log")"
}

# refused NAME CMD...: CMD must fail; its output in NAME.log.
refused() {
  local name=$1
  shift
  if "$@" >"$name.log" 2>&1; then fail "$name: $* succeeded: $(tail -3 "$name.log")"; fi
}

# has NAME TEXT: NAME.log holds TEXT.
has() { grep -qF -- "$2" "$1.log" || fail "$1: no '$2' in: $(tail -3 "$1.log")"; }
