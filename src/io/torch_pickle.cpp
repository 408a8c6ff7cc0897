#include "io/torch_pickle.h"

#include <cctype>
#include <cstring>
#include <deque>
#include <limits>
#include <unordered_map>

#include "sd/error.h"

namespace sd {

namespace {

// A value of the pickle machine. Values live in one arena owned by the parser
// and refer to each other by index, so a pickle that puts a list inside itself
// (the memo allows it) makes no ownership cycle.
struct Value {
    enum Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Storage, Tensor, Opaque } kind = None;
    int64_t i = 0;              // Int, Bool, Float bits; Storage, Tensor: index into the parser's tensors_
    std::string s, s2;          // Str: s; Global: module s, name s2
    std::vector<size_t> items;  // Tuple/List: elements; Dict: key, value, key, value, ...
};

constexpr size_t kMaxDepth = 64;  // nesting of containers when collecting tensors
constexpr size_t kMaxDims = 16;
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Hard limits, each checked before the memory it guards is taken. A real
// torch.save pickle spends a few dozen opcodes and values per tensor (an SD
// checkpoint: ~1000 tensors, a few hundred KB of pickle); these allow a
// hundred times that, and bound a hostile pickle (a run of ')' '0' opcodes, a
// long string fetched from the memo over and over) to tens of megabytes.
constexpr size_t kMaxOpcodes = size_t{1} << 24;
constexpr size_t kMaxStack = size_t{1} << 20;   // stack entries and marks
constexpr size_t kMaxMemo = size_t{1} << 18;    // memo entries
constexpr size_t kMaxBytes = size_t{64} << 20;  // values, strings, items and collected tensors together
constexpr size_t kMaxNameBytes = 1024;          // a tensor's dotted name

std::string storage_dtype(const std::string& name) {
    static const std::unordered_map<std::string, std::string> types = {
        {"FloatStorage", "F32"}, {"HalfStorage", "F16"}, {"BFloat16Storage", "BF16"}, {"DoubleStorage", "F64"},
        {"LongStorage", "I64"},  {"IntStorage", "I32"},  {"ShortStorage", "I16"},     {"CharStorage", "I8"},
        {"ByteStorage", "U8"},   {"BoolStorage", "BOOL"}};
    auto it = types.find(name);
    return it == types.end() ? "" : it->second;
}

class Parser {
public:
    Parser(std::string_view data, const std::string& path) : data_(data), path_(path) {}

    std::vector<PickledTensor> run() {
        const size_t root = execute();
        std::vector<PickledTensor> out;
        collect(root, "", 0, out);
        return out;
    }

private:
    std::string_view data_;
    const std::string& path_;
    size_t pos_ = 0;
    std::deque<Value> arena_;
    std::vector<size_t> stack_;
    std::vector<size_t> marks_;
    std::unordered_map<uint64_t, size_t> memo_;
    std::vector<PickledTensor> tensors_;  // of Storage and Tensor values
    size_t visits_ = 0, bytes_ = 0;

    // Counts memory the parse is about to take; refuses past kMaxBytes.
    void charge(size_t n) {
        if (n > kMaxBytes - bytes_)
            fail("reading its pickle would take more than " + std::to_string(kMaxBytes >> 20) +
                 " MiB of memory, this reader's limit");
        bytes_ += n;
    }
    void push(size_t v) {
        if (stack_.size() >= kMaxStack) fail("a pickle stack deeper than " + std::to_string(kMaxStack));
        stack_.push_back(v);
    }
    PickledTensor& tensor_of(size_t v) { return tensors_[static_cast<size_t>(at(v).i)]; }
    size_t add_tensor(PickledTensor t, Value::Kind kind) {
        charge(sizeof(PickledTensor) + t.storage.size() + t.dtype.size() + 16 * t.shape.size());
        tensors_.push_back(std::move(t));
        Value x;
        x.kind = kind;
        x.i = static_cast<int64_t>(tensors_.size() - 1);
        return make(std::move(x));
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("cannot read " + path_ + ": " + what + " (corrupt, or not a file of saved tensors)");
    }

    size_t make(Value v) {
        charge(sizeof(Value) + v.s.size() + v.s2.size() + sizeof(size_t) * v.items.size());
        arena_.push_back(std::move(v));
        return arena_.size() - 1;
    }
    size_t make(Value::Kind k) {
        Value v;
        v.kind = k;
        return make(std::move(v));
    }
    Value& at(size_t i) { return arena_[i]; }

    std::string_view take(size_t n) {
        if (n > data_.size() - pos_) fail("the pickle ends early");
        auto s = data_.substr(pos_, n);
        pos_ += n;
        return s;
    }
    uint64_t unsigned_le(size_t n) {
        auto b = take(n);
        uint64_t v = 0;
        for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
        return v;
    }
    std::string line() {
        const size_t end = data_.find('\n', pos_);
        if (end == std::string_view::npos) fail("the pickle ends early");
        std::string s(data_.substr(pos_, end - pos_));
        pos_ = end + 1;
        return s;
    }

    size_t pop() {
        if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
            fail("the pickle pops an empty stack");
        const size_t v = stack_.back();
        stack_.pop_back();
        return v;
    }
    size_t& top() {
        if (stack_.empty()) fail("the pickle reads an empty stack");
        return stack_.back();
    }
    std::vector<size_t> pop_to_mark() {
        if (marks_.empty()) fail("the pickle has no mark");
        const size_t m = marks_.back();
        marks_.pop_back();
        std::vector<size_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
        stack_.resize(m);
        return items;
    }
    void push_int(int64_t v) {
        Value x;
        x.kind = Value::Int;
        x.i = v;
        push(make(std::move(x)));
    }
    void push_str(std::string_view s) {
        Value x;
        x.kind = Value::Str;
        x.s = std::string(s);
        push(make(std::move(x)));
    }
    void push_tuple(std::vector<size_t> items) {
        Value x;
        x.kind = Value::Tuple;
        x.items = std::move(items);
        push(make(std::move(x)));
    }
    void push_global(std::string module, std::string name) {
        Value x;
        x.kind = Value::Global;
        x.s = std::move(module);
        x.s2 = std::move(name);
        push(make(std::move(x)));
    }
    void memo_put(uint64_t key) {
        if (memo_.size() >= kMaxMemo && !memo_.count(key))
            fail("more than " + std::to_string(kMaxMemo) + " memo entries");
        memo_[key] = top();
    }
    void memo_get(uint64_t key) {
        auto it = memo_.find(key);
        if (it == memo_.end()) fail("the pickle refers to a value it never stored");
        push(it->second);
    }
    void set_items(size_t dict, const std::vector<size_t>& kv) {
        if (kv.size() % 2) fail("a dict update with an odd number of items");
        if (at(dict).kind == Value::Opaque) return;
        if (at(dict).kind != Value::Dict) fail("a dict update of something that is not a dict");
        charge(sizeof(size_t) * kv.size());
        for (size_t k : kv) at(dict).items.push_back(k);
    }
    void append_items(size_t list, const std::vector<size_t>& v) {
        if (at(list).kind == Value::Opaque) return;
        if (at(list).kind != Value::List) fail("an append to something that is not a list");
        charge(sizeof(size_t) * v.size());
        for (size_t k : v) at(list).items.push_back(k);
    }

    int64_t int_of(size_t v, const char* what) {
        if (at(v).kind != Value::Int && at(v).kind != Value::Bool) fail(std::string(what) + " is not an integer");
        return at(v).i;
    }
    std::vector<int64_t> ints_of(size_t v, const char* what) {
        if (at(v).kind != Value::Tuple && at(v).kind != Value::List) fail(std::string(what) + " is not a tuple");
        if (at(v).items.size() > kMaxDims)
            fail(std::string(what) + " has more than " + std::to_string(kMaxDims) + " dimensions");
        std::vector<int64_t> out;
        for (size_t e : at(v).items) out.push_back(int_of(e, what));
        return out;
    }

    // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]).
    size_t rebuild_tensor(const std::vector<size_t>& args) {
        if (args.size() < 4) fail("a tensor with too few arguments");
        if (at(args[0]).kind != Value::Storage) fail("a tensor without a storage");
        PickledTensor t = tensor_of(args[0]);
        t.offset = int_of(args[1], "a tensor's offset");
        t.shape = ints_of(args[2], "a tensor's size");
        t.stride = ints_of(args[3], "a tensor's stride");
        if (t.shape.size() != t.stride.size() || t.shape.size() > kMaxDims)
            fail("a tensor whose size and stride disagree");
        // The last element it reaches must lie inside the storage; every size
        // is bounded first, so the products cannot overflow.
        if (t.offset < 0 || t.offset > kMaxElements) fail("a tensor with a bad offset");
        int64_t last = t.offset, numel = 1;
        for (size_t d = 0; d < t.shape.size(); ++d) {
            if (t.shape[d] < 0 || t.shape[d] > kMaxElements || t.stride[d] < 0 || t.stride[d] > kMaxElements)
                fail("a tensor with a bad size or stride");
            numel = t.shape[d] == 0 ? 0 : numel;
            if (numel && t.shape[d] > kMaxElements / numel) fail("a tensor with too many elements");
            numel *= t.shape[d];
            if (t.shape[d] > 0) {
                if (t.stride[d] && t.shape[d] - 1 > (kMaxElements - last) / t.stride[d])
                    fail("a tensor outside its storage");
                last += (t.shape[d] - 1) * t.stride[d];
            }
        }
        if (numel > 0 && last >= t.storage_numel) fail("a tensor outside its storage");
        return add_tensor(std::move(t), Value::Tensor);
    }

    // REDUCE: the only calls this reader makes are rebuilding tensors and empty
    // OrderedDicts; anything else becomes an opaque value that holds nothing.
    size_t call(size_t fn, size_t args_v) {
        if (at(fn).kind != Value::Global) fail("a call of something that is not a global");
        if (at(args_v).kind != Value::Tuple) fail("a call whose arguments are not a tuple");
        const std::vector<size_t> args = at(args_v).items;
        const std::string& module = at(fn).s;
        const std::string& name = at(fn).s2;
        if (module == "torch._utils" && name == "_rebuild_tensor_v2") return rebuild_tensor(args);
        if (module == "torch._utils" && (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state")) {
            if (args.empty() || at(args[0]).kind != Value::Tensor) fail("a parameter without a tensor");
            return args[0];
        }
        if (module == "collections" && name == "OrderedDict" && args.empty()) return make(Value::Dict);
        return make(Value::Opaque);
    }

    // ('storage', torch.FloatStorage, key, location, numel)
    size_t persistent(size_t pid) {
        const Value& p = at(pid);
        if (p.kind != Value::Tuple || p.items.size() != 5 || at(p.items[0]).kind != Value::Str ||
            at(p.items[0]).s != "storage")
            fail("a persistent reference that is not a storage");
        const Value& type = at(p.items[1]);
        const std::string dtype = type.kind == Value::Global && type.s == "torch" ? storage_dtype(type.s2) : "";
        if (dtype.empty()) fail("a storage of an unknown type");
        if (at(p.items[2]).kind != Value::Str) fail("a storage without a name");
        PickledTensor t;
        t.storage = at(p.items[2]).s;
        t.dtype = dtype;
        t.storage_numel = int_of(p.items[4], "a storage's size");
        if (t.storage_numel < 0 || t.storage_numel > kMaxElements) fail("a storage with a bad size");
        if (t.storage.empty() || t.storage.size() > 64) fail("a storage with a bad name");
        for (char c : t.storage)
            if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) fail("a storage with a bad name");
        return add_tensor(std::move(t), Value::Storage);
    }

    size_t execute() {
        for (size_t ops = 0;; ++ops) {
            if (ops >= kMaxOpcodes) fail("a pickle of more than " + std::to_string(kMaxOpcodes) + " opcodes");
            const auto op = static_cast<unsigned char>(take(1)[0]);
            switch (op) {
                case 0x80:
                    take(1);
                    break;  // PROTO
                case 0x95:
                    take(8);
                    break;  // FRAME
                case '.':   // STOP
                    if (stack_.size() != 1 || !marks_.empty()) fail("the pickle does not end with one value");
                    return stack_.back();
                case '(':  // MARK
                    if (marks_.size() >= kMaxStack) fail("more than " + std::to_string(kMaxStack) + " marks");
                    marks_.push_back(stack_.size());
                    break;
                case 'N':
                    push(make(Value::None));
                    break;
                case 0x88:
                case 0x89: {  // NEWTRUE, NEWFALSE
                    Value x;
                    x.kind = Value::Bool;
                    x.i = op == 0x88;
                    push(make(std::move(x)));
                    break;
                }
                case 'K':
                    push_int(static_cast<int64_t>(unsigned_le(1)));
                    break;
                case 'M':
                    push_int(static_cast<int64_t>(unsigned_le(2)));
                    break;
                case 'J':
                    push_int(static_cast<int32_t>(static_cast<uint32_t>(unsigned_le(4))));
                    break;
                case 0x8a: {  // LONG1
                    const size_t n = unsigned_le(1);
                    if (n > 8) fail("an integer too large for this reader");
                    uint64_t v = n ? unsigned_le(n) : 0;
                    if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
                    push_int(static_cast<int64_t>(v));
                    break;
                }
                case 'G': {  // BINFLOAT (big-endian)
                    auto b = take(8);
                    uint64_t bits = 0;
                    for (int k = 0; k < 8; ++k) bits = bits << 8 | static_cast<unsigned char>(b[k]);
                    Value x;
                    x.kind = Value::Float;
                    x.i = static_cast<int64_t>(bits);
                    push(make(std::move(x)));
                    break;
                }
                case 'X':
                    push_str(take(unsigned_le(4)));
                    break;  // BINUNICODE
                case 0x8c:
                    push_str(take(unsigned_le(1)));
                    break;  // SHORT_BINUNICODE
                case 0x8d:
                    push_str(take(unsigned_le(8)));
                    break;  // BINUNICODE8
                case 'T':
                    push_str(take(unsigned_le(4)));
                    break;  // BINSTRING
                case 'U':
                    push_str(take(unsigned_le(1)));
                    break;  // SHORT_BINSTRING
                case 'B':
                    push_str(take(unsigned_le(4)));
                    break;  // BINBYTES
                case 'C':
                    push_str(take(unsigned_le(1)));
                    break;  // SHORT_BINBYTES
                case ')':
                    push_tuple({});
                    break;
                case 0x85:
                case 0x86:
                case 0x87: {  // TUPLE1..3
                    std::vector<size_t> items(op - 0x84);
                    for (size_t k = items.size(); k-- > 0;) items[k] = pop();
                    push_tuple(std::move(items));
                    break;
                }
                case 't':
                    push_tuple(pop_to_mark());
                    break;
                case ']':
                    push(make(Value::List));
                    break;
                case 'l': {  // LIST
                    auto items = pop_to_mark();
                    Value x;
                    x.kind = Value::List;
                    x.items = std::move(items);
                    push(make(std::move(x)));
                    break;
                }
                case '}':
                    push(make(Value::Dict));
                    break;
                case 'd': {  // DICT
                    auto kv = pop_to_mark();
                    const size_t d = make(Value::Dict);
                    set_items(d, kv);
                    push(d);
                    break;
                }
                case 'a': {  // APPEND
                    const size_t v = pop();
                    append_items(top(), {v});
                    break;
                }
                case 'e': {  // APPENDS
                    auto items = pop_to_mark();
                    append_items(top(), items);
                    break;
                }
                case 's': {  // SETITEM
                    const size_t v = pop();
                    const size_t k = pop();
                    set_items(top(), {k, v});
                    break;
                }
                case 'u': {  // SETITEMS
                    auto kv = pop_to_mark();
                    set_items(top(), kv);
                    break;
                }
                case 'c': {  // GLOBAL "module\nname\n"
                    std::string module = line();
                    std::string name = line();
                    push_global(std::move(module), std::move(name));
                    break;
                }
                case 0x93: {  // STACK_GLOBAL
                    const size_t name = pop();
                    const size_t module = pop();
                    if (at(module).kind != Value::Str || at(name).kind != Value::Str) fail("a global without a name");
                    push_global(at(module).s, at(name).s);
                    break;
                }
                case 'R': {  // REDUCE
                    const size_t args = pop();
                    const size_t fn = pop();
                    push(call(fn, args));
                    break;
                }
                case 0x81: {  // NEWOBJ: an object of some class
                    pop();
                    pop();
                    push(make(Value::Opaque));
                    break;
                }
                case 'b':
                    pop();
                    top();
                    break;   // BUILD: object state, not kept
                case 'Q': {  // BINPERSID
                    const size_t pid = pop();
                    push(persistent(pid));
                    break;
                }
                case 'q':
                    memo_put(unsigned_le(1));
                    break;  // BINPUT
                case 'r':
                    memo_put(unsigned_le(4));
                    break;  // LONG_BINPUT
                case 0x94:
                    memo_put(memo_.size());
                    break;  // MEMOIZE
                case 'h':
                    memo_get(unsigned_le(1));
                    break;  // BINGET
                case 'j':
                    memo_get(unsigned_le(4));
                    break;  // LONG_BINGET
                case '0':
                    pop();
                    break;   // POP
                case '2': {  // DUP
                    const size_t v = top();
                    push(v);
                    break;
                }
                default: {
                    static const char* hex = "0123456789abcdef";
                    fail(std::string("an unsupported pickle opcode 0x") + hex[op >> 4] + hex[op & 15]);
                }
            }
        }
    }

    std::string key_text(size_t k) {
        if (at(k).kind == Value::Str) return at(k).s;
        if (at(k).kind == Value::Int) return std::to_string(at(k).i);
        fail("a dict key that is neither a string nor an integer");
    }

    // A pickle can share one container many times over (the memo), so the
    // walk is bounded by the number of values, not just by depth.
    void collect(size_t v, const std::string& name, size_t depth, std::vector<PickledTensor>& out) {
        if (depth > kMaxDepth) fail("values nested more than " + std::to_string(kMaxDepth) + " deep");
        if (++visits_ > 4 * arena_.size() + 1024) fail("values shared too many times over");
        const Value& x = at(v);
        auto child = [&](const std::string& key) {
            if (name.size() + key.size() >= kMaxNameBytes)
                fail("a tensor name longer than " + std::to_string(kMaxNameBytes) + " bytes");
            return name.empty() ? key : name + "." + key;
        };
        switch (x.kind) {
            case Value::Tensor: {
                PickledTensor t = tensor_of(v);
                t.name = name;
                charge(sizeof(PickledTensor) + t.name.size() + t.storage.size() + t.dtype.size() + 16 * t.shape.size());
                out.push_back(std::move(t));
                break;
            }
            case Value::Dict:
                for (size_t k = 0; k + 1 < x.items.size(); k += 2)
                    collect(x.items[k + 1], child(key_text(x.items[k])), depth + 1, out);
                break;
            case Value::List:
            case Value::Tuple:
                for (size_t k = 0; k < x.items.size(); ++k)
                    collect(x.items[k], child(std::to_string(k)), depth + 1, out);
                break;
            default:
                break;
        }
    }
};

}  // namespace

std::vector<PickledTensor> parse_torch_pickle(std::string_view pickle, const std::string& path) {
    return Parser(pickle, path).run();
}

}  // namespace sd
