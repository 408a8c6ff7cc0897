#include <algorithm>
#include <cstdio>
#include <string>

#include "sd/memory_plan.h"

namespace sd {

std::string measurement_report(const MemoryPlan& plan, const StagePeaks& m, const StageTimes& t, bool on_gpu) {
    std::string out = plan.describe();
    const double resident = plan.sequential ? 0 : plan.text.weights + plan.unet.weights + plan.vae.weights;
    const std::string measured_what = on_gpu ? ", host RSS measured " : ", measured ";
    auto line = [&](const char* stage, const StagePrediction& s, long long measured, long long kept) {
        const double predicted = plan.sequential ? s.total(plan.base) : plan.base + resident + s.transient();
        out += std::string("  ") + stage + " peak: predicted " + format_size(predicted) + " (freed blocks kept " +
               format_size(s.kept) + ")" + measured_what + format_size(static_cast<double>(measured)) + " (kept " +
               format_size(static_cast<double>(kept)) + ")\n";
    };
    line("text encoder", plan.text, m.text, m.text_kept);
    line("unet        ", plan.unet, m.unet, m.unet_kept);
    line("vae decoder ", plan.vae, m.vae, m.vae_kept);
    char buf[256];
    // The encoder (--init-img, the hires fix's lanczos pass), loaded beside the resident stages.
    if (m.encode > 0 || t.encode_load > 0) {
        const double predicted = plan.sequential ? plan.enc.total(plan.base) : resident + plan.base + plan.enc.total(0);
        std::snprintf(buf, sizeof buf,
                      "  vae encoder peak: predicted %s (freed blocks kept %s), measured %s (kept %s), load %.2f s, "
                      "last encode %.2f s\n",
                      format_size(plan.encode ? predicted : 0).c_str(), format_size(plan.enc.kept).c_str(),
                      format_size(static_cast<double>(m.encode)).c_str(),
                      format_size(static_cast<double>(m.encode_kept)).c_str(), t.encode_load, t.last_encode);
        out += buf;
    }
    // Measuring a stage resets the kernel's peak counter, so an outside tool
    // (/usr/bin/time) sees the last stage's peak only: give the whole run's here.
    const long long run_peak = std::max({m.text, m.unet, m.vae, m.encode});
    out += "  whole run peak: predicted " + format_size(plan.peak()) + measured_what +
           format_size(static_cast<double>(run_peak)) +
           " (the largest stage; with --verbose, /usr/bin/time's maximum RSS covers the last stage only)\n";
    std::snprintf(
        buf, sizeof buf,
        "sd-txt2img: timing: text encoder load %.2f s, UNet load %.2f s, VAE load %.2f s, first prompts encoded "
        "in %.2f s, start to first step %.2f s, last decode %.2f s\n",
        t.text_load, t.unet_load, t.vae_load, t.first_text_encode, t.start_to_first_step, t.last_decode);
    out += buf;
    out += "sd-txt2img: allocator: " + std::to_string(m.reused_blocks) + " of " + std::to_string(m.large_blocks) +
           " large blocks reused\n";
    // Rows per evaluation and image: 2 with guidance, 1 at --scale 1 (the cond alone).
    out += "sd-txt2img: unet: " + std::to_string(m.unet_evaluations) + " model evaluations, " +
           std::to_string(m.unet_rows) + " UNet rows, " + std::to_string(m.text_rows) +
           " text encoder rows (last batch)\n";
    return out;
}

}  // namespace sd
