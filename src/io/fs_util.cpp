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
        const char* kind = S_ISREG(st.st_mode)   ? "a file"
                           : S_ISLNK(st.st_mode) ? "a symbolic link"
                           : S_ISDIR(st.st_mode) ? "a folder"
                                                 : "a special file";
        throw Error(what + " " + path + ": " + kind + " is already there; it is never replaced (choose a new name)");
    }
    const auto slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (!is_directory(dir)) throw Error(what + " " + path + ": the folder " + dir + " does not exist");
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
        throw Error(what + " " + path + ": the folder " + dir + " is not writable");
}

size_t check_regular_file(const std::string& path, const std::string& what) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) throw Error(what + " " + path + " does not exist");
        throw Error(what + " " + path + " cannot be read: " + std::strerror(err));
    }
    if (S_ISREG(st.st_mode)) return static_cast<size_t>(st.st_size);
    const char* kind = S_ISDIR(st.st_mode)                          ? "a folder"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                    : "not a regular file";
    throw Error(what + " " + path + " is " + kind + ", not a regular file");
}

std::string read_file_capped(const std::string& path, size_t max_bytes, const std::string& what) {
    const size_t size = check_regular_file(path, what);
    if (size > max_bytes)
        throw Error(what + " " + path + " is " + std::to_string(size) + " bytes, more than the " +
                    std::to_string(max_bytes) + " this reader takes");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(what + " " + path + " cannot be read: " + std::strerror(errno));
    std::string data;
    // Read at most one byte past the cap: the file may grow after the stat.
    char buf[1 << 16];
    while (data.size() <= max_bytes) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            ::close(fd);
            throw Error(what + " " + path + " cannot be read: " + std::strerror(err));
        }
        if (n == 0) break;
        data.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    if (data.size() > max_bytes)
        throw Error(what + " " + path + " is larger than the " + std::to_string(max_bytes) +
                    " bytes this reader takes");
    return data;
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

std::string read_kernel_text(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    std::string text;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || text.size() + static_cast<size_t>(n) > (1u << 20)) break;
        text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return text;
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
