#include "sd/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace sd {

std::string format_duration(double seconds) {
    const long s = std::lround(std::max(0.0, seconds));
    char buf[32];
    if (s >= 3600)
        std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else if (s >= 60)
        std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
    else
        std::snprintf(buf, sizeof buf, "%lds", s);
    return buf;
}

std::string progress_text(const ProgressInfo& p) {
    char buf[160];
    std::string images = p.batch_images > 1 ? "images " + std::to_string(p.first_image) + "-" +
                                                  std::to_string(p.first_image + p.batch_images - 1)
                                            : "image " + std::to_string(p.first_image);
    std::snprintf(buf, sizeof buf, "%s/%d  step %d/%d  %.2f s/step  ETA %s", images.c_str(), p.total_images, p.step,
                  p.steps, p.seconds_per_step, p.eta_seconds < 0 ? "--" : format_duration(p.eta_seconds).c_str());
    return buf;
}

ProgressDisplay::Mode ProgressDisplay::detect(bool quiet, FILE* out) {
    if (quiet) return Mode::off;
    return isatty(fileno(out)) ? Mode::bar : Mode::lines;
}

void ProgressDisplay::update(const ProgressInfo& p) {
    if (mode_ == Mode::off) return;
    const std::string text = progress_text(p);
    if (mode_ == Mode::lines) {
        std::fprintf(out_, "sd-txt2img: %s\n", text.c_str());
        std::fflush(out_);
        return;
    }
    // The bar shows the run's progress in sampler steps of the current batch
    // and images done; it is sized to the terminal so that it never wraps.
    int columns = 80;
    winsize ws{};
    if (ioctl(fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) columns = ws.ws_col;
    std::string text_fit = text.substr(0, static_cast<size_t>(std::max(1, columns - 1)));
    const int width = std::min(30, columns - static_cast<int>(text_fit.size()) - 4);
    std::string line = "\r\033[K";
    if (width >= 5) {
        const double done =
            p.total_images > 0
                ? (p.first_image - 1 + p.batch_images * double(p.step) / std::max(1, p.steps)) / p.total_images
                : 0.0;
        const int filled = std::clamp(static_cast<int>(done * width), 0, width);
        line += "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
    }
    line += text_fit;
    std::fputs(line.c_str(), out_);
    std::fflush(out_);
    bar_shown_ = true;
}

void ProgressDisplay::clear() {
    if (!bar_shown_) return;
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
    bar_shown_ = false;
}

}  // namespace sd
