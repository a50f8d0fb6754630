"""Optional compiled CPU kernels (C++/OpenMP); `cpu_ops.load_cpu_kernels()` returns None when unavailable."""
