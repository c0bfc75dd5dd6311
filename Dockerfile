# A kernel image for Jupyter Enterprise Gateway with lemon_exec (docs/scale-out.md).
#
#   docker build -t lemon-kernel:latest .
#
# Enterprise Gateway's Kubernetes process proxy starts one pod of this image per kernel and
# sets KERNEL_ID, RESPONSE_ADDRESS, PUBLIC_KEY and PORT_RANGE in its environment; the
# command below reads them, reports the kernel's ports to the gateway (encrypted with the
# gateway's public key) and runs lemon-python. Pair it with the kernelspec written by
#   lemon-exec kernelspec install --for-gateway DIR --kubernetes-image lemon-kernel:latest
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

# tini reaps whatever a script leaves behind and forwards the gateway's signals.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

COPY . /tmp/lemon_exec
RUN pip install --no-cache-dir "/tmp/lemon_exec[gateway-kernel]" \
    && rm -rf /tmp/lemon_exec

# Scripts run as an unprivileged user with a writable home: the kernel's cwd and workspace.
RUN useradd --create-home --uid 1000 --gid 100 jovyan
USER 1000:100
WORKDIR /home/jovyan

ENTRYPOINT ["tini", "--"]
CMD ["python", "-m", "lemon_exec.kernel.gateway_launcher"]
