// Errors the user can fix (bad flags, missing or corrupt files, sizes the model
// cannot take). The CLI prints what() as one line and exits with status 1.
#pragma once
#include <stdexcept>
#include <string>

namespace sd {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A failure while running, after the input was accepted (the disk filled up,
// stdout closed, sampling diverged): the CLI exits 2 for it, not 1.
struct RunFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace sd
