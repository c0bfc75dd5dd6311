"""The fixed values behind the settings: names, bounds and the sandbox's default lists."""

from __future__ import annotations

from lemon_exec.wire.protocol import HELPER_NAMES

# Host tools a script may call through helpers; ``tools`` can only narrow this list.
HELPER_ALLOWLIST: tuple[str, ...] = HELPER_NAMES  # declared once, in the protocol

# Dotted path of the TOML table that holds these settings.
TOML_TABLE: tuple[str, ...] = ("runtime", "tools", "execute_code")

ENV_PREFIX = "LEMON_EXECUTE_CODE_"

#: The shortest wall-clock limit a run gets, whatever a call or the config asks for.
MIN_TIMEOUT_MS = 1000

#: Most warm spares a host keeps (each is a running interpreter); larger values are clamped.
MAX_WARM_KERNELS = 8

#: What a sandboxed kernel cannot see by default: the usual credential stores.
DEFAULT_SANDBOX_HIDDEN: tuple[str, ...] = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.netrc",
    "~/.docker",
    "~/.kube",
    "~/.config/gcloud",
    "~/.azure",
    "~/.git-credentials",
    "~/.pypirc",
    # Sockets that would lead out of the sandbox: agents, D-Bus (systemd-run), Docker.
    "/run/user",
    "/run/dbus",
    "/run/docker.sock",
    "/var/run/docker.sock",
    # The whole home directory (an empty, private tmpfs in its place), so that credential
    # files nobody listed, and those created after a kernel started, stay out of view too;
    # the working directory and sandbox_visible are bound back.
    "~",
)

#: What a sandboxed kernel sees again inside hidden paths (read-only): user site-packages.
DEFAULT_SANDBOX_VISIBLE: tuple[str, ...] = ("~/.local/lib",)

#: Environment variables a sandboxed kernel does not get (shell patterns, any case).
DEFAULT_SANDBOX_ENV_HIDDEN: tuple[str, ...] = (
    "*_TOKEN",
    "*_TOKEN_*",
    "TOKEN",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*_KEY",
    "*_KEY_*",
    "*APIKEY*",
    "*CREDENTIAL*",
    "*_AUTH",
    "*_AUTH_*",
    "*_PAT",
    "*_DSN",
    "DATABASE_URL",
    "AWS_*",
    "AZURE_*",
    "GPG_AGENT_INFO",
)
