// The tensor side of the tool (LibTorch and the TorchScript stages) is a
// shared module, libsd_engine.so beside the executable, loaded only when a
// model is about to run. Until then the process is small and quick: flags,
// prompt files, model.json and every other input are checked in a few
// milliseconds and megabytes, where linking LibTorch costs about a second and
// 160 MB before main() (measured, docs/benchmarks.md).
#pragma once
#include <memory>

#include "sd/pipeline.h"

namespace sd {

// Bumped whenever Pipeline, PipelineOptions or what they carry change shape,
// so that an engine module from another build is refused, not misread.
constexpr int kEngineInterfaceVersion = 4;

// OpenMP threads that wait for work spin by default; a spinning thread takes
// the core the working one needs, even on a quiet 2-core machine (measured: a
// 256x256 step 3.4 s passive against 6.6-6.9 s active). When the user has not
// set OMP_WAIT_POLICY, this sets it to passive. Call it before load_pipeline:
// libgomp reads the variable when the engine module brings it in.
void use_passive_openmp();

// Debian 12's OpenBLAS (0.3.21) picks its kernels by CPU model and falls back to
// its SSE3 ones ("Prescott") on models it does not know: measured on a Xeon of
// family 6 model 207, 52-174 GFLOP/s for a 2048² product against 331 with its
// SkylakeX kernels (LibTorch's fp32 matmuls outside oneDNN: the text encoders).
// On a CPU with AVX-512, unless the user set OPENBLAS_CORETYPE, this names
// SkylakeX's. Call it before load_pipeline, as use_passive_openmp.
void use_openblas_kernels_for_this_cpu();

// Loads the engine module (once) and makes a pipeline with it. Throws
// sd::Error when the module is missing or from another build, and whatever
// make_pipeline throws.
std::unique_ptr<Pipeline> load_pipeline(const PipelineOptions& options);

}  // namespace sd
