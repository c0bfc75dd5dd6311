# Enterprise Gateway with the lemon-python kernelspec added (docs/scale-out.md, "Kubernetes").
#
# Write the kernelspec first, naming the kernel image the gateway's pods will run:
#   lemon-exec kernelspec install --for-gateway deploy/kubernetes/kernels \
#       --kubernetes-image REGISTRY/lemon-kernel:TAG
# then, from the repository root:
#   docker build -f deploy/kubernetes/gateway.Dockerfile -t REGISTRY/enterprise-gateway-lemon:3.3.0 deploy/kubernetes
#
# The gateway's own image keeps its python_kubernetes launcher (launch_kubernetes.py and the
# pod template), which the lemon-python kernelspec runs.
ARG EG_IMAGE=elyra/enterprise-gateway:3.3.0
FROM ${EG_IMAGE}

COPY kernels/lemon-python /usr/local/share/jupyter/kernels/lemon-python
