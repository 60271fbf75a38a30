#pragma once
// `bottle bench step`: the training step of `bottle train` (train/train_step.h: forward +
// backward, the global gradient norm, clipping, AdamW) timed on one process for each model
// kind, on the cpu, reference or cuda backend, next to the same step in PyTorch run in the same
// invocation (on the CPU, or on the same GPU: eager, and torch.compile'd with
// --torch-compile), with achieved GFLOP/s and MFU against a GEMM peak measured here and now
// (and against a nominal peak given with --peak-tflops); with --json one StepRow per kind and
// precision (bench/results.h).
#include <cstdint>
#include <string>

#include "train/train_config.h"

namespace bottle {

// What bench step times, its defaults resolved by the command line (apps/).
struct BenchStepOptions {
  // The configuration file the settings came from; empty: none (the shape came from --hidden
  // and the rest).
  std::string config_path;
  ModelConfig model;                // the shape; max_seq_len at least seq
  std::string kinds = "none,cola";  // comma-separated model kinds
  std::string precisions = "fp32";  // comma-separated: fp32, bf16
  std::string optimizers;           // comma-separated optimizer.name values; empty: the config's
  int64_t batch = 8, seq = 256, steps = 10, warmup = 3;
  int threads = 2;
  std::string save;                  // --save: a folder for each kind's model after its steps
  std::string backend;               // cpu, reference or cuda
  bool backend_from_config = false;  // training.backend chose it, not --backend
  std::string attention;             // auto, cudnn or own
  double peak_tflops = 0;            // --peak-tflops; 0: none given
  bool torch = true, torch_compile = false, json = false, profile = false;
  // --torch-blas: "best" (OpenBLAS's best core for the CPU over a weaker pinned one) or
  // "environment"; empty: $BOTTLE_TORCH_BLAS, else best (the tests set environment).
  std::string torch_blas;
};

// Times each kind in each precision on `base`'s step settings (seed, max_norm, optimizer,
// micro-batch and sequence length) and prints a line, or its StepRow as JSON, per kind and
// precision.
void run_bench_step(const TrainConfig& base, BenchStepOptions options);

}  // namespace bottle
