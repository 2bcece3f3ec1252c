"""``vagrant validate`` accepts the Vagrantfile for both of its providers, offline.

Validation needs neither the box (it is never downloaded) nor a running hypervisor, with one
exception: Vagrant refuses to validate for VirtualBox unless ``VBoxManage --version`` answers,
and VirtualBox is not a Debian package. A two-line ``VBoxManage`` on PATH gives that answer,
which is all validation asks of it; the VirtualBox block itself is then checked by Vagrant's own
VirtualBox provider. The libvirt block is checked by the ``vagrant-libvirt`` plugin (Debian
package), and skipped with a reason where the plugin is missing.

Vagrant writes only under ``tmp_path`` here (``VAGRANT_HOME``, ``VAGRANT_DOTFILE_PATH``), and
its version check and box update check, which would go to the network, are off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VAGRANTFILE = REPO / "Vagrantfile"
PROVIDERS = ("virtualbox", "libvirt")
# A version Vagrant 2.3's VirtualBox provider supports.
VBOXMANAGE = "#!/bin/sh\necho 7.0.14r161095\n"
VALIDATE_TIMEOUT_S = 120.0

needs_vagrant = pytest.mark.skipif(
    shutil.which("vagrant") is None,
    reason="vagrant is not installed (Debian packages vagrant and vagrant-libvirt; "
    ".ci/run installs them)",
)


@pytest.fixture(scope="module")
def vagrant_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One VAGRANT_HOME for the module: Vagrant sets a new one up on first use (~1 s)."""
    return tmp_path_factory.mktemp("vagrant.d")


def _validate(
    project: Path, provider: str, tmp: Path, home: Path
) -> subprocess.CompletedProcess[str]:
    stub_bin = tmp / "bin"
    stub_bin.mkdir(exist_ok=True)
    vboxmanage = stub_bin / "VBoxManage"
    vboxmanage.write_text(VBOXMANAGE)
    vboxmanage.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stub_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "VAGRANT_CWD": str(project),
        "VAGRANT_DOTFILE_PATH": str(tmp / "dotfile"),
        "VAGRANT_HOME": str(home),
        "VAGRANT_DEFAULT_PROVIDER": provider,
        "VAGRANT_CHECKPOINT_DISABLE": "1",
        "VAGRANT_BOX_UPDATE_CHECK_DISABLE": "1",
    }
    res = subprocess.run(
        ["vagrant", "validate", "--no-color", "--no-tty"],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=VALIDATE_TIMEOUT_S,
    )
    out = res.stdout + res.stderr
    if res.returncode != 0 and f"provider '{provider}' could not be found" in out:
        pytest.skip(f"Vagrant has no {provider} provider here (for libvirt: vagrant-libvirt)")
    return res


@needs_vagrant
@pytest.mark.parametrize("provider", PROVIDERS)
def test_vagrant_validates_the_vagrantfile(
    provider: str, tmp_path: Path, vagrant_home: Path
) -> None:
    res = _validate(REPO, provider, tmp_path, vagrant_home)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout


@needs_vagrant
@pytest.mark.parametrize(
    ("provider", "block"), [("virtualbox", "vb.cpus = 2"), ("libvirt", "lv.cpus = 2")]
)
def test_vagrant_rejects_a_setting_its_provider_lacks(
    provider: str, block: str, tmp_path: Path, vagrant_home: Path
) -> None:
    # The same file with one setting the provider does not have: validation must see it, so
    # the passing test above checks that provider's block and not only Vagrant's syntax.
    text = VAGRANTFILE.read_text()
    assert text.count(block) == 1, f"{block!r} not found once in the Vagrantfile"
    prefix = block.split(".")[0]
    project = tmp_path / "project"
    project.mkdir()
    (project / "Vagrantfile").write_text(
        text.replace(block, f"{block}\n    {prefix}.no_such_setting = 1")
    )
    res = _validate(project, provider, tmp_path, vagrant_home)
    assert res.returncode != 0
    assert "no_such_setting" in res.stdout + res.stderr


def test_the_vagrantfile_uses_the_debian_box_and_provisions_with_lab_setup_sh() -> None:
    text = VAGRANTFILE.read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text
    assert text.count('config.vm.provision "shell"') == 1
    assert "bash /vagrant/lab/setup.sh" in text
