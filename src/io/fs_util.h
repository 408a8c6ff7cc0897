// File output that never leaves partial files: everything is written to a
// temporary name in the same folder and then renamed (or linked) into place.
#pragma once
#include <cstddef>
#include <string>

namespace sd {

// Writes data to path via a temporary file and rename(); replaces an existing file.
// Throws sd::Error with a one-line message (e.g. folder missing, disk full).
void write_file_atomic(const std::string& path, const void* data, size_t size);

// Like write_file_atomic, but never replaces an existing file: returns false
// (and leaves nothing behind) when path already exists.
bool write_file_new(const std::string& path, const void* data, size_t size);

// Creates the folder (and parents) if needed and checks that files can be
// created in it. Throws sd::Error naming the folder otherwise.
void ensure_writable_dir(const std::string& dir);

// For an output file that must not exist yet (--save-latents): refuses a path
// where anything is, a file, a symlink (even a dangling one), a FIFO or a
// device, and a path whose folder is missing or not writable. `what` names
// the option in the message. Throws sd::Error.
void check_new_file_path(const std::string& path, const std::string& what);

// For a file the user hands in: refuses (sd::Error, naming `what` and the
// path) one that is missing, a folder, a FIFO, a device or a socket, after
// following links, so that no reader blocks on a pipe or spins on /dev/zero.
// Returns the file's size in bytes.
size_t check_regular_file(const std::string& path, const std::string& what);

// The whole file, after check_regular_file, refused with one line when it is
// larger than max_bytes (no byte of it is read then).
std::string read_file_capped(const std::string& path, size_t max_bytes, const std::string& what);

// The text of a kernel interface file (/proc, /sys: their sizes read as 0), at
// most 1 MiB of it. "" where it cannot be read, without an error: a cgroup file
// that is missing means no limit.
std::string read_kernel_text(const std::string& path);

bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace sd
