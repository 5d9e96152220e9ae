"""nbval's kernels listen on Unix sockets, not TCP ports: a neighbour's gloo or TCPStore process can take a port
jupyter_client picked before the kernel binds it (a quiet CI run: "Kernel didn't respond in 60 seconds").
Why and how: :mod:`labkit.core.kernels`."""
import nbval.kernel

from labkit.core.kernels import ipc_kernel_manager

nbval.kernel.KernelManager = ipc_kernel_manager(nbval.kernel.KernelManager)
