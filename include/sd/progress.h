// Progress on stderr: a redrawn bar on a terminal, plain lines otherwise
// (logs, pipes, Slurm output files), nothing with --quiet.
#pragma once
#include <cstdio>
#include <string>

namespace sd {

struct ProgressInfo {
    int first_image = 1;          // 1-based number, among this run's images, of the batch's first image
    int batch_images = 1;         // images in the batch being sampled
    int total_images = 1;         // images this run generates
    int step = 0, steps = 0;      // sampler step just finished, of steps
    double seconds_per_step = 0;  // of the batch's last step
    double eta_seconds = -1;      // for the whole run; < 0 when not known yet
};

// "1h02m", "4m05s", "12s".
std::string format_duration(double seconds);

// The text of one progress report, without bar: "images 4-6/21  step 12/50  1.23 s/step  ETA 4m05s".
std::string progress_text(const ProgressInfo& p);

class ProgressDisplay {
public:
    enum class Mode { off, bar, lines };

    // bar when `out` is a terminal, lines otherwise, off when quiet.
    static Mode detect(bool quiet, FILE* out = stderr);

    explicit ProgressDisplay(Mode mode, FILE* out = stderr) : mode_(mode), out_(out) {}
    ~ProgressDisplay() { clear(); }

    void update(const ProgressInfo& p);
    // Erases the bar, so that other output (an image path, a message) starts on a clean line.
    void clear();
    Mode mode() const { return mode_; }

private:
    Mode mode_;
    FILE* out_;
    bool bar_shown_ = false;
};

}  // namespace sd
