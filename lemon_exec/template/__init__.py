"""The fork-server template: the process that forks kernels, its host-side client and
jupyter_client provisioner, heap filling and the sandbox each forked kernel builds."""
