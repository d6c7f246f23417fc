#!/usr/bin/env bash
# Packs what a GPU host without Node.js needs to run this repository's code, into .device/
# (git-ignored). Run from the repository root after `pnpm install --frozen-lockfile`:
#   bash tools/gpu-rig/scripts/pack.sh ENTRY.ts [ENTRY.ts ...]
# It writes
#   .device/node.xz, node.version   this machine's Node.js binary, xz-compressed (~25 MB)
#   .device/app/<entry>.mjs         one esbuild bundle per entry: the workspace packages bundled
#                                   from their TypeScript sources (no `tsc` build needed), koffi
#                                   and webgpu kept external
#   .device/app/node_modules/       koffi with its prebuilt linux-x64 part, webgpu's JavaScript
#                                   and its dawn.node (xz-compressed), onnxruntime-web's WebGPU
#                                   bundle and its WebAssembly (xz-compressed)
#   .device/debs/                   the Vulkan and EGL loader packages (amd64): the GPU host has
#                                   the NVIDIA driver but not the loaders Dawn opens
#   .device/setup.sh                source it on the GPU host, from the repository root: it
#                                   unpacks node, dawn.node and the loaders into a prefix
#                                   (CRISP_RIG_PREFIX, default /tmp/crisp-gpu-rig) and sets PATH,
#                                   LD_LIBRARY_PATH and the Vulkan/EGL driver files
# Copy the repository with .device/ to the GPU host (or carry .device/ where the host already
# has a checkout of the same commit), then there:
#   source .device/setup.sh && node .device/app/<entry>.mjs ...
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 ENTRY [ENTRY...]  (from the repository root)" >&2; exit 2; }
[ -f pnpm-workspace.yaml ] || { echo "$0: run from the repository root" >&2; exit 2; }
[ -d node_modules ] || { echo "$0: run pnpm install --frozen-lockfile first" >&2; exit 2; }
out=$PWD/.device
git check-ignore -q .device/ 2>/dev/null || echo "warning: .device/ is not git-ignored here" >&2
mkdir -p "$out/app/node_modules" "$out/debs"

# 1. Node.js, compressed; redone only when the version changes.
ver=$(node --version)
if [ "$(cat "$out/node.version" 2>/dev/null)" != "$ver" ] || [ ! -s "$out/node.xz" ]; then
  xz -T0 -6 -c "$(command -v node)" > "$out/node.xz.tmp"
  mv "$out/node.xz.tmp" "$out/node.xz"
  echo "$ver" > "$out/node.version"
fi

# 2. The bundles. `@crisp/source` resolves the workspace packages to their src/*.ts (as
# apps/bench/scripts/bundle.mjs does); CommonJS dependencies get a require().
esbuild=node_modules/.bin/esbuild
[ -x "$esbuild" ] || { echo "$0: $esbuild missing (pnpm install)" >&2; exit 1; }
# The crisp command's version goes into the bundle (apps/cli/src/version.ts): there is no
# apps/cli/package.json beside the bundle on the GPU host.
cli_version=$(node -p 'JSON.stringify(require("./apps/cli/package.json").version)')
for entry in "$@"; do
  [ -f "$entry" ] || { echo "$0: no such entry: $entry" >&2; exit 2; }
  name=$(basename "${entry%.*}")
  "$esbuild" "$entry" --bundle --platform=node --format=esm --target=node20 \
    --conditions=@crisp/source --external:koffi --external:webgpu --sourcemap=inline \
    --define:__CRISP_CLI_VERSION__="$cli_version" \
    --banner:js="import { createRequire as __crispRequire } from 'node:module'; const require = __crispRequire(import.meta.url);" \
    --outfile="$out/app/$name.mjs" --log-level=warning
  echo "bundle: .device/app/$name.mjs"
done

# 3. The native packages the bundles keep external, links resolved. pnpm links each one
# into the node_modules of the packages that depend on it.
find_pkg() {
  local d
  for d in tools/gpu-rig packages/kernels-cuda packages/kernels-webgpu apps/bench .; do
    if [ -f "$d/node_modules/$1/package.json" ]; then realpath "$d/node_modules/$1"; return; fi
  done
}
koffi=$(find_pkg koffi)
[ -n "$koffi" ] || { echo "$0: koffi not found in node_modules" >&2; exit 1; }
# koffi loads its prebuilt part from the sibling folder node_modules/@koromix/koffi-<platform>
koffi_native=$(dirname "$koffi")/@koromix/koffi-linux-x64
[ -f "$koffi_native/linux_x64/koffi.node" ] || { echo "$0: $koffi_native/linux_x64/koffi.node missing" >&2; exit 1; }
rm -rf "$out/app/node_modules/koffi" "$out/app/node_modules/@koromix"
cp -rL "$koffi" "$out/app/node_modules/koffi"
mkdir -p "$out/app/node_modules/@koromix"
cp -rL "$koffi_native" "$out/app/node_modules/@koromix/koffi-linux-x64"

webgpu=$(find_pkg webgpu)
[ -n "$webgpu" ] || { echo "$0: webgpu not found in node_modules" >&2; exit 1; }
dawn=$webgpu/dist/linux-x64/dawn.node
[ -f "$dawn" ] || { echo "$0: $dawn missing" >&2; exit 1; }
w=$out/app/node_modules/webgpu
rm -rf "$w" && mkdir -p "$w/dist/linux-x64"
cp "$webgpu"/package.json "$webgpu"/*.js "$w/"
cp "$webgpu"/*.d.ts "$w/" 2>/dev/null || true
# setup.sh decompresses it in place (21 MB -> ~6 MB)
xz -T0 -6 -c "$dawn" > "$w/dist/linux-x64/dawn.node.xz"

# onnxruntime-web's WebGPU build (crisp-bench's ORT Web peer imports it at run time): its
# package.json, the self-contained bundle and the WebAssembly it loads (xz-compressed,
# 27 MB -> ~4 MB; setup.sh decompresses it in place).
ortweb=$(find_pkg onnxruntime-web)
if [ -n "$ortweb" ]; then
  ow=$out/app/node_modules/onnxruntime-web
  rm -rf "$ow" && mkdir -p "$ow/dist"
  cp "$ortweb"/package.json "$ow/"
  cp "$ortweb"/dist/ort.webgpu.bundle.min.mjs "$ortweb"/dist/ort-wasm-simd-threaded.asyncify.mjs "$ow/dist/"
  xz -T0 -6 -c "$ortweb"/dist/ort-wasm-simd-threaded.asyncify.wasm > "$ow/dist/ort-wasm-simd-threaded.asyncify.wasm.xz"
else
  echo "warning: onnxruntime-web not found in node_modules: crisp-bench's ORT Web peer will be absent on the GPU host" >&2
fi

# 4. The Vulkan and EGL loaders, amd64 packages from this machine's apt sources, with their
# own package lists so the host's apt state is left alone. Downloaded once.
debs=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
missing=()
for p in "${debs[@]}"; do ls "$out/debs/${p}"_*_amd64.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  lists=${TMPDIR:-/tmp}/crisp-gpu-rig-apt-lists
  mkdir -p "$lists/partial"
  apt=(-o APT::Sandbox::User=root -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o "Dir::State::Lists=$lists")
  apt-get "${apt[@]}" update >/dev/null 2>&1 || echo "warning: apt-get update failed" >&2
  (cd "$out/debs" && apt-get "${apt[@]}" download "${missing[@]}" >/dev/null) \
    || echo "warning: not all of ${missing[*]} downloaded: WebGPU on the GPU host needs a Vulkan loader there" >&2
fi

# 5. setup.sh, sourced on the GPU host from the repository root.
cat > "$out/setup.sh" <<'SETUP'
# source .device/setup.sh   (on the GPU host, from the repository root; written by
# tools/gpu-rig/scripts/pack.sh). Unpacks node, dawn.node and the Vulkan/EGL loaders into
# CRISP_RIG_PREFIX (default /tmp/crisp-gpu-rig), once, and sets up this shell to use them.
_rig_dev=$(pwd)/.device
_rig_prefix=${CRISP_RIG_PREFIX:-/tmp/crisp-gpu-rig}
mkdir -p "$_rig_prefix/bin"
# Node.js
if [ "$("$_rig_prefix/bin/node" --version 2>/dev/null)" != "$(cat "$_rig_dev/node.version")" ]; then
  xz -dc "$_rig_dev/node.xz" > "$_rig_prefix/bin/node.tmp" && chmod +x "$_rig_prefix/bin/node.tmp" \
    && mv "$_rig_prefix/bin/node.tmp" "$_rig_prefix/bin/node"
fi
case ":$PATH:" in *":$_rig_prefix/bin:"*) ;; *) export PATH="$_rig_prefix/bin:$PATH" ;; esac
# dawn.node beside webgpu's index.js, where it loads it from
_rig_dawn=$_rig_dev/app/node_modules/webgpu/dist/linux-x64/dawn.node
if [ -f "$_rig_dawn.xz" ] && { [ ! -s "$_rig_dawn" ] || [ "$_rig_dawn.xz" -nt "$_rig_dawn" ]; }; then
  xz -dc "$_rig_dawn.xz" > "$_rig_dawn.tmp" && mv "$_rig_dawn.tmp" "$_rig_dawn"
fi
# onnxruntime-web's WebAssembly beside its bundle
_rig_ortw=$_rig_dev/app/node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm
if [ -f "$_rig_ortw.xz" ] && { [ ! -s "$_rig_ortw" ] || [ "$_rig_ortw.xz" -nt "$_rig_ortw" ]; }; then
  xz -dc "$_rig_ortw.xz" > "$_rig_ortw.tmp" && mv "$_rig_ortw.tmp" "$_rig_ortw"
fi
# The loaders: the system's when it has them, else the packed ones, unpacked into the prefix
_rig_lib=$_rig_prefix/root/usr/lib/x86_64-linux-gnu
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; then
  if [ ! -e "$_rig_lib/libvulkan.so.1" ] && ls "$_rig_dev"/debs/*.deb >/dev/null 2>&1; then
    for _rig_deb in "$_rig_dev"/debs/*.deb; do dpkg-deb -x "$_rig_deb" "$_rig_prefix/root"; done
  fi
  [ -e "$_rig_lib/libvulkan.so.1" ] || echo "setup: no Vulkan loader (libvulkan.so.1): WebGPU will find no adapter" >&2
fi
# (libcuda and NVRTC for the CUDA backend: the driver's and the toolkit's folders)
for _rig_d in /usr/local/cuda/lib64 /usr/local/nvidia/lib64 "$_rig_lib"; do
  case ":${LD_LIBRARY_PATH:-}:" in *":$_rig_d:"*) ;; *) [ -d "$_rig_d" ] && export LD_LIBRARY_PATH=$_rig_d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
done
# NVIDIA's Vulkan ICD and EGL vendor files: the driver's own when installed (container
# runtimes put them under /usr/local/nvidia), else, where the driver's libraries are there,
# written into the prefix.
_rig_find() { for _rig_f in "$@"; do [ -f "$_rig_f" ] && { echo "$_rig_f"; return; }; done; }
_rig_icd=$(_rig_find /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
  /usr/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.x86_64.json)
_rig_has() { ldconfig -p 2>/dev/null | grep -q "$1 " || [ -e "/usr/local/nvidia/lib64/$1" ] || [ -e "/usr/lib/x86_64-linux-gnu/$1" ]; }
if [ -z "$_rig_icd" ] && _rig_has libGLX_nvidia.so.0; then
  _rig_icd=$_rig_prefix/nvidia_icd.json
  printf '{ "file_format_version": "1.0.0", "ICD": { "library_path": "libGLX_nvidia.so.0", "api_version": "1.3.0" } }\n' > "$_rig_icd"
fi
[ -n "$_rig_icd" ] && export VK_DRIVER_FILES=$_rig_icd VK_ICD_FILENAMES=$_rig_icd
_rig_egl=$(_rig_find /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json /etc/glvnd/egl_vendor.d/10_nvidia.json \
  /usr/share/glvnd/egl_vendor.d/10_nvidia.json)
if [ -z "$_rig_egl" ] && _rig_has libEGL_nvidia.so.0; then
  _rig_egl=$_rig_prefix/10_nvidia.json
  printf '{ "file_format_version": "1.0.0", "ICD": { "library_path": "libEGL_nvidia.so.0" } }\n' > "$_rig_egl"
fi
[ -n "$_rig_egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$_rig_egl
if node --version >/dev/null 2>&1; then
  echo "setup: node $(node --version)$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/, /')"
else
  echo "setup: node from .device/node.xz does not run here" >&2
fi
unset _rig_dev _rig_prefix _rig_dawn _rig_lib _rig_deb _rig_d _rig_f _rig_icd _rig_egl
unset -f _rig_find _rig_has
SETUP
du -sh "$out" | sed 's/^/packed: /'
