// Every sampler of the tool, one row each:
//   X(function, name, A1111 name, family, schedules, automatic, options)
// `function` names sample_<function>, the tensor code (src/engine/sampling_loop.cpp
// or src/engine/samplers/<function>.cpp); `name` is what --sampler and JSONL
// lines say; the A1111 name is what the web UI's PNG "Sampler:" field says
// (--sampler takes it too); `family` is compvis (CompVis timesteps, so
// --steps 30 runs 31), k_diffusion (sigmas, exactly --steps, except the DDIM
// schedule) or lcm (LCMScheduler's timesteps from its 50-step origin grid,
// exactly --steps, at most 50); `schedules` are the --schedule values the
// sampler takes besides "automatic" ("leading" for euler, euler_a and
// dpmpp_2m and "trailing" for euler and euler_a are diffusers' schedulers with
// that timestep spacing; trailing is the Turbo schedule); `automatic` is the
// schedule "automatic" (the web UI's "Automatic") runs, the web UI's choice
// for the sampler; `options` are the web UI's sampler options this tool
// honours: discard_penultimate (the schedule is made for steps + 1 and its
// next-to-last sigma dropped), eta (its added noise is scaled by eta, the
// web UI's "Eta"; 1 unless set), brownian (its noise comes from Brownian
// trees, --brownian-tree) and second_order (the web UI counts two model calls a
// step when it schedules prompt editing: engine/text_schedule.h).
// Names, help, errors, metadata and step counts all come from this list:
// adding a sampler is one row here and one function there.
#pragma once

// The sigma schedules every k-diffusion sampler takes (k_sigmas in engine/sampling_loop.h).
#define SD_K_SCHEDULES \
    "default karras exponential polyexponential sgm_uniform kl_optimal align_your_steps simple normal ddim beta"

#define SD_SAMPLERS(X)                                                                                             \
    X(plms, "plms", "PLMS", compvis, "default leading trailing", "default", "")                                    \
    X(ddim, "ddim", "DDIM", compvis, "default leading trailing", "default", "")                                    \
    X(euler, "euler", "Euler", k_diffusion, SD_K_SCHEDULES " leading trailing", "default", "")                     \
    X(euler_a, "euler_a", "Euler a", k_diffusion, SD_K_SCHEDULES " leading trailing", "default", "eta")            \
    X(dpmpp_2m, "dpmpp_2m", "DPM++ 2M", k_diffusion, SD_K_SCHEDULES " leading", "karras", "")                      \
    X(lcm, "lcm", "LCM", lcm, "default", "default", "")                                                            \
    X(heun, "heun", "Heun", k_diffusion, SD_K_SCHEDULES, "default", "second_order")                                \
    X(dpm_2, "dpm_2", "DPM2", k_diffusion, SD_K_SCHEDULES, "karras", "discard_penultimate second_order")           \
    X(dpm_2_a, "dpm_2_a", "DPM2 a", k_diffusion, SD_K_SCHEDULES, "karras", "discard_penultimate eta second_order") \
    X(lms, "lms", "LMS", k_diffusion, SD_K_SCHEDULES, "default", "")                                               \
    X(dpmpp_2s_a, "dpmpp_2s_a", "DPM++ 2S a", k_diffusion, SD_K_SCHEDULES, "karras", "eta second_order")           \
    X(dpmpp_sde, "dpmpp_sde", "DPM++ SDE", k_diffusion, SD_K_SCHEDULES, "karras", "eta brownian second_order")     \
    X(dpmpp_2m_sde, "dpmpp_2m_sde", "DPM++ 2M SDE", k_diffusion, SD_K_SCHEDULES, "exponential", "eta brownian")    \
    X(dpmpp_2m_sde_heun, "dpmpp_2m_sde_heun", "DPM++ 2M SDE Heun", k_diffusion, SD_K_SCHEDULES, "exponential",     \
      "eta brownian")                                                                                              \
    X(dpmpp_3m_sde, "dpmpp_3m_sde", "DPM++ 3M SDE", k_diffusion, SD_K_SCHEDULES, "exponential",                    \
      "discard_penultimate eta brownian")

// Every schedule name and the web UI's "Schedule type" label for it, in the web UI's order.
#define SD_SCHEDULE_LABELS(X)                 \
    X("automatic", "Automatic")               \
    X("default", "Uniform")                   \
    X("karras", "Karras")                     \
    X("exponential", "Exponential")           \
    X("polyexponential", "Polyexponential")   \
    X("sgm_uniform", "SGM Uniform")           \
    X("kl_optimal", "KL Optimal")             \
    X("align_your_steps", "Align Your Steps") \
    X("simple", "Simple")                     \
    X("normal", "Normal")                     \
    X("ddim", "DDIM")                         \
    X("beta", "Beta")                         \
    X("leading", "Leading")                   \
    X("trailing", "Trailing")
