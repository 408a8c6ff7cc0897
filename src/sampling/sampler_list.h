// Every sampler of the tool, one row each:
//   X(function, name, A1111 name, family)
// `function` names sample_<function> in src/engine/samplers.cpp, the tensor
// code; `name` is what --sampler and JSONL lines say; the A1111 name is what
// the PNG's "Sampler:" field says; `family` is compvis (CompVis timesteps, so
// --steps 30 runs 31) or k_diffusion (sigmas, --schedule, exactly --steps).
// Names, help, errors, metadata and step counts all come from this list:
// adding a sampler is one row here and one function there.
#pragma once

#define SD_SAMPLERS(X)                           \
    X(plms, "plms", "PLMS", compvis)             \
    X(ddim, "ddim", "DDIM", compvis)             \
    X(euler, "euler", "Euler", k_diffusion)      \
    X(euler_a, "euler_a", "Euler a", k_diffusion) \
    X(dpmpp_2m, "dpmpp_2m", "DPM++ 2M", k_diffusion)
