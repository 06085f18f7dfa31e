# shellcheck shell=bash
# Source me: `source scripts/env.sh`. Sets up paths for the venv, tritonserver and perf_analyzer.
# Works from any current directory; does not change shell options of the caller.
_specgram_env_dir="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export REPO="$(cd "$_specgram_env_dir/.." && pwd)"
unset _specgram_env_dir
export VENV="$REPO/.venv"
case ":${PATH}:" in
  *":$VENV/bin:"*) ;;
  *) export PATH="$VENV/bin:$PATH" ;;
esac
# perf_analyzer needs libb64.so.0d and libcudart.so.12 (symlinks made by scripts/setup.sh)
case ":${LD_LIBRARY_PATH:-}:" in
  *":$REPO/build/lib:"*) ;;
  *) export LD_LIBRARY_PATH="$REPO/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
esac
export SITE_PACKAGES="$VENV/lib/python3.11/site-packages"
export TRITON_BIN="$SITE_PACKAGES/pytriton/tritonserver/bin/tritonserver"
export TRITON_BACKENDS="$REPO/build/triton/backends"
