"""lab.freshcheck's pure parts: reading the Vagrantfile's provisioning (checked against Ruby
itself where Ruby is installed), the README's quick test command, the arguments, the guest's
boot pieces (module order, QEMU's command line) and the wheelhouse's server. The check itself
boots a VM and provisions it (about 15 minutes under TCG before its tests), so it is run by
hand (docs/freshcheck.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import pytest

from lab import freshcheck
from lab.fresh import rootfs, wheelhouse
from lab.fresh.guest import (
    ROOT_MODULES,
    Forward,
    GuestError,
    MachineSpec,
    init_script,
    module_load_order,
    qemu_argv,
)
from lab.fresh.readme import (
    FALLBACK_COMMAND,
    MARKER,
    ReadmeError,
    load_quick_test_command,
    quick_test_command,
)
from lab.fresh.rubylit import RubySubsetError, tokenize
from lab.fresh.vagrantfile import (
    ShellProvisioner,
    VagrantfileError,
    load_vagrantfile,
    read_vagrantfile,
)
from lab.vm import Accel, GuestKernel

REPO = Path(__file__).resolve().parent.parent
RUBY = shutil.which("ruby")

# Ruby evaluates the Vagrantfile with a stand-in for Vagrant that records every provision call:
# the reference the Python reader must agree with.
RUBY_RECORDER = r"""
require "json"
$provs = []
class Rec
  def initialize(h = {}); @h = h; end
  def h; @h; end
  def respond_to_missing?(*); true; end
  def method_missing(n, *a, **kw, &b)
    s = n.to_s
    if s.end_with?("=")
      @h[s.chomp("=")] = a[0]
      return a[0]
    end
    if s == "provision"
      o = Rec.new({"type" => a[0].to_s}.merge(kw.transform_keys(&:to_s)))
      b.call(o) if b
      $provs << o.h
      return o
    end
    b.call(Rec.new) if b
    Rec.new
  end
end
module Vagrant
  def self.configure(_v); yield Rec.new; end
end
load ARGV[0]
puts JSON.generate($provs.map { |h| h.transform_values { |v| v.is_a?(Symbol) ? v.to_s : v } })
"""


def ruby_provisioners(vagrantfile: Path, tmp_path: Path) -> list[dict]:
    recorder = tmp_path / "recorder.rb"
    recorder.write_text(RUBY_RECORDER)
    out = subprocess.run(
        [RUBY, str(recorder), str(vagrantfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=vagrantfile.parent,
    ).stdout
    return json.loads(out)


def agree_with_ruby(source: str, tmp_path: Path) -> None:
    """Where Ruby is installed: the reader's scripts, env and privilege are Ruby's."""
    if RUBY is None:
        return
    vf_path = tmp_path / "Vagrantfile"
    vf_path.write_text(source)
    ours = read_vagrantfile(source, tmp_path).provisioners
    theirs = [p for p in ruby_provisioners(vf_path, tmp_path) if p.get("run") != "never"]
    assert len(ours) == len(theirs)
    for p, r in zip(ours, theirs, strict=True):
        if "inline" in r:  # Vagrant uploads the script with LF line ends
            assert p.script == re.sub(r"\r\n?", "\n", r["inline"])
        else:
            assert p.script == (tmp_path / r["path"]).read_text()
        assert dict(p.env) == {k: str(v) for k, v in r.get("env", {}).items()}
        assert p.privileged == r.get("privileged", True)


def vagrantfile(body: str) -> str:
    return 'Vagrant.configure("2") do |config|\n' + textwrap.dedent(body) + "end\n"


# -- the real Vagrantfile ----------------------------------------------------------------------


def test_the_project_vagrantfile_runs_lab_setup(tmp_path: Path) -> None:
    vf = load_vagrantfile(REPO / "Vagrantfile")
    assert vf.provisioners, "the Vagrantfile provisions with a shell provisioner"
    assert any("lab/setup.sh" in p.script for p in vf.provisioners)
    assert vf.forwarded_ports and vf.forwarded_ports[0].guest > 0
    agree_with_ruby((REPO / "Vagrantfile").read_text(), tmp_path)


@pytest.mark.skipif(RUBY is None, reason="needs ruby (Debian package ruby) as the reference")
def test_the_project_vagrantfile_reads_as_ruby_reads_it(tmp_path: Path) -> None:
    ours = load_vagrantfile(REPO / "Vagrantfile").provisioners
    theirs = ruby_provisioners(REPO / "Vagrantfile", tmp_path)
    assert [p.script for p in ours] == [r.get("inline") for r in theirs if "inline" in r]


# -- tricky samples ----------------------------------------------------------------------------

SAMPLES = {
    "continued adjacent literals": (
        """\
        config.vm.provision "shell",
          inline: "A=1 B='two' " \\
                  "bash /vagrant/x.sh"
        """,
        "A=1 B='two' bash /vagrant/x.sh",
    ),
    "plus across lines": (
        """\
        config.vm.provision :shell, inline: "echo one; " +
          'echo two'
        """,
        "echo one; echo two",
    ),
    "squiggly heredoc with more on the call line": (
        """\
        config.vm.provision "shell", privileged: true, inline: <<~SHELL
            set -e
              echo "indented \\t tab"
            echo done
          SHELL
        """,
        'set -e\n  echo "indented \t tab"\necho done\n',
    ),
    "dash heredoc keeps indentation": (
        """\
        config.vm.provision "shell", inline: <<-EOS
          echo a
          EOS
        """,
        "  echo a\n",
    ),
    "quoted heredoc is raw": (
        """\
        config.vm.provision "shell", inline: <<~'EOS'
          echo "#{not_ruby}" \\n
        EOS
        """,
        'echo "#{not_ruby}" \\n\n',
    ),
    "single quotes keep backslashes": (
        """\
        config.vm.provision "shell", inline: 'it\\'s \\n raw\\\\'
        """,
        "it's \\n raw\\",
    ),
    "double-quoted escapes": (
        """\
        config.vm.provision "shell", inline: "a\\tb \\u00e9 \\x41 \\\\ \\" \\#{x}"
        """,
        'a\tb \u00e9 A \\ " #{x}',
    ),
    "hash rocket and parentheses": (
        """\
        config.vm.provision("shell", :inline => "echo rocket")
        """,
        "echo rocket",
    ),
    "block form": (
        """\
        config.vm.provision "shell" do |s|
          s.inline = "echo block"
          s.privileged = false
        end
        """,
        "echo block",
    ),
    "named provisioner with type": (
        """\
        config.vm.provision "bootstrap", type: "shell", inline: "echo named"
        """,
        "echo named",
    ),
    "comments with quotes and a block comment": (
        """\
        # don't be fooled by "quotes" here
        =begin
        config.vm.provision "shell", inline: "never seen"
        =end
        config.vm.provision "shell", inline: "echo real" # it's the real one
        """,
        "echo real",
    ),
    "CRLF line ends become LF": (
        'config.vm.provision "shell", inline: "a\\r\\nb\\r\\n"\n',
        "a\nb\n",
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_inline_scripts_are_read_as_ruby_reads_them(name: str, tmp_path: Path) -> None:
    body, expected = SAMPLES[name]
    source = vagrantfile(body)
    (p,) = read_vagrantfile(source, tmp_path).provisioners
    assert p.script == expected
    agree_with_ruby(source, tmp_path)


def test_block_form_privileged_false_runs_without_sudo() -> None:
    (p,) = read_vagrantfile(vagrantfile(SAMPLES["block form"][0])).provisioners
    assert not p.privileged and p.shell() == "bash -l"


def test_path_env_and_args_make_vagrants_command(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "go.sh").write_text("echo from a file\r\n")
    source = vagrantfile(
        """\
        config.vm.provision "shell", path: "scripts/go.sh",
          env: {"GREETING" => 'say "hi"', COUNT: 3}, args: ["a b", "c"]
        config.vm.provision "shell", inline: "echo later", run: "never"
        """
    )
    (p,) = read_vagrantfile(source, tmp_path).provisioners
    assert p.script == "echo from a file\n"
    assert p.env == (("GREETING", 'say "hi"'), ("COUNT", "3"))
    # Vagrant's quote_and_escape: a double quote inside becomes "\"" (close, escaped, reopen)
    assert p.command() == (
        'chmod +x \'/tmp/vagrant-shell\' && GREETING="say "\\""hi"\\""" COUNT="3" '
        '/tmp/vagrant-shell "a b" "c"'
    )
    assert p.shell() == "sudo -E -H bash -l"
    agree_with_ruby(source, tmp_path)


def test_vagrant_command_runs_the_uploaded_script_in_a_shell(tmp_path: Path) -> None:
    """The command line is real shell: run it against a script in a temporary upload path."""
    upload = tmp_path / "vagrant-shell"
    upload.write_text('printf "%s|%s|%s" "$GREETING" "$1" "$2"')
    p = ShellProvisioner(
        "", env=(("GREETING", 'say "hi"'),), args=' "a b" "c"', upload_path=str(upload)
    )
    out = subprocess.run(["bash", "-c", p.command()], capture_output=True, text=True, check=True)
    assert out.stdout == 'say "hi"|a b|c'


def test_sizes_ports_and_hostname_are_read() -> None:
    vf = read_vagrantfile(
        vagrantfile(
            """\
            config.vm.hostname = "box"
            config.vm.network "forwarded_port", guest: 80, host: 8080, host_ip: "127.0.0.1"
            config.vm.provider :libvirt do |lv|
              lv.memory = 6144
              lv.cpus = 3
            end
            config.vm.provision "shell", inline: "true"
            """
        )
    )
    assert vf.hostname == "box"
    assert vf.size("libvirt") == (6144, 3)
    assert vf.size("virtualbox") == (None, None)
    assert (vf.forwarded_ports[0].guest, vf.forwarded_ports[0].host) == (80, 8080)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('config.vm.provision "shell", inline: "echo #{name}"\n', "interpolation"),
        ('script = "x"\nconfig.vm.provision "shell", inline: script\n', "not a literal"),
        ('if true\n  config.vm.provision "shell", inline: "x"\nend\n', "under a condition"),
        ('config.vm.provision "ansible", playbook: "p.yml"\n', "only shell"),
        ('config.vm.provision "shell", inline: "x", reboot: true\n', "reboot"),
        ('config.vm.provision "shell"\n', "exactly one of inline: and path:"),
        ('config.vm.provision "shell", inline: <<~EOS\n  x\n', "not terminated"),
        ('config.vm.provision "shell", inline: "x\n', "unterminated string"),
        ('config.vm.provision "shell", path: "missing.sh"\n', "missing.sh"),
    ],
)
def test_what_cannot_be_read_is_named(body: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(VagrantfileError, match=message) as info:
        read_vagrantfile(vagrantfile(body), tmp_path)
    assert "line" in str(info.value) or "missing.sh" in message


def test_tokenizer_reports_the_line_of_an_unterminated_string() -> None:
    with pytest.raises(RubySubsetError, match="line 3"):
        tokenize('a = 1\nb = 2\nc = "open\n')


# -- the README --------------------------------------------------------------------------------


def test_the_quick_command_is_the_block_after_the_marker() -> None:
    text = (
        f"# T\n\nQuick tests:\n\n{MARKER}\n\n"
        "```sh\n$ sudo python -m pytest -q \\\n    -m quick\n```\n"
    )
    assert quick_test_command(text) == "sudo python -m pytest -q \\\n    -m quick"


def test_a_readme_without_the_marker_falls_back(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# T\n```\npython -m pytest\n```\n")
    assert quick_test_command(readme.read_text()) is None
    assert load_quick_test_command(readme) == (FALLBACK_COMMAND, False)
    readme.write_text(f"{MARKER}\n~~~\nmake quick\n~~~\n")
    assert load_quick_test_command(readme) == ("make quick", True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{MARKER}\nrun this\n", "must be followed by a fenced code block"),
        (f"{MARKER}\n```\npytest\n", "not closed"),
        (f"{MARKER}\n```\n\n```\n", "empty"),
        (f"{MARKER}\n```\na\n```\n{MARKER}\n```\nb\n```\n", "keep one"),
    ],
)
def test_a_malformed_quick_block_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ReadmeError, match=message):
        quick_test_command(text)


def test_the_project_readme_has_a_usable_quick_command() -> None:
    command, _ = load_quick_test_command(REPO / "README.md")
    assert "pytest" in command


# -- arguments and plan ------------------------------------------------------------------------


def test_steps_follow_the_options(tmp_path: Path) -> None:
    args = freshcheck.parse_args([])
    assert freshcheck.plan_steps(args) == list(freshcheck.STEPS)
    args = freshcheck.parse_args(["--stop-after", "boot", "--pip", "direct"])
    assert freshcheck.plan_steps(args) == ["project", "root", "image", "boot"]
    image = tmp_path / "disk.img"
    image.write_bytes(b"")
    args = freshcheck.parse_args(["--image", str(image), "--start-at", "lab-run"])
    steps = ["project", "wheelhouse", "boot", "lab-run", "quick-tests"]
    assert freshcheck.plan_steps(args) == steps


@pytest.mark.parametrize(
    "argv",
    [
        ["--memory", "0"],
        ["--cpus", "-1"],
        ["--timeout", "0"],
        ["--start-at", "lab-run"],
        ["--image", "/nonexistent/disk.img"],
        ["--stop-after", "nonsense"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        freshcheck.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_guest_size_prefers_flags_then_the_vagrantfile() -> None:
    vf = read_vagrantfile(
        vagrantfile('config.vm.provider "libvirt" do |lv|\n  lv.memory = 3000\nend\n')
    )
    default = freshcheck.parse_args([])
    assert freshcheck.guest_size(default, vf) == (3000, freshcheck.FALLBACK_CPUS)
    flags = freshcheck.parse_args(["--memory", "8192", "--cpus", "4"])
    assert freshcheck.guest_size(flags, vf) == (8192, 4)


def test_help_names_every_step(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        freshcheck.parse_args(["--help"])
    out = capsys.readouterr().out
    for s in freshcheck.STEPS:
        assert s in out


# -- the guest's pieces ------------------------------------------------------------------------

MODULES_DEP = """\
kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko
kernel/fs/jbd2/jbd2.ko:
kernel/fs/mbcache.ko:
kernel/lib/crc16.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko \
kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/a/loop-a.ko: kernel/a/loop_b.ko
kernel/a/loop_b.ko: kernel/a/loop-a.ko
"""


def test_modules_load_after_their_dependencies() -> None:
    order = module_load_order(MODULES_DEP, ["virtio_blk", "ext4"])
    assert order.index("drivers/virtio/virtio_ring") < order.index("drivers/virtio/virtio")
    assert order.index("drivers/virtio/virtio") < order.index("drivers/block/virtio_blk")
    assert order[-1] == "fs/ext4/ext4"
    assert len(order) == len(set(order)) == 7
    with pytest.raises(GuestError, match="cycle"):
        module_load_order(MODULES_DEP, ["loop_a"])
    with pytest.raises(GuestError, match="not in modules.dep"):
        module_load_order(MODULES_DEP, ["nvme"])


def test_the_guest_kernel_has_what_the_root_needs() -> None:
    dep = Path("/var/cache/crew-lab/vm/root/lib/modules")
    found = sorted(dep.glob("*/modules.dep")) if dep.is_dir() else []
    if not found:
        pytest.skip("lab.vm's guest kernel is not unpacked here (lab/setup.sh does it)")
    order = module_load_order(found[-1].read_text(), ROOT_MODULES)
    names = [Path(m).name for m in order]
    assert names.index("virtio_blk") > names.index("virtio")
    assert names[-1] == "ext4" and "crc32c_generic" in names
    assert all((found[-1].parent / "kernel" / f"{m}.ko").is_file() for m in order)
    script = init_script(order)
    assert "switch_root /newroot /sbin/init" in script and "insmod" in script


def test_qemu_gets_the_disk_the_forwards_and_lab_vms_kernel(tmp_path: Path) -> None:
    kernel = GuestKernel(tmp_path / "k", "6.1.0-test")
    spec = MachineSpec(
        kernel,
        tmp_path / "initrd",
        tmp_path / "disk.img",
        tmp_path / "console.log",
        4096,
        2,
        Accel.TCG,
        (Forward(2222, 22), Forward(18501, 8501)),
    )
    argv = qemu_argv(spec)
    joined = " ".join(argv)
    assert argv[argv.index("-kernel") + 1] == str(kernel.vmlinuz)
    assert f"file={tmp_path / 'disk.img'},format=raw,if=virtio" in joined
    assert "hostfwd=tcp:127.0.0.1:2222-:22,hostfwd=tcp:127.0.0.1:18501-:8501" in joined
    assert argv[argv.index("-m") + 1] == "4096" and argv[argv.index("-smp") + 1] == "2"
    assert "tcg,thread=multi" in argv


def test_the_root_is_a_bare_debian_with_sources_and_a_cache(tmp_path: Path) -> None:
    argv = rootfs.mmdebstrap_argv(tmp_path / "root", tmp_path / "debs")
    assert argv[0] == "mmdebstrap" and rootfs.SUITE in argv
    assert all(src in argv for src in rootfs.SOURCES)
    included = argv[[a.startswith("--include=") for a in argv].index(True)].split("=", 1)[1]
    assert {"sudo", "openssh-server", "systemd-sysv"} <= set(included.split(","))
    # What lab/setup.sh installs is not pre-installed: the provisioning must bring it.
    assert not {"python3", "mininet", "qemu-system-x86"} & set(included.split(","))


def test_the_wheelhouse_covers_the_build_backend(tmp_path: Path) -> None:
    reqs = wheelhouse.requirements(REPO)
    assert reqs[0] == f"{REPO}[test]"
    assert any(r.startswith("setuptools") for r in reqs) and "pip" in reqs
    conf = wheelhouse.guest_pip_conf("http://10.0.2.2:1234/")
    assert "no-index = true" in conf and "find-links = http://10.0.2.2:1234/" in conf
    with pytest.raises(wheelhouse.WheelhouseError, match="pyproject.toml"):
        wheelhouse.requirements(tmp_path)


def test_the_wheel_server_serves_its_folder_on_loopback(tmp_path: Path) -> None:
    (tmp_path / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    with wheelhouse.WheelServer(tmp_path) as server:
        base = f"http://127.0.0.1:{server.port}/"
        listing = urllib.request.urlopen(base, timeout=10).read().decode()
        assert "pkg-1.0-py3-none-any.whl" in listing  # pip's find-links reads these anchors
        data = urllib.request.urlopen(base + "pkg-1.0-py3-none-any.whl", timeout=10).read()
        assert data == b"wheel bytes"
        assert server.guest_url() == f"http://10.0.2.2:{server.port}/"
