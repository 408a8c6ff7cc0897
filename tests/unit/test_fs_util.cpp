// io/fs_util: the regular-file check and the capped reader every user file goes through.
#include "io/fs_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "sd/error.h"
#include "test_util.h"

namespace {

using sdtest::temp_dir;

TEST(FsUtil, RegularFileGivesItsSize) {
    const std::string d = temp_dir(), f = d + "/a.txt";
    std::ofstream(f) << "hello";
    EXPECT_EQ(sd::check_regular_file(f, "--lora"), 5u);
    EXPECT_EQ(sd::read_file_capped(f, 5, "--lora"), "hello");
}

TEST(FsUtil, RefusesSpecialFilesNamingThem) {
    const std::string d = temp_dir();
    const std::string fifo = d + "/y.safetensors";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    // Would block forever if it opened the FIFO.
    EXPECT_NE(sdtest::error_of([&] { sd::read_file_capped(fifo, 100, "--embedding"); }).find("--embedding " + fifo + " is a FIFO"),
              std::string::npos);
    const std::string link = d + "/x.safetensors";
    ASSERT_EQ(symlink("/dev/zero", link.c_str()), 0);
    EXPECT_NE(sdtest::error_of([&] { sd::check_regular_file(link, "--lora"); }).find("is a device"), std::string::npos);
    EXPECT_NE(sdtest::error_of([&] { sd::check_regular_file(d, "--from-png"); }).find("is a folder"), std::string::npos);
    EXPECT_NE(sdtest::error_of([&] { sd::check_regular_file(d + "/none", "--vae"); }).find("does not exist"), std::string::npos);
}

TEST(FsUtil, RefusesFilesOverTheCap) {
    const std::string d = temp_dir(), f = d + "/big.png";
    std::ofstream(f) << std::string(1000, 'x');
    const std::string m = sdtest::error_of([&] { sd::read_file_capped(f, 999, "--from-png"); });
    EXPECT_NE(m.find("--from-png " + f + " is 1000 bytes, more than the 999"), std::string::npos) << m;
}

}  // namespace

TEST(FsUtil, ReadsKernelFilesWhoseSizeIsZero) {
    struct stat st {};
    ASSERT_EQ(::stat("/proc/self/status", &st), 0);
    EXPECT_EQ(st.st_size, 0);
    EXPECT_NE(sd::read_kernel_text("/proc/self/status").find("\nVmRSS:"), std::string::npos);
    EXPECT_EQ(sd::read_kernel_text("/proc/self/no-such-file"), "");
    EXPECT_EQ(sd::read_kernel_text(sdtest::temp_dir()), "");  // a folder reads as nothing
}
