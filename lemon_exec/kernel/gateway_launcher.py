"""Start lemon-python for Enterprise Gateway's remote process proxies (a Kubernetes pod, or a
host reached by the distributed proxy): ``python -m lemon_exec.kernel.gateway_launcher``.

This is the protocol of Enterprise Gateway's own ``launch_ipykernel.py``, spoken by lemon's
kernel application instead of a plain IPKernelApp:

1. pick five free ports (inside ``--port-range`` when one is given) and write a connection
   file with a fresh key, owner-only;
2. open a TCP "comm" socket on which the gateway sends ``{"signum": N}`` (0 polls; 2
   interrupts; others stop) and ``{"shutdown": 1}``;
3. send the connection info (plus ``pid``, ``pgid``, ``comm_port``, ``kernel_id``) to
   ``--response-address``, AES-encrypted under a random key that is RSA-encrypted with the
   gateway's ``--public-key`` (payload version 1);
4. run the kernel on those ports.

Every option falls back to the variable Enterprise Gateway's Kubernetes launcher sets in the
kernel pod (``KERNEL_ID``, ``RESPONSE_ADDRESS``, ``PUBLIC_KEY``, ``PORT_RANGE``), so the
image's command needs no arguments (see the Dockerfile and docs/scale-out.md). The
encryption uses ``pycryptodomex`` (the ``gateway-kernel`` extra), as the gateway does.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import uuid
from typing import Any

#: The payload layout the gateway's RemoteProcessProxy decodes.
LAUNCHER_VERSION = 1
#: Attempts at a random port inside a port range before giving up.
_PORT_RETRIES = 20
#: Largest request the gateway sends on the comm socket (a small JSON object).
_MAX_REQUEST = 64 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m lemon_exec.kernel.gateway_launcher",
        description="Start lemon-python for a Jupyter Enterprise Gateway remote process proxy.",
    )
    parser.add_argument("--kernel-id", default=env.get("KERNEL_ID"))
    parser.add_argument("--response-address", default=env.get("RESPONSE_ADDRESS"))
    parser.add_argument("--public-key", default=env.get("PUBLIC_KEY"))
    parser.add_argument("--port-range", default=env.get("PORT_RANGE", "0..0"))
    parser.add_argument(
        "--ip",
        default=env.get("LEMON_GATEWAY_KERNEL_IP", "0.0.0.0"),
        help="address the kernel's ports bind (default 0.0.0.0: reachable in the pod network)",
    )
    # Accepted for compatibility with the gateway's kernelspecs; lemon always runs its own.
    parser.add_argument("--spark-context-initialization-mode", default="none")
    parser.add_argument("--kernel-class-name", default=None)
    args = parser.parse_args(argv)
    missing = [
        flag
        for flag, value in (
            ("--kernel-id", args.kernel_id),
            ("--response-address", args.response_address),
            ("--public-key", args.public_key),
        )
        if not value
    ]
    if missing:
        parser.error(
            f"missing {', '.join(missing)} (or KERNEL_ID / RESPONSE_ADDRESS / PUBLIC_KEY): "
            "this launcher is started by Enterprise Gateway, which supplies them"
        )
    return args


def port_range(text: str) -> tuple[int, int]:
    """``"lower..upper"`` (``"0..0"``: any port) as a pair; ValueError when malformed."""
    lower, sep, upper = text.partition("..")
    if not sep:
        raise ValueError(f"port range {text!r} is not LOWER..UPPER")
    low, high = int(lower), int(upper)
    if not (0 <= low <= high <= 65535):
        raise ValueError(f"port range {text!r} is out of order or out of bounds")
    return low, high


def bind_socket(ip: str, ports: tuple[int, int]) -> socket.socket:
    """A TCP socket bound to ``ip`` on a free port inside ``ports`` (any when 0..0)."""
    low, high = ports
    for _ in range(_PORT_RETRIES if high else 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((ip, random.randint(low, high) if high else 0))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError(f"no free port in {low}..{high} after {_PORT_RETRIES} tries")


def write_connection_file(ip: str, ports: tuple[int, int]) -> tuple[str, dict[str, Any]]:
    """A new owner-only connection file on five free ports; returns (path, its content)."""
    sockets = [bind_socket(ip, ports) for _ in range(5)]
    numbers = [s.getsockname()[1] for s in sockets]
    for sock in sockets:  # released just before the kernel binds them (as the gateway does)
        sock.close()
    info: dict[str, Any] = {
        "shell_port": numbers[0],
        "iopub_port": numbers[1],
        "stdin_port": numbers[2],
        "hb_port": numbers[3],
        "control_port": numbers[4],
        "ip": ip,
        "key": uuid.uuid4().hex,
        "transport": "tcp",
        "signature_scheme": "hmac-sha256",
        "kernel_name": "",
    }
    directory = tempfile.mkdtemp(prefix="lemon-gateway-kernel-")  # 0700
    path = os.path.join(directory, "kernel.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(info, handle)
    return path, info


def encrypt_payload(connection_info: dict[str, Any], public_key: str) -> bytes:
    """The gateway's version-1 payload: AES-ECB(info) under an RSA(PKCS#1 v1.5)-wrapped key."""
    from Cryptodome.Cipher import AES, PKCS1_v1_5
    from Cryptodome.PublicKey import RSA
    from Cryptodome.Random import get_random_bytes
    from Cryptodome.Util.Padding import pad

    aes_key = get_random_bytes(16)
    body = AES.new(aes_key, AES.MODE_ECB).encrypt(pad(json.dumps(connection_info).encode(), 16))
    rsa = PKCS1_v1_5.new(RSA.import_key(base64.b64decode(public_key.encode())))
    payload = {
        "version": LAUNCHER_VERSION,
        "key": base64.b64encode(rsa.encrypt(aes_key)).decode(),
        "conn_info": base64.b64encode(body).decode(),
    }
    return base64.b64encode(json.dumps(payload).encode())


def send_connection_info(address: str, payload: bytes) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"response address {address!r} is not HOST:PORT")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(payload)


def serve_requests(comm: socket.socket, connection_dir: str) -> None:
    """Carry out the gateway's signal and shutdown requests until it says shutdown."""
    while True:
        try:
            conn, _ = comm.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)  # a peer that never finishes cannot hold the gateway's requests up
            data = b""
            while len(data) <= _MAX_REQUEST:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
        try:
            request = json.loads(data or b"{}")
        except ValueError:
            continue
        if not isinstance(request, dict):
            continue
        signum = request.get("signum")
        if isinstance(signum, int) and signum > 0:
            # The whole process group: a script's children are interrupted or stopped too.
            os.killpg(os.getpgid(0), signum)
        if request.get("shutdown"):
            # A signal's death runs no exit handler: the key's file goes first.
            shutil.rmtree(connection_dir, ignore_errors=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.suppress(OSError):  # our own group: its signals reach no one else
        os.setpgid(0, 0)
    try:
        ports = port_range(args.port_range)
    except ValueError as exc:
        sys.exit(f"gateway_launcher: {exc}")
    path, info = write_connection_file(args.ip, ports)
    comm = bind_socket(args.ip, ports)
    comm.listen(1)
    reported = {
        **info,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "comm_port": comm.getsockname()[1],
        "kernel_id": args.kernel_id,
    }
    send_connection_info(args.response_address, encrypt_payload(reported, args.public_key))
    directory = os.path.dirname(path)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # a normal exit
    threading.Thread(
        target=serve_requests, args=(comm, directory), name="gateway-comm", daemon=True
    ).start()

    from lemon_exec.kernel.lean import skip_optional_modules
    from lemon_exec.proc.supervise import supervise_kernel

    supervise_kernel(path, None)
    skip_optional_modules()
    from lemon_exec.kernel.app import main as kernel_main

    sys.argv = [sys.argv[0], "-f", path]
    kernel_main()


if __name__ == "__main__":
    main()
