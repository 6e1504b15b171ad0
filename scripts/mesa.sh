#!/usr/bin/env bash
# What the wgpu tests need, installed on first use: Mesa's llvmpipe, a software GPU, reached by
# wgpu through OpenGL ES on EGL. Mesa 25 from Debian's bookworm-backports: Debian 12's own Mesa
# was not verified for these shaders (NOTES.md "GPUs: facts"). Vulkan's software driver
# (lavapipe) is not installed: its shader compiler crashes on Burn's reduce kernels.
set -euo pipefail
have() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null | grep -q '^25\.'; }
if have libegl-mesa0 && have libgl1-mesa-dri; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo -n); else
  echo "mesa.sh: installing Mesa needs root (apt-get)" >&2
  exit 1
fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" = bookworm ]; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" | "${sudo[@]}" tee /etc/apt/sources.list.d/llaisys-backports.list >/dev/null
  target=(-t bookworm-backports)
else
  target=()
fi
echo "mesa.sh: installing Mesa (EGL, llvmpipe)" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${target[@]}" \
  libegl1 libegl-mesa0 libgl1-mesa-dri libgles2 >&2
