#!/usr/bin/env bash
# cibuildwheel before-all for bitsandbytes-cuda in manylinux_2_28 (AlmaLinux 8): nvcc and the static
# runtime from NVIDIA's RHEL 8 repository. 12.8 is the first release that targets sm_100 and sm_120.
set -euo pipefail
# The same version as the nvcc path in [tool.cibuildwheel.linux] environment.
CUDA_VERSION=12-8
case "$(uname -m)" in
  x86_64) repo_arch=x86_64 ;;
  aarch64) repo_arch=sbsa ;;
  *) echo "no CUDA toolkit for $(uname -m)" >&2; exit 1 ;;
esac
dnf install -y dnf-plugins-core
dnf config-manager --add-repo "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${repo_arch}/cuda-rhel8.repo"
# No driver package: the library links cudart statically and never the driver (auditwheel excludes it).
dnf install -y "cuda-nvcc-${CUDA_VERSION}" "cuda-cudart-devel-${CUDA_VERSION}"
/usr/local/cuda-12.8/bin/nvcc --version
