// The Python export (python/sd_export) run as a child process, for the model
// cache (run/model_cache). Where it is found:
//   the interpreter: $SD_PYTHON, else /usr/bin/python3 (Debian's, with python3-torch);
//   the package:     $SD_EXPORT_PYTHONPATH (the folder holding sd_export/), else
//                    the source tree's python/ this build was made from.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace sd {

std::string export_python();
std::string export_package_dir();

// Exports `source` (a checkpoint file or diffusers folder) into the folder
// `out` with the export's own extra arguments. Each line the export prints
// goes to note (its error line and argparse's usage text excepted). A missing
// interpreter, PyTorch or package, and a failed export, throw sd::Error with
// one line saying what to do; an export killed by a signal throws
// sd::RunFailure. The child dies with this process (PR_SET_PDEATHSIG).
// `shown` names the source in messages (the path as the user gave it).
void run_python_export(const std::string& source, const std::string& out, const std::vector<std::string>& args,
                       const std::function<void(const std::string&)>& note, const std::string& shown);

}  // namespace sd
