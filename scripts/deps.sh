#!/usr/bin/env bash
# scripts/deps.sh - installs the Debian packages gradwire builds, tests and
# benchmarks with (Open MPI and Gloo are the peers bench/ compares against), only when some are missing (safe to rerun; no network use when
# everything is there).  Sourced by run.sh and test.sh.
gw_install_deps() {
  # The model (oneDNN), the verbs transport, the trainer's data (zlib for the
  # IDX .gz files, libjpeg-turbo, Fashion-MNIST itself) and its plots (gnuplot).
  # PyTorch and torchvision (Debian's, CPU): the torchvision-roundtrip test
  # (our ResNet-50 weights loaded strictly by torchvision and back, bit for bit)
  # and the fixture scripts; about 175 packages, installed once.
  local pkgs=(meson ninja-build pkg-config gcc libc6-dev check python3 iproute2 util-linux
              libopenmpi-dev openmpi-bin g++ libgloo-dev clang libclang-rt-14-dev
              libdnnl-dev libibverbs-dev librdmacm-dev zlib1g-dev libturbojpeg0-dev
              dataset-fashion-mnist gnuplot-nox python3-torch python3-torchvision)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q >/dev/null || { echo "apt-get update failed" >&2; return 1; }
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "apt-get install ${missing[*]} failed" >&2; return 1; }
}

# Configures DIR (default build/; warnings are errors, as in CI) with any extra
# meson options, and compiles it.
gw_build() {
  local dir="${1:-build}"
  shift || true
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" -Dwerror=true "$@" >/dev/null || return 1
  else
    meson setup "$dir" -Dwerror=true "$@" >/dev/null || return 1
  fi
  meson compile -C "$dir" >/dev/null || meson compile -C "$dir"
}
