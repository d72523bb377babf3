"""``poprun``: start N instances of a command as one distributed run.

    poprun --num-instances 2 --num-replicas 4 python train.py

Each instance is the same command with PopDist's environment (``POPDIST_*``, read by the
``popdist`` module) and, when there are several instances, the address of JAX's distributed
coordinator (instance 0; a free port is picked). On CPUs each instance gets one JAX device
per local replica (``XLA_FLAGS=--xla_force_host_platform_device_count``).

Output lines are tagged with the instance (``[1,0]<stdout>: ...`` as PopRun/MPI did), or
only one instance's output is shown (``--only-output-from-instance``). SIGINT, SIGTERM and
SIGHUP are forwarded to every instance. As soon as one instance fails, the others are
stopped (SIGTERM, then SIGKILL after ``--kill-timeout`` seconds) and poprun exits with the
failed instance's status; every instance runs in its own process group, so their children
go too.

Several hosts: ``--host h1,h2`` spreads the instances evenly over the hosts in order (so
instance 0 runs on ``h1``). Instances on this machine (``localhost``, ``127.0.0.1`` or its
hostname) are started directly, others through ``ssh HOST`` (``--ssh-command`` replaces
``ssh``), in the same working directory, with the same command line: the project and its
virtual environment must be at the same path on every host. The coordinator runs inside
instance 0, so its address must be reachable from every host: it is ``FIRST_HOST:PORT``
unless ``--coordinator-address HOST:PORT`` says otherwise (pick a port that is free there).

PopRun, MPI and V-IPU options that mean nothing here (partitions, MPI arguments, V-IPU
servers...) are accepted and reported as ignored.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from . import environment

# PopRun/MPI/V-IPU options accepted without effect: name -> whether it takes a value.
IGNORED_OPTIONS = {
    "--vipu-partition": True,
    "--vipu-server-host": True,
    "--vipu-server-port": True,
    "--vipu-server-timeout": True,
    "--vipu-cluster": True,
    "--vipu-allocation": True,
    "--update-partition": True,
    "--remove-partition": True,
    "--reset-partition": True,
    "--mpi-global-args": True,
    "--mpi-local-args": True,
    "--host-subnet": True,
    "--num-ilds": True,
    "--ipus-per-ild": True,
    "--executable-cache-path": True,
    "--process-placement": True,
    "--numa-aware": True,
    "--offline-mode": True,
    "--print-topology": True,
    "--interactive-mode": True,
    "--tag-output": False,
    "--bind-to": True,
    "--map-by": True,
}
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_KILL_TIMEOUT_S = 5.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Layout:
    """Where the replicas of a run go."""

    num_instances: int
    num_replicas: int
    ipus_per_replica: int

    @property
    def local_replicas(self) -> int:
        return self.num_replicas // self.num_instances

    def environment(self, index: int, coordinator: str, timeout: int | None) -> dict[str, str]:
        """The variables instance ``index`` starts with (added to the launcher's own)."""
        env = {
            environment.NUM_INSTANCES: str(self.num_instances),
            environment.INSTANCE_INDEX: str(index),
            environment.NUM_TOTAL_REPLICAS: str(self.num_replicas),
            environment.NUM_LOCAL_REPLICAS: str(self.local_replicas),
            environment.REPLICA_INDEX_OFFSET: str(index * self.local_replicas),
            environment.NUM_IPUS_PER_REPLICA: str(self.ipus_per_replica),
            "XLA_FLAGS": _with_device_count(os.environ.get("XLA_FLAGS", ""), self.local_replicas),
        }
        if self.num_instances > 1:
            env[environment.COORDINATOR_ADDRESS] = coordinator
        if timeout is not None:
            env[environment.TIMEOUT] = str(timeout)
        return env


def _with_device_count(flags: str, count: int) -> str:
    """``XLA_FLAGS`` with the host device count set to ``count`` (replacing a user's)."""
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={count}"])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="poprun",
        description="Start instances of a command as one distributed PopXL run (JAX).",
        epilog="Options of PopRun with no meaning here are accepted and ignored: "
        + ", ".join(sorted(IGNORED_OPTIONS)),
    )
    p.add_argument("--num-instances", type=int, default=1, help="processes to start")
    p.add_argument("--num-replicas", type=int, default=None, help="replicas over all instances")
    p.add_argument("--ipus-per-replica", type=int, default=1, help="IPUs (devices) per replica")
    p.add_argument(
        "--only-output-from-instance",
        type=int,
        default=None,
        help="show only this instance's output (untagged)",
    )
    p.add_argument("--host", "-H", default=None, help="comma-separated hosts to spread over")
    p.add_argument("--coordinator-address", default=None, help="HOST:PORT of the coordinator")
    p.add_argument("--ssh-command", default="ssh", help="command that runs argv on a host")
    p.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds instances wait for each other to connect (POPDIST_TIMEOUT)",
    )
    p.add_argument(
        "--kill-timeout",
        type=float,
        default=DEFAULT_KILL_TIMEOUT_S,
        help="seconds between SIGTERM and SIGKILL when stopping instances",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v: launches, -vv: env")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def split_ignored(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(arguments for the parser, ignored PopRun options) up to the command."""
    kept: list[str] = []
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            break  # the command starts here
        name = arg.split("=", 1)[0]
        if name in IGNORED_OPTIONS:
            takes_value = IGNORED_OPTIONS[name] and "=" not in arg
            ignored.append(arg if not takes_value else f"{arg} {argv[i + 1]}")
            i += 2 if takes_value else 1
            continue
        kept.append(arg)
        if name in _VALUED and "=" not in arg and i + 1 < len(argv):
            kept.append(argv[i + 1])
            i += 1
        i += 1
    return kept + list(argv[i:]), ignored


_VALUED = {
    "--num-instances",
    "--num-replicas",
    "--ipus-per-replica",
    "--only-output-from-instance",
    "--host",
    "-H",
    "--coordinator-address",
    "--ssh-command",
    "--timeout",
    "--kill-timeout",
}


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Layout, list[str]]:
    """Parse and check a command line; errors exit with status 2 and a message."""
    p = parser()
    kept, ignored = split_ignored(argv)
    args = p.parse_args(kept)
    if not args.command:
        p.error("no command to run: poprun [options] PROGRAM [ARGS...]")
    n = args.num_instances
    replicas = n if args.num_replicas is None else args.num_replicas
    if n < 1 or replicas < 1 or args.ipus_per_replica < 1:
        p.error("--num-instances, --num-replicas and --ipus-per-replica must be positive")
    if replicas % n:
        p.error(
            f"--num-replicas {replicas} cannot be split evenly over --num-instances {n}; "
            "use a multiple of the number of instances"
        )
    out = args.only_output_from_instance
    if out is not None and not 0 <= out < n:
        p.error(f"--only-output-from-instance {out} is not an instance (0 to {n - 1})")
    return args, Layout(n, replicas, args.ipus_per_replica), ignored


def hosts_of(spec: str | None, n: int) -> list[str]:
    """The host of each instance: ``spec``'s hosts in order, ``n / len(hosts)`` each."""
    hosts = [h for h in (spec or "localhost").split(",") if h]
    if n % len(hosts):
        raise SystemExit(
            f"poprun: {n} instances cannot be split evenly over {len(hosts)} hosts "
            f"({', '.join(hosts)})"
        )
    per_host = n // len(hosts)
    return [hosts[i // per_host] for i in range(n)]


def is_local(host: str) -> bool:
    return host in LOCAL_HOSTS or host in (socket.gethostname(), socket.getfqdn())


def free_port() -> int:
    """A TCP port nobody listens on now (the coordinator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def coordinator_address(args: argparse.Namespace, hosts: list[str]) -> str:
    if args.coordinator_address:
        return str(args.coordinator_address)
    host = "127.0.0.1" if is_local(hosts[0]) else hosts[0]
    return f"{host}:{free_port()}"


def instance_argv(
    command: list[str], host: str, env: dict[str, str], ssh: str
) -> tuple[list[str], dict[str, str] | None]:
    """(argv, environment) that start one instance on ``host``."""
    if is_local(host):
        return command, {**os.environ, **env}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    remote = f"cd {shlex.quote(os.getcwd())} && env {exports} {shlex.join(command)}"
    return [*shlex.split(ssh), host, remote], None


@dataclass
class Instance:
    index: int
    process: subprocess.Popen
    pumps: list[threading.Thread] = field(default_factory=list)


def _pump(stream: IO[bytes], sink: Any, tag: bytes | None, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if sink is None:
            continue
        with lock:
            sink.buffer.write(tag + line if tag else line)
            sink.buffer.flush()
    stream.close()


def start(
    argv: list[str], env: dict[str, str] | None, index: int, show: bool, tagged: bool, lock: Any
) -> Instance:
    """Start one instance in its own process group, its output pumped to ours."""
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    instance = Instance(index, process)
    for stream, sink, name in (
        (process.stdout, sys.stdout, "stdout"),
        (process.stderr, sys.stderr, "stderr"),
    ):
        tag = f"[1,{index}]<{name}>:".encode() if tagged else None
        t = threading.Thread(
            target=_pump, args=(stream, sink if show else None, tag, lock), daemon=True
        )
        t.start()
        instance.pumps.append(t)
    return instance


def signal_all(instances: list[Instance], sig: int) -> None:
    for inst in instances:
        if inst.process.poll() is None:
            try:
                os.killpg(inst.process.pid, sig)
            except ProcessLookupError:
                pass


def stop_all(instances: list[Instance], kill_timeout: float) -> None:
    """SIGTERM every running instance's group, then SIGKILL what is left."""
    signal_all(instances, signal.SIGTERM)
    deadline = time.monotonic() + kill_timeout
    while time.monotonic() < deadline and any(i.process.poll() is None for i in instances):
        time.sleep(0.05)
    signal_all(instances, signal.SIGKILL)
    for inst in instances:
        inst.process.wait()
        # Groups of finished leaders may still hold children (e.g. a shell's background job).
        try:
            os.killpg(inst.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def supervise(instances: list[Instance], kill_timeout: float, log: Any) -> int:
    """Wait for every instance; on the first failure stop the rest. Returns poprun's status."""
    received: list[int] = []

    def forward(sig: int, _frame: Any) -> None:
        received.append(sig)
        signal_all(instances, sig)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        return _wait(instances, kill_timeout, log, received)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for inst in instances:
            for t in inst.pumps:
                t.join(timeout=1.0)


def _wait(instances: list[Instance], kill_timeout: float, log: Any, received: list[int]) -> int:
    running = list(instances)
    while running:
        for inst in list(running):
            code = inst.process.poll()
            if code is None:
                continue
            running.remove(inst)
            if code != 0:
                log(
                    f"instance {inst.index} exited with status {exit_status(code)}; "
                    f"stopping the other {len(running)} instance(s)"
                )
                stop_all(running, kill_timeout)
                return exit_status(code)
        if received and running:
            stop_all(running, kill_timeout)
            return 128 + received[0]
        time.sleep(0.02)
    return 128 + received[0] if received else 0


def main(argv: Sequence[str] | None = None) -> int:
    args, layout, ignored = parse(sys.argv[1:] if argv is None else argv)
    verbose = args.verbose

    def log(message: str) -> None:
        print(f"poprun: {message}", file=sys.stderr, flush=True)

    if ignored:
        log("ignoring PopRun options with no meaning here: " + " ".join(ignored))
    hosts = hosts_of(args.host, layout.num_instances)
    coordinator = coordinator_address(args, hosts)
    lock = threading.Lock()
    tagged = args.only_output_from_instance is None and layout.num_instances > 1
    instances: list[Instance] = []
    try:
        for index, host in enumerate(hosts):
            env = layout.environment(index, coordinator, args.timeout)
            argv, full_env = instance_argv(list(args.command), host, env, args.ssh_command)
            if verbose:
                log(f"instance {index} on {host}: {shlex.join(argv)}")
            if verbose > 1:
                log(f"instance {index} environment: {env}")
            show = args.only_output_from_instance in (None, index)
            instances.append(start(argv, full_env, index, show, tagged, lock))
    except OSError as err:
        log(f"could not start instance {len(instances)}: {err}")
        stop_all(instances, args.kill_timeout)
        return 127
    status = supervise(instances, args.kill_timeout, log)
    if verbose:
        log(f"all instances finished; exit status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
