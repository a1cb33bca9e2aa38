// Package gpu is the node agent's GPU telemetry over NVML (go-nvml):
// utilisation, memory, power, temperature, clocks and throttle (clocks
// event) reasons, XID critical errors, ECC error counts and NVLink
// throughput, per GPU, with the model-server pods using each GPU.
//
// NVML is loaded at run time (go-nvml dlopens libnvidia-ml.so.1), so the
// agent builds and runs on machines without a driver: New then reports
// the library missing once, in the log, and the Collector answers
// Available() false with that reason and no GPUs.
//
// Pods: NVML names the processes running on a GPU; a process's cgroup
// path (/proc/<pid>/cgroup) carries its pod's UID, and its network
// namespace's local addresses (/proc/<pid>/net/fib_trie) the pod IP, which
// is how the picker matches the GPU to its endpoints. This needs the
// host's PID namespace (the DaemonSet's hostPID). Config.Endpoints maps
// GPUs to endpoints explicitly where there are no pods.
//
// gpumock builds go-nvml's mock DGX servers (A100, H100, H200, B200) with
// the telemetry calls filled in, for tests and for the agent's --gpu=mock:
// demo mode.
//
// Ownership: the Collector's mutex guards the XID counts (written by the
// event loop) and the cached sample; NVML calls are made outside it.
package gpu
