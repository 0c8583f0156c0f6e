#!/usr/bin/env bash
# Installs the build tools when they are missing (Debian/Ubuntu, as root or with sudo).
set -euo pipefail
packages=()
command -v cmake >/dev/null || packages+=(cmake)
command -v ninja >/dev/null || packages+=(ninja-build)
command -v g++ >/dev/null || packages+=(g++)
[ -f /usr/include/gtest/gtest.h ] || packages+=(libgtest-dev)
[ -n "$(find /usr/lib /usr/lib64 -name 'libgomp.so*' 2>/dev/null | head -n 1)" ] || packages+=(libgomp1)
if [ ${#packages[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${packages[@]}"
fi
