#include "io/tensor_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <new>
#include <set>

#include "io/fs_util.h"
#include "io/printable.h"
#include "io/sha256.h"
#include "io/zip_reader.h"
#include "sd/error.h"

namespace sd {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the safetensors format's own limit
// data.pkl of a checkpoint of ~1000 tensors is a few hundred KB; the parse of
// a pickle this size stays within torch_pickle.cpp's own limits.
constexpr uint64_t kMaxPickle = 16u << 20;

uint64_t le64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
    return v;
}

// Copies the elements of view t out of its storage's bytes, in row-major order.
// torch_pickle.cpp checked that every element it reaches lies in the storage.
void gather(const char* storage, const PickledTensor& t, uint64_t elem, char* dst) {
    const size_t dims = t.shape.size();
    for (int64_t n : t.shape)
        if (n == 0) return;
    if (dims == 0) {
        std::memcpy(dst, storage + t.offset * elem, elem);
        return;
    }
    const int64_t inner = t.shape[dims - 1], inner_stride = t.stride[dims - 1];
    std::vector<int64_t> idx(dims - 1, 0);
    for (;;) {
        int64_t base = t.offset;
        for (size_t d = 0; d + 1 < dims; ++d) base += idx[d] * t.stride[d];
        if (inner_stride == 1) {
            std::memcpy(dst, storage + base * elem, inner * elem);
            dst += inner * elem;
        } else {
            for (int64_t k = 0; k < inner; ++k, dst += elem)
                std::memcpy(dst, storage + (base + k * inner_stride) * elem, elem);
        }
        size_t d = dims - 1;
        bool done = true;
        while (d > 0) {
            --d;
            if (++idx[d] < t.shape[d]) {
                done = false;
                break;
            }
            idx[d] = 0;
        }
        if (done) return;
    }
}

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

}  // namespace

TensorReader::TensorReader(const std::string& path, TensorReadOptions options)
    : path_(path), options_(std::move(options)) {
    size_ = check_regular_file(path_, options_.what);
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw Error(options_.what + " " + path_ + " cannot be read: " + std::strerror(errno));
    try {
        unsigned char head[4] = {};
        if (size_ >= 4) read_at(fd_, 0, 4, reinterpret_cast<char*>(head), path_);
        const bool zip = size_ >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0;
        if (!options_.safetensors_only && size_ >= 2 && head[0] == 0x80 && head[1] <= 5)
            throw Error(path_ +
                        " is in torch.save's format of before PyTorch 1.6, which this tool does not read; "
                        "save it again with a newer PyTorch or convert it to .safetensors");
        if (zip && !options_.safetensors_only)
            open_torch_zip();
        else
            open_safetensors();
    } catch (const std::bad_alloc&) {
        ::close(fd_);
        out_of_memory();
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

TensorReader::~TensorReader() {
    if (fd_ >= 0) ::close(fd_);
}

void TensorReader::out_of_memory() const {
    throw Error("cannot read " + path_ + ": out of memory while reading its tensors");
}

long TensorReader::find(const std::string& name) const {
    for (size_t k = 0; k < entries_.size(); ++k)
        if (entries_[k].name == name) return static_cast<long>(k);
    return -1;
}

void TensorReader::open_safetensors() {
    safetensors_ = true;
    unsigned char len[8];
    if (size_ < 8) throw Error("weights file " + path_ + " is corrupt: shorter than its header");
    read_at(fd_, 0, 8, reinterpret_cast<char*>(len), path_);
    const uint64_t header_len = le64(len);
    if (header_len > kMaxHeader || header_len > size_ - 8)
        throw Error("weights file " + path_ + " is corrupt: header length past the end of the file");
    std::string header(header_len, '\0');
    read_at(fd_, 8, header_len, header.data(), path_);
    ranges_ = parse_weight_header(header, size_, path_, WeightUse::AnyDtype);
    for (const auto& w : ranges_) entries_.push_back({w.name, w.dtype, w.shape, w.end - w.begin});
    if (options_.hash) hash_file(8 + header_len);
}

void TensorReader::open_torch_zip() {
    zip_ = std::make_unique<ZipReader>(fd_, size_, path_);
    // Code records would make it a TorchScript module: loading that runs its
    // code, so such a file is not a file of tensors.
    for (const auto& r : zip_->records()) {
        const size_t slash = r.name.find('/');
        const std::string name = slash == std::string::npos ? r.name : r.name.substr(slash + 1);
        if (name.rfind("code/", 0) == 0 || name == "constants.pkl")
            throw Error(path_ +
                        " is a TorchScript program, not a file of tensors; refusing to load it (README \"Security\")");
    }
    if (const ZipRecord* order = zip_->find("byteorder")) {
        char text[8] = {};
        if (order->size != 6 || (zip_->read(*order, 6, text), std::string(text, 6) != "little"))
            throw Error("cannot read " + path_ + ": its tensors are stored big-endian");
    }
    const ZipRecord* pkl = zip_->find("data.pkl");
    if (!pkl) throw Error("cannot read " + path_ + ": a zip archive without data.pkl (not a torch.save file)");
    if (pkl->size > kMaxPickle)
        throw Error("cannot read " + path_ + ": its data.pkl is " + mib(pkl->size) + ", more than the " +
                    mib(kMaxPickle) + " this reader takes (a damaged or hostile file?)");
    std::string pickle(pkl->size, '\0');
    zip_->read(*pkl, pkl->size, pickle.data());
    pickled_ = parse_torch_pickle(pickle, path_);
    std::set<std::string> names;
    for (const auto& p : pickled_) {
        if (!names.insert(p.name).second)
            throw Error("cannot read " + path_ + ": two tensors named " + printable(p.name));
        uint64_t n = static_cast<uint64_t>(dtype_size(p.dtype));
        for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);  // each size below 2^40 and their product too
        entries_.push_back({p.name, p.dtype, p.shape, n});
    }
    if (options_.hash) hash_file(0);
}

void TensorReader::hash_file(uint64_t data_start) {
    Sha256 whole, data;
    std::string buf(1u << 20, '\0');
    for (uint64_t at = 0; at < size_;) {
        const uint64_t n = std::min<uint64_t>(buf.size(), size_ - at);
        read_at(fd_, at, n, buf.data(), path_);
        whole.update(buf.data(), n);
        if (at + n > data_start) {
            const uint64_t skip = at >= data_start ? 0 : data_start - at;
            data.update(buf.data() + skip, n - skip);
        }
        at += n;
    }
    sha256_ = whole.hex();
    data_sha256_ = data.hex();
}

void TensorReader::read(const std::vector<size_t>& which, const std::function<char*(size_t)>& dest) {
    // The memory these tensors take, before any of it is: each storage once at
    // its declared size, and every tensor at what it materialises (a stride-0
    // view of one element can stand for gigabytes).
    uint64_t total = 0;
    std::map<std::string, std::vector<size_t>> by_storage;  // storage -> indexes, in order
    const auto add = [&](uint64_t n) {
        if (n > options_.max_bytes - std::min(total, options_.max_bytes))
            throw Error(options_.what + " " + path_ + ": its tensors would take more than " + mib(options_.max_bytes) +
                        " of memory, this reader's limit for such a file (a damaged or hostile file?)");
        total += n;
    };
    for (size_t i : which) {
        add(entries_.at(i).bytes);
        if (!safetensors_) by_storage[pickled_[i].storage].push_back(i);
    }
    std::map<std::string, uint64_t> storage_bytes;  // the largest size any view declares for it
    for (const auto& [storage, list] : by_storage) {
        uint64_t need = 0;
        for (size_t i : list)
            need = std::max(need, static_cast<uint64_t>(pickled_[i].storage_numel) * dtype_size(pickled_[i].dtype));
        add(need);
        storage_bytes[storage] = need;
    }
    try {
        if (safetensors_) {
            for (size_t i : which) {
                char* to = dest(i);  // also for an empty tensor: the caller makes each one it asked for
                if (entries_[i].bytes) read_at(fd_, ranges_[i].begin, entries_[i].bytes, to, path_);
            }
            return;
        }
        for (const auto& [storage, list] : by_storage) {
            const PickledTensor& first = pickled_[list.front()];
            const uint64_t elem = static_cast<uint64_t>(dtype_size(first.dtype));
            const uint64_t need = storage_bytes[storage];  // every view fits its declared storage (torch_pickle.cpp)
            const ZipRecord* r = zip_->find("data/" + storage);
            if (!r) throw Error("cannot read " + path_ + ": the storage " + storage + " is missing");
            if (r->size < need)
                throw Error("cannot read " + path_ + ": the storage " + storage + " is shorter than its tensors");
            // torch.save writes a storage's bytes exactly: a record of another size
            // (a small deflated record that would inflate to gigabytes) is not one.
            if (r->size != need)
                throw Error("cannot read " + path_ + ": the storage " + storage + " holds " + std::to_string(r->size) +
                            " bytes, its tensors declare " + std::to_string(need));
            std::string bytes(need, '\0');
            zip_->read(*r, need, bytes.data());
            for (size_t i : list) {
                if (dtype_size(pickled_[i].dtype) != static_cast<int>(elem))
                    throw Error("cannot read " + path_ + ": the storage " + storage + " is read as two element sizes");
                gather(bytes.data(), pickled_[i], elem, dest(i));
            }
        }
    } catch (const std::bad_alloc&) {
        out_of_memory();
    }
}

}  // namespace sd
