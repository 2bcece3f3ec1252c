"""What a Vagrantfile asks of the machine: its shell provisioners, forwarded ports, size and
hostname, read from the file itself (``lab.fresh.rubylit``) so a check that provisions a
machine "as Vagrant would" runs exactly what the Vagrantfile says.

Shell provisioners become the command Vagrant 2.x runs for them over SSH (its shell
provisioner, Linux guest): the script (``inline:`` text or the file ``path:`` names, relative to
the Vagrantfile) is uploaded to ``upload_path`` (``/tmp/vagrant-shell``), and

    chmod +x '/tmp/vagrant-shell' && K="V" ... /tmp/vagrant-shell ARGS

runs in ``sudo -E -H bash -l`` (``privileged``, the default) or ``bash -l``, from the SSH
user's home directory, after the script's CRLF line ends became LF.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from lab.fresh.rubylit import Assign, Call, Opaque, RubySubsetError, Stmt, Sym, Value, parse, walk

DEFAULT_UPLOAD_PATH = "/tmp/vagrant-shell"
# The shell provisioner's options this reader understands; any other is an error, so a new
# option in the Vagrantfile is noticed rather than silently dropped.
SHELL_OPTIONS = frozenset(
    {
        "inline",
        "path",
        "args",
        "env",
        "privileged",
        "upload_path",
        "name",
        "type",
        "run",
        "binary",
        "keep_color",
        "sensitive",
    }
)


class VagrantfileError(ValueError):
    """The Vagrantfile says something this reader cannot turn into commands (names the line)."""


@dataclass(frozen=True)
class ShellProvisioner:
    """One ``config.vm.provision "shell"``: the script's text and how Vagrant runs it."""

    script: str
    env: tuple[tuple[str, str], ...] = ()
    args: str = ""  # as Vagrant appends it: "" or " ARG ..."
    privileged: bool = True
    upload_path: str = DEFAULT_UPLOAD_PATH
    name: str = "shell"
    line: int = 0

    def command(self) -> str:
        """The command line Vagrant sends to the login shell once the script is uploaded."""
        env = "".join(f" {k}={_vagrant_quote(v)}" for k, v in self.env)
        return f"chmod +x '{self.upload_path}' &&{env} {self.upload_path}{self.args}"

    def shell(self) -> str:
        """The shell the command runs in (Vagrant's default ``ssh.shell`` and ``sudo_command``)."""
        return "sudo -E -H bash -l" if self.privileged else "bash -l"


@dataclass(frozen=True)
class ForwardedPort:
    guest: int
    host: int
    host_ip: str = ""


@dataclass(frozen=True)
class Vagrantfile:
    box: str | None
    hostname: str | None
    provisioners: tuple[ShellProvisioner, ...]
    forwarded_ports: tuple[ForwardedPort, ...]
    # provider name -> {"memory": MiB, "cpus": n}, as far as the file sets them
    providers: dict[str, dict[str, int]]

    def size(self, provider: str) -> tuple[int | None, int | None]:
        """(memory MiB, cpus) the file gives ``provider``; None where it does not say."""
        p = self.providers.get(provider, {})
        return p.get("memory"), p.get("cpus")


def _vagrant_quote(text: str) -> str:
    """Vagrant's ``quote_and_escape``: double quotes, each inner quote written ``"\\""``."""
    return '"' + text.replace('"', '"\\""') + '"'


def _literal(value: Value, what: str, line: int) -> Value:
    if isinstance(value, Opaque):
        raise VagrantfileError(
            f"Vagrantfile line {value.line or line}: {what} is not a literal ({value.text!r}); "
            "it cannot be read without running Ruby"
        )
    return value


def _text(value: Value, what: str, line: int) -> str:
    value = _literal(value, what, line)
    if isinstance(value, Sym):
        return value.name
    if isinstance(value, bool) or value is None or not isinstance(value, str | int | float):
        raise VagrantfileError(f"Vagrantfile line {line}: {what} must be a string, got {value!r}")
    return str(value)


def _shell_provisioner(call: Call, root: Path) -> ShellProvisioner | None:
    """The provisioner of one ``provision`` call; None for ``run: "never"``."""
    opts: dict[str, Value] = dict(call.kwargs)
    block_var = call.block_params[0] if call.block_params else None
    for s in call.body:
        if isinstance(s, Assign) and len(s.chain) == 2 and s.chain[0] == block_var:
            opts[s.chain[1]] = s.value
        elif not isinstance(s, Opaque) or s.text:
            raise VagrantfileError(
                f"Vagrantfile line {getattr(s, 'line', call.line)}: the shell provisioner's "
                "block may only set options (x.inline = ...)"
            )
    unknown = sorted(set(opts) - SHELL_OPTIONS)
    if unknown:
        raise VagrantfileError(
            f"Vagrantfile line {call.line}: shell provisioner option(s) {', '.join(unknown)} "
            f"are not understood here (known: {', '.join(sorted(SHELL_OPTIONS))})"
        )
    if "run" in opts and _text(opts["run"], "run:", call.line) == "never":
        return None
    has_inline, has_path = opts.get("inline") is not None, opts.get("path") is not None
    if has_inline == has_path:
        raise VagrantfileError(
            f"Vagrantfile line {call.line}: a shell provisioner needs exactly one of inline: "
            "and path:"
        )
    if has_inline:
        script = _text(opts["inline"], "inline:", call.line)
    else:
        rel = _text(opts["path"], "path:", call.line)
        if re.match(r"^[a-z]+://", rel):
            raise VagrantfileError(f"Vagrantfile line {call.line}: remote path: {rel} not fetched")
        try:
            script = (root / rel).read_text()
        except OSError as e:
            raise VagrantfileError(f"Vagrantfile line {call.line}: path: {rel}: {e}") from e
    if not _literal(opts.get("binary", False), "binary:", call.line):
        script = re.sub(r"\r\n?", "\n", script)
    env_value = _literal(opts.get("env", {}), "env:", call.line) or {}
    if not isinstance(env_value, dict):
        raise VagrantfileError(f"Vagrantfile line {call.line}: env: must be a hash")
    env = tuple((str(k), _text(v, f"env: {k}", call.line)) for k, v in env_value.items())
    args_value = _literal(opts.get("args"), "args:", call.line)
    if args_value is None:
        args = ""
    elif isinstance(args_value, list):
        args = " " + " ".join(_vagrant_quote(_text(a, "args:", call.line)) for a in args_value)
    else:
        args = " " + _text(args_value, "args:", call.line)
    privileged = _literal(opts.get("privileged", True), "privileged:", call.line)
    if not isinstance(privileged, bool):
        raise VagrantfileError(f"Vagrantfile line {call.line}: privileged: must be true or false")
    upload = _text(opts.get("upload_path", DEFAULT_UPLOAD_PATH), "upload_path:", call.line)
    name = _text(opts["name"], "name:", call.line) if "name" in opts else "shell"
    return ShellProvisioner(script, env, args, privileged, upload, name, call.line)


def _int(value: Value, what: str, line: int) -> int:
    value = _literal(value, what, line)
    if isinstance(value, bool) or not isinstance(value, int):
        raise VagrantfileError(f"Vagrantfile line {line}: {what} must be an integer")
    return value


def read_vagrantfile(source: str, root: Path = Path(".")) -> Vagrantfile:
    """Interpret a Vagrantfile's text; ``root`` is its folder (``path:`` scripts are there)."""
    try:
        stmts: list[Stmt] = parse(source)
    except RubySubsetError as e:
        raise VagrantfileError(f"Vagrantfile: {e}") from e
    box = hostname = None
    provisioners: list[ShellProvisioner] = []
    ports: list[ForwardedPort] = []
    providers: dict[str, dict[str, int]] = {}
    for s in walk(stmts):
        if isinstance(s, Assign) and s.chain[-2:] == ("vm", "box"):
            box = _text(s.value, "vm.box", s.line)
        elif isinstance(s, Assign) and s.chain[-2:] == ("vm", "hostname"):
            hostname = _text(s.value, "vm.hostname", s.line)
        if not isinstance(s, Call):
            continue
        if s.chain[-2:] == ("vm", "provision"):
            if s.conditional:
                raise VagrantfileError(
                    f"Vagrantfile line {s.line}: a provisioner under a condition: whether it "
                    "runs cannot be known without running Ruby"
                )
            if not s.args:
                raise VagrantfileError(f"Vagrantfile line {s.line}: provision without a type")
            kind = _text(s.kwargs.get("type", s.args[0]), "provisioner type", s.line)
            if kind != "shell":
                raise VagrantfileError(
                    f"Vagrantfile line {s.line}: provisioner type {kind!r}: only shell "
                    "provisioners can be run here"
                )
            kwargs = {k: v for k, v in s.kwargs.items() if k != "type"}
            p = _shell_provisioner(
                Call(s.chain, s.args, kwargs, s.block_params, s.body, s.line), root
            )
            if p is not None:
                provisioners.append(p)
        elif s.chain[-2:] == ("vm", "network") and s.args:
            if _literal(s.args[0], "network type", s.line) in (
                "forwarded_port",
                Sym("forwarded_port"),
            ):
                ports.append(
                    ForwardedPort(
                        guest=_int(s.kwargs.get("guest"), "forwarded_port guest:", s.line),
                        host=_int(s.kwargs.get("host"), "forwarded_port host:", s.line),
                        host_ip=_text(s.kwargs.get("host_ip", ""), "host_ip:", s.line),
                    )
                )
        elif s.chain[-2:] == ("vm", "provider") and s.args and s.block_params:
            name = _text(s.args[0], "provider name", s.line)
            var = s.block_params[0]
            for a in s.body:
                if (
                    isinstance(a, Assign)
                    and len(a.chain) == 2
                    and a.chain[0] == var
                    and a.chain[1] in ("memory", "cpus")
                ):
                    value = _int(a.value, f"{name} {a.chain[1]}", a.line)
                    providers.setdefault(name, {})[a.chain[1]] = value
    return Vagrantfile(box, hostname, tuple(provisioners), tuple(ports), providers)


def load_vagrantfile(path: Path) -> Vagrantfile:
    try:
        source = path.read_text()
    except OSError as e:
        raise VagrantfileError(f"cannot read {path}: {e}") from e
    return read_vagrantfile(source, path.parent)


def describe(p: ShellProvisioner) -> str:
    """One line for a log: the provisioner and the command it runs."""
    first = p.script.strip().splitlines()[0] if p.script.strip() else ""
    return f"{p.name} (line {p.line}): {p.shell()} -c {shlex.quote(p.command())}  # {first}"
