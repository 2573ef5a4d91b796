# cibuildwheel before-all for bitsandbytes-cuda on Windows AMD64: NVIDIA's network installer, silent, with
# only nvcc, the runtime and the Visual Studio integration (CMake's Visual Studio generator needs it).
# CUDA_PATH in [tool.cibuildwheel.windows] environment must name the same version.
$ErrorActionPreference = "Stop"
$version = "12.8.1"
$short = "12.8"
$installer = Join-Path ([System.IO.Path]::GetTempPath()) "cuda_network.exe"
$url = "https://developer.download.nvidia.com/compute/cuda/$version/network_installers/cuda_${version}_windows_network.exe"
Invoke-WebRequest -Uri $url -OutFile $installer
$parts = @("nvcc_$short", "cudart_$short", "visual_studio_integration_$short")
$proc = Start-Process -FilePath $installer -ArgumentList (@("-s") + $parts) -Wait -PassThru
if ($proc.ExitCode -ne 0) { throw "CUDA installer exited with $($proc.ExitCode)" }
& "C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v$short\bin\nvcc.exe" --version
