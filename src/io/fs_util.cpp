#include "io/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "sd/error.h"

namespace sd {

namespace {

// Writes into a fresh temporary file next to path; returns its name.
std::string write_temp(const std::string& path, const void* data, size_t size) {
    std::string tmp = path + ".tmp-XXXXXX";
    int fd = mkstemp(tmp.data());
    if (fd < 0) throw Error("cannot create a file next to " + path + ": " + std::strerror(errno));
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
        ssize_t n = ::write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw Error("cannot write " + path + ": " + std::strerror(err));
        }
        p += n;
        left -= static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        throw Error("cannot write " + path + ": " + std::strerror(err));
    }
    return tmp;
}

}  // namespace

void write_file_atomic(const std::string& path, const void* data, size_t size) {
    std::string tmp = write_temp(path, data, size);
    ::chmod(tmp.c_str(), 0644);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        throw Error("cannot write " + path + ": " + std::strerror(err));
    }
}

bool write_file_new(const std::string& path, const void* data, size_t size) {
    std::string tmp = write_temp(path, data, size);
    ::chmod(tmp.c_str(), 0644);
    // link() fails with EEXIST instead of replacing, unlike rename().
    int rc = ::link(tmp.c_str(), path.c_str());
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) return true;
    if (err == EEXIST) return false;
    throw Error("cannot write " + path + ": " + std::strerror(err));
}

void ensure_writable_dir(const std::string& dir) {
    std::error_code ec;
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
        throw Error("output folder " + dir + " is not a folder");
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create output folder " + dir + ": " + ec.message());
    std::string probe = join_path(dir, ".sd-txt2img-probe-XXXXXX");
    int fd = mkstemp(probe.data());
    if (fd < 0) throw Error("output folder " + dir + " is not writable: " + std::strerror(errno));
    ::close(fd);
    ::unlink(probe.c_str());
}

void check_new_file_path(const std::string& path, const std::string& what) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
        const char* kind = S_ISREG(st.st_mode) ? "a file" : S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a folder" : "a special file";
        throw Error(what + " " + path + ": " + kind + " is already there; it is never replaced (choose a new name)");
    }
    const auto slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (!is_directory(dir)) throw Error(what + " " + path + ": the folder " + dir + " does not exist");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(what + " " + path + ": the folder " + dir + " is not writable");
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join_path(const std::string& dir, const std::string& name) {
    if (dir.empty()) return name;
    return dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace sd
