// Force-included (-include) by astra.cuda_parse after clang's CUDA runtime wrapper.
//
// Clang parses CUDA as a different dialect from nvcc. These declarations close the gaps that
// SGLang's JIT kernels hit, so that a parse error means a real problem in the source. They are
// declarations only: nothing here is ever compiled into a kernel.
#pragma once
#if defined(__CUDA__)

// cooperative_groups only declares cluster_group / this_cluster() under nvcc (__NVCC__) unless
// this macro says the cluster intrinsics exist; clang >= 16 provides them for sm_90.
#ifndef _CG_CLUSTER_INTRINSICS_AVAILABLE
#define _CG_CLUSTER_INTRINSICS_AVAILABLE 1
#endif

// Clang lowers <<<...>>> to cudaConfigureCall when it cannot tell the CUDA version; CUDA 13
// removed that declaration from cuda_runtime_api.h.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
extern "C" __host__ cudaError_t cudaConfigureCall(dim3 gridDim, dim3 blockDim, size_t sharedMem = 0,
                                                  cudaStream_t stream = 0);
#endif

// nvcc's crt/math_functions.hpp makes the integer/float min and max overloads __host__ __device__;
// clang's CUDA wrapper keeps them __device__ only, so host code calling max(1u, n) fails to parse.
#define ASTRA_HOST_MINMAX(A, B, R) \
  __host__ R min(A a, B b);        \
  __host__ R max(A a, B b);
ASTRA_HOST_MINMAX(int, int, int)
ASTRA_HOST_MINMAX(unsigned int, unsigned int, unsigned int)
ASTRA_HOST_MINMAX(int, unsigned int, unsigned int)
ASTRA_HOST_MINMAX(unsigned int, int, unsigned int)
ASTRA_HOST_MINMAX(long, long, long)
ASTRA_HOST_MINMAX(unsigned long, unsigned long, unsigned long)
ASTRA_HOST_MINMAX(long, unsigned long, unsigned long)
ASTRA_HOST_MINMAX(unsigned long, long, unsigned long)
ASTRA_HOST_MINMAX(long long, long long, long long)
ASTRA_HOST_MINMAX(unsigned long long, unsigned long long, unsigned long long)
ASTRA_HOST_MINMAX(long long, unsigned long long, unsigned long long)
ASTRA_HOST_MINMAX(unsigned long long, long long, unsigned long long)
ASTRA_HOST_MINMAX(float, float, float)
ASTRA_HOST_MINMAX(double, double, double)
ASTRA_HOST_MINMAX(float, double, double)
ASTRA_HOST_MINMAX(double, float, double)
#undef ASTRA_HOST_MINMAX

// Cache-hinted loads and stores: nvcc declares them for every vector type in
// sm_32_intrinsics.h; clang's wrapper only defines __ldg.
template <class T> __device__ T __ldca(const T* ptr);
template <class T> __device__ T __ldcg(const T* ptr);
template <class T> __device__ T __ldcs(const T* ptr);
template <class T> __device__ T __ldcv(const T* ptr);
template <class T> __device__ T __ldlu(const T* ptr);
template <class T> __device__ void __stcg(T* ptr, T value);
template <class T> __device__ void __stcs(T* ptr, T value);
template <class T> __device__ void __stwb(T* ptr, T value);
template <class T> __device__ void __stwt(T* ptr, T value);

#endif  // __CUDA__
