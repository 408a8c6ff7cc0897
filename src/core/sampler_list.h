// Every sampler of the tool, one row each:
//   X(function, name, A1111 name, family, schedules)
// `function` names sample_<function> in src/engine/sampling_loop.cpp, the tensor
// code; `name` is what --sampler and JSONL lines say; the A1111 name is what
// the PNG's "Sampler:" field says; `family` is compvis (CompVis timesteps, so
// --steps 30 runs 31), k_diffusion (sigmas, exactly --steps) or lcm
// (LCMScheduler's timesteps from its 50-step origin grid, exactly --steps, at
// most 50); `schedules` are the --schedule values the sampler takes
// ("leading" for euler, euler_a and dpmpp_2m and "trailing" for euler and
// euler_a are diffusers' schedulers with that timestep spacing; trailing is
// the Turbo schedule).
// Names, help, errors, metadata and step counts all come from this list:
// adding a sampler is one row here and one function there.
#pragma once

#define SD_SAMPLERS(X)                                                               \
    X(plms, "plms", "PLMS", compvis, "default leading trailing")                     \
    X(ddim, "ddim", "DDIM", compvis, "default leading trailing")                     \
    X(euler, "euler", "Euler", k_diffusion, "default karras leading trailing")       \
    X(euler_a, "euler_a", "Euler a", k_diffusion, "default karras leading trailing") \
    X(dpmpp_2m, "dpmpp_2m", "DPM++ 2M", k_diffusion, "default karras leading")       \
    X(lcm, "lcm", "LCM", lcm, "default")
