"""An emulated Debian arm64 machine on a Debian x86-64 host: qemu-user through binfmt_misc, a debootstrap
root, and a venv in it with PyPI's aarch64 torch (a CPU build at 2.9.1; 2.13.0's aarch64 wheel is a CUDA
build that pulls GBs of CUDA packages).

Everything lives under one cache folder, so a second run skips the setup:

    <cache>/root            the Debian bookworm arm64 root (a .ready stamp once complete)
    <cache>/root/opt/base   venv: torch and the test tools, no bitsandbytes
    <cache>/root/opt/venv-<name>  per-checkout venvs on top of base (ensure_venv): core + CPU backend
    <cache>/wheels          the wheels base was installed from, mounted at /root/wheels inside (pip's own
                            cache cannot help: a proxy that sends no caching headers makes it keep nothing)

Commands run in a private mount namespace (``unshare --mount``): /proc, /sys, /dev, the checkout (at the
same absolute path as on the host) and the wheels folder are mounted for that command only and vanish with
it, so runs from several checkouts can share one root at once. Needs root (chroot, mount).

    python ci/arm64/root.py setup [--cache DIR]
    python ci/arm64/root.py shell [--cache DIR] [--venv NAME] [--cpu max] [--checkout DIR] -- COMMAND...
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(os.environ.get("BNB_ARM64_CACHE") or REPO / ".nox" / "arm64-cache")
SUITE = "bookworm"
MIRROR = os.environ.get("BNB_ARM64_MIRROR", "http://deb.debian.org/debian")
# What the root needs to build the CPU backend natively and to run the tests: Debian's Python 3.11.
ROOT_PACKAGES = ("python3", "python3-venv", "python3-dev", "cmake", "g++", "make", "ca-certificates")
HOST_PACKAGES = {
    "qemu-aarch64-static": "qemu-user-static",
    "update-binfmts": "binfmt-support",
    "debootstrap": "debootstrap",
    # The cross compiler of the aarch64 wheel (ci/arm64/cross.py); without it run.py builds in the root.
    "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
}
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
BASE = "/opt/base"
WHEELS = "/root/wheels"
# The host's CA bundle, copied in: pip inside must trust what the host trusts (a proxy's CA included).
CA_IN_ROOT = "/etc/ssl/certs/host-ca-bundle.crt"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def log(msg: str) -> None:
    print(f"[arm64] {msg}", flush=True)


def sh(*args: str, **kwargs) -> subprocess.CompletedProcess:
    log("$ " + shlex.join(args))
    return subprocess.run(args, check=True, **kwargs)


def ensure_host_tools() -> None:
    if os.geteuid() != 0:
        sys.exit("ci/arm64: needs root (apt-get, mount, chroot); run as root or in a root container")
    missing = sorted({pkg for tool, pkg in HOST_PACKAGES.items() if shutil.which(tool) is None})
    if not Path(DEBIAN_KEYRING).exists():  # an Ubuntu host (GitHub's runners) verifies Debian's release with it
        missing.append("debian-archive-keyring")
    if importlib.util.find_spec("ensurepip") is None:  # Debian's python3 makes venvs (the host build's) with it
        missing.append("python3-venv")
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh("apt-get", "update", "-q", env=env)
        sh("apt-get", "install", "-y", "-q", *missing, env=env)


def ensure_binfmt() -> None:
    """aarch64 ELF files run through qemu-aarch64-static. The F flag (Debian's default) opens the
    interpreter when registering, so it works inside the chroot without a copy of qemu there."""
    misc = Path("/proc/sys/fs/binfmt_misc")
    if not (misc / "register").exists():
        sh("mount", "binfmt_misc", "-t", "binfmt_misc", str(misc))
    entry = misc / "qemu-aarch64"
    if not entry.exists() or "enabled" not in entry.read_text():
        sh("update-binfmts", "--enable", "qemu-aarch64")
    if not entry.exists() or "enabled" not in entry.read_text():
        sys.exit(f"ci/arm64: binfmt_misc has no enabled qemu-aarch64 entry ({entry}); cannot run aarch64 programs")


def ensure_root(cache: Path) -> Path:
    root = cache / "root"
    if (root / ".ready").exists():
        return root
    tmp = cache / "root.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # an interrupted debootstrap: start over
    cache.mkdir(parents=True, exist_ok=True)
    include = ",".join(ROOT_PACKAGES)
    keyring = f"--keyring={DEBIAN_KEYRING}"
    sh("debootstrap", "--arch=arm64", "--variant=minbase", keyring, f"--include={include}", SUITE, str(tmp), MIRROR)
    if root.exists():
        shutil.rmtree(root)
    tmp.rename(root)
    (root / ".ready").write_text(f"debootstrap {SUITE} arm64 {include}\n")
    return root


def copy_host_config(root: Path) -> None:
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    bundle = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    shutil.copyfile(bundle, root / CA_IN_ROOT.lstrip("/"))


def root_env(cpu: str | None, extra: dict[str, str] | None = None, venv: str | None = None) -> dict[str, str]:
    path = f"{venv}/bin:{PATH}" if venv else PATH
    env = {
        "PATH": path,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PIP_CERT": CA_IN_ROOT,
        "SSL_CERT_FILE": CA_IN_ROOT,
        "REQUESTS_CA_BUNDLE": CA_IN_ROOT,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_DEFAULT_TIMEOUT": "180",
        "PYTHONDONTWRITEBYTECODE": "1",  # the checkout is shared with the host's x86 Python
    }
    if venv:
        env["VIRTUAL_ENV"] = venv
    if cpu:
        env["QEMU_CPU"] = cpu  # read by qemu-user at every aarch64 exec, children included
    return {**env, **(extra or {})}


def run_in_root(
    cache: Path,
    argv: list[str],
    *,
    cpu: str | None = "max",
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    venv: str | None = None,
    check: bool = True,
    checkout: Path = REPO,
) -> int:
    """Runs argv inside the root, the checkout mounted at its host path, in a mount namespace of its own."""
    root = cache / "root"
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    checkout = str(Path(checkout).resolve())
    mounts = [
        f"mount -t proc proc {q(root / 'proc')}",
        f"mount --rbind /sys {q(root / 'sys')}",
        f"mount --rbind /dev {q(root / 'dev')}",
        f"mkdir -p {q(str(root) + checkout)} && mount --bind {q(checkout)} {q(str(root) + checkout)}",
        f"mkdir -p {q(root / WHEELS.lstrip('/'))} && mount --bind {q(wheels)} {q(root / WHEELS.lstrip('/'))}",
    ]
    inner_env = root_env(cpu, env, venv)
    inner = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in inner_env.items()), *argv])
    script = " && ".join([*mounts, f"exec chroot {q(root)} sh -c {q(f'cd {q(cwd or checkout)} && exec {inner}')}"])
    log(f"(arm64{', QEMU_CPU=' + cpu if cpu else ''}) $ {shlex.join(argv)}")
    # Private propagation: nothing mounted here shows on the host, and it all goes when the command ends.
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return proc.returncode


def q(p: object) -> str:
    return shlex.quote(str(p))


def ensure_base_venv(cache: Path) -> None:
    """torch and the test tools, shared by every per-checkout venv."""
    root = cache / "root"
    stamp = root / BASE.lstrip("/") / ".requirements"
    wanted = REQUIREMENTS.read_text()
    if stamp.exists() and stamp.read_text() == wanted:
        return
    shutil.copyfile(REQUIREMENTS, root / "tmp" / "bnb-requirements.txt")
    run_in_root(cache, ["python3", "-m", "venv", "--clear", BASE], cwd="/")
    # Downloads kept in <cache>/wheels (pip skips files already there), then installed from there only.
    req = "/tmp/bnb-requirements.txt"
    run_in_root(cache, [f"{BASE}/bin/pip", "download", "-q", "-d", WHEELS, "-r", req], cwd="/")
    run_in_root(cache, [f"{BASE}/bin/pip", "install", "--no-index", "--find-links", WHEELS, "-r", req], cwd="/")
    stamp.write_text(wanted)


def ensure_venv(cache: Path, name: str) -> str:
    """A venv of this checkout's own whose site-packages also sees base's (a .pth line), so installing
    the core and the backend there never touches what another checkout installed into its venv."""
    venv = f"/opt/venv-{name}"
    host = cache / "root" / venv.lstrip("/")
    if not (host / "bin" / "python").exists():
        # No pip of its own (ensurepip takes minutes under qemu): base's, seen through the .pth, installs here.
        run_in_root(cache, ["python3", "-m", "venv", "--without-pip", venv], cwd="/")
    site = next((host / "lib").glob("python3*/site-packages"))
    base_site = next((cache / "root" / BASE.lstrip("/") / "lib").glob("python3*/site-packages"))
    (site / "_bnb_base.pth").write_text(f"/{base_site.relative_to(cache / 'root')}\n")
    return venv


def setup(cache: Path) -> Path:
    ensure_host_tools()
    ensure_binfmt()
    root = ensure_root(cache)
    copy_host_config(root)
    ensure_base_venv(cache)
    return root


def venv_name() -> str:
    return os.environ.get("BNB_ARM64_VENV") or REPO.name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["setup", "shell"])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--venv", help="name of the checkout's venv in the root (default: the checkout's folder name)")
    parser.add_argument("--cpu", default="max", help="QEMU_CPU: max, neoverse-n1, cortex-a76, cortex-a72, ...")
    parser.add_argument("--checkout", type=Path, default=REPO, help="the tree to mount (default: this one)")
    # Everything after `--` is the command (argparse would take a nargs="*" positional before the options).
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.argv = command
    setup(args.cache)
    if args.command == "setup":
        return 0
    venv = ensure_venv(args.cache, args.venv or os.environ.get("BNB_ARM64_VENV") or args.checkout.resolve().name)
    argv = args.argv or ["bash"]
    return run_in_root(args.cache, argv, cpu=args.cpu, venv=venv, check=False, checkout=args.checkout)


if __name__ == "__main__":
    sys.exit(main())
