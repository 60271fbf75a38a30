#pragma once
// The `cuda` backend: every Backend op on an NVIDIA GPU, in f32 and bf16. Memory comes from
// cudaMalloc, one block per arena (arenas ask for one block each); kernels run on one compute
// stream in order; GEMMs are cuBLASLt with fp32 accumulation; the other kernels are
// src/backend/cuda/*.cu, one file per op family, their per-element math shared with the CPU
// backends (core/kernel_math.h).
//
// Part of the CUDA module (cuda_module.h): only the module's own files include it. Free of
// CUDA headers.
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/backend_options.h"

namespace bottle {
namespace cuda {
struct CudnnLoad;
using CudnnLoader = CudnnLoad (*)(void* stream);  // backend/cuda/attention_cudnn.h
}  // namespace cuda

// Why this process cannot use a GPU ("no CUDA device is visible (cudaGetDeviceCount: ...)"),
// or empty when it can. Tests skip with this reason.
std::string cuda_unavailable();

// The backend on the GPU of this node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or
// LOCAL_RANK, modulo the devices visible; device 0 for a single process). Fails with
// cuda_unavailable()'s reason when there is no GPU. `attention` chooses its attention kernels
// (training.attention); `load_cudnn` opens cuDNN's (backend/cuda/attention_cudnn.h), null in a
// build without cudnn-frontend.
std::unique_ptr<Backend> make_cuda_backend(AttentionChoice attention, cuda::CudnnLoader load_cudnn);

// "cuda: CUDA runtime 13.0, cuBLASLt 13.0.0; NVIDIA H200 (sm_90, 139.8 GiB)" or the reason
// there is no GPU, for `bottle --version`.
std::string cuda_description();

}  // namespace bottle
