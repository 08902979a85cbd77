"""Building kernel modules as SGLang's `load_jit` does: a job's build requests (`job_requests`), the nvcc
build and its content-hashed cache (`nvcc_build`), the sources and candidate overlay (`sources`), where the
compilers and tvm-ffi are (`toolchain`), ptxas's resource report (`ptxas`), and loading a built module and
reading its exports' signatures (`module_loading`)."""
