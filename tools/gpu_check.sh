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
#      Built on Debian 12; the binaries need GLIBC_2.34 at most.
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
#      and $OUT/summary.txt with one PASS/FAIL/SKIP line per check.
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

# run NAME SECONDS CMD...: one check, its output appended to tests.log.
check() {
  local name=$1 secs=$2; shift 2
  echo "== $name" | tee -a "$OUT/tests.log"
  local t0=$SECONDS
  timeout "$secs" "$@" >>"$OUT/tests.log" 2>&1
  local rc=$?
  local verdict=FAIL
  [ $rc -eq 0 ] && verdict=PASS
  [ $rc -eq 77 ] && verdict=SKIP
  [ $rc -eq 124 ] && verdict="FAIL (timeout ${secs}s)"
  printf '%-22s %s (rc %d, %ds)\n' "$name" "$verdict" $rc $((SECONDS - t0)) | tee -a "$OUT/summary.txt"
}

run_checks() {
  OUT=${OUT:-$ROOT/gpu-check-out}
  mkdir -p "$OUT"
  local sr=/tmp/sr-gpu
  if [ -f "$BUNDLE_DIR/shardrec-gpu.tar.xz" ]; then
    rm -rf "$sr" && tar -C /tmp -xJf "$BUNDLE_DIR/shardrec-gpu.tar.xz"
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
  export CK_FORK=yes CK_DEFAULT_TIMEOUT=120 SHARDREC_BIN="$sr/bin/shardrec"
  : >"$OUT/tests.log"
  check test_collective 60 "$sr/bin/test_collective"
  check test_cuda_kernels 180 "$sr/bin/test_cuda_kernels"
  check test_cuda_model 240 "$sr/bin/test_cuda_model"
  check test_cuda_nccl 120 "$sr/bin/test_cuda_nccl"
  if [ "${GPU_CHECK_SKIP_TRAIN:-0}" != 1 ]; then
    check test_cuda_train 300 "$sr/bin/test_cuda_train"
  fi
  echo "== shardrec bench train --device cuda" | tee "$OUT/bench.log"
  timeout 240 "$sr/bin/shardrec" bench train --device cuda --runs 3 >>"$OUT/bench.log" 2>&1
  printf '%-22s rc %d\n' "bench train (cuda)" $? | tee -a "$OUT/summary.txt"
  cat "$OUT/summary.txt"
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
