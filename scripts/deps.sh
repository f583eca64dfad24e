#!/usr/bin/env bash
# scripts/deps.sh - installs the Debian packages gradwire builds, tests and
# benchmarks with (Open MPI and Gloo are the peers bench/ compares against), only when some are missing (safe to rerun; no network use when
# everything is there).  Sourced by run.sh and test.sh.
gw_install_deps() {
  # The model (oneDNN), the verbs transport, the trainer's data (zlib for the
  # IDX .gz files, libjpeg-turbo and libpng for image folders, Fashion-MNIST
  # itself) and its plots (gnuplot).
  # PyTorch and torchvision (Debian's, CPU): the torchvision-roundtrip test
  # (our ResNet-50 weights loaded strictly by torchvision and back, bit for bit)
  # and the fixture scripts; about 175 packages, installed once.
  local pkgs=(meson ninja-build pkg-config gcc libc6-dev check python3 iproute2 util-linux
              libopenmpi-dev openmpi-bin g++ libgloo-dev clang libclang-rt-14-dev
              libdnnl-dev libibverbs-dev librdmacm-dev zlib1g-dev libturbojpeg0-dev libpng-dev
              dataset-fashion-mnist gnuplot-nox python3-torch python3-torchvision)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null || ! sudo -n apt-get --version >/dev/null 2>&1; then
      echo "missing Debian packages, and this user cannot install them (not root, no password-less sudo): as root," \
        "run: apt-get install ${missing[*]}" >&2
      return 1
    fi
    sudo=(sudo -n)
  fi
  # A fresh machine's dpkg lock is waited for.  A source that cannot be
  # fetched (apt-get update exits 0 for most) is shown when the install then
  # fails, which says only "Unable to locate package".
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Acquire::Retries=3
             -o Acquire::http::Timeout=30 -o DPkg::Lock::Timeout=300)
  local log
  log=$(mktemp)
  "${apt[@]}" update >"$log" 2>&1 || echo "apt-get update failed (trying the install anyway)" >&2
  if ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    grep -E "^(W|E|Err):" "$log" | tail -n 12 >&2
    rm -f "$log"
    echo "apt-get install ${missing[*]} failed: is Debian's package archive reachable (network, proxy," \
      "/etc/apt/sources.list)? (above: apt's warnings and errors)" >&2
    return 1
  fi
  rm -f "$log"
}

# Configures DIR (default build/; warnings are errors, as in CI) with any extra
# meson options, and compiles it.
gw_build() {
  local dir="${1:-build}"
  shift || true
  local setup=(meson setup "$dir" -Dwerror=true "$@") log
  [ -f "$dir/build.ninja" ] && setup=(meson setup --reconfigure "$dir" -Dwerror=true "$@")
  log=$(mktemp)
  # meson prints its ERROR lines on stdout: shown when the setup fails
  if ! "${setup[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -f "$log"
    echo "meson setup $dir failed (above)" >&2
    return 1
  fi
  rm -f "$log"
  meson compile -C "$dir" >/dev/null || meson compile -C "$dir"
}
