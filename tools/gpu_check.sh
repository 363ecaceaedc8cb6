#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU (an H200) that lacks the
# build's Debian packages (a bare Debian-like image with the CUDA 13 toolkit,
# cmake and python, and no network). Two steps:
#
#   1. HERE (no GPU needed):   tools/gpu_check.sh bundle
#      Builds what the GPU checks need in build-gpu/ (shardrec and the
#      tests/cuda programs, sm_90 + compute_90 PTX), then packs the binaries
#      and every shared library they load that is neither glibc nor CUDA's
#      (OpenBLAS, RocksDB, gRPC, OpenMPI, ... from Debian) into
#      build-gpu-bundle/shardrec-gpu.tar.xz (build-*/ is git-ignored).
#      Built on Debian 12: the binaries need GLIBC_2.34 at most, the
#      libraries carried GLIBC_2.36 (libevent_core, for gRPC).
#
#   2. THERE (about 3-6 minutes), in a copy of the repository with
#      build-gpu-bundle/ in it (logs in $OUT, default gpu-check-out/):
#        tools/gpu_check.sh run
#      Unpacks the bundle into /tmp/sr-gpu, finds CUDA's libraries (cublas,
#      cublasLt from /usr/local/cuda; NCCL from there or from the image's
#      nvidia-nccl-cu13 Python wheel), then runs, each with a time limit and
#      its log in $OUT:
#        nvidia-smi                             -> $OUT/gpu.txt
#        test_cuda_kernels, test_cuda_model,
#        test_cuda_nccl, test_collective        -> $OUT/tests.log
#        test_cuda_train (CPU vs CUDA AUC)      -> $OUT/tests.log
#        shardrec bench train --device cuda     -> $OUT/bench.log
#      and $OUT/summary.txt with one PASS/FAIL/SKIP line per check; the exit
#      status is 1 when one failed. A check skipped while nvidia-smi lists
#      a GPU is a failure (the GPU is there and could not be used: the skip
#      line says cudaGetDeviceCount's reason).
#      Every check has its own time limit, each Check test a quarter of its
#      suite's, and all of them together GPU_CHECK_SECONDS (default 330:
#      inside a 360 s device call), the bench keeping at least 60 s of it,
#      so that one check that hangs leaves the others time to report.
#      GPU_CHECK_SKIP_TRAIN=1 leaves out the training test (the longest).
#
# If the bundle's binaries do not start there (a library the image lacks),
# $OUT/ldd.txt says which; fall back to building there with
# `tools/gpu_check.sh build-there`, which needs the Debian -dev packages the
# top CMakeLists requires. Get them HERE into an ignored folder, e.g.
#   mkdir -p build-gpu-debs && cd build-gpu-debs && apt-get download \
#     libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 \
#     libcjson-dev libcjson1 check libsubunit-dev libsubunit0 zlib1g-dev \
#     libssl-dev librocksdb-dev librocksdb7.8 libsnappy1v5 libgflags2.2 \
#     libgrpc-dev libgrpc29 libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler \
#     pkg-config
# (plus what `apt-cache depends` lists for them that the image lacks), and
# copy build-gpu-debs/ over too: they are unpacked under /tmp/sr-deps, never /.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-run}
BUNDLE_DIR=$ROOT/build-gpu-bundle
TARGETS="shardrec shardrec_cuda test_cuda_kernels test_cuda_model test_cuda_nccl test_cuda_train test_collective"

bundle() {
  set -e
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target $TARGETS
  local stage; stage=$(mktemp -d)
  mkdir -p "$stage/sr-gpu/bin" "$stage/sr-gpu/lib" "$stage/sr-gpu/lib-fallback"
  # the CUDA backend module sits beside the binary that loads it
  cp build-gpu/tools/shardrec build-gpu/tools/libshardrec_cuda.so "$stage/sr-gpu/bin/"
  for t in test_cuda_kernels test_cuda_model test_cuda_nccl test_cuda_train test_collective; do
    cp "build-gpu/tests/cuda/$t" "$stage/sr-gpu/bin/"
  done
  # Shared libraries to carry: all but glibc's own and CUDA's (the image
  # has the toolkit; libcublasLt alone is 500 MB).
  ldd "$stage"/sr-gpu/bin/* | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*|libnccl*) ;;
      # The C++ runtime: the image's own (cuBLAS may need a newer one), ours
      # only where the image has none.
      libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$stage/sr-gpu/lib-fallback/" ;;
      *) cp -L "$lib" "$stage/sr-gpu/lib/" ;;
    esac
  done
  mkdir -p "$BUNDLE_DIR"
  tar -C "$stage" -cf - sr-gpu | xz -T0 -6 >"$BUNDLE_DIR/shardrec-gpu.tar.xz"
  rm -rf "$stage"
  ls -la "$BUNDLE_DIR"
  echo "gpu_check: carry [\"build-gpu-bundle\"] and run: tools/gpu_check.sh run"
}

# LD_LIBRARY_PATH entries for CUDA's libraries on the device image.
cuda_libs() {
  local dirs="/usr/local/cuda/lib64:/usr/local/cuda/lib"
  local py
  py=$(python3 - 2>/dev/null <<'PY'
import glob, os, site
out = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(os.path.join(base, "nvidia", "*", "lib")):
        out.append(d)
print(":".join(out))
PY
)
  [ -n "$py" ] && dirs="$dirs:$py"
  echo "$dirs"
}

# Seconds a check may take: its own limit, within what is left of
# GPU_CHECK_SECONDS less what is kept for the checks after it.
limit() {
  local own=$1 left=$((DEADLINE - SECONDS - $2))
  [ $left -lt 1 ] && left=1
  echo $((own < left ? own : left))
}

# check NAME SECONDS KEEP LOG CMD...: one check, at most SECONDS, leaving KEEP
# seconds for those after it, its output appended to $OUT/LOG.
check() {
  local name=$1 secs log=$OUT/$4; secs=$(limit "$2" "$3"); shift 4
  echo "== $name" | tee -a "$log"
  local t0=$SECONDS
  timeout "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  local verdict=FAIL
  [ $rc -eq 0 ] && verdict=PASS
  if [ $rc -eq 77 ]; then
    verdict=SKIP
    [ -n "$GPUS" ] && verdict="FAIL (skipped, and nvidia-smi lists a GPU)"
  fi
  [ $rc -eq 124 ] && verdict="FAIL (timeout ${secs}s)"
  printf '%-22s %s (rc %d, %ds)\n' "$name" "$verdict" $rc $((SECONDS - t0)) | tee -a "$OUT/summary.txt"
}

run_checks() {
  DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-330}))
  OUT=${OUT:-$ROOT/gpu-check-out}
  mkdir -p "$OUT"
  : >"$OUT/summary.txt"
  local sr=/tmp/sr-gpu
  if [ -f "$BUNDLE_DIR/shardrec-gpu.tar.xz" ]; then
    rm -rf "$sr"
    # tar's -J runs xz(1); an image without it unpacks through Python's lzma.
    tar -C /tmp -xJf "$BUNDLE_DIR/shardrec-gpu.tar.xz" 2>"$OUT/unpack.txt" ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("/tmp")' \
        "$BUNDLE_DIR/shardrec-gpu.tar.xz" 2>>"$OUT/unpack.txt" ||
      { echo "gpu_check: the bundle does not unpack (unpack.txt):" | tee -a "$OUT/summary.txt"
        tee -a "$OUT/summary.txt" <"$OUT/unpack.txt"; return 1; }
  elif [ -x "$ROOT/build-gpu/tools/shardrec" ]; then
    mkdir -p "$sr/bin" "$sr/lib"
    cp "$ROOT"/build-gpu/tools/shardrec "$ROOT"/build-gpu/tools/libshardrec_cuda.so \
      "$ROOT"/build-gpu/tests/cuda/test_* "$sr/bin/"
  else
    echo "gpu_check: no bundle (build-gpu-bundle/) and no build-gpu/: run 'tools/gpu_check.sh bundle' here first, or 'build-there'" | tee "$OUT/summary.txt"
    return 1
  fi
  export LD_LIBRARY_PATH="$sr/lib:$(cuda_libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -d "$sr/lib-fallback" ] && ! ldconfig -p 2>/dev/null | grep -q 'libstdc++.so.6 '; then
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$sr/lib-fallback"
  fi
  { nvidia-smi; nvidia-smi -q | sed -n '1,40p'; uname -a; cat /etc/os-release; ldd --version | head -1; } >"$OUT/gpu.txt" 2>&1
  ldd "$sr"/bin/* >"$OUT/ldd.txt" 2>&1
  if grep -q "not found" "$OUT/ldd.txt"; then
    echo "gpu_check: missing libraries (see ldd.txt):" | tee -a "$OUT/summary.txt"
    grep "not found" "$OUT/ldd.txt" | sort -u | tee -a "$OUT/summary.txt"
  fi
  GPUS=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
  # NCCL says why it fails only when asked.
  export CK_FORK=yes CK_DEFAULT_TIMEOUT=120 CK_TIMEOUT_MULTIPLIER=0.25 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  export SHARDREC_BIN="$sr/bin/shardrec"
  : >"$OUT/tests.log"
  : >"$OUT/bench.log"
  check test_collective 30 60 tests.log "$sr/bin/test_collective"
  check test_cuda_kernels 90 60 tests.log "$sr/bin/test_cuda_kernels"
  check test_cuda_model 120 60 tests.log "$sr/bin/test_cuda_model"
  check test_cuda_nccl 60 60 tests.log "$sr/bin/test_cuda_nccl"
  if [ "${GPU_CHECK_SKIP_TRAIN:-0}" != 1 ]; then
    check test_cuda_train 180 60 tests.log "$sr/bin/test_cuda_train"
  fi
  check "bench train (cuda)" 150 0 bench.log "$sr/bin/shardrec" bench train --device cuda --runs 3
  echo "== summary"
  cat "$OUT/summary.txt"
  ! grep -q FAIL "$OUT/summary.txt"
}

build_there() {
  OUT=${OUT:-$ROOT/gpu-check-out}
  mkdir -p "$OUT"
  local deps=/tmp/sr-deps
  mkdir -p "$deps"
  for f in "$ROOT"/build-gpu-debs/*.deb; do dpkg -x "$f" "$deps"; done
  # .pc files name prefix=/usr: point them at the unpacked tree.
  find "$deps" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$deps/usr|" {} +
  local pcs libs
  pcs=$(find "$deps" -type d -name pkgconfig | paste -sd:)
  libs=$(find "$deps" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)
  export PKG_CONFIG_PATH="$pcs" LD_LIBRARY_PATH="$libs:$(cuda_libs)" LIBRARY_PATH="$libs"
  export CPATH="$deps/usr/include:$deps/usr/include/cjson" PATH="$deps/usr/bin:$PATH"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" \
    >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target $TARGETS >>"$OUT/build.log" 2>&1 ||
    { echo "gpu_check: build failed (build.log)"; tail -30 "$OUT/build.log"; return 1; }
  run_checks
}

case "$MODE" in
  bundle) bundle ;;
  run) run_checks ;;
  build-there) build_there ;;
  *) echo "usage: tools/gpu_check.sh [bundle|run|build-there]" >&2; exit 2 ;;
esac
